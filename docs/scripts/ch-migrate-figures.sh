#!/usr/bin/env bash
# Live-migrates a cloud-hypervisor VM with a gmig vGPU N times on this machine and prints
# cloud-hypervisor's own report of each migration (total time, downtime), then the same guest
# migrated N times by `gmig vm migrate` (gmig's own VMM) for comparison.
#
#   docs/scripts/ch-migrate-figures.sh [N] [PROFILE]      (defaults: 5 desktop)
#
# Needs: target/release/gmig (cargo build --release -p gmig-cli) and cloud-hypervisor built by
# scripts/cloud-hypervisor/build.sh. Guest: the GPU driver as a PVH ELF, 128 MiB of shared RAM,
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

for i in $(seq "$n"); do
    d=$work/$i
    mkdir -p "$d"
    cd "$d"
    "$gmig" serve --socket a.sock --ram-by-vmm --clients 1 >a.log 2>&1 &
    "$gmig" serve --socket b.sock --ram-by-vmm --slot 1 --clients 1 >b.log 2>&1 &
    until [[ -S a.sock && -S b.sock ]]; do sleep 0.1; done
    ln -s a.sock gpu.sock
    ln -s src.console console
    "$bin/cloud-hypervisor" -v --api-socket src.api --kernel "$elf" \
        --cmdline="--profile $profile --frames 1000000" --memory size=128M,shared=on \
        --serial file=console --console off --user-device socket=gpu.sock >src.log 2>&1 &
    "$bin/cloud-hypervisor" -v --api-socket dst.api >dst.log 2>&1 &
    until grep -qa "frame 16 sum" src.console 2>/dev/null; do sleep 0.2; done
    until [[ -S dst.api ]]; do sleep 0.1; done
    ln -sfn b.sock gpu.sock
    ln -sfn dst.console console
    "$bin/ch-remote" --api-socket dst.api receive-migration receiver_url=unix:mig.sock >/dev/null 2>&1 &
    until [[ -S mig.sock ]]; do sleep 0.1; done
    "$bin/ch-remote" --api-socket src.api send-migration destination_url=unix:mig.sock
    until grep -qa "Migration completed\|Migration failed" src.log; do sleep 0.2; done
    until grep -qa "frame" dst.console 2>/dev/null; do sleep 0.2; done
    echo "cloud-hypervisor run $i: $(grep -ao 'Migration .*' src.log | head -1); destination renders: $(grep -a frame dst.console | head -1)"
    "$bin/ch-remote" --api-socket dst.api shutdown-vmm >/dev/null 2>&1 || true
    kill %1 %2 %3 %4 2>/dev/null || true
    wait 2>/dev/null || true
    cd "$work"
done

echo "gmig vm migrate, the same guest ($profile, 128 MiB):"
for i in $(seq "$n"); do
    "$gmig" --json vm migrate --profile "$profile" --ram-mib 128 --frames 64 2>/dev/null \
        | python3 -c 'import json,sys; r=json.load(sys.stdin); print("gmig vm migrate run", '"$i"', {k: r[k] for k in r if "downtime" in k or "total" in k})'
done
