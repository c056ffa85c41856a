#!/usr/bin/env bash
# Runs IGT's i915 fast-feedback tests (the non-kms_* lines of
# tests/intel-ci/i915.fast-feedback.testlist, or with --list kms its kms_* lines) in a Linux i915
# guest on the gmig vGPU, rebooting the guest after a hang, and prints one line per subtest.
#
#   scripts/igt/run.sh [--list ff|kms] [--fbcon] [--no-posted-writes] [--timeout SECS]
#                      [--boot-timeout SECS]
#                      [--gmig-wait SECS] [--ram-mib MIB] [--details FILE] [--times FILE]
#                      [--keep DIR] [REGEX]
#
#   --list ff|kms     which lines: `ff` (default) the testlist's non-kms_* lines, `kms` its
#                     kms_* lines (the display: the vGPU's virtual monitor)
#   --fbcon           boot with i915's fbdev emulation (fbcon, /dev/fb0), for the fbdev@*
#                     subtests; without it the guest boots with drm_kms_helper.fbdev_emulation=0.
#                     With --fbcon or --list kms QEMU posts region writes (its default);
#                     otherwise it runs with x-no-posted-writes=true (see below)
#   --no-posted-writes  x-no-posted-writes=true whatever the list
#   REGEX             run only the testlist entries (`igt@BINARY@SUBTEST[@DYNAMIC]`) that match
#                     this extended regular expression (grep -E), e.g. 'gem_basic|prime_vgem'
#   --timeout SECS    bound on one subtest in the guest (default 120); past it the test is
#                     killed (SIGTERM, SIGKILL 10 s later) and counts as `hang`
#   --boot-timeout S  bound on the guest's silence outside a subtest: boot, loading i915
#                     (default 600)
#   --gmig-wait SECS  how long to wait for the gmig binary to appear (default 3600)
#   --ram-mib MIB     guest RAM (default 1024; IGT skips gem_linear_blits, gem_tiled_blits,
#                     gem_tiled_fence_blits and gem_exec_gttfill unless the guest has RAM for
#                     objects covering the whole 4 GiB GGTT, or 1 GiB of it)
#   --details FILE    write every non-pass subtest's complaints there (default: stderr)
#   --times FILE      write `NAME RESULT SECONDS BOOT` per subtest there
#   --keep DIR        work in DIR and keep it (consoles, server logs, the initramfs)
#   --prepare-only    build QEMU, IGT and the guest for the subtests REGEX selects, print
#                     QEMU=<path>, KERNEL=<path>, INITRD=<path> and exit 0 without booting (with
#                     --keep: the files stay there). The guest runs `gmig.run=/bin/igt-guest,1,LIMIT`:
#                     every selected subtest in order, LIMIT seconds each, with the console markers
#                     below (tests/igt.rs boots it itself, to migrate it).
#
# stdout: exactly one line per subtest, in testlist order:
#   igt@BINARY@SUBTEST: pass|fail|skip|timeout|hang
# from the test's exit status (0 pass, 77 skip, 78 timeout (IGT's own), anything else fail);
# `hang`: killed by the bound, or the guest stopped answering (the host then kills QEMU).
# A testlist entry without a subtest (`igt@i915_pciid`) runs the whole binary; one with a dynamic
# subtest (`igt@gem_busy@busy@all-engines`) runs `--run-subtest busy --dynamic-subtest
# all-engines`. For each non-pass subtest the details say: the guest's kernel log since the
# subtest started, the test's stderr tail and stdout tail, and `gmig serve`'s WARN/ERROR lines
# logged while it ran (for a hang seen by the host: the console since the subtest started).
# Progress and a summary go to stderr. Exit status: 0 when every subtest passed or skipped,
# 1 when some failed, timed out or hung, 2 when the run itself could not go on.
#
# What it does:
#   1. QEMU (scripts/qemu/build.sh; it may be building: it waits for the lock) and IGT
#      (scripts/igt/build.sh: the test binaries with their libraries);
#   2. waits for the gmig binary, ${GMIG:-<repo>/target/debug/gmig} (it does not build it), and
#      copies it into the work directory so a rebuild during the run changes nothing;
#   3. the guest (scripts/qemu/guest.sh --modules i915,vgem --add ...): every IGT file, the test
#      list, a guest-side runner /bin/igt-guest, and libkmod's binary indexes (modules.dep.bin, ...)
#      made by kmod's depmod over the modules the initramfs carries (IGT loads and unloads
#      modules through libkmod, which cannot read the text modules.dep busybox writes);
#   4. boots, as many times as needed: `gmig serve --ram-by-vmm --clients 1` (a fresh vGPU per
#      boot; RUST_LOG=info) and QEMU under TCG with the vGPU as vfio-user-pci,
#      -global vfio-user-pci.x-no-posted-writes=true, memfd RAM (share=on, --ram-mib), the kernel
#      command line drm_kms_helper.fbdev_emulation=0 (no fbcon: with writes not posted its
#      drawing through the aperture takes minutes under TCG) gmig.run=/bin/igt-guest,FIRST,TIMEOUT. In the guest, before each subtest,
#      i915 and vgem are loaded if they are not (busybox modprobe, as
#      crates/gmig-cli/tests/qemu_i915.rs does; none before igt@i915_module_load@load, which
#      loads i915 itself), then the subtest runs under the bound with its output in files; after
#      it the guest prints its result, and stops (powers off) when it was killed or i915 is
#      wedged (debugfs i915_wedged), so that the next boot goes on with the next subtest.
# Guest console markers (the host reads them from the serial console file):
#   IGT-START <i> <name>     IGT-RESULT <i> <exit status|killed> <seconds> wedged=<0|1>
#   IGT-DMESG <i>: <line>    IGT-ERR <i>: <line>    IGT-OUT <i>: <line>    (non-pass only)
#   IGT-STOP <i>             IGT-END                IGT-NOTE <text>
#
# Environment: GMIG (the gmig binary), GMIG_CACHE, GMIG_SHARED (see scripts/qemu/build.sh,
# scripts/igt/build.sh). Installs Debian's kmod (for depmod) if missing. Each boot costs the
# guest's i915 probe under TCG.
set -euo pipefail
{   # The whole script is one block, read before it runs: editing the file mid-run is harmless.

die() { echo "scripts/igt/run.sh: error: $*" >&2; exit 2; }
note() { echo "scripts/igt/run.sh: $*" >&2; }

timeout=120 boot_timeout=600 gmig_wait=3600 ram=1024 details='' times='' keep='' regex='' prepare_only=0
list=ff fbcon=0 force_no_posted=0
while (($#)); do
    case $1 in
        --list) list=$2; shift 2 ;;
        --fbcon) fbcon=1; shift ;;
        --no-posted-writes) force_no_posted=1; shift ;;
        --timeout) timeout=$2; shift 2 ;;
        --boot-timeout) boot_timeout=$2; shift 2 ;;
        --gmig-wait) gmig_wait=$2; shift 2 ;;
        --ram-mib) ram=$2; shift 2 ;;
        --details) details=$2; shift 2 ;;
        --times) times=$2; shift 2 ;;
        --keep) keep=$2; shift 2 ;;
        --prepare-only) prepare_only=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) die "unknown option '$1' (see --help)" ;;
        *) [[ -z $regex ]] || die "only one REGEX"; regex=$1; shift ;;
    esac
done
[[ $timeout =~ ^[0-9]+$ && $boot_timeout =~ ^[0-9]+$ && $gmig_wait =~ ^[0-9]+$ ]] ||
    die "--timeout, --boot-timeout and --gmig-wait take whole seconds"
[[ $ram =~ ^[0-9]+$ ]] || die "--ram-mib takes a whole number"
case $list in
    ff) listfile=fast-feedback.testlist ;;
    kms) listfile=kms.testlist ;;
    *) die "--list takes ff or kms, not '$list'" ;;
esac
# QEMU's posted writes stay off (x-no-posted-writes=true) for the ff list, whose tests read back
# through RAM what they wrote through the aperture; the display's tests draw their framebuffers
# through the aperture, which takes minutes under TCG with every write waiting for the server.
no_posted=true
[[ $list == kms || $fbcon == 1 ]] && no_posted=false
((force_no_posted)) && no_posted=true
fbdev_arg=' drm_kms_helper.fbdev_emulation=0'
((fbcon)) && fbdev_arg=''


root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if [[ -n $keep ]]; then
    mkdir -p "$keep"
    work=$(cd "$keep" && pwd)
else
    work=$(mktemp -d "${TMPDIR:-/tmp}/gmig-igt-XXXXXX")
fi
serve_pid='' qemu_pid=''
# shellcheck disable=SC2317 # run by the trap
cleanup() {
    if [[ -n $qemu_pid ]]; then kill "$qemu_pid" 2>/dev/null || true; fi
    if [[ -n $serve_pid ]]; then kill "$serve_pid" 2>/dev/null || true; fi
    if [[ -z $keep ]]; then rm -rf "$work"; fi
}
trap cleanup EXIT
if [[ -n $details ]]; then : >"$details"; exec 4>>"$details"; else exec 4>&2; fi
if [[ -n $times ]]; then : >"$times"; fi

# ---- host packages: kmod's depmod ---------------------------------------------------------------
if ! command -v depmod >/dev/null && [[ ! -x /usr/sbin/depmod && ! -x /sbin/depmod ]]; then
    sudo=()
    [[ $(id -u) == 0 ]] || sudo=(sudo)
    note "installing Debian's kmod (depmod)"
    "${sudo[@]}" apt-get update -qq || die "apt-get update failed"
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends kmod >&2 ||
        die "apt-get install kmod failed"
fi
depmod=$(command -v depmod || echo /usr/sbin/depmod)
[[ -x $depmod ]] || depmod=/sbin/depmod

# ---- 1. QEMU and IGT ----------------------------------------------------------------------------
note "QEMU: scripts/qemu/build.sh (waits if another build runs)"
qemu=$("$root/scripts/qemu/build.sh" | tail -n1)
[[ -x $qemu ]] || die "scripts/qemu/build.sh gave no binary"
t=$SECONDS
igt=$("$root/scripts/igt/build.sh" | tail -n1)
[[ -f $igt/files.txt ]] || die "scripts/igt/build.sh gave no install dir"
note "IGT: $igt ($((SECONDS - t)) s)"

[[ -f $igt/$listfile ]] || die "$igt has no $listfile (an IGT built by an older scripts/igt/build.sh?)"
grep -E -- "${regex:-.}" "$igt/$listfile" >"$work/tests.txt" || true
mapfile -t names <"$work/tests.txt"
n=${#names[@]}
((n > 0)) || die "no testlist entry matches '${regex}'"
note "$n subtests"

# ---- 2. gmig ------------------------------------------------------------------------------------
gmig_src=${GMIG:-$root/target/debug/gmig}
t=$SECONDS
if [[ ! -x $gmig_src ]]; then
    note "waiting for $gmig_src (built by someone else; up to $gmig_wait s)"
    while [[ ! -x $gmig_src ]]; do
        ((SECONDS - t < gmig_wait)) || die "$gmig_src did not appear in $gmig_wait s"
        sleep 5
    done
fi
# Settled: the same size and time twice, 3 s apart.
while :; do
    a=$(stat -c '%s %Y' "$gmig_src"); sleep 3; b=$(stat -c '%s %Y' "$gmig_src")
    [[ $a == "$b" ]] && break
done
gmig=$work/gmig
cp "$gmig_src" "$gmig"
"$gmig" serve --help >/dev/null || die "$gmig serve --help failed"
note "gmig: $gmig_src ($(stat -c %y "$gmig_src" | cut -d. -f1))"

# ---- 3. the guest -------------------------------------------------------------------------------
cat >"$work/igt-guest" <<'GUEST'
#!/bin/sh
# igt-guest FIRST LIMIT (generated by scripts/igt/run.sh; see its header): runs the entries of
# /etc/igt/tests.txt from number FIRST on, each bounded by LIMIT seconds.
first=$1 limit=$2
export HOME=/root LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu
bin=/usr/libexec/igt-gpu-tools
mkdir -p /dev/shm /root && mount -t tmpfs tmpfs /dev/shm 2>/dev/null

now() { cut -d' ' -f1 /proc/uptime; }
idle() {   # waits up to 20 s for i915's GT to park
    for f in /sys/kernel/debug/dri/*/i915_engine_info; do
        [ -r "$f" ] || continue
        for _ in $(seq 20); do
            head -n1 "$f" | grep -q 'GT awake? no' && return
            sleep 1
        done
        echo "IGT-NOTE gt still busy after 20 s"
    done
}
# i915 and vgem, loaded if they are not (the test before may have unloaded them)
load() {
    if [ ! -d /sys/module/i915 ]; then
        echo "igt-guest: modprobe i915" >/dev/kmsg
        t0=$(now)
        modprobe i915 || echo "IGT-NOTE modprobe i915 failed"
        echo "IGT-NOTE modprobe i915 took $(awk "BEGIN { printf \"%.1f\", $(now) - $t0 }") s"
        idle
    fi
    [ -d /sys/module/vgem ] || modprobe vgem || echo "IGT-NOTE modprobe vgem failed"
}
wedged() {
    for f in /sys/kernel/debug/dri/*/i915_wedged; do
        [ -r "$f" ] && [ "$(cat "$f" 2>/dev/null)" != 0 ] && return 0
    done
    return 1
}

i=0
while read -r name; do
    i=$((i + 1))
    [ "$i" -lt "$first" ] && continue
    [ "$name" = igt@i915_module_load@load ] || load
    rest=${name#igt@}
    prog=${rest%%@*}
    set -- "$bin/$prog"
    case $rest in *@*)
        rest=${rest#*@}
        set -- "$@" --run-subtest "${rest%%@*}"
        case $rest in *@*) set -- "$@" --dynamic-subtest "${rest#*@}" ;; esac ;;
    esac
    echo "igt-guest: start $i $name" >/dev/kmsg
    echo "IGT-START $i $name"
    rm -f /tmp/killed
    t0=$(now)
    "$@" >/tmp/out 2>/tmp/err </dev/null &
    pid=$!
    (sleep "$limit"; : >/tmp/killed; kill -TERM "$pid"; sleep 10; kill -KILL "$pid") 2>/dev/null &
    killer=$!
    wait "$pid"
    rc=$?
    kill "$killer" 2>/dev/null
    secs=$(awk "BEGIN { printf \"%.1f\", $(now) - $t0 }")
    [ -e /tmp/killed ] && rc=killed
    w=0
    wedged && w=1
    if [ "$rc" != 0 ] || [ "$w" = 1 ]; then
        dmesg | sed -n "/igt-guest: start $i /,\$p" | sed "s/^/IGT-DMESG $i: /"
        # awk, not sed: a last line without a newline still ends its marker line
        tail -n 30 /tmp/err | awk -v p="IGT-ERR $i: " '{ print p $0 }'
        tail -n 12 /tmp/out | awk -v p="IGT-OUT $i: " '{ print p $0 }'
    fi
    echo "IGT-RESULT $i $rc $secs wedged=$w"
    if [ "$rc" = killed ] || [ "$w" = 1 ]; then
        echo "IGT-STOP $i"
        exit 0
    fi
done </etc/igt/tests.txt
echo "IGT-END"
GUEST
chmod 0755 "$work/igt-guest"

# The kernel and its module tree, from a first guest without IGT (cheap once cached).
mods=i915,vgem
mapfile -t g0 < <("$root/scripts/qemu/guest.sh" --modules "$mods" --out "$work/guest0")
kernel=
for l in "${g0[@]}"; do [[ $l == KERNEL=* ]] && kernel=${l#KERNEL=}; done
[[ -f $kernel ]] || die "scripts/qemu/guest.sh printed no KERNEL="
rels=("$(dirname "$kernel")"/modules/*)
[[ ${#rels[@]} == 1 && -f ${rels[0]}/modules.dep ]] || die "no module tree beside $kernel"
mdir=${rels[0]} rel=$(basename "${rels[0]}")
# The modules guest.sh puts in: i915, vgem and their dependencies (modules.dep's lines).
kt=$work/kmod
rm -rf "$kt"
mkdir -p "$kt/lib/modules/$rel"
awk -F: '{ n = $1; sub(/.*\//, "", n); sub(/\.ko$/, "", n); gsub(/-/, "_", n) }
         n == "i915" || n == "vgem" { print $1; m = split($2, d, " "); for (j = 1; j <= m; j++) print d[j] }' \
    "$mdir/modules.dep" | sort -u >"$work/modules.txt"
[[ -s $work/modules.txt ]] || die "i915 and vgem are not in $mdir/modules.dep"
while read -r p; do
    mkdir -p "$kt/lib/modules/$rel/$(dirname "$p")"
    ln "$mdir/$p" "$kt/lib/modules/$rel/$p" 2>/dev/null || cp "$mdir/$p" "$kt/lib/modules/$rel/$p"
done <"$work/modules.txt"
for f in modules.builtin modules.builtin.modinfo modules.order; do
    [[ -f $mdir/$f ]] && cp "$mdir/$f" "$kt/lib/modules/$rel/"
done
"$depmod" -b "$kt" "$rel" || die "depmod failed"
[[ -s $kt/lib/modules/$rel/modules.dep.bin ]] || die "depmod wrote no modules.dep.bin"

adds=(--add "$work/igt-guest:/bin/igt-guest" --add "$work/tests.txt:/etc/igt/tests.txt")
while read -r src dest; do adds+=(--add "$igt/$src:$dest"); done <"$igt/files.txt"
for f in "$kt/lib/modules/$rel"/modules.*; do
    adds+=(--add "$f:/lib/modules/$rel/$(basename "$f")")
done
mapfile -t g < <("$root/scripts/qemu/guest.sh" --modules "$mods" "${adds[@]}" --out "$work/guest")
initrd=
for l in "${g[@]}"; do [[ $l == INITRD=* ]] && initrd=${l#INITRD=}; done
[[ -f $initrd ]] || die "scripts/qemu/guest.sh printed no INITRD="
rm -rf "$work/guest0"
note "guest: $kernel, $initrd ($(du -h "$initrd" | cut -f1), $((${#adds[@]} / 2)) files added)"
if ((prepare_only)); then
    [[ -n $keep ]] || die "--prepare-only needs --keep DIR (the initramfs lives there)"
    echo "QEMU=$qemu"
    echo "KERNEL=$kernel"
    echo "INITRD=$initrd"
    exit 0
fi

# ---- 4. boots -----------------------------------------------------------------------------------
declare -A result=() secs=()
counts_pass=0 counts_fail=0 counts_skip=0 counts_timeout=0 counts_hang=0
size() { stat -c %s "$1" 2>/dev/null || echo 0; }
clean() { [[ -f $1 ]] || return 0; tr -d '\r' <"$1" | sed 's/\x1b\[[0-9;]*m//g'; }

# verdict I RESULT SECONDS : records and prints subtest I's line
verdict() {
    local i=$1 r=$2 s=$3 name=${names[$1 - 1]}
    result[$i]=$r secs[$i]=$s
    echo "$name: $r"
    eval "counts_$r=\$((counts_$r + 1))"
    note "[$i/$n] $name: $r ($s s, boot $boot)"
    [[ -z $times ]] || echo "$name $r $s $boot" >>"$times"
}
# complaints I CONSOLE SERVE-LOG FROM TO HEADER : the details block of subtest I
complaints() {
    local i=$1 con=$2 slog=$3 from=$4 to=$5 header=$6 name=${names[$1 - 1]}
    {
        echo "=== $name: ${result[$i]} (${secs[$i]} s, boot $boot)$header"
        local c
        c=$(clean "$con")
        if grep -q "^IGT-DMESG $i: " <<<"$c"; then
            echo "--- guest kernel log since the subtest started:"
            sed -n "s/^IGT-DMESG $i: //p" <<<"$c"
        else
            echo "--- guest console since the subtest started (no kernel log came back):"
            sed -n "/^IGT-START $i /,\$p" <<<"$c" | grep -v '^IGT-START' | tail -n 60
        fi
        echo "--- test stderr (tail):"
        sed -n "s/^IGT-ERR $i: //p" <<<"$c"
        echo "--- test stdout (tail):"
        sed -n "s/^IGT-OUT $i: //p" <<<"$c"
        echo "--- gmig serve WARN/ERROR while it ran:"
        local sl
        sl=$(tail -c +"$((from + 1))" "$slog" 2>/dev/null | head -c "$((to - from))" |
            sed 's/\x1b\[[0-9;]*m//g' | grep -E '\b(WARN|ERROR)\b' || true)
        if [[ -n $sl ]]; then
            echo "($(wc -l <<<"$sl") lines; first 20)"
            head -n 20 <<<"$sl"
        fi
        echo
    } >&4
}

next=1 boot=0
while ((next <= n)); do
    boot=$((boot + 1))
    sock=$work/gpu-$boot.sock slog=$work/serve-$boot.log con=$work/console-$boot.log
    rm -f "$sock" "$con"
    NO_COLOR=1 RUST_LOG=info "$gmig" serve --socket "$sock" --ram-by-vmm --clients 1 \
        </dev/null >/dev/null 2>"$slog" &
    serve_pid=$!
    for _ in $(seq 400); do [[ -S $sock ]] && break; sleep 0.05; done
    [[ -S $sock ]] || { cat "$slog" >&2; die "gmig serve did not listen on $sock"; }
    note "boot $boot: subtests $next..$n"
    "$qemu" -machine q35,accel=tcg,memory-backend=mem -cpu max -m "${ram}M" \
        -object "memory-backend-memfd,id=mem,size=${ram}M,share=on" \
        -nodefaults -nographic -no-reboot -display none -serial "file:$con" \
        -kernel "$kernel" -initrd "$initrd" \
        -append "console=ttyS0 panic=-1 quiet no_timer_check$fbdev_arg gmig.run=/bin/igt-guest,$next,$timeout" \
        -device "{\"driver\":\"vfio-user-pci\",\"id\":\"gpu0\",\"socket\":{\"path\":\"$sock\",\"type\":\"unix\"}}" \
        -global "vfio-user-pci.x-no-posted-writes=$no_posted" \
        </dev/null >"$work/qemu-$boot.log" 2>&1 &
    qemu_pid=$!
    boot_t0=$SECONDS quiet_since=$SECONDS seen=0 cur='' cur_t0=0 off0=0 started=0 ended=0 killed=0
    while :; do
        alive=1
        kill -0 "$qemu_pid" 2>/dev/null || alive=0
        mapfile -t m < <(clean "$con" | grep -a -E '^IGT-(START|RESULT|STOP|END|NOTE)( |$)' || true)
        for ((k = seen; k < ${#m[@]}; k++)); do
            read -r tag i rest <<<"${m[k]}"
            quiet_since=$SECONDS
            case $tag in
                IGT-START)
                    if ((started == 0)); then note "boot $boot: first subtest after $((SECONDS - boot_t0)) s"; fi
                    cur=$i cur_t0=$SECONDS off0=$(size "$slog") started=$((started + 1)) ;;
                IGT-RESULT)
                    read -r rc s w <<<"$rest"
                    case $rc in
                        0) r=pass ;; 77) r=skip ;; 78) r=timeout ;; killed) r=hang ;; *) r=fail ;;
                    esac
                    verdict "$i" "$r" "$s"
                    hdr=
                    [[ $rc == killed ]] && hdr=" killed after the ${timeout} s bound"
                    [[ $w == wedged=1 ]] && hdr+=" i915 wedged after it"
                    if [[ $r != pass || -n $hdr ]]; then
                        [[ $rc =~ ^[0-9]+$ && $r == fail ]] && hdr=" exit $rc$hdr"
                        complaints "$i" "$con" "$slog" "$off0" "$(size "$slog")" "$hdr"
                    fi
                    cur='' next=$((i + 1)) ;;
                IGT-END) ended=1 ;;
                IGT-NOTE) note "boot $boot: guest: $i $rest" ;;
            esac
        done
        seen=${#m[@]}
        ((alive)) || break
        if [[ -n $cur ]]; then
            if ((SECONDS - cur_t0 > timeout + 60)); then
                note "boot $boot: subtest $cur silent for $((SECONDS - cur_t0)) s: killing QEMU"
                killed=1
            fi
        elif ((SECONDS - quiet_since > boot_timeout)); then
            note "boot $boot: guest silent outside a subtest for $boot_timeout s: killing QEMU"
            killed=1
        fi
        if ((killed)); then
            kill "$qemu_pid" 2>/dev/null || true
            sleep 2
            kill -9 "$qemu_pid" 2>/dev/null || true
        fi
        sleep 0.5
    done
    qrc=0
    wait "$qemu_pid" || qrc=$?
    qemu_pid=
    for _ in $(seq 100); do kill -0 "$serve_pid" 2>/dev/null || break; sleep 0.1; done
    kill "$serve_pid" 2>/dev/null || true
    src=0
    wait "$serve_pid" || src=$?
    serve_pid=
    if [[ -n $cur ]]; then   # started, never finished: the guest hung (or QEMU or the server died)
        verdict "$cur" hang "$((SECONDS - cur_t0))"
        why=" QEMU exit $qrc, gmig serve exit $src"
        ((killed)) && why=" guest stopped answering, killed by the host;$why"
        complaints "$cur" "$con" "$slog" "$off0" "$(size "$slog")" "$why"
        next=$((cur + 1))
    fi
    if ((started == 0)); then
        {
            echo "--- console of boot $boot:"; clean "$con" | tail -n 60
            echo "--- QEMU:"; tail -n 20 "$work/qemu-$boot.log"
            echo "--- gmig serve:"; sed 's/\x1b\[[0-9;]*m//g' "$slog" | grep -E '\b(WARN|ERROR)\b' | tail -n 20 || true
        } >&2
        die "boot $boot started no subtest (QEMU exit $qrc, gmig serve exit $src)"
    fi
    ((ended)) && break
done

note "summary: $n subtests, $boot boots: pass $counts_pass, fail $counts_fail," \
    "skip $counts_skip, timeout $counts_timeout, hang $counts_hang"
((counts_fail + counts_timeout + counts_hang == 0)) && exit 0
exit 1
}
