#!/usr/bin/env bash
# Builds the i915 fast-feedback test binaries of IGT GPU Tools (Intel's DRM test suite) from the
# shared source tarball, once, into a cache outside the clone, together with every shared library
# they load, laid out as a root-filesystem fragment for the busybox guest (which has no libc);
# later calls print the cached directory at once.
#
#   scripts/igt/build.sh               build if needed; the LAST stdout line is the absolute path
#                                      of the install directory (DIR below)
#   scripts/igt/build.sh --print-key   print the cache key only (installs and builds nothing)
#   scripts/igt/build.sh --check       exit 0 if the install for this key is cached, 1 if not
#
# DIR holds:
#   DIR/root/usr/libexec/igt-gpu-tools/<test>   the test binaries of the lines of
#                                               tests/intel-ci/i915.fast-feedback.testlist
#   DIR/root/usr/lib/x86_64-linux-gnu/libigt.so.0   IGT's own libraries (libigt, libi915_perf)
#   DIR/root/lib/x86_64-linux-gnu/<soname>      each system library they need (`ldd`'s closure,
#   DIR/root/usr/lib/x86_64-linux-gnu/<soname>  at the path ldd found it, copied from the target
#   DIR/root/lib64/ld-linux-x86-64.so.2         of any symlink), the dynamic loader, libgcc_s
#                                               (glibc dlopens it for thread cancellation)
#   DIR/files.txt             one line per file: `ROOT-RELATIVE-SOURCE ABSOLUTE-GUEST-PATH`, e.g.
#                             `root/usr/libexec/igt-gpu-tools/gem_basic /usr/libexec/igt-gpu-tools/gem_basic`
#                             (what scripts/igt/run.sh passes to scripts/qemu/guest.sh --add)
#   DIR/fast-feedback.testlist  the testlist's non-kms_* `igt@...` lines, in its order
#   DIR/kms.testlist            its kms_* lines (the display's), in its order
#   DIR/build.log, key.txt, build-seconds   the build's log, key inputs, first build's duration
# Run the tests with LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu (the guest
# has no ld.so.cache). Binaries and libraries keep their symbol tables (debug info is stripped),
# so IGT's backtraces name functions.
#
# Source: $GMIG_SHARED/igt/igt-gpu-tools-b3d809d53.tar.xz (GMIG_SHARED defaults to ../shared
# beside the repository; $GMIG_SHARED/igt/README.md is the recipe followed here). The snapshot
# lacks lib/i915/perf-configs/oa-acmgt{1,2,3}.xml (Arc A-series OA metrics), so 'acmgt1',
# 'acmgt2', 'acmgt3' are dropped from lib/meson.build's i915_perf_hardware list (not from
# xe_oa_hardware, whose files are present) and lib/i915/perf.c's DG2 branch reports an
# unsupported platform instead of loading them. Meson options: -Dtests=enabled
# -Dxe_driver=disabled -Dlibdrm_drivers=intel, runner/docs/man/overlay/testplan/chamelium/
# valgrind disabled; only the test binaries of the list (and libigt) are built.
# Never touches the network except Debian apt.
#
# Cache layout (CACHE = ${GMIG_CACHE:-$HOME/.cache/gmig}/igt):
#   CACHE/<key>/...                 DIR (appears by one atomic rename)
#   CACHE/<key>.log                 log of a failed or running attempt (moved into <key>/)
#   CACHE/.tmp-<key>-*/             a build in progress (removed on exit; stale ones are removed
#                                   by the next build of that key)
#   CACHE/.<key>.lock               flock(1): concurrent callers wait, one builds
# key = sha256 over: the tarball's sha256, a recipe string (meson options, edits, targets), and
# this script's sha256 (so any change here rebuilds).
#
# Environment:
#   GMIG_CACHE    cache root (default $HOME/.cache/gmig)
#   GMIG_SHARED   shared folder holding igt/ (default <repo>/../shared)
#   GMIG_JOBS     ninja -j (default: nproc)
#   GMIG_VERBOSE  1 = also stream the build log to stderr
# Installs missing Debian packages (bookworm: meson, ninja-build, libdrm-dev, libkmod-dev,
# libproc2-dev, libdw-dev, libunwind-dev, libcairo2-dev, libpciaccess-dev, libudev-dev, ...) with
# apt-get (as root, or through sudo), after one `apt-get update`.
set -euo pipefail

# stdout carries only the result; everything else goes to stderr.
exec 3>&1 1>&2

die() { echo "scripts/igt/build.sh: error: $*" >&2; exit 1; }
note() { echo "scripts/igt/build.sh: $*" >&2; }

mode=build
case "${1:-}" in
    "") ;;
    --print-key) mode=print-key ;;
    --check) mode=check ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (expected --print-key, --check or nothing)" ;;
esac
[[ $# -le 1 ]] || die "too many arguments"

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
self=$script_dir/$(basename "${BASH_SOURCE[0]}")
repo=$(git -C "$script_dir" rev-parse --show-toplevel 2>/dev/null) || repo=$(cd "$script_dir/../.." && pwd)
shared=${GMIG_SHARED:-$repo/../shared}
tarball=$shared/igt/igt-gpu-tools-b3d809d53.tar.xz
src_top=igt-gpu-tools
cache_root=${GMIG_CACHE:-$HOME/.cache/gmig}
cache=$cache_root/igt
testlist_rel=tests/intel-ci/i915.fast-feedback.testlist
libexec=/usr/libexec/igt-gpu-tools

[[ -f $tarball ]] || die "IGT source tarball not found: $tarball (set GMIG_SHARED to the folder holding igt/)"

meson_opts=(
    --prefix=/usr --buildtype=debugoptimized
    -Dtests=enabled -Dxe_driver=disabled -Dlibdrm_drivers=intel
    -Drunner=disabled -Ddocs=disabled -Dman=disabled -Doverlay=disabled -Dtestplan=disabled
    -Dchamelium=disabled -Dvalgrind=disabled
)
# Part of the key: bump when the recipe changes in a way the options do not show.
recipe="v2 debian-meson edits=no-acmgt-i915-perf targets=ff+kms+libigt opts=${meson_opts[*]}"

tar_sha=$(sha256sum "$tarball" | cut -d' ' -f1)
key_material="tarball $tar_sha"$'\n'"recipe $recipe"$'\n'"script $(sha256sum "$self" | cut -d' ' -f1)"$'\n'
key=$(printf '%s' "$key_material" | sha256sum | cut -d' ' -f1)

final=$cache/$key

case $mode in
    print-key) echo "$key" >&3; exit 0 ;;
    check) [[ -f $final/files.txt ]] && exit 0 || exit 1 ;;
esac

# ---- Debian packages -------------------------------------------------------------------------
build_pkgs=(meson ninja-build pkg-config flex bison gcc libc6-dev xz-utils python3
            libdrm-dev libkmod-dev libproc2-dev libdw-dev libunwind-dev libcairo2-dev
            libpixman-1-dev libpciaccess-dev libudev-dev libglib2.0-dev binutils)

apt_updated=0
ensure_pkgs() {
    local missing=() p status
    for p in "$@"; do
        status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)
        [[ $status == ii* ]] || missing+=("$p")
    done
    ((${#missing[@]} == 0)) && return 0
    local sudo=()
    if [[ $(id -u) != 0 ]]; then
        command -v sudo >/dev/null || die "need root (or sudo) to install: ${missing[*]}"
        sudo=(sudo)
    fi
    note "installing Debian packages: ${missing[*]}"
    if ((apt_updated == 0)); then
        "${sudo[@]}" apt-get update -qq || die "apt-get update failed"
        apt_updated=1
    fi
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" || die "apt-get install failed: ${missing[*]}"
}

# ---- fast path: cached ------------------------------------------------------------------------
finish() {
    [[ -f $final/build-seconds ]] && note "cached (first build took $(cat "$final/build-seconds") s): $final"
    echo "$final" >&3
    exit 0
}
[[ -f $final/files.txt ]] && finish

# ---- build ------------------------------------------------------------------------------------
mkdir -p "$cache"
exec 9>"$cache/.$key.lock"
if ! flock -n 9; then
    note "another build of $key is running; waiting for its lock ($cache/.$key.lock)"
    flock 9
fi
[[ -f $final/files.txt ]] && finish   # built by the caller that held the lock

log=$cache/$key.log
: >"$log"
rm -rf "$cache/.tmp-$key-"*   # left by a killed build (we hold the lock)
tmp=$(mktemp -d "$cache/.tmp-$key-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS

fail() {
    echo "----- last lines of $log -----" >&2
    tail -n 40 "$log" >&2 || true
    echo "-----" >&2
    die "$* (full log: $log)"
}
# run DESCRIPTION CMD... : runs CMD with its output in the log (and on stderr if GMIG_VERBOSE=1)
run() {
    local what=$1; shift
    note "$what"
    echo "=== $what: $*" >>"$log"
    if [[ ${GMIG_VERBOSE:-0} == 1 ]]; then
        "$@" 2>&1 | tee -a "$log" >&2 || fail "$what failed"
    else
        "$@" >>"$log" 2>&1 || fail "$what failed"
    fi
}

ensure_pkgs "${build_pkgs[@]}"

run "extracting $(basename "$tarball")" tar -xJf "$tarball" -C "$tmp"
src=$tmp/$src_top
[[ -d $src ]] || fail "tarball has no $src_top/ directory"

# ---- the missing oa-acmgt{1,2,3}.xml (README) -------------------------------------------------
# lib/meson.build: drop the line from i915_perf_hardware only (the first list naming them).
grep -c "^  'acmgt1', 'acmgt2', 'acmgt3',\$" "$src/lib/meson.build" | grep -qx 2 ||
    fail "lib/meson.build: expected the acmgt line twice (has the source changed?)"
sed -i "/^i915_perf_hardware = \[/,/^\]/{/^  'acmgt1', 'acmgt2', 'acmgt3',\$/d}" "$src/lib/meson.build"
grep -c "^  'acmgt1', 'acmgt2', 'acmgt3',\$" "$src/lib/meson.build" | grep -qx 1 ||
    fail "lib/meson.build: the acmgt line was not dropped from i915_perf_hardware only"
sed -n '/^xe_oa_hardware = \[/,/^\]/p' "$src/lib/meson.build" | grep -q acmgt1 ||
    fail "lib/meson.build: xe_oa_hardware lost acmgt"
echo "=== edited lib/meson.build: acmgt dropped from i915_perf_hardware" >>"$log"
# lib/i915/perf.c: no acmgt headers; the DG2 branch reports an unsupported platform.
perf_c=$src/lib/i915/perf.c
grep -q $'^\t\tif (is_acm_gt1(&perf->devinfo))$' "$perf_c" || fail "lib/i915/perf.c: no DG2 acmgt branch (has the source changed?)"
sed -i -e '/^#include "i915_perf_metrics_acmgt[123]\.h"$/d' \
    -e '/^\t\tif (is_acm_gt1(&perf->devinfo))$/,/^\t\t\treturn unsupported_i915_perf_platform(perf);$/c\
\t\t/* gmig: this snapshot lacks the OA configs of DG2 (see scripts/igt/build.sh) */\
\t\treturn unsupported_i915_perf_platform(perf);' "$perf_c"
! grep -n acmgt "$perf_c" >>"$log" || fail "lib/i915/perf.c still names acmgt"
echo "=== edited lib/i915/perf.c: DG2 reports an unsupported platform" >>"$log"

# ---- which binaries ---------------------------------------------------------------------------
[[ -f $src/$testlist_rel ]] || fail "no $testlist_rel"
grep '^igt@' "$src/$testlist_rel" | grep -v '^igt@kms_' >"$tmp/fast-feedback.testlist"
grep '^igt@kms_' "$src/$testlist_rel" >"$tmp/kms.testlist" || true
mapfile -t progs < <(cat "$tmp/fast-feedback.testlist" "$tmp/kms.testlist" | cut -d@ -f2 | sort -u)
((${#progs[@]} > 0)) || fail "no tests in $testlist_rel"
note "${#progs[@]} test binaries, $(cat "$tmp/fast-feedback.testlist" "$tmp/kms.testlist" | wc -l) testlist lines"
targets=()
for p in "${progs[@]}"; do targets+=("tests/$p"); done

run "meson setup" meson setup "${meson_opts[@]}" "$tmp/build" "$src"
run "ninja: ${#targets[@]} test binaries and libigt (a few minutes)" \
    ninja -C "$tmp/build" -j "${GMIG_JOBS:-$(nproc)}" lib/libigt.so.0 "${targets[@]}"

# ---- the root-filesystem fragment ---------------------------------------------------------------
stage=$tmp/out
root=$stage/root
mkdir -p "$root$libexec" "$root/usr/lib/x86_64-linux-gnu"
: >"$stage/files.txt"
declare -A placed=()
# place SRC GUEST-PATH: copies SRC (through symlinks) to root/GUEST-PATH, debug info stripped
place() {
    local src=$1 dest=$2
    [[ -z ${placed[$dest]:-} ]] || return 0
    placed[$dest]=1
    mkdir -p "$(dirname "$root$dest")"
    cp -L "$src" "$root$dest"
    chmod u+w "$root$dest"
    strip --strip-debug "$root$dest" 2>>"$log" || true
    echo "root$dest $dest" >>"$stage/files.txt"
}
for p in "${progs[@]}"; do
    [[ -x $tmp/build/tests/$p ]] || fail "tests/$p was not built"
    place "$tmp/build/tests/$p" "$libexec/$p"
done
# ldd's closure, from the build tree (the build rpath finds IGT's own libraries there: libigt,
# libi915_perf, ...; they go to /usr/lib/x86_64-linux-gnu under their sonames).
ldd_out=$tmp/ldd.txt
for p in "${progs[@]}"; do ldd "$tmp/build/tests/$p"; done >"$ldd_out" 2>&1 ||
    fail "ldd failed: $(tail -3 "$ldd_out")"
! grep 'not found' "$ldd_out" || fail "a library is not found (above)"
mapfile -t libs < <(awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 } $1 ~ /^\// { print $1, $1 }' "$ldd_out" |
    sort -u)
gcc_s=$(gcc -print-file-name=libgcc_s.so.1)
[[ -f $gcc_s ]] && libs+=("libgcc_s.so.1 $(readlink -f "$gcc_s")")
for l in "${libs[@]}"; do
    soname=${l%% *} path=${l#* }
    case $path in
        "$tmp"/*) place "$path" "/usr/lib/x86_64-linux-gnu/$soname" ;;
        */libgcc_s.so.1) place "$path" /lib/x86_64-linux-gnu/libgcc_s.so.1 ;;
        *) place "$path" "$path" ;;
    esac
done
[[ -n ${placed[/usr/lib/x86_64-linux-gnu/libigt.so.0]:-} ]] || fail "ldd named no libigt.so.0"
[[ -n ${placed[/lib64/ld-linux-x86-64.so.2]:-} ]] || fail "ldd named no /lib64/ld-linux-x86-64.so.2"
# Check: every placed file's needs are placed (by soname).
declare -A have=()
for d in "${!placed[@]}"; do have[$(basename "$d")]=1; done
while read -r _ dest; do
    while read -r need; do
        [[ -n ${have[$need]:-} ]] || fail "$dest needs $need, which is not placed"
    done < <(objdump -p "$root$dest" 2>/dev/null | awk '$1 == "NEEDED" { print $2 }')
done <"$stage/files.txt"
cp "$tmp/fast-feedback.testlist" "$tmp/kms.testlist" "$stage/"
printf '%s' "$key_material" >"$stage/key.txt"
echo "=== $(wc -l <"$stage/files.txt") files, $(du -sh "$root" | cut -f1)" >>"$log"
echo "$((SECONDS - start))" >"$stage/build-seconds"
mv "$log" "$stage/build.log"
mv -T "$stage" "$final" || fail "could not move $stage to $final"
note "built in $((SECONDS - start)) s ($(wc -l <"$final/files.txt") files, $(du -sh "$final/root" | cut -f1)): $final"
echo "$final" >&3
