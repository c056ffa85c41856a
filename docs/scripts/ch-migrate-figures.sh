#!/usr/bin/env bash
# Live-migrates a cloud-hypervisor VM with a gmig vGPU N times on this machine and prints
# cloud-hypervisor's own report of each migration (total time, downtime), then the same guest
# migrated N times by QEMU (gmig's patched build, TCG: QEMU boots the same PVH ELF) and by
# `gmig vm migrate` (gmig's own VMM on KVM, the vGPU in process) for comparison.
#
#   docs/scripts/ch-migrate-figures.sh [N] [PROFILE]      (defaults: 5 desktop)
#
# Needs: target/release/gmig (cargo build --release -p gmig-cli), cloud-hypervisor built by
# scripts/cloud-hypervisor/build.sh and QEMU by scripts/qemu/build.sh. Guest: the GPU driver as a PVH ELF, 128 MiB of shared RAM,
# one vCPU, migrated after its `frame 16` line, source and destination servers in slots 0 and 1,
# over a Unix socket on one machine.
set -euo pipefail
n=${1:-5}
profile=${2:-desktop}
repo=$(cd "$(dirname "$0")/../.." && pwd)
gmig=$repo/target/release/gmig
[[ -x $gmig ]] || { echo "build gmig first: cargo build --release -p gmig-cli" >&2; exit 1; }
bin=$("$repo/scripts/cloud-hypervisor/build.sh")
elf=$(ls -t "$repo"/target/release/build/gmig-vmm-*/out/guest-pvh.elf | head -1)
work=$(mktemp -d)
trap 'pkill -P $$ 2>/dev/null || true; rm -rf "$work"' EXIT
waitfor() {   # waitfor CONDITION: polls it, gives up after 300 s
    local deadline=$((SECONDS + 300))
    until eval "$1"; do
        ((SECONDS < deadline)) || { echo "timed out waiting for: $1 (in $PWD)" >&2; exit 1; }
        sleep 0.2
    done
}

for i in $(seq "$n"); do
    d=$work/$i
    mkdir -p "$d"
    cd "$d"
    "$gmig" serve --socket a.sock --ram-by-vmm --clients 1 >a.log 2>&1 &
    "$gmig" serve --socket b.sock --ram-by-vmm --slot 1 --clients 1 >b.log 2>&1 &
    waitfor '[[ -S a.sock && -S b.sock ]]'
    ln -s a.sock gpu.sock
    ln -s src.console console
    "$bin/cloud-hypervisor" -v --api-socket src.api --kernel "$elf" \
        --cmdline="--profile $profile --frames 1000000" --memory size=128M,shared=on \
        --serial file=console --console off --user-device socket=gpu.sock >src.log 2>&1 &
    "$bin/cloud-hypervisor" -v --api-socket dst.api >dst.log 2>&1 &
    waitfor 'grep -qa "frame 16 sum" src.console 2>/dev/null'
    waitfor '[[ -S dst.api ]]'
    ln -sfn b.sock gpu.sock
    ln -sfn dst.console console
    "$bin/ch-remote" --api-socket dst.api receive-migration receiver_url=unix:mig.sock >/dev/null 2>&1 &
    waitfor '[[ -S mig.sock ]]'
    "$bin/ch-remote" --api-socket src.api send-migration destination_url=unix:mig.sock
    waitfor 'grep -qa "Migration completed\|Migration failed" src.log'
    waitfor 'grep -qa "frame" dst.console 2>/dev/null'
    echo "cloud-hypervisor run $i: $(grep -ao 'Migration \(completed\|failed\).*' src.log | head -1); destination renders: $(grep -a frame dst.console | head -1)"
    "$bin/ch-remote" --api-socket dst.api shutdown-vmm >/dev/null 2>&1 || true
    pkill -P $$ 2>/dev/null || true
    wait 2>/dev/null || true
    cd "$work"
done

echo "QEMU (TCG, q35), the same guest ($profile, 128 MiB memfd, 1 vCPU), migrate over a Unix socket:"
qemu=$("$repo/scripts/qemu/build.sh" | tail -1)
qmp() {   # qmp SOCKET COMMAND-JSON: runs one QMP command, prints its "return"
    python3 - "$1" "$2" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile("rw")
def rd():
    while True:
        m = json.loads(f.readline())
        if "event" not in m:
            return m
rd(); f.write('{"execute":"qmp_capabilities"}\n'); f.flush(); rd()
f.write(sys.argv[2] + "\n"); f.flush(); print(json.dumps(rd().get("return")))
PY
}
for i in $(seq "$n"); do
    d=$work/q$i
    mkdir -p "$d"
    cd "$d"
    "$gmig" serve --socket a.sock --ram-by-vmm --clients 1 >a.log 2>&1 &
    "$gmig" serve --socket b.sock --ram-by-vmm --slot 1 --clients 1 >b.log 2>&1 &
    waitfor '[[ -S a.sock && -S b.sock ]]'
    vm() {   # vm NAME GPU-SOCKET EXTRA...
        local name=$1 gpu=$2
        shift 2
        "$qemu" -machine q35,accel=tcg -m 128 -smp 1 -object memory-backend-memfd,id=mem,size=128M,share=on \
            -numa node,memdev=mem -kernel "$elf" -append "--profile $profile --frames 1000000" \
            -display none -serial "file:$name.console" -qmp "unix:$name.qmp,server=on,wait=off" \
            -device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"path\":\"$gpu\",\"type\":\"unix\"}}" \
            "$@" >"$name.log" 2>&1 &
    }
    vm src a.sock
    vm dst b.sock -incoming unix:mig.sock
    waitfor 'grep -qa "frame 16 sum" src.console 2>/dev/null'
    waitfor '[[ -S dst.qmp && -S mig.sock ]]'
    qmp src.qmp '{"execute":"migrate","arguments":{"uri":"unix:mig.sock"}}' >/dev/null
    while :; do
        q=$(qmp src.qmp '{"execute":"query-migrate"}')
        case $q in *'"completed"'*|*'"failed"'*) break ;; esac
        sleep 0.2
    done
    waitfor 'grep -qa "frame" dst.console 2>/dev/null'
    echo "QEMU run $i: $(python3 -c 'import json,sys; q=json.loads(sys.argv[1]); print("%s, total %s ms, downtime %s ms" % (q["status"], q.get("total-time"), q.get("downtime")))' "$q"); destination renders: $(grep -a frame dst.console | head -1)"
    qmp dst.qmp '{"execute":"quit"}' >/dev/null 2>&1 || true
    pkill -P $$ 2>/dev/null || true
    wait 2>/dev/null || true
    cd "$work"
done

echo "gmig vm migrate, the same guest ($profile, 128 MiB), the vGPU in process, over TCP on 127.0.0.1:"
for i in $(seq "$n"); do
    port=$((4470 + i))
    "$gmig" --json vm migrate --listen "127.0.0.1:$port" --slot 1 --ram-mib 128 --profile "$profile" \
        --frames 96 >"$work/dst-$i.json" 2>/dev/null &
    sleep 0.5
    "$gmig" --json vm migrate --to "127.0.0.1:$port" --ram-mib 128 --profile "$profile" --frames 96 \
        --at-frame 16 >"$work/src-$i.json" 2>/dev/null
    wait
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("gmig vm migrate run %s: total %.0f ms, downtime %.2f ms" % (sys.argv[2], r["total_ms"], r["downtime_ms"]))' "$work/src-$i.json" "$i"
done
