#!/usr/bin/env bash
# Counts the vGPU register accesses one EXECBUFFER2 costs Debian's i915 in a QEMU/TCG guest on a
# gmig vGPU, by register, as QEMU's own trace of the device's region accesses shows them.
#
#   docs/scripts/i915-submission-accesses.sh [N] [--no-posted-writes]
#
# The guest loads i915 and runs `gmig-i915-blit nop N` (crates/gmig-vmm/guest/i915.c): one empty
# batch submitted on the blitter and waited for (GEM_WAIT), N times, between two reads of the
# GPU's PCI configuration space at 0xf0 and 0xf4 (markers in the trace). QEMU traces (on its stderr)
# `vfio_region_read`, `vfio_region_write` and `vfio_pci_read_config`; every BAR access between the
# markers is counted, by BAR and offset, divided by N, and named from gmig's register table.
# Reads wait for the server (a vfio-user round trip each); writes are posted unless
# --no-posted-writes (QEMU's x-no-posted-writes=true). Prints the table and the guest's time per
# submission. Needs: scripts/qemu/build.sh's QEMU, gcc with static glibc, GMIG (default
# target/release/gmig); SERVE_ARGS adds arguments to `gmig serve` (e.g. `--poll-us 50`). Nothing
# is kept (a temporary directory).
set -euo pipefail
n=200 posted=false
for a in "$@"; do
    case $a in
        --no-posted-writes) posted=true ;;
        [0-9]*) n=$a ;;
        *) echo "usage: $0 [N] [--no-posted-writes]" >&2; exit 2 ;;
    esac
done
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=docs/scripts/i915-guest.sh
. "$root/docs/scripts/i915-guest.sh"
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; [[ -n ${GMIG_KEEP:-} ]] || rm -rf "$work"' EXIT
cat >"$work/nop-run" <<SCRIPT
#!/bin/sh
modprobe i915 || echo "GMIG-NOP: modprobe failed"
sleep 2
/bin/gmig-i915-blit nop $n
SCRIPT
chmod +x "$work/nop-run"
i915_guest_prepare "$root" "$work" "$work/nop-run"
i915_guest_serve "$work"
i915_guest_argv "$work"
timeout 600 "${QEMU_ARGV[@]}" -global "vfio-user-pci.x-no-posted-writes=$posted" \
    -trace enable=vfio_region_read -trace enable=vfio_region_write \
    -trace enable=vfio_pci_read_config >"$work/qemu.log" 2>&1 || true
grep -a "GMIG-NOP" "$work/console" || { echo "$0: the guest printed no result:" >&2; tail -20 "$work/console" >&2; exit 1; }
python3 - "$work/qemu.log" "$n" "$root" "$posted" <<'PY'
import re, sys, glob, collections
trace, n, root, no_posted = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "true"
names, engine = {}, {}
for f in glob.glob(f"{root}/crates/gmig-vgpu/src/regs/*.rs"):
    text = open(f).read()
    # table.rs: rows after `pub const ENGINE` are relative to an engine's register base.
    cut = text.find("pub const ENGINE") if f.endswith("table.rs") else -1
    for m in re.finditer(r'reg\(\s*(0x[0-9a-f_]+),\s*"([^"]+)"', text):
        off, name = int(m.group(1).replace("_", ""), 16), m.group(2)
        (engine if 0 <= cut < m.start() else names).setdefault(off, name)
BASES = {0x2000: "RCS", 0x22000: "BCS", 0x12000: "VCS", 0x1c000: "VCS2", 0x1a000: "VECS"}
def name_of(off):
    if off in names: return names[off]
    for base, e in BASES.items():
        if base <= off < base + 0x1000 and off - base in engine:
            return f"{e} {engine[off - base]}"
    return "?"
counts, inside = collections.Counter(), False
for line in open(trace, errors="replace"):
    if "vfio_pci_read_config" in line:
        if "0xf0" in line: inside = True
        if "0xf4" in line: inside = False
        continue
    if not inside: continue
    m = re.search(r"vfio_region_(read|write).*?region(\d+)\+0x([0-9a-f]+)", line)
    if m: counts[(m.group(1), int(m.group(2)), int(m.group(3), 16))] += 1
total_r = sum(c for (k, _, _), c in counts.items() if k == "read")
total_w = sum(c for (k, _, _), c in counts.items() if k == "write")
print(f"per submission ({n} submissions): {total_r / n:.2f} reads (each a round trip), "
      f"{total_w / n:.2f} writes ({'each a round trip' if no_posted else 'posted'})")
print("| access | BAR | offset | register | per submission |")
print("|---|---|---|---|---|")
for (k, bar, off), c in sorted(counts.items(), key=lambda x: -x[1]):
    if c / n < 0.05: continue
    name = name_of(off) if bar == 0 else "(aperture)"
    print(f"| {k} | {bar} | 0x{off:x} | {name} | {c / n:.2f} |")
PY
