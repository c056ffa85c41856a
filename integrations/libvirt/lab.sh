#!/usr/bin/env bash
# Private libvirt daemons on one machine, for gmig's libvirt recipe and its test: each daemon has
# its own configuration, run, state, cache and log directories (bind-mounted over libvirt's fixed
# paths in a private mount namespace), its own host UUID and hostname, optionally its own network
# namespace, and gmig's QEMU hook installed. A system libvirtd, if any, is neither used nor touched.
#
#   lab.sh install                    install Debian's libvirt daemon and clients (apt, as root)
#                                     and the user libvirt-qemu (see README.md)
#   lab.sh check                      exit 0 if libvirtd can run here; else say why on stderr, 1
#   lab.sh start DIR [options]        start a private libvirtd whose files live under DIR
#       --netns NS                    run it (and its QEMUs and gmig servers) in network namespace NS
#       --hostname NAME               its hostname (own UTS namespace; default: the machine's)
#       --host-uuid UUID              its host UUID (default: a new random one)
#       --gmig PATH                   the gmig binary its hook starts (default: gmig on PATH)
#       --slot-offset N               the hook adds N to every vGPU's slot (default 0)
#       --listen-tcp                  also listen on TCP port 16509, no authentication
#                                     (only inside a network namespace of your own)
#       --migration-host ADDR         incoming migrations listen on ADDR, and the source's QEMU
#                                     is told to connect there (qemu.conf migration_address and
#                                     migration_host): `virsh migrate` needs no --migrateuri
#   lab.sh uri DIR                    print the daemon's URI (qemu+unix:///system?socket=...)
#   lab.sh stop DIR                   stop the daemon and every process left in its namespaces
#   lab.sh net-up NS_A ADDR_A NS_B ADDR_B   two network namespaces joined by a veth pair (gm0 in
#                                     each), addresses with prefix, e.g. 10.231.31.1/24
#   lab.sh net-down NS_A NS_B         remove them
#   lab.sh domain [options]           print a domain XML from domain.xml.in (see its header)
#       --qemu PATH --kernel PATH --initrd PATH [--name N (gmig-demo)] [--frames N (48)]
#       [--profile P (desktop)] [--ram-mib M (1024)] [--type A+H (64+384)] [--slot S (0)]
#       [--socket PATH (/run/gmig/NAME.sock)] [--serial PATH (/var/log/libvirt/qemu/NAME.serial,
#       which is DIR/log/qemu/NAME.serial: each daemon's QEMU writes its own)]
#
# Layout of DIR (each bind-mounted, in the daemon's mount namespace, over the path shown):
#   DIR/etc   -> /etc/libvirt        libvirtd.conf, qemu.conf, hooks/qemu, gmig.conf, domains
#   DIR/run   -> /run/libvirt        the daemon's sockets (DIR/run/libvirt-sock), live status
#   DIR/lib   -> /var/lib/libvirt    state
#   DIR/cache -> /var/cache/libvirt  QEMU capabilities cache
#   DIR/log   -> /var/log/libvirt    libvirtd.log, gmig-hook.log, qemu/DOMAIN.log (QEMU's own),
#                                    qemu/DOMAIN-gmig.log (the vGPU server's)
#   DIR/gmig  -> /run/gmig           vGPU sockets and the hook's pid files: the same socket path in
#                                    two daemons' domains names two files, as on two hosts
#   DIR/libvirtd.pid, DIR/mntns      the daemon's pid and mount namespace (for stop)
# The mount points themselves are created on the machine if missing (empty directories).
#
# The QEMU configuration (DIR/etc/qemu.conf) runs QEMU as root without a security driver, cgroups,
# or a private /dev, and writes QEMU's output straight to its log (no virtlogd): what a container
# without systemd allows. The TCG CPU: see domain.xml.in and README.md.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
die() { echo "lab.sh: error: $*" >&2; exit 1; }
note() { echo "lab.sh: $*" >&2; }

packages=(libvirt-daemon libvirt-clients libvirt-daemon-driver-qemu)
mounts=(etc:/etc/libvirt run:/run/libvirt lib:/var/lib/libvirt cache:/var/cache/libvirt
        log:/var/log/libvirt gmig:/run/gmig)

need_root() { [[ $(id -u) -eq 0 ]] || die "run as root (libvirtd's system instance, mounts, netns)"; }

have_qemu_driver() {
    [[ -n $(find /usr/lib /usr/lib64 -name libvirt_driver_qemu.so -print -quit 2>/dev/null) ]]
}

# The daemon's packages (not libvirt-daemon-system: it brings systemd, iptables and services
# that a private daemon does not use), and the user and groups that libvirt-daemon-system's
# postinst would create: Debian's QEMU driver looks its default user up (libvirt-qemu) before it
# reads qemu.conf, and fails to start without it, even with user = "root".
cmd_install() {
    if ! command -v libvirtd >/dev/null || ! command -v virsh >/dev/null || ! have_qemu_driver; then
        need_root
        command -v apt-get >/dev/null || die "no apt-get: install ${packages[*]} by hand"
        export DEBIAN_FRONTEND=noninteractive
        # Recommends would bring Debian's own QEMU and the LXC/Xen drivers: not wanted.
        if ! apt-get install -y --no-install-recommends "${packages[@]}" >&2; then
            apt-get update >&2
            apt-get install -y --no-install-recommends "${packages[@]}" >&2
        fi
    fi
    getent group kvm >/dev/null || { need_root; groupadd --system kvm; }
    if ! getent passwd libvirt-qemu >/dev/null; then
        need_root
        local uid=()
        getent passwd 64055 >/dev/null || uid=(--uid 64055)
        useradd --system "${uid[@]}" --gid kvm --home-dir /var/lib/libvirt --no-create-home \
            --shell /usr/sbin/nologin --comment "Libvirt Qemu" libvirt-qemu
    fi
    if ! getent group libvirt-qemu >/dev/null; then
        need_root
        local gid=()
        getent group 64055 >/dev/null || gid=(--gid 64055)
        groupadd --system "${gid[@]}" libvirt-qemu
        usermod -a -G libvirt-qemu libvirt-qemu
    fi
}

cmd_check() {
    [[ $(id -u) -eq 0 ]] || { echo "not root: a private system libvirtd needs root" >&2; return 1; }
    command -v libvirtd >/dev/null || { echo "libvirtd is not installed" >&2; return 1; }
    command -v virsh >/dev/null || { echo "virsh is not installed" >&2; return 1; }
    have_qemu_driver || { echo "libvirt's QEMU driver is not installed" >&2; return 1; }
    getent passwd libvirt-qemu >/dev/null ||
        { echo "no user libvirt-qemu (lab.sh install creates it)" >&2; return 1; }
    command -v unshare >/dev/null || { echo "no unshare(1)" >&2; return 1; }
    unshare -m --propagation private true 2>/dev/null ||
        { echo "cannot make a mount namespace (unshare -m): no CAP_SYS_ADMIN here" >&2; return 1; }
}

uri_of() { echo "qemu+unix:///system?socket=$1/run/libvirt-sock"; }

cmd_start() {
    need_root
    local dir=${1:?lab.sh start DIR}; shift
    local netns= hostname= uuid= gmig= offset=0 tcp=0 mighost=
    while [[ $# -gt 0 ]]; do
        case $1 in
            --netns) netns=$2; shift 2 ;;
            --hostname) hostname=$2; shift 2 ;;
            --host-uuid) uuid=$2; shift 2 ;;
            --gmig) gmig=$2; shift 2 ;;
            --slot-offset) offset=$2; shift 2 ;;
            --listen-tcp) tcp=1; shift ;;
            --migration-host) mighost=$2; shift 2 ;;
            *) die "start: unknown argument $1" ;;
        esac
    done
    [[ -n $uuid ]] || uuid=$(cat /proc/sys/kernel/random/uuid)
    [[ -n $gmig ]] || gmig=$(command -v gmig || true)
    [[ -x $gmig ]] || die "start: no gmig binary (give --gmig PATH)"
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    if [[ -f $dir/libvirtd.pid ]] && kill -0 "$(cat "$dir/libvirtd.pid")" 2>/dev/null; then
        die "start: a daemon already runs for $dir (pid $(cat "$dir/libvirtd.pid"))"
    fi
    local m
    for m in "${mounts[@]}"; do mkdir -p "$dir/${m%%:*}" "${m#*:}"; done
    mkdir -p "$dir/etc/hooks" "$dir/log/qemu"

    # Logs: warnings of everything, plus the steps of QEMU's start and of migration.
    cat >"$dir/etc/libvirtd.conf" <<EOF
# written by gmig's integrations/libvirt/lab.sh
host_uuid = "$uuid"
unix_sock_group = "root"
unix_sock_rw_perms = "0770"
auth_unix_ro = "none"
auth_unix_rw = "none"
listen_tls = 0
listen_tcp = $tcp
auth_tcp = "none"
log_filters = "1:qemu.qemu_migration 1:qemu.qemu_process 1:util.hook 3:*"
log_outputs = "1:file:/var/log/libvirt/libvirtd.log"
EOF
    cat >"$dir/etc/qemu.conf" <<EOF
# written by gmig's integrations/libvirt/lab.sh
user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
cgroup_controllers = [ ]
namespaces = [ ]
stdio_handler = "file"
EOF
    if [[ -n $mighost ]]; then
        printf 'migration_address = "%s"\nmigration_host = "%s"\n' "$mighost" "$mighost" \
            >>"$dir/etc/qemu.conf"
    fi
    cat >"$dir/etc/gmig.conf" <<EOF
# gmig's libvirt hook configuration (read by hooks/qemu)
gmig = $gmig
slot_offset = $offset
EOF
    install -m 0755 "$here/hooks/qemu" "$dir/etc/hooks/qemu"
    : >"$dir/log/libvirtd.log"

    # The daemon's mount namespace: libvirt's fixed paths replaced by DIR's directories.
    local binds=""
    for m in "${mounts[@]}"; do binds+="mount --bind '$dir/${m%%:*}' '${m#*:}'; "; done
    local uts=() sethost=""
    if [[ -n $hostname ]]; then uts=(-u); sethost="hostname '$hostname'; "; fi
    local netexec=() loup=""
    [[ -n $netns ]] && netexec=(ip netns exec "$netns") && loup="ip link set lo up; "
    local tcpflag=""
    [[ $tcp -eq 1 ]] && tcpflag="--listen"
    "${netexec[@]}" unshare -m "${uts[@]}" --propagation private sh -c "
        set -e; $binds $sethost $loup
        exec libvirtd -d $tcpflag --pid-file '$dir/libvirtd.pid'" >&2 ||
        die "start: libvirtd did not start; see $dir/log/libvirtd.log"
    local pid i
    for i in $(seq 200); do
        [[ -S $dir/run/libvirt-sock && -s $dir/libvirtd.pid ]] && break
        sleep 0.05
    done
    [[ -S $dir/run/libvirt-sock ]] || die "start: no socket at $dir/run/libvirt-sock; see $dir/log/libvirtd.log"
    pid=$(cat "$dir/libvirtd.pid")
    readlink "/proc/$pid/ns/mnt" >"$dir/mntns"
    note "libvirtd $pid: $(uri_of "$dir") host UUID $uuid${netns:+ netns $netns}"
    uri_of "$dir"
}

cmd_uri() { uri_of "$(cd "${1:?lab.sh uri DIR}" && pwd)"; }

# Processes whose mount namespace is the daemon's: libvirtd, its QEMUs, hooks, gmig servers.
ns_pids() {
    local ns=$1 p
    for p in /proc/[0-9]*; do
        [[ $(readlink "$p/ns/mnt" 2>/dev/null) == "$ns" ]] && echo "${p#/proc/}"
    done
    return 0
}

cmd_stop() {
    need_root
    local dir=${1:?lab.sh stop DIR}
    [[ -d $dir ]] || return 0
    dir=$(cd "$dir" && pwd)
    local ns="" pid="" p i
    [[ -f $dir/mntns ]] && ns=$(cat "$dir/mntns")
    [[ -f $dir/libvirtd.pid ]] && pid=$(cat "$dir/libvirtd.pid")
    if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null &&
        [[ -z $ns || $(readlink "/proc/$pid/ns/mnt" 2>/dev/null) == "$ns" ]]; then
        kill -TERM "$pid" 2>/dev/null || true
        for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    fi
    if [[ -n $ns ]]; then
        for p in $(ns_pids "$ns"); do kill -TERM "$p" 2>/dev/null || true; done
        for i in $(seq 60); do [[ -z $(ns_pids "$ns") ]] && break; sleep 0.05; done
        for p in $(ns_pids "$ns"); do kill -KILL "$p" 2>/dev/null || true; done
    fi
    rm -f "$dir/libvirtd.pid" "$dir/mntns"
}

cmd_net_up() {
    need_root
    local a=${1:?} aa=${2:?} b=${3:?} ba=${4:?}
    ip netns add "$a"
    ip netns add "$b" || { ip netns del "$a"; exit 1; }
    # One veth pair made straight inside the two namespaces, named gm0 in each.
    ip link add gm0 netns "$a" type veth peer name gm0 netns "$b" ||
        { ip netns del "$a"; ip netns del "$b"; exit 1; }
    ip -n "$a" addr add "$aa" dev gm0
    ip -n "$b" addr add "$ba" dev gm0
    local n
    for n in "$a" "$b"; do
        ip -n "$n" link set lo up
        ip -n "$n" link set gm0 up
    done
}

cmd_net_down() {
    need_root
    local n
    for n in "$@"; do ip netns del "$n" 2>/dev/null || true; done
}

cmd_domain() {
    local name=gmig-demo qemu= kernel= initrd= serial= socket= frames=48 profile=desktop ram=1024
    local type=64+384 slot=0
    while [[ $# -gt 0 ]]; do
        case $1 in
            --name) name=$2 ;; --qemu) qemu=$2 ;; --kernel) kernel=$2 ;; --initrd) initrd=$2 ;;
            --serial) serial=$2 ;; --socket) socket=$2 ;; --frames) frames=$2 ;;
            --profile) profile=$2 ;; --ram-mib) ram=$2 ;; --type) type=$2 ;; --slot) slot=$2 ;;
            *) die "domain: unknown argument $1" ;;
        esac
        shift 2
    done
    [[ -n $qemu && -n $kernel && -n $initrd ]] ||
        die "domain: --qemu, --kernel and --initrd are required"
    [[ -n $serial ]] || serial=/var/log/libvirt/qemu/$name.serial
    [[ -n $socket ]] || socket=/run/gmig/$name.sock
    sed -e "s|@NAME@|$name|g" -e "s|@QEMU@|$qemu|g" -e "s|@KERNEL@|$kernel|g" \
        -e "s|@INITRD@|$initrd|g" -e "s|@SERIAL@|$serial|g" -e "s|@SOCKET@|$socket|g" \
        -e "s|@FRAMES@|$frames|g" -e "s|@PROFILE@|$profile|g" -e "s|@RAM_MIB@|$ram|g" \
        -e "s|@TYPE@|$type|g" -e "s|@SLOT@|$slot|g" "$here/domain.xml.in" | sed '/^<!--/,/^-->/d'
}

case ${1:-} in
    install) shift; cmd_install "$@" ;;
    check) shift; cmd_check "$@" ;;
    start) shift; cmd_start "$@" ;;
    stop) shift; cmd_stop "$@" ;;
    uri) shift; cmd_uri "$@" ;;
    net-up) shift; cmd_net_up "$@" ;;
    net-down) shift; cmd_net_down "$@" ;;
    domain) shift; cmd_domain "$@" ;;
    -h|--help|"") sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
    *) die "unknown command $1 (see lab.sh --help)" ;;
esac
