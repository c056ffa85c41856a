#!/usr/bin/env bash
# One-shot-narrow downtime on this machine idle and with a QEMU/TCG guest running beside it
# (issue 43 item 4): the same `gmig --json bench migrate` call, K times idle, K times while the
# guest runs, K times idle again, then p50 / p95 / max per profile over each phase's samples and
# busy against idle.
#
#   docs/scripts/busy-host-downtime.sh [K] [--out DIR]
#
# The guest beside it is Debian's kernel with i915 on a gmig vGPU (`gmig serve`), submitting empty
# blitter batches with EXECBUFFER2 and waiting for each, in a loop (`gmig-i915-blit nop`), so TCG
# keeps a core busy and the vGPU server answers its register accesses: the load of a host that
# runs a graphics VM. Each bench call: desktop, 3d, video, compute; one-shot-narrow; 64+384;
# 10 Gbit/s; 5 repetitions. Nothing is pinned. Needs scripts/qemu/build.sh's QEMU, gcc with static
# glibc, GMIG (default target/release/gmig). Writes each call's JSON into DIR (default a temporary
# directory, removed) and prints the table.
set -euo pipefail
k=3 out=
while (($#)); do
    case $1 in
        --out) out=$2; shift ;;
        [0-9]*) k=$1 ;;
        *) echo "usage: $0 [K] [--out DIR]" >&2; exit 2 ;;
    esac
    shift
done
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=docs/scripts/i915-guest.sh
. "$root/docs/scripts/i915-guest.sh"
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
out=${out:-$work/out}
mkdir -p "$out"
cat >"$work/busy-run" <<'SCRIPT'
#!/bin/sh
modprobe i915 || echo "GMIG-BUSY: modprobe failed"
echo "GMIG-BUSY: running"
while :; do /bin/gmig-i915-blit nop 1000 >/dev/null; done
SCRIPT
chmod +x "$work/busy-run"
i915_guest_prepare "$root" "$work" "$work/busy-run"

bench() { # phase index
    "$gmig" --json bench migrate --profiles desktop,3d,video,compute --policies one-shot-narrow \
        --types 64+384 --links 10 --reps 5 >"$out/$1-$2.json"
    echo "$1 $2: load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
}
for i in $(seq "$k"); do bench idle "$i"; done

i915_guest_serve "$work"
i915_guest_argv "$work"
"${QEMU_ARGV[@]}" >"$work/qemu.log" 2>&1 &
qemu_pid=$!
for _ in $(seq 600); do grep -aq "GMIG-BUSY: running" "$work/console" 2>/dev/null && break; sleep 0.5; done
grep -aq "GMIG-BUSY: running" "$work/console" || { echo "$0: the guest did not start its loop:" >&2; tail -20 "$work/console" >&2; exit 1; }
for i in $(seq "$k"); do bench busy "$i"; done
kill "$qemu_pid"; wait "$qemu_pid" 2>/dev/null || true
for i in $(seq "$k"); do bench idle-after "$i"; done

python3 - "$out" <<'PY'
import json, sys, glob, collections
samples = collections.defaultdict(list)
pages = collections.defaultdict(list)
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    phase = f.rsplit("/", 1)[1].rsplit("-", 1)[0]
    phase = "idle" if phase.startswith("idle") else phase
    for row in json.load(open(f))["rows"]:
        if not row["identical"]:
            sys.exit(f"{f}: {row['profile']} differs from its unmigrated run")
        samples[(phase, row["profile"])] += row["downtime_samples_ms"]
        pages[(phase, row["profile"])].append(row["pages_stop_copy"])
def q(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]
print("| profile | idle: p50 / p95 / max (ms) | busy: p50 / p95 / max (ms) | busy / idle: p50, p95 | samples idle, busy | stop-copy pages (busy) |")
print("|---|---|---|---|---|---|")
for prof in sorted({p for _, p in samples}, key=["desktop", "3d", "video", "compute"].index):
    i, b = samples[("idle", prof)], samples[("busy", prof)]
    fmt = lambda xs: " / ".join(f"{q(xs, p):.2f}" for p in (0.5, 0.95, 1.0))
    print(f"| {prof} | {fmt(i)} | {fmt(b)} | {q(b, .5) / q(i, .5):.2f}×, {q(b, .95) / q(i, .95):.2f}× "
          f"| {len(i)}, {len(b)} | {min(pages[('busy', prof)])}–{max(pages[('busy', prof)])} |")
PY
