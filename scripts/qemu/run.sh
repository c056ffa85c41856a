#!/usr/bin/env bash
# Runs a Linux guest in QEMU with a gmig vGPU attached over vfio-user, the guest GPU driver
# rendering on it, and prints what the guest printed (its PCI devices, frames, checksum).
#
#   scripts/qemu/run.sh [--profile desktop|compute] [--frames N] [--type A+H] [--ram-mib M]
#                       [--keep DIR]
#
# What it does, in order (each step is one of the project's own scripts or binaries):
#   1. QEMU 10.2.2 from the shared tarball (scripts/qemu/build.sh; ~8 min the first time, cached);
#   2. the guest GPU driver as a static Linux program (crates/gmig-vmm/guest/build-linux.sh) and
#      a guest with it (scripts/qemu/guest.sh: Debian's cloud kernel, busybox initramfs);
#   3. `gmig serve --ram-by-vmm --clients 1` on a socket (target/release/gmig; built if absent);
#   4. QEMU under TCG with the vGPU as a vfio-user-pci device and shared memfd RAM; the guest
#      lists its PCI devices, runs `gmig-guest --profile P --frames N` and powers off.
# The checksum it prints equals `gmig vm run --profile P --frames N`'s (same driver, KVM VMM).
# Exit status: the guest driver's (0: rendered every frame), 1 if QEMU or the server failed.
#
# Environment: GMIG_CACHE, GMIG_SHARED (see build.sh and guest.sh), GMIG (the gmig binary).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
profile=desktop frames=48 type=64+384 ram=1024 keep=
while [ $# -gt 0 ]; do
    case $1 in
        --profile) profile=$2; shift 2 ;;
        --frames) frames=$2; shift 2 ;;
        --type) type=$2; shift 2 ;;
        --ram-mib) ram=$2; shift 2 ;;
        --keep) keep=$2; shift 2 ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "scripts/qemu/run.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

work=${keep:-$(mktemp -d)}
mkdir -p "$work"
serve_pid=
cleanup() {
    [ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null || true
    [ -z "$keep" ] && rm -rf "$work"
}
trap cleanup EXIT

qemu=$("$root/scripts/qemu/build.sh")
"$root/crates/gmig-vmm/guest/build-linux.sh" "$work/gmig-guest" >/dev/null
eval "$("$root/scripts/qemu/guest.sh" --add "$work/gmig-guest:/bin/gmig-guest" --out "$work/guest" |
    sed -n 's/^\(KERNEL\|INITRD\)=\(.*\)$/\1="\2"/p')"

gmig=${GMIG:-$root/target/release/gmig}
if [ ! -x "$gmig" ]; then
    (cd "$root" && cargo build --release -p gmig-cli >&2)
fi

sock=$work/gmig.sock
"$gmig" serve --socket "$sock" --type "$type" --ram-by-vmm --clients 1 2>"$work/serve.log" &
serve_pid=$!
for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || { echo "gmig serve did not listen:" >&2; cat "$work/serve.log" >&2; exit 1; }

"$qemu" -machine q35,accel=tcg,memory-backend=mem -cpu max -m "${ram}M" \
    -object "memory-backend-memfd,id=mem,size=${ram}M,share=on" \
    -nodefaults -nographic -no-reboot -serial stdio \
    -kernel "$KERNEL" -initrd "$INITRD" \
    -append "console=ttyS0 panic=-1 quiet no_timer_check gmig.run=/bin/gmig-guest,--profile,$profile,--frames,$frames" \
    -device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"path\":\"$sock\",\"type\":\"unix\"}}" \
    | tee "$work/console.log" | tr -d '\r' | grep -E '^(GMIG-|gmig guest|gpu:|frame |checksum|tsc |guest error)'
qemu_status=${PIPESTATUS[0]}
wait "$serve_pid" || { echo "gmig serve failed:" >&2; cat "$work/serve.log" >&2; exit 1; }
serve_pid=
[ "$qemu_status" -eq 0 ] || { echo "QEMU exited with $qemu_status" >&2; exit 1; }
status=$(tr -d '\r' <"$work/console.log" | sed -n 's/^GMIG-GUEST: exit //p' | tail -1)
exit "${status:-1}"
