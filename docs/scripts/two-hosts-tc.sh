#!/usr/bin/env bash
# Run a gmig migration between two "hosts": two network namespaces joined by a veth pair whose
# source side is shaped by tc (tbf rate limit, optional netem delay). Needs root, iproute2 and a
# built gmig. Only the two namespaces and the veth pair this script creates are touched; they are
# removed on exit. Addresses are loopback-range (127.10.0.0/24), routed over the veth with
# route_localnet, so nothing can leave the machine.
#
#   sudo docs/scripts/two-hosts-tc.sh [RATE] [DELAY] [-- extra gmig migrate args]
#   e.g. docs/scripts/two-hosts-tc.sh 10gbit 0ms -- --profile desktop --policy one-shot-narrow
set -euo pipefail
RATE=${1:-10gbit}
DELAY=${2:-0ms}
shift $(( $# > 2 ? 2 : $# )) || true
[ "${1:-}" = "--" ] && shift
GMIG=${GMIG:-target/release/gmig}
SRC=gmig-src-$$ DST=gmig-dst-$$ VS=gmigs$$ VD=gmigd$$
SRC_IP=127.10.0.1 DST_IP=127.10.0.2 PORT=7700
OUTDIR=${OUTDIR:-$(mktemp -d)}
mkdir -p "$OUTDIR"

cleanup() {
    ip netns del "$SRC" 2>/dev/null || true
    ip netns del "$DST" 2>/dev/null || true
}
trap cleanup EXIT

ip netns add "$SRC"
ip netns add "$DST"
ip link add "$VS" type veth peer name "$VD"
ip link set "$VS" netns "$SRC"
ip link set "$VD" netns "$DST"
for ns in "$SRC" "$DST"; do
    # 127/8 is martian on non-loopback devices unless route_localnet is set (per namespace).
    ip netns exec "$ns" sysctl -qw net.ipv4.conf.all.route_localnet=1
done
ip netns exec "$SRC" sysctl -qw "net.ipv4.conf.$VS.route_localnet=1"
ip netns exec "$DST" sysctl -qw "net.ipv4.conf.$VD.route_localnet=1"
ip -n "$SRC" addr add "$SRC_IP/24" dev "$VS"
ip -n "$DST" addr add "$DST_IP/24" dev "$VD"
ip -n "$SRC" link set "$VS" up
ip -n "$DST" link set "$VD" up
# The source's egress is the migration stream: shape it. netem adds the delay, tbf the rate.
if [ "$DELAY" != "0ms" ]; then
    ip netns exec "$SRC" tc qdisc add dev "$VS" root handle 1: netem delay "$DELAY"
    ip netns exec "$SRC" tc qdisc add dev "$VS" parent 1: handle 2: tbf rate "$RATE" burst 4mb latency 50ms
else
    ip netns exec "$SRC" tc qdisc add dev "$VS" root tbf rate "$RATE" burst 4mb latency 50ms
fi
ip netns exec "$SRC" tc qdisc show dev "$VS" >&2

ip netns exec "$DST" timeout 300 "$GMIG" migrate --listen "$DST_IP:$PORT" --json "$@" > "$OUTDIR/dst.json" &
DPID=$!
sleep 1
ip netns exec "$SRC" timeout 300 "$GMIG" migrate --to "$DST_IP:$PORT" --json "$@" > "$OUTDIR/src.json"
wait "$DPID"
echo "source:      $(cat "$OUTDIR/src.json")"
echo "destination: $(cat "$OUTDIR/dst.json")"
