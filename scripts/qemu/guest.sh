#!/usr/bin/env bash
# Prepares a small Linux guest for QEMU: Debian's cloud kernel and a busybox initramfs whose /init
# reports the guest's PCI devices or runs one command, then powers the VM off (so QEMU exits).
#
#   scripts/qemu/guest.sh [--add SRC:DEST]... [--modules MOD[,MOD]...]... [--out DIR]
#   scripts/qemu/guest.sh --print-key [--add SRC:DEST]... [--modules MOD[,MOD]...]...
#
#   --add SRC:DEST  put host file SRC into the initramfs at DEST (absolute, no whitespace), e.g.
#                   --add target/x86_64-unknown-linux-musl/release/gmig-guest:/bin/gmig-guest
#                   (a static binary: the initramfs has no libc). Mode 0755 if SRC is executable,
#                   else 0644. Later --add entries, and any --add, win over busybox's files.
#   --modules MODS  boot the Debian kernel that has its drivers as modules (the image package
#                   linux-image-amd64 depends on, e.g. linux-image-6.1.0-56-amd64; the cloud
#                   kernel has no GPU drivers) and put each module named (comma separated, e.g.
#                   i915) and every module it depends on into the initramfs under
#                   /lib/modules/<release>/, with a modules.dep for them, so that
#                   `modprobe i915 enable_guc=0` (busybox) loads the lot in dependency order.
#                   Dependencies come from busybox depmod over the whole package (the modules'
#                   own `depends=`). No firmware is added.
#   --out DIR       write initrd.img (and init, for reading) into DIR, rebuilt on every call,
#                   instead of into the keyed cache directory
#   --print-key     print the guest key only (downloads the packages if not cached yet)
#
# The last two stdout lines (and the only ones) are KERNEL=<path> and INITRD=<path>. Boot with
#   "$(scripts/qemu/build.sh)" -L /usr/share/seabios -L /usr/share/qemu \
#     -machine q35,accel=tcg,memory-backend=mem -cpu max -m 1G \
#     -object memory-backend-memfd,id=mem,size=1G,share=on -nographic -nodefaults \
#     -serial mon:stdio -no-reboot -kernel "$KERNEL" -initrd "$INITRD" \
#     -append "console=ttyS0 panic=-1 quiet no_timer_check [gmig.run=...]"
# (TCG: the host's /dev/kvm cannot run this kernel). `-nodefaults -serial mon:stdio` drops q35's
# default VGA, NIC and empty CD-ROM; the CD-ROM alone costs SeaBIOS a 30 s AHCI timeout, so
# `GMIG-GUEST: up` comes ~3 s after start with it and ~35 s without.
#
# What /init does (console lines, all on the serial console):
#   mounts proc, sysfs, devtmpfs on /dev, debugfs on /sys/kernel/debug; prints `GMIG-GUEST: up`;
#   prints one line per PCI device:
#     GMIG-PCI: <addr> <vendor> <device> <class> bar0=<size> bar2=<size>
#   (e.g. `GMIG-PCI: 0000:00:02.0 0x8086 0x3e92 0x030000 bar0=0x1000000 bar2=0x10000000`; sizes
#   in hex from sysfs `resource`, 0x0 for an unused BAR); then, if the kernel command line has
#   gmig.run=PROG,ARG1,ARG2 (commas separate argv; no spaces or commas inside an argument; use
#   `gmig.run=/bin/env,RUST_LOG=debug,/bin/gmig-guest,...` for environment), runs it and prints
#   `GMIG-GUEST: exit <status>`;
#   then powers off (poweroff -f; else sysrq o; else init exits and panic=-1 + -no-reboot end it).
#
# Cache layout (CACHE = ${GMIG_CACHE:-$HOME/.cache/gmig}/guest):
#   CACHE/kernel/<kernel .deb name>/vmlinuz, config   kernel from the .deb, per package version
#   CACHE/kernel/<kernel .deb name>/modules/<release>/ its modules (only with --modules)
#   CACHE/busybox/<busybox .deb name>/busybox         static busybox, per package version
#   CACHE/<key>/vmlinuz (hard link), initrd.img, init, key.txt   one prepared guest
#   CACHE/.lock                                        flock(1): one preparer at a time
#   CACHE/.resolved-<image package>                    package names, until apt's lists change
# key = sha256 over the kernel and busybox .deb file names, this script's content, each --add
# (DEST, mode, sha256 of SRC) and the modules put in (names, sorted). Every directory appears by
# an atomic rename; temp dirs are CACHE/.tmp-*.
#
# The kernel is the image package linux-image-cloud-amd64 depends on (e.g.
# linux-image-6.1.0-56-cloud-amd64), fetched with `apt-get download` (no install); its config is
# checked for PCI, sysfs, devtmpfs, initrd+gzip and the 8250 serial console. No modules are used,
# unless --modules is given: then the kernel is the one linux-image-amd64 depends on, its whole
# module tree is kept in the cache beside vmlinuz (CACHE/kernel/<deb>/modules/<release>/, ~400 MB,
# with a modules.dep made by busybox depmod) and only the modules asked for, with their
# dependencies, go into the initramfs.
#
# Environment:
#   GMIG_CACHE             cache root (default $HOME/.cache/gmig)
#   GMIG_GUEST_KERNEL_PKG  kernel image package to use instead (e.g. linux-image-6.1.0-56-cloud-amd64)
# Needs apt-get, apt-cache, dpkg-deb, python3 (writes the cpio), sha256sum, flock; runs
# `apt-get update` (as root or through sudo) only when apt does not know the packages.
set -euo pipefail

# stdout carries only the result; everything else goes to stderr.
exec 3>&1 1>&2

die() { echo "scripts/qemu/guest.sh: error: $*" >&2; exit 1; }
note() { echo "scripts/qemu/guest.sh: $*" >&2; }

adds=()
want_modules=()
out=
print_key=0
while (($#)); do
    case $1 in
        --add) (($# >= 2)) || die "--add needs SRC:DEST"; adds+=("$2"); shift 2 ;;
        --add=*) adds+=("${1#--add=}"); shift ;;
        --modules) (($# >= 2)) || die "--modules needs MOD[,MOD]..."; IFS=, read -ra m <<<"$2"
                   want_modules+=("${m[@]}"); shift 2 ;;
        --modules=*) IFS=, read -ra m <<<"${1#--modules=}"; want_modules+=("${m[@]}"); shift ;;
        --out) (($# >= 2)) || die "--out needs DIR"; out=$2; shift 2 ;;
        --out=*) out=${1#--out=}; shift ;;
        --print-key) print_key=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done

self=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
cache=${GMIG_CACHE:-$HOME/.cache/gmig}/guest
mkdir -p "$cache"

# Validate --add entries: SRC:DEST, split at the last colon.
add_src=() add_dest=() add_mode=()
for a in ${adds[@]+"${adds[@]}"}; do
    [[ $a == *:* ]] || die "--add '$a': expected SRC:DEST"
    src=${a%:*} dest=${a##*:}
    [[ -f $src ]] || die "--add '$a': $src is not a file"
    [[ $dest == /* && $dest != */ && $dest != *[[:space:]]* ]] ||
        die "--add '$a': DEST must be an absolute file path without whitespace"
    [[ -x $src ]] && mode=0755 || mode=0644
    add_src+=("$(cd "$(dirname "$src")" && pwd)/$(basename "$src")")
    add_dest+=("$dest") add_mode+=("$mode")
done
for m in ${want_modules[@]+"${want_modules[@]}"}; do
    [[ $m =~ ^[A-Za-z0-9_-]+$ ]] || die "--modules: '$m' is not a module name"
done
# Module names as the kernel spells them (dashes are underscores), sorted, once each.
if ((${#want_modules[@]})); then
    mapfile -t want_modules < <(printf '%s\n' "${want_modules[@]}" | tr - _ | sort -u)
fi

exec 9>"$cache/.lock"
if ! flock -n 9; then
    note "waiting for another guest.sh ($cache/.lock)"
    flock 9
fi
tmp=$(mktemp -d "$cache/.tmp-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
find "$cache" -maxdepth 1 -name '.tmp-*' ! -path "$tmp" -exec rm -rf {} + # left by killed runs

# ---- apt metadata -----------------------------------------------------------------------------
apt_updated=0
apt_update() {
    ((apt_updated == 0)) || return 1
    apt_updated=1
    local sudo=()
    if [[ $(id -u) != 0 ]]; then
        command -v sudo >/dev/null || die "apt does not know the packages; need root or sudo for apt-get update"
        sudo=(sudo)
    fi
    note "apt-get update"
    "${sudo[@]}" apt-get update -qq || die "apt-get update failed"
}
# show_field PKG FIELD: the field of PKG's candidate version (apt-get update once if unknown)
show_field() {
    local v
    while :; do
        v=$(apt-cache show --no-all-versions "$1" 2>/dev/null | sed -n "s/^$2: //p" | head -n1)
        [[ -n $v ]] && { echo "$v"; return 0; }
        apt_update || die "apt knows no package '$1' (field $2)"
    done
}

# apt-cache parses every package list (about a second here), so the answer is remembered in
# CACHE/.resolved-<image package> until the package lists change.
meta_pkg=linux-image-cloud-amd64
((${#want_modules[@]} == 0)) || meta_pkg=linux-image-amd64
lists_stamp=$( (echo "${GMIG_GUEST_KERNEL_PKG:-}"; stat -c '%n %Y %s' /var/lib/apt/lists/*_Packages* 2>/dev/null) |
    sha256sum | cut -d' ' -f1)
resolved=()
[[ -f $cache/.resolved-$meta_pkg ]] && mapfile -t resolved <"$cache/.resolved-$meta_pkg"
if [[ ${#resolved[@]} == 4 && ${resolved[0]} == "$lists_stamp" ]]; then
    kernel_pkg=${resolved[1]} kernel_deb=${resolved[2]} busybox_deb=${resolved[3]}
else
    if [[ -n ${GMIG_GUEST_KERNEL_PKG:-} ]]; then
        kernel_pkg=$GMIG_GUEST_KERNEL_PKG
    else
        kernel_pkg=$(show_field "$meta_pkg" Depends | tr ',' '\n' |
            sed -n 's/^ *\(linux-image-[^ ]*\).*/\1/p' | head -n1)
        [[ -n $kernel_pkg ]] || die "could not resolve the image package $meta_pkg depends on"
    fi
    kernel_deb=$(basename "$(show_field "$kernel_pkg" Filename)")
    busybox_deb=$(basename "$(show_field busybox-static Filename)")
    if ((apt_updated == 0)); then
        printf '%s\n' "$lists_stamp" "$kernel_pkg" "$kernel_deb" "$busybox_deb" \
            >"$cache/.resolved-$meta_pkg"
    fi
fi

# fetch_deb PKG DEBNAME DESTDIR: downloads PKG and extracts it into DESTDIR (a temp dir)
fetch_deb() {
    local d=$tmp/dl-$1
    mkdir -p "$d"
    note "downloading $2"
    local sandbox=()   # as root, apt's _apt sandbox user cannot write into $HOME: say so
    [[ $(id -u) != 0 ]] || sandbox=(-o APT::Sandbox::User=root)
    (cd "$d" && apt-get download -qq "${sandbox[@]}" "$1") || die "apt-get download $1 failed"
    local debs=("$d"/*.deb)   # named with the epoch (%3a), unlike the pool's file name
    [[ ${#debs[@]} == 1 && -f ${debs[0]} ]] || die "apt-get download $1 did not produce one .deb"
    dpkg-deb -x "${debs[0]}" "$3" || die "dpkg-deb -x $2 failed"
    rm -f "${debs[0]}"
}

# ---- kernel -----------------------------------------------------------------------------------
kdir=$cache/kernel/${kernel_deb%.deb}
if [[ ! -f $kdir/vmlinuz ]]; then
    x=$tmp/kernel-x stage=$tmp/kernel
    mkdir -p "$x" "$stage"
    fetch_deb "$kernel_pkg" "$kernel_deb" "$x"
    vmlinuz=("$x"/boot/vmlinuz-*) config=("$x"/boot/config-*)
    [[ -f ${vmlinuz[0]} && -f ${config[0]} ]] || die "$kernel_deb has no boot/vmlinuz-* and boot/config-*"
    missing=()
    for opt in CONFIG_PCI CONFIG_SYSFS CONFIG_PROC_FS CONFIG_DEVTMPFS CONFIG_BLK_DEV_INITRD \
               CONFIG_RD_GZIP CONFIG_SERIAL_8250 CONFIG_SERIAL_8250_CONSOLE CONFIG_BINFMT_ELF \
               CONFIG_BINFMT_SCRIPT; do
        grep -qx "$opt=y" "${config[0]}" || missing+=("$opt")
    done
    ((${#missing[@]} == 0)) || die "$kernel_deb lacks built-in ${missing[*]}"
    grep -qx 'CONFIG_DEBUG_FS=y' "${config[0]}" || note "warning: $kernel_deb has no debugfs"
    cp "${vmlinuz[0]}" "$stage/vmlinuz"
    cp "${config[0]}" "$stage/config"
    ((${#want_modules[@]})) || rm -rf "$x"   # else the modules step below takes its modules
    mkdir -p "$cache/kernel"
    mv -T "$stage" "$kdir"
fi

# ---- busybox ----------------------------------------------------------------------------------
bdir=$cache/busybox/${busybox_deb%.deb}
if [[ ! -x $bdir/busybox ]]; then
    x=$tmp/busybox-x stage=$tmp/busybox
    mkdir -p "$x" "$stage"
    fetch_deb busybox-static "$busybox_deb" "$x"
    [[ -x $x/bin/busybox ]] || die "$busybox_deb has no bin/busybox"
    cp "$x/bin/busybox" "$stage/busybox"
    rm -rf "$x"
    mkdir -p "$cache/busybox"
    mv -T "$stage" "$bdir"
fi
busybox=$bdir/busybox

# ---- modules (only with --modules) --------------------------------------------------------------
# The kernel package's whole module tree is kept once per package (dependencies need it all);
# the initramfs gets only the closure of the modules asked for.
mod_release='' mod_paths=()
if ((${#want_modules[@]})); then
    grep -qx 'CONFIG_MODULES=y' "$kdir/config" || die "$kernel_deb has no loadable modules"
    if [[ ! -d $kdir/modules ]]; then
        x=$tmp/kernel-x stage=$tmp/modules
        mkdir -p "$stage"
        [[ -d $x/lib/modules ]] || { mkdir -p "$x"; fetch_deb "$kernel_pkg" "$kernel_deb" "$x"; }
        rels=("$x"/lib/modules/*)
        [[ ${#rels[@]} == 1 && -d ${rels[0]}/kernel ]] ||
            die "$kernel_deb has not exactly one lib/modules/<release>/kernel"
        note "depmod over $(basename "${rels[0]}")"
        "$busybox" depmod -b "$x" "$(basename "${rels[0]}")" || die "busybox depmod failed"
        [[ -s ${rels[0]}/modules.dep ]] || die "busybox depmod wrote no modules.dep"
        mv "${rels[0]}" "$stage/"
        rm -rf "$x"
        mv -T "$stage" "$kdir/modules"
    fi
    rels=("$kdir"/modules/*)
    mod_release=$(basename "${rels[0]}")
    mdir=$kdir/modules/$mod_release
    # name -> its modules.dep line (the module's path, then every module it needs, transitively)
    declare -A dep_line=()
    while IFS= read -r line; do
        n=${line%%:*}
        n=${n##*/}
        n=${n%.ko}
        dep_line[${n//-/_}]=$line
    done <"$mdir/modules.dep"
    declare -A picked=()
    for m in "${want_modules[@]}"; do
        line=${dep_line[$m]:-}
        if [[ -z $line ]]; then
            grep -q "/${m}.ko\$\|/${m//_/-}.ko\$" "$mdir/modules.builtin" 2>/dev/null &&
                { note "module $m is built into $kernel_deb"; continue; }
            die "$kernel_deb has no module '$m'"
        fi
        picked[${line%%:*}]=1
        for d in ${line#*:}; do picked[$d]=1; done
    done
    mapfile -t mod_paths < <(printf '%s\n' "${!picked[@]}" | sort)
fi

# ---- key --------------------------------------------------------------------------------------
key_material="kernel $kernel_deb"$'\n'"busybox $busybox_deb"$'\n'
key_material+="script $(sha256sum "$self" | cut -d' ' -f1)"$'\n'
for i in ${add_src[@]+"${!add_src[@]}"}; do
    key_material+="add ${add_dest[i]} ${add_mode[i]} $(sha256sum "${add_src[i]}" | cut -d' ' -f1)"$'\n'
done
((${#want_modules[@]} == 0)) || key_material+="modules ${want_modules[*]}"$'\n'
key=$(printf '%s' "$key_material" | sha256sum | cut -d' ' -f1)
if ((print_key)); then echo "$key" >&3; exit 0; fi

if [[ -z $out ]]; then
    gdir=$cache/$key
    if [[ -f $gdir/initrd.img && -f $gdir/vmlinuz ]]; then
        printf 'KERNEL=%s\nINITRD=%s\n' "$gdir/vmlinuz" "$gdir/initrd.img" >&3
        exit 0
    fi
    stage=$tmp/guest
else
    mkdir -p "$out"
    stage=$(cd "$out" && pwd)
fi
mkdir -p "$stage"

# ---- /init ------------------------------------------------------------------------------------
cat >"$stage/init" <<'INIT'
#!/bin/sh
# gmig test guest init (generated by scripts/qemu/guest.sh; see its header).
# shellcheck disable=SC2086,SC2013 # word splitting of /proc/cmdline, gmig.run and resource lines
export PATH=/sbin:/bin:/usr/sbin:/usr/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null || echo "GMIG-GUEST: warning: no devtmpfs"
[ -d /sys/kernel/debug ] && mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
echo   # the firmware's last console line has no newline: start the marker on a line of its own
echo "GMIG-GUEST: up"

# bar_size DEVDIR N: size of BAR N from the device's sysfs resource file, in hex
bar_size() {
    line=$(sed -n "$(($2 + 1))p" "$1/resource" 2>/dev/null)
    set -- $line
    if [ $# -ge 2 ] && [ $(($2)) -ne 0 ]; then printf '0x%x' $(($2 - $1 + 1)); else printf '0x0'; fi
}

for d in /sys/bus/pci/devices/*; do
    [ -e "$d/vendor" ] || continue
    echo "GMIG-PCI: ${d##*/} $(cat "$d/vendor") $(cat "$d/device") $(cat "$d/class")" \
        "bar0=$(bar_size "$d" 0) bar2=$(bar_size "$d" 2)"
done

set -f   # no globbing while splitting the command line
run=
for arg in $(cat /proc/cmdline); do
    case $arg in gmig.run=*) run=${arg#gmig.run=} ;; esac
done
if [ -n "$run" ]; then
    IFS=,
    set -- $run
    unset IFS
    set +f
    "$@"
    echo "GMIG-GUEST: exit $?"
fi
set +f
sync
poweroff -f
echo o >/proc/sysrq-trigger
sleep 10
INIT
chmod 0755 "$stage/init"

# ---- modules.dep for the modules put in ----------------------------------------------------------
if [[ -n $mod_release ]]; then
    for p in ${mod_paths[@]+"${mod_paths[@]}"}; do
        awk -v p="$p:" 'index($0, p) == 1 { print; exit }' "$mdir/modules.dep"
    done >"$stage/modules.dep"
fi

# ---- initramfs (cpio newc, gzip; root-owned, mtime 0, so the same inputs give the same bytes) ---
manifest=$tmp/manifest
{
    echo "dir /dev 0755"
    echo "nod /dev/console 0600 c 5 1"
    echo "nod /dev/null 0666 c 1 3"
    for d in /proc /sys /tmp /root /run /bin /sbin /usr /usr/bin /usr/sbin; do echo "dir $d 0755"; done
    echo "file /bin/busybox 0755 $busybox"
    "$busybox" --list-full | while read -r applet; do
        [[ $applet == bin/busybox ]] || echo "slink /$applet /bin/busybox"
    done
    echo "file /init 0755 $stage/init"
    if [[ -n $mod_release ]]; then
        for p in ${mod_paths[@]+"${mod_paths[@]}"}; do
            echo "file /lib/modules/$mod_release/$p 0644 $mdir/$p"
        done
        echo "file /lib/modules/$mod_release/modules.dep 0644 $stage/modules.dep"
    fi
    for i in ${add_src[@]+"${!add_src[@]}"}; do
        echo "file ${add_dest[i]} ${add_mode[i]} ${add_src[i]}"
    done
} >"$manifest"
initrd_tmp=$tmp/initrd.img
python3 - "$manifest" "$initrd_tmp" <<'PY' || die "writing the initramfs failed"
# A gen_init_cpio-style manifest to a gzip'd newc cpio. Later entries for a path win; parent
# directories are created as needed.
import gzip, os, stat, sys

entries = {}
def add(path, kind, mode, arg=None):
    path = path.strip("/")
    parts = path.split("/")
    for i in range(1, len(parts)):
        entries.setdefault("/".join(parts[:i]), ("dir", 0o755, None))
    entries.pop(path, None)
    entries[path] = (kind, mode, arg)

for line in open(sys.argv[1]):
    f = line.split()
    if not f:
        continue
    if f[0] == "dir":
        add(f[1], "dir", int(f[2], 8))
    elif f[0] == "file":
        add(f[1], "file", int(f[2], 8), f[3])
    elif f[0] == "slink":
        add(f[1], "slink", 0o777, f[2])
    elif f[0] == "nod":
        add(f[1], "nod", int(f[2], 8), (f[3], int(f[4]), int(f[5])))
    else:
        sys.exit("bad manifest line: " + line)

def hdr(ino, mode, nlink, size, name, rdev=(0, 0)):
    fields = [ino, mode, 0, 0, nlink, 0, size, 0, 0, rdev[0], rdev[1], len(name) + 1, 0]
    h = b"070701" + b"".join(b"%08X" % v for v in fields) + name.encode() + b"\0"
    return h + b"\0" * (-len(h) % 4)

out = bytearray()
for ino, (path, (kind, mode, arg)) in enumerate(sorted(entries.items()), start=1):
    if kind == "dir":
        out += hdr(ino, stat.S_IFDIR | mode, 2, 0, path)
        continue
    if kind == "file":
        data = open(arg, "rb").read()
        m = stat.S_IFREG
    elif kind == "slink":
        data = arg.encode()
        m = stat.S_IFLNK
    else:
        data = b""
        m = stat.S_IFCHR if arg[0] == "c" else stat.S_IFBLK
    out += hdr(ino, m | mode, 1, len(data), path, arg[1:] if kind == "nod" else (0, 0))
    out += data + b"\0" * (-len(data) % 4)
out += hdr(0, 0, 1, 0, "TRAILER!!!")
with open(sys.argv[2], "wb") as f:
    f.write(gzip.compress(bytes(out), compresslevel=6, mtime=0))
PY
mv -f "$initrd_tmp" "$stage/initrd.img"

if [[ -n $out ]]; then
    printf 'KERNEL=%s\nINITRD=%s\n' "$kdir/vmlinuz" "$stage/initrd.img" >&3
    exit 0
fi
printf '%s' "$key_material" >"$stage/key.txt"
ln "$kdir/vmlinuz" "$stage/vmlinuz" 2>/dev/null || cp "$kdir/vmlinuz" "$stage/vmlinuz"
mv -T "$stage" "$gdir"
printf 'KERNEL=%s\nINITRD=%s\n' "$gdir/vmlinuz" "$gdir/initrd.img" >&3
