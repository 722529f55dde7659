#!/usr/bin/env bash
# Namespace topology for the forumpulse firewall tests (root only; touches nothing outside its namespaces
# except one veth end "<tag>r" in the root namespace with 10.200.<n>.1/24 for the decision API).
#
#   up TAG N     creates namespaces TAG-v (victim), TAG-a (attacker), TAG-l (legit), TAG-s (server behind):
#                  TAG-a 10.200.N.2  <->  10.200.N.1 TAG-v
#                  TAG-l 10.200.N+1.2 <-> 10.200.N+1.1 TAG-v
#                  root  10.200.N+2.1 <-> 10.200.N+2.2 TAG-v   (victim reaches a server in the root namespace)
#                  TAG-s 10.200.N+3.2 <-> 10.200.N+3.1 TAG-v   (TAG-v routes between a, l and s: forwarded
#                                                              traffic, like a web server in a container)
#   down TAG     deletes them (idempotent; safe after partial setup)
#   check        prints what is missing (ip, nft, ipset, iptables, root)
set -euo pipefail
cmd=${1:-}; tag=${2:-}
need() { command -v "$1" >/dev/null 2>&1 || { echo "missing tool: $1 ($2)"; return 1; }; }
case "$cmd" in
  check)
    ok=0
    [ "$(id -u)" = 0 ] || { echo "not root: network namespace tests need root"; ok=1; }
    need ip iproute2 || ok=1; need nft nftables || ok=1; need ipset ipset || ok=1; need iptables iptables || ok=1
    exit $ok ;;
  up)
    n=${3:?usage: up TAG N}
    [[ "$tag" =~ ^[a-z][a-z0-9]{0,7}$ ]] || { echo "TAG must be 1-8 lower-case letters/digits"; exit 2; }
    [[ "$n" =~ ^[0-9]+$ ]] && (( n >= 1 && n <= 250 )) || { echo "N must be 1..250"; exit 2; }
    for ns in v a l s; do ip netns add "$tag-$ns"; ip -n "$tag-$ns" link set lo up; done
    ip link add "${tag}a0" netns "$tag-a" type veth peer name "${tag}a1" netns "$tag-v"
    ip link add "${tag}l0" netns "$tag-l" type veth peer name "${tag}l1" netns "$tag-v"
    ip link add "${tag}r" type veth peer name "${tag}r1" netns "$tag-v"
    ip -n "$tag-a" addr add "10.200.$n.2/24" dev "${tag}a0"; ip -n "$tag-v" addr add "10.200.$n.1/24" dev "${tag}a1"
    ip -n "$tag-l" addr add "10.200.$((n+1)).2/24" dev "${tag}l0"; ip -n "$tag-v" addr add "10.200.$((n+1)).1/24" dev "${tag}l1"
    ip addr add "10.200.$((n+2)).1/24" dev "${tag}r"; ip -n "$tag-v" addr add "10.200.$((n+2)).2/24" dev "${tag}r1"
    ip -n "$tag-a" link set "${tag}a0" up; ip -n "$tag-v" link set "${tag}a1" up
    ip -n "$tag-l" link set "${tag}l0" up; ip -n "$tag-v" link set "${tag}l1" up
    ip link set "${tag}r" up; ip -n "$tag-v" link set "${tag}r1" up
    ip link add "${tag}s0" netns "$tag-s" type veth peer name "${tag}s1" netns "$tag-v"
    ip -n "$tag-s" addr add "10.200.$((n+3)).2/24" dev "${tag}s0"; ip -n "$tag-v" addr add "10.200.$((n+3)).1/24" dev "${tag}s1"
    ip -n "$tag-s" link set "${tag}s0" up; ip -n "$tag-v" link set "${tag}s1" up
    ip netns exec "$tag-v" sysctl -qw net.ipv4.ip_forward=1
    ip -n "$tag-a" route add "10.200.$((n+3)).0/24" via "10.200.$n.1"
    ip -n "$tag-l" route add "10.200.$((n+3)).0/24" via "10.200.$((n+1)).1"
    ip -n "$tag-s" route add default via "10.200.$((n+3)).1" ;;
  down)
    [[ "$tag" =~ ^[a-z][a-z0-9]{0,7}$ ]] || { echo "TAG must be 1-8 lower-case letters/digits"; exit 2; }
    ip link del "${tag}r" 2>/dev/null || true
    for ns in v a l s; do ip netns pids "$tag-$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true; ip netns del "$tag-$ns" 2>/dev/null || true; done ;;
  *) echo "usage: $0 check | up TAG N | down TAG"; exit 2 ;;
esac
