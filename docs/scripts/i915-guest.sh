# shellcheck shell=bash
# Sourced by the scripts beside it that boot Debian's i915 in a QEMU/TCG guest on a gmig vGPU
# and run one script of theirs in it (i915-submission-accesses.sh, busy-host-downtime.sh).
#
#   i915_guest_prepare ROOT WORK RUN  QEMU (scripts/qemu/build.sh, cached), gmig-i915-blit and an
#                                     initramfs whose /bin/run is the file RUN; sets gmig (GMIG,
#                                     default ROOT/target/release/gmig), qemu, KERNEL, INITRD
#   i915_guest_serve WORK [ARG...]    gmig serve on WORK/gpu.sock (stderr WORK/serve.log) in the
#                                     background, with SERVE_ARGS and ARGs; returns once it listens
#   i915_guest_argv WORK              sets QEMU_ARGV: the VM (1 GiB, the vGPU, its console in
#                                     WORK/console, /bin/run run at boot), for the caller to run
#                                     with its own extra arguments

i915_guest_prepare() {
    local root=$1 work=$2 run=$3
    gmig=${GMIG:-$root/target/release/gmig}
    [[ -x $gmig ]] || { echo "$0: no gmig at $gmig (cargo build --release -p gmig-cli, or set GMIG)" >&2; exit 2; }
    qemu=$("$root/scripts/qemu/build.sh" | tail -n1)
    sh "$root/crates/gmig-vmm/guest/build-i915.sh" "$work/gmig-i915-blit" >/dev/null
    eval "$("$root/scripts/qemu/guest.sh" --modules i915 --add "$run:/bin/run" \
        --add "$work/gmig-i915-blit:/bin/gmig-i915-blit" --out "$work/guest" | tail -n2)"
}

i915_guest_serve() {
    local work=$1
    shift
    # shellcheck disable=SC2086 # SERVE_ARGS is split into arguments on purpose
    "$gmig" serve --socket "$work/gpu.sock" --ram-by-vmm --clients 1 ${SERVE_ARGS:-} "$@" \
        2>"$work/serve.log" &
    for _ in $(seq 100); do [[ -S $work/gpu.sock ]] && return; sleep 0.05; done
    echo "$0: gmig serve did not listen:" >&2
    cat "$work/serve.log" >&2
    exit 1
}

i915_guest_argv() {
    local work=$1
    # shellcheck disable=SC2034,SC2054 # QEMU_ARGV is the callers'; commas are QEMU's, not bash's
    QEMU_ARGV=("$qemu" -machine q35,accel=tcg,memory-backend=mem -cpu max -m 1G
        -object memory-backend-memfd,id=mem,size=1G,share=on
        -nodefaults -nographic -no-reboot -serial "file:$work/console"
        -kernel "$KERNEL" -initrd "$INITRD"
        -append "console=ttyS0 panic=-1 quiet no_timer_check drm_kms_helper.fbdev_emulation=0 gmig.run=/bin/run"
        -device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"path\":\"$work/gpu.sock\",\"type\":\"unix\"}}")
}
