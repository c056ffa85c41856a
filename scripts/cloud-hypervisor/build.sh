#!/usr/bin/env bash
# Builds cloud-hypervisor and ch-remote (upstream ae44c297, release, default features: kvm,
# io_uring; live migration needs no feature) from the shared source tarballs, once, into a cache
# outside the clone; later calls print the cached binaries at once.
#
#   scripts/cloud-hypervisor/build.sh               build if needed; the LAST stdout line is the
#                                                   absolute path of the folder holding
#                                                   cloud-hypervisor and ch-remote
#   scripts/cloud-hypervisor/build.sh --print-key   print the cache key only (builds nothing)
#   scripts/cloud-hypervisor/build.sh --check       exit 0 if the binaries for this key are
#                                                   cached, 1 if not
#
# Source: $GMIG_SHARED/cloud-hypervisor/cloud-hypervisor-ae44c297.tar.xz and
# micro-http-7975fe0e.tar.xz (GMIG_SHARED defaults to ../shared beside the repository; see its
# README.md). micro_http, the one git dependency, comes from the shared copy: vmm/Cargo.toml's git
# dependency is rewritten to a path dependency (the build never reaches GitHub; crates.io is
# reached through cargo). After extracting, every integrations/cloud-hypervisor/patches/*.patch
# is applied in sorted name order with `patch -p1`. A folder `patches/<crate>-<version>/` holds
# patches to a crates.io dependency: the build fetches the dependencies (`cargo fetch`), checks the
# crate's .crate file against Cargo.lock's checksum, extracts it beside the tree, applies the
# folder's *.patch in name order and points the workspace at it (`[patch.crates-io]`).
#
# Profile: upstream's release profile (opt-level "s", strip) without its fat LTO and single
# codegen unit (CARGO_PROFILE_RELEASE_LTO=false, CODEGEN_UNITS=16): those make the final link a
# long serial step on a small machine and change nothing the tests look at.
#
# Cache layout (CACHE = ${GMIG_CACHE:-$HOME/.cache/gmig}/cloud-hypervisor):
#   CACHE/<key>/bin/{cloud-hypervisor,ch-remote}  the binaries (the directory appears by one
#                                                 atomic rename)
#   CACHE/<key>/build.log, key.txt                the build's log and the key's inputs
#   CACHE/<key>.log                               log of a failed or running attempt
#   CACHE/src/                                    the extracted, patched source of the last build
#   CACHE/target/                                 cargo's target folder, shared by every key (a
#                                                 new key rebuilds cloud-hypervisor's own crates,
#                                                 not its crates.io dependencies)
#   CACHE/.build.lock                             flock(1) lock: concurrent callers wait, one builds
# key = sha256 over: both tarballs' sha256, a recipe string (cargo command, profile overrides),
# and each patch's path under patches/ and sha256, in sorted order.
#
# Environment:
#   GMIG_CACHE    cache root (default $HOME/.cache/gmig)
#   GMIG_SHARED   shared folder holding cloud-hypervisor/ (default <repo>/../shared)
#   GMIG_JOBS     cargo -j (default: nproc)
#   GMIG_VERBOSE  1 = also stream the build log to stderr
# Installs missing Debian packages with apt-get (as root, or through sudo). Heavy: run it under
# `nice` on a shared machine.
set -euo pipefail

# stdout carries only the result; everything else goes to stderr.
exec 3>&1 1>&2

die() { echo "scripts/cloud-hypervisor/build.sh: error: $*" >&2; exit 1; }
note() { echo "scripts/cloud-hypervisor/build.sh: $*" >&2; }

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
ch_tarball=$shared/cloud-hypervisor/cloud-hypervisor-ae44c297.tar.xz
mh_tarball=$shared/cloud-hypervisor/micro-http-7975fe0e.tar.xz
patch_dir=$repo/integrations/cloud-hypervisor/patches
cache_root=${GMIG_CACHE:-$HOME/.cache/gmig}
cache=$cache_root/cloud-hypervisor

for t in "$ch_tarball" "$mh_tarball"; do
    [[ -f $t ]] || die "source tarball not found: $t (set GMIG_SHARED to the folder holding cloud-hypervisor/)"
done

cargo_args=(build --release -p cloud-hypervisor --bin cloud-hypervisor --bin ch-remote)
profile_env=(CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16)
# Part of the key: bump when the recipe changes in a way the strings do not show.
recipe="v2 micro_http=path crate-patches=fetch+patch.crates-io cargo=${cargo_args[*]} env=${profile_env[*]}"

patches=()       # to the tree
crate_dirs=()    # patches/<crate>-<version>/: patches to a crates.io dependency
if [[ -d $patch_dir ]]; then
    while IFS= read -r -d '' p; do patches+=("$p"); done \
        < <(find "$patch_dir" -maxdepth 1 -type f -name '*.patch' -print0 | LC_ALL=C sort -z)
    while IFS= read -r -d '' p; do crate_dirs+=("$p"); done \
        < <(find "$patch_dir" -mindepth 1 -maxdepth 1 -type d -print0 | LC_ALL=C sort -z)
fi
crate_patches() { find "$1" -maxdepth 1 -type f -name '*.patch' -print0 | LC_ALL=C sort -z; }

key_material="tarball $(basename "$ch_tarball") $(sha256sum "$ch_tarball" | cut -d' ' -f1)"$'\n'
key_material+="tarball $(basename "$mh_tarball") $(sha256sum "$mh_tarball" | cut -d' ' -f1)"$'\n'
key_material+="recipe $recipe"$'\n'
for p in ${patches[@]+"${patches[@]}"}; do
    key_material+="patch $(basename "$p") $(sha256sum "$p" | cut -d' ' -f1)"$'\n'
done
for d in ${crate_dirs[@]+"${crate_dirs[@]}"}; do
    while IFS= read -r -d '' p; do
        key_material+="patch $(basename "$d")/$(basename "$p") $(sha256sum "$p" | cut -d' ' -f1)"$'\n'
    done < <(crate_patches "$d")
done
key=$(printf '%s' "$key_material" | sha256sum | cut -d' ' -f1)

final=$cache/$key
bindir=$final/bin

case $mode in
    print-key) echo "$key" >&3; exit 0 ;;
    check) [[ -x $bindir/cloud-hypervisor && -x $bindir/ch-remote ]] && exit 0 || exit 1 ;;
esac

finish() {
    echo "$bindir" >&3
    exit 0
}
[[ -x $bindir/cloud-hypervisor && -x $bindir/ch-remote ]] && finish

# ---- Debian packages (the same way as scripts/qemu/build.sh) -----------------------------------
build_pkgs=(gcc libc6-dev pkg-config xz-utils)
((${#patches[@]} == 0)) || build_pkgs+=(patch)

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
    "${sudo[@]}" apt-get update -qq || die "apt-get update failed"
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" || die "apt-get install failed: ${missing[*]}"
}

# ---- build ------------------------------------------------------------------------------------
mkdir -p "$cache"
exec 9>"$cache/.build.lock"
if ! flock -n 9; then
    note "another build is running; waiting for its lock ($cache/.build.lock)"
    flock 9
fi
[[ -x $bindir/cloud-hypervisor && -x $bindir/ch-remote ]] && finish   # built by the lock's holder

log=$cache/$key.log
: >"$log"
rm -rf "$cache/.tmp-"*   # left by a killed build (we hold the lock)
stage=$(mktemp -d "$cache/.tmp-$key-XXXXXX")
trap 'rm -rf "$stage"' EXIT
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
command -v cargo >/dev/null || die "cargo not found (cloud-hypervisor needs Rust 1.89 or later)"

# A fixed source path, so cargo's fingerprints of the dependencies stay valid between keys.
src_root=$cache/src
rm -rf "$src_root"
mkdir -p "$src_root"
run "extracting $(basename "$ch_tarball")" tar -xJf "$ch_tarball" -C "$src_root"
run "extracting $(basename "$mh_tarball")" tar -xJf "$mh_tarball" -C "$src_root"
src=$src_root/cloud-hypervisor
[[ -f $src/Cargo.toml && -f $src_root/micro-http/Cargo.toml ]] \
    || fail "the tarballs lack cloud-hypervisor/ or micro-http/"

# micro_http from the shared copy (vmm is the only workspace member that names it).
git_dep='micro_http = { git = "https://github.com/firecracker-microvm/micro-http", branch = "main" }'
grep -qF -- "$git_dep" "$src/vmm/Cargo.toml" || fail "vmm/Cargo.toml: micro_http's git dependency not found (has the source changed?)"
sed -i "s|^micro_http = { git = .*|micro_http = { path = \"../../micro-http\" }|" "$src/vmm/Cargo.toml"
echo "=== vmm/Cargo.toml: micro_http from ../../micro-http" >>"$log"

for p in ${patches[@]+"${patches[@]}"}; do
    run "applying $(basename "$p")" patch -p1 -d "$src" --forward --batch -i "$p"
done

# Patched crates.io dependencies (patches/<crate>-<version>/), from cargo's own download.
if ((${#crate_dirs[@]} > 0)); then
    (cd "$src" && run "cargo fetch" cargo fetch)
    registry=${CARGO_HOME:-$HOME/.cargo}/registry/cache
    printf '\n[patch.crates-io]\n' >>"$src/Cargo.toml"
    for d in "${crate_dirs[@]}"; do
        base=$(basename "$d")
        crate=${base%-*} version=${base##*-}
        file=$(find "$registry" -name "$base.crate" -print -quit)
        [[ -n $file ]] || fail "cargo fetch left no $base.crate under $registry"
        want=$(awk -v n="$crate" -v v="$version" '
            $0 == "name = \"" n "\"" { hit = 1; next }
            hit && $0 == "version = \"" v "\"" { ok = 1; next }
            hit && ok && /^checksum = / { gsub(/"/, "", $3); print $3; exit }
            /^$/ { hit = 0; ok = 0 }' "$src/Cargo.lock")
        [[ -n $want ]] || fail "Cargo.lock has no checksum for $crate $version (has the source changed?)"
        [[ $(sha256sum "$file" | cut -d' ' -f1) == "$want" ]] \
            || fail "$file does not match Cargo.lock's checksum $want"
        run "extracting $base.crate" tar -xzf "$file" -C "$src_root"
        while IFS= read -r -d '' p; do
            run "applying $base/$(basename "$p")" patch -p1 -d "$src_root/$base" --forward --batch -i "$p"
        done < <(crate_patches "$d")
        printf '%s = { path = "../%s" }\n' "$crate" "$base" >>"$src/Cargo.toml"
        echo "=== Cargo.toml: [patch.crates-io] $crate from ../$base" >>"$log"
    done
fi

(
    cd "$src"
    run "cargo ${cargo_args[*]} (this takes many minutes)" \
        env "${profile_env[@]}" CARGO_TARGET_DIR="$cache/target" \
        cargo "${cargo_args[@]}" -j "${GMIG_JOBS:-$(nproc)}"
)

mkdir -p "$stage/out/bin"
for b in cloud-hypervisor ch-remote; do
    cp "$cache/target/release/$b" "$stage/out/bin/" || fail "cargo made no $b"
done
"$stage/out/bin/cloud-hypervisor" --version >>"$log" 2>&1 || fail "the built cloud-hypervisor does not run"
printf '%s' "$key_material" >"$stage/out/key.txt"
mv "$log" "$stage/out/build.log"
rm -rf "$final"
mv -T "$stage/out" "$final" || fail "could not move $stage/out to $final"
note "built in $((SECONDS - start)) s: $bindir"
finish
