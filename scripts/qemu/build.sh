#!/usr/bin/env bash
# Builds qemu-system-x86_64 (QEMU 10.2.2, vfio-user client included) from the shared source
# tarball, once, into a cache outside the clone; later calls print the cached binary at once.
#
#   scripts/qemu/build.sh               build if needed; the LAST (and only) stdout line is the
#                                       absolute path of qemu-system-x86_64
#   scripts/qemu/build.sh --print-key   print the cache key only (installs and builds nothing)
#   scripts/qemu/build.sh --check       exit 0 if the binary for this key is cached, 1 if not
#
# The binary uses the distribution's firmware (BIOS, VGA BIOS, option ROMs such as
# linuxboot_dma.bin, NIC ROMs), which this script installs (Debian packages seabios,
# qemu-system-data, ipxe-qemu) and builds in as the firmware path; `-L /usr/share/seabios
# -L /usr/share/qemu` may still be given and changes nothing:
#
#   "$(scripts/qemu/build.sh)" -machine q35,accel=tcg ... -nodefaults -serial mon:stdio ...
#
# For test VMs pass `-nodefaults -serial mon:stdio` (with -nographic): q35's default empty
# CD-ROM costs SeaBIOS a 30 s AHCI timeout under TCG (a guest boots in ~3 s instead of ~35 s).
#
# Source: $GMIG_SHARED/qemu/qemu_10.2.2+ds.orig.tar.xz (GMIG_SHARED defaults to ../shared beside
# the repository; see $GMIG_SHARED/qemu/README.md for the recipe this script follows). After
# extracting, every integrations/qemu/patches/*.patch is applied in sorted name order with
# `patch -p1`. Never touches the network except Debian apt and PyPI (meson, pycotap).
#
# Cache layout (CACHE = ${GMIG_CACHE:-$HOME/.cache/gmig}/qemu):
#   CACHE/<key>/bin/qemu-system-x86_64   the binary (the directory appears by one atomic rename)
#   CACHE/<key>/build.log, key.txt       the build's log and the inputs the key was made from
#   CACHE/<key>.log                      log of a failed or running attempt (moved into <key>/)
#   CACHE/venv/                          Python venv with meson==1.9.0 and pycotap==1.3.1
#   CACHE/.tmp-<key>-*/                  a build in progress (removed on exit; stale ones are
#                                        removed by the next build of that key)
#   CACHE/.<key>.lock, .venv.lock        flock(1) locks: concurrent callers wait, one builds
# key = sha256 over: the tarball's sha256, a recipe string (configure flags and the meson edits
# below, so changing the recipe rebuilds), and each patch's file name and sha256, in sorted order.
#
# Environment:
#   GMIG_CACHE    cache root (default $HOME/.cache/gmig)
#   GMIG_SHARED   shared folder holding qemu/ (default <repo>/../shared)
#   GMIG_PYTHON   Python used for the meson venv (default /usr/bin/python3, else python3)
#   GMIG_JOBS     ninja -j (default: nproc)
#   GMIG_VERBOSE  1 = also stream the build log to stderr
# Installs missing Debian packages with apt-get (as root, or through sudo). Heavy: about 8 min
# on 2 cores; run it under `nice` on a shared machine.
set -euo pipefail

# stdout carries only the result; everything else goes to stderr.
exec 3>&1 1>&2

die() { echo "scripts/qemu/build.sh: error: $*" >&2; exit 1; }
note() { echo "scripts/qemu/build.sh: $*" >&2; }

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
repo=$(git -C "$script_dir" rev-parse --show-toplevel 2>/dev/null) || repo=$(cd "$script_dir/../.." && pwd)
shared=${GMIG_SHARED:-$repo/../shared}
tarball=$shared/qemu/qemu_10.2.2+ds.orig.tar.xz
src_top=qemu-10.2.2
patch_dir=$repo/integrations/qemu/patches
cache_root=${GMIG_CACHE:-$HOME/.cache/gmig}
cache=$cache_root/qemu

[[ -f $tarball ]] || die "QEMU source tarball not found: $tarball (set GMIG_SHARED to the folder holding qemu/)"

configure_flags=(
    --target-list=x86_64-softmmu --enable-kvm --disable-docs --disable-werror
    --disable-gtk --disable-sdl --enable-vnc --disable-opengl --disable-virglrenderer
    --disable-spice --disable-curses --disable-tools --disable-guest-agent --disable-download
    --disable-install-blobs
    # Where Debian's packages put firmware (seabios; qemu-system-data; ipxe-qemu's NIC ROMs such
    # as efi-e1000e.rom, which q35's default NIC needs): the binary finds them without -L.
    --firmwarepath=/usr/share/qemu:/usr/share/seabios:/usr/lib/ipxe/qemu
)
# Part of the key: bump when the recipe changes in a way the flags do not show.
recipe="v1 meson=1.9.0 pycotap=1.3.1 edk2-blobs=false no-dtb flags=${configure_flags[*]}"

patches=()
if [[ -d $patch_dir ]]; then
    while IFS= read -r -d '' p; do patches+=("$p"); done \
        < <(find "$patch_dir" -maxdepth 1 -type f -name '*.patch' -print0 | LC_ALL=C sort -z)
fi

tar_sha=$(sha256sum "$tarball" | cut -d' ' -f1)
key_material="tarball $tar_sha"$'\n'"recipe $recipe"$'\n'
for p in ${patches[@]+"${patches[@]}"}; do
    key_material+="patch $(basename "$p") $(sha256sum "$p" | cut -d' ' -f1)"$'\n'
done
key=$(printf '%s' "$key_material" | sha256sum | cut -d' ' -f1)

final=$cache/$key
binary=$final/bin/qemu-system-x86_64

case $mode in
    print-key) echo "$key" >&3; exit 0 ;;
    check) [[ -x $binary ]] && exit 0 || exit 1 ;;
esac

# ---- Debian packages -------------------------------------------------------------------------
build_pkgs=(ninja-build libglib2.0-dev libpixman-1-dev libfdt-dev flex bison python3-venv
            pkg-config gcc libc6-dev xz-utils)
run_pkgs=(seabios qemu-system-data ipxe-qemu)
((${#patches[@]} == 0)) || build_pkgs+=(patch)

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

firmware_note() {
    note "firmware: built-in path /usr/share/qemu:/usr/share/seabios:/usr/lib/ipxe/qemu" \
        "(-L /usr/share/seabios -L /usr/share/qemu also works)"
}

# ---- fast path: cached ------------------------------------------------------------------------
finish() {
    ensure_pkgs "${run_pkgs[@]}"
    # The binary links the system's glib, pixman and libfdt: on a machine where only the cache
    # was restored, the build dependencies bring them back.
    if ldd "$binary" 2>/dev/null | grep -q 'not found'; then
        ensure_pkgs "${build_pkgs[@]}"
        ! ldd "$binary" | grep 'not found' || die "$binary: shared libraries missing (see above)"
    fi
    firmware_note
    echo "$binary" >&3
    exit 0
}
[[ -x $binary ]] && finish

# ---- build ------------------------------------------------------------------------------------
mkdir -p "$cache"
exec 9>"$cache/.$key.lock"
if ! flock -n 9; then
    note "another build of $key is running; waiting for its lock ($cache/.$key.lock)"
    flock 9
fi
[[ -x $binary ]] && finish   # built by the caller that held the lock

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

ensure_pkgs "${build_pkgs[@]}" "${run_pkgs[@]}"

# meson + pycotap in a venv of our own (shared by all keys; QEMU's configure nests its venv
# inside it). Built under its own lock and renamed into place, like the binary.
venv=$cache/venv
if [[ ! -f $venv/.complete ]]; then
    exec 8>"$cache/.venv.lock"
    flock 8
    if [[ ! -f $venv/.complete ]]; then
        python=${GMIG_PYTHON:-}
        if [[ -z $python ]]; then
            if [[ -x /usr/bin/python3 ]]; then python=/usr/bin/python3; else python=$(command -v python3) || die "python3 not found"; fi
        fi
        # A venv's scripts name its own path, so it is made in place; .complete marks it done.
        rm -rf "$venv"
        run "creating the meson venv ($python)" "$python" -m venv "$venv"
        run "pip install meson==1.9.0 pycotap==1.3.1" \
            "$venv/bin/python" -m pip install -q --disable-pip-version-check meson==1.9.0 pycotap==1.3.1
        touch "$venv/.complete"
    fi
    exec 8>&-
fi

run "extracting $(basename "$tarball")" tar -xJf "$tarball" -C "$tmp"
src=$tmp/$src_top
[[ -d $src ]] || fail "tarball has no $src_top/ directory"

for p in ${patches[@]+"${patches[@]}"}; do
    run "applying $(basename "$p")" patch -p1 -d "$src" --forward --batch -i "$p"
done

# The +ds tarball lacks the blobs two meson files name (README step 3).
edit() {  # edit FILE SED-ADDRESS-REGEX SED-SCRIPT : fails unless REGEX matched before and not after
    local file=$1 regex=$2 script=$3
    grep -q -- "$regex" "$src/$file" || fail "meson edit: '$regex' not found in $file (has the source changed?)"
    sed -i -e "$script" "$src/$file"
    ! grep -q -- "$regex" "$src/$file" || fail "meson edit: '$regex' still in $file after sed"
    echo "=== edited $file: $script" >>"$log"
}
edit meson.build '^ *unpack_edk2_blobs = bzip2\.found()$' \
    's/^\( *unpack_edk2_blobs = \)bzip2\.found()$/\1false/'
edit pc-bios/meson.build "^subdir('dtb')\$" "/^subdir('dtb')\$/d"

mkdir -p "$tmp/build"
(
    cd "$tmp/build"
    run "configure" "$src/configure" --python="$venv/bin/python3" "${configure_flags[@]}"
    run "ninja qemu-system-x86_64 (this takes minutes)" \
        ninja -j "${GMIG_JOBS:-$(nproc)}" qemu-system-x86_64
)

stage=$tmp/out
mkdir -p "$stage/bin"
cp "$tmp/build/qemu-system-x86_64" "$stage/bin/"
"$stage/bin/qemu-system-x86_64" --version >>"$log" 2>&1 || fail "the built binary does not run"
printf '%s' "$key_material" >"$stage/key.txt"
mv "$log" "$stage/build.log"
mv -T "$stage" "$final" || fail "could not move $stage to $final"
note "built in $((SECONDS - start)) s: $binary"
finish
