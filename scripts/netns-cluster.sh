#!/usr/bin/env bash
# A simulated cluster on one machine: N "nodes", each a network namespace plus a UTS namespace with its own hostname,
# joined to a bridge in the root namespace by veth pairs whose both directions are limited with tc (tbf: the rate;
# a netem child: the one-way delay). Open MPI, run through `run`, sees them as N different hosts: ranks on one node talk through
# shared memory (vader), ranks on different nodes through TCP over the limited links.
#
#   sudo ./scripts/netns-cluster.sh up 2                   # mlacp-node0 (10.77.0.10), mlacp-node1 (10.77.0.11)
#   sudo RATE=500mbit DELAY=100us ./scripts/netns-cluster.sh up 4
#   sudo ./scripts/netns-cluster.sh hostfile 2 > /tmp/hosts # "mlacp-node0 slots=2" ...
#   sudo ./scripts/netns-cluster.sh run -- mpirun -np 4 --host mlacp-node0:2,mlacp-node1:2 hostname
#   sudo ./scripts/netns-cluster.sh run -- mpirun -np 4 --hostfile /tmp/hosts --map-by ppr:2:node ./a.out
#   sudo ./scripts/netns-cluster.sh status                 # nodes, addresses, qdiscs with their counters
#   sudo ./scripts/netns-cluster.sh bytes                  # "mlacp-node0 tx=<bytes> rx=<bytes>" per node
#   sudo ./scripts/netns-cluster.sh down                   # removes everything `up` created
#
# Layout: bridge mlacpbr0 (10.77.0.1/24) in the root namespace; node i is the network namespace mlacp-node<i>
# (/run/netns/mlacp-node<i>) with eth0 = 10.77.0.(10+i)/24 and lo up, and the UTS namespace persisted as the bind
# file /run/mlacp-uts/mlacp-node<i> (unshare --uts=FILE), whose hostname is mlacp-node<i>. The root-side veth end is
# mlacp-v<i>, a port of the bridge. Both directions are shaped: the node's egress by a root tbf (handle 1:, with
# netem 10: below it) on its eth0 (tx), its ingress by the same on mlacp-v<i>'s egress (rx); `bytes` reads the root
# qdiscs' "Sent" counters. Kernels built without sch_netem (some VMs and sandboxes) get the rate only: `up` warns,
# and MLACP_TESTBED_DELAY reads "none". The node names go
# into /etc/hosts between "# mlacp-netns-cluster begin/end" markers.
#
# `run` exports, for every mpirun inside the command: plm_rsh_agent = scripts/netns-cluster-agent.sh (an "ssh" that
# nsenter's the node's network and UTS namespaces, keeping the environment), no tree spawn, btl = self,vader,tcp, TCP
# (BTL and out-of-band) restricted to 10.77.0.0/24 (mpirun's own out-of-band listens on the bridge), and
# MLACP_TESTBED_RATE / MLACP_TESTBED_DELAY (the link's settings, for reports), OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1,
# mpi_yield_when_idle=1 unless already set (the kernel moving the links' packets shares the ranks' cores), and a TCP
# eager limit of TCP_EAGER bytes (default 8 MiB; see cmd_run: the links stay full-duplex under bidirectional traffic).
# The orteds inherit mpirun's environment through the agent, so the application processes get it too.
#
# Environment: RATE (default 2gbit), DELAY (one-way, default 50us, "none" for no netem), LIMIT (netem queue, packets,
# default 10000), BURST and QUEUE_LATENCY (the tbf's, defaults 256kb and 50ms, as scripts/netns-link.sh).
# Needs root, ip and tc (iproute2), unshare and nsenter (util-linux), veth/bridge/netem in the kernel. Exits 1 with a
# message when one is missing, so callers can skip. Only one cluster at a time (it owns the names above).
# br_netfilter: bridged frames go through iptables' FORWARD chain when bridge-nf-call-iptables is 1; if iptables is
# installed and FORWARD does not accept by default (Docker sets DROP), `up` inserts an ACCEPT rule for mlacpbr0 ->
# mlacpbr0 and `down` removes it.
set -euo pipefail

prefix=mlacp-node
bridge=mlacpbr0
subnet=10.77.0.0/24
uts_dir=/run/mlacp-uts
state_dir=/run/mlacp-cluster
hosts_begin="# mlacp-netns-cluster begin"
hosts_end="# mlacp-netns-cluster end"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
agent=$here/netns-cluster-agent.sh

die() {
  echo "netns-cluster: $*" >&2
  exit 1
}

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

preflight() {
  [[ $(id -u) -eq 0 ]] || die "needs root (network and UTS namespaces, tc); run it with sudo"
  local tool
  for tool in ip tc unshare nsenter mount umount; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool not found: install iproute2 and util-linux (scripts/setup-deps.sh)"
  done
}

# The number of nodes `up` created (0 when none).
node_count() {
  if [[ -f $state_dir/nodes ]]; then cat "$state_dir/nodes"; else echo 0; fi
}

node_names() {
  local n i
  n=$(node_count)
  for ((i = 0; i < n; i++)); do echo "$prefix$i"; done
}

# The first "Sent <n> bytes" of a qdisc listing (the root qdisc), 0 when none.
sent_bytes() {
  awk '/Sent [0-9]+ bytes/ { for (i = 1; i <= NF; i++) if ($i == "Sent") { print $(i + 1); exit } } END { }' |
    { read -r b || true; echo "${b:-0}"; }
}

iptables_forward_blocks() {
  command -v iptables >/dev/null 2>&1 || return 1
  [[ $(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null || echo 0) == 1 ]] || return 1
  ! iptables -S FORWARD 2>/dev/null | grep -q '^-P FORWARD ACCEPT'
}

cmd_down() {
  local name
  # Every namespace and link with our names (also the leftovers of an interrupted `up`).
  for name in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${prefix}[0-9]*$" || true); do
    ip netns delete "$name" 2>/dev/null || true
  done
  for name in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep '^mlacp-v[0-9]*$' || true); do
    ip link delete "$name" 2>/dev/null || true
  done
  ip link delete "$bridge" 2>/dev/null || true
  if [[ -d $uts_dir ]]; then
    for name in "$uts_dir"/*; do
      [[ -e $name ]] || continue
      umount "$name" 2>/dev/null || true
      rm -f "$name"
    done
    mountpoint -q "$uts_dir" && umount "$uts_dir" # (an older version bind-mounted it)
    rmdir "$uts_dir" 2>/dev/null || true
  fi
  if [[ -f $state_dir/iptables ]]; then
    iptables -D FORWARD -i "$bridge" -o "$bridge" -j ACCEPT 2>/dev/null || true
  fi
  if grep -qF "$hosts_begin" /etc/hosts 2>/dev/null; then
    # In place (not sed -i, which replaces the file: /etc/hosts may be a bind mount).
    local kept
    kept=$(sed "/^$hosts_begin\$/,/^$hosts_end\$/d" /etc/hosts)
    printf '%s\n' "$kept" >/etc/hosts
  fi
  rm -rf "$state_dir"
  echo "netns-cluster: down"
}

# Root tbf (the rate), with a netem child (the one-way delay) where the kernel has sch_netem.
shape() { # <netns or ""> <dev>
  local ns=$1 dev=$2
  local -a exec_in=()
  [[ -n $ns ]] && exec_in=(ip netns exec "$ns")
  "${exec_in[@]}" tc qdisc replace dev "$dev" root handle 1: tbf rate "$rate" burst "$burst" latency "$queue_latency" ||
    die "tc qdisc replace dev $dev root tbf rate $rate burst $burst latency $queue_latency failed${ns:+ (in $ns)}"
  if [[ $delay != none ]]; then
    if ! "${exec_in[@]}" tc qdisc add dev "$dev" parent 1:1 handle 10: netem delay "$delay" limit "$limit" 2>/dev/null; then
      echo "netns-cluster: warning: no netem qdisc in this kernel (CONFIG_NET_SCH_NETEM): DELAY=$delay not applied," \
        "the links have the rate only" >&2
      delay=none
      echo none >"$state_dir/delay"
    fi
  fi
}

cmd_up() {
  local n=${1:-}
  [[ $n =~ ^[0-9]+$ && $n -ge 1 && $n -le 200 ]] || die "up: expected a node count 1..200, got '${n}'"
  cmd_down >/dev/null
  rate=${RATE:-2gbit} delay=${DELAY:-50us} limit=${LIMIT:-10000}
  burst=${BURST:-256kb} queue_latency=${QUEUE_LATENCY:-50ms}
  mkdir -p "$state_dir" "$uts_dir"
  echo "$rate" >"$state_dir/rate"
  echo "$delay" >"$state_dir/delay"
  ip link add "$bridge" type bridge || die "cannot create bridge $bridge (kernel bridge module?)"
  ip addr add 10.77.0.1/24 dev "$bridge"
  ip link set "$bridge" up
  if iptables_forward_blocks; then
    iptables -I FORWARD -i "$bridge" -o "$bridge" -j ACCEPT && touch "$state_dir/iptables"
  fi
  local i name veth hosts=""
  for ((i = 0; i < n; i++)); do
    name=$prefix$i veth=mlacp-v$i
    ip netns add "$name" || die "ip netns add $name failed"
    echo "$((i + 1))" >"$state_dir/nodes"
    touch "$uts_dir/$name"
    unshare --uts="$uts_dir/$name" hostname "$name" || die "cannot persist a UTS namespace at $uts_dir/$name"
    [[ $(nsenter --uts="$uts_dir/$name" hostname) == "$name" ]] || die "the UTS namespace of $name has the wrong hostname"
    ip link add "$veth" type veth peer name eth0 netns "$name" || die "cannot create veth pair $veth / $name:eth0"
    ip link set "$veth" master "$bridge"
    ip link set "$veth" up
    ip -n "$name" link set lo up
    ip -n "$name" addr add "10.77.0.$((10 + i))/24" dev eth0
    ip -n "$name" link set eth0 up
    shape "$name" eth0
    shape "" "$veth"
    hosts+="10.77.0.$((10 + i)) $name"$'\n'
  done
  [[ -s /etc/hosts && $(tail -c 1 /etc/hosts) != "" ]] && echo >>/etc/hosts # (a last line without its newline)
  printf '%s\n%s%s\n' "$hosts_begin" "$hosts" "$hosts_end" >>/etc/hosts
  # Wait until every node answers on the bridge (the bridge's ports take a moment to forward).
  for ((i = 0; i < n; i++)); do
    local tries=0
    until ip netns exec "$prefix$i" ping -c 1 -W 1 10.77.0.1 >/dev/null 2>&1; do
      tries=$((tries + 1))
      [[ $tries -lt 10 ]] || { echo "netns-cluster: warning: $prefix$i does not answer ping (no ping installed?)" >&2; break; }
      command -v ping >/dev/null 2>&1 || break
      sleep 0.3
    done
  done
  echo "netns-cluster: up $n nodes on $bridge ($subnet), links rate $rate delay $delay each way"
  for ((i = 0; i < n; i++)); do
    echo "  $prefix$i 10.77.0.$((10 + i)) hostname $(nsenter --uts="$uts_dir/$prefix$i" hostname)"
    echo "    tx $(ip netns exec "$prefix$i" tc qdisc show dev eth0 | head -n 1)"
    echo "    rx $(tc qdisc show dev "mlacp-v$i" | head -n 1)"
  done
}

cmd_hostfile() {
  local g=${1:-2} name
  [[ $g =~ ^[0-9]+$ && $g -ge 1 ]] || die "hostfile: expected a slot count, got '$g'"
  [[ $(node_count) -gt 0 ]] || die "no cluster: run '$0 up N' first"
  for name in $(node_names); do echo "$name slots=$g"; done
}

cmd_status() {
  local name i=0
  [[ $(node_count) -gt 0 ]] || { echo "netns-cluster: no cluster (run '$0 up N')"; return 0; }
  echo "bridge $bridge: $(ip -o -4 addr show dev "$bridge" | awk '{print $4}') rate $(cat "$state_dir/rate") delay $(cat "$state_dir/delay")"
  for name in $(node_names); do
    echo "$name: hostname $(nsenter --uts="$uts_dir/$name" hostname)," \
      "eth0 $(ip -n "$name" -o -4 addr show dev eth0 | awk '{print $4}')"
    echo "  tx (eth0 egress in $name):"
    ip netns exec "$name" tc -s qdisc show dev eth0 | sed 's/^/    /'
    echo "  rx (mlacp-v$i egress in the root namespace):"
    tc -s qdisc show dev "mlacp-v$i" | sed 's/^/    /'
    i=$((i + 1))
  done
}

cmd_bytes() {
  local name i=0 tx rx
  [[ $(node_count) -gt 0 ]] || die "no cluster: run '$0 up N' first"
  for name in $(node_names); do
    tx=$(ip netns exec "$name" tc -s qdisc show dev eth0 root | sent_bytes)
    rx=$(tc -s qdisc show dev "mlacp-v$i" root | sent_bytes)
    echo "$name tx=$tx rx=$rx"
    i=$((i + 1))
  done
}

cmd_run() {
  [[ ${1:-} == -- ]] && shift
  [[ $# -gt 0 ]] || die "run: expected a command (run -- mpirun ...)"
  [[ $(node_count) -gt 0 ]] || die "no cluster: run '$0 up N' first"
  [[ -x $agent ]] || die "agent $agent missing or not executable"
  export OMPI_MCA_plm_rsh_agent=$agent
  export OMPI_MCA_plm_rsh_no_tree_spawn=1
  export OMPI_MCA_btl=self,vader,tcp
  export OMPI_MCA_btl_tcp_if_include=$subnet
  export OMPI_MCA_oob_tcp_if_include=$subnet
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  # The simulated links' packets are moved by the kernel on the same cores as the ranks: busy-polling ranks starve it
  # (8-byte ping-pong across nodes: ~4 ms polling, ~40 us yielding, on 2 cores). Yield unless the caller says otherwise.
  export OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1}
  # A full-duplex link: the TCP BTL sends a message above its eager limit (64 KiB) as a rendezvous, whose
  # acknowledgement travels back in the same TCP stream as the receiver's own data. In a bidirectional exchange whose
  # ranks start a little apart, that acknowledgement waits behind the other direction's whole message, and the two
  # directions run one after the other: a P = 2 all-to-all of 1 MiB per rank at 500 Mbit/s took 17.5 ms after a
  # sleeping barrier and 8.8 ms after a spinning one. Messages up to TCP_EAGER bytes (default 8 MiB, above the layer's
  # largest) go eagerly, so that both directions flow at once, as on an RDMA fabric. TCP_EAGER=65536 restores the
  # default; a caller's OMPI_MCA_btl_tcp_eager_limit wins.
  local eager=${TCP_EAGER:-8388608}
  export OMPI_MCA_btl_tcp_eager_limit=${OMPI_MCA_btl_tcp_eager_limit:-$eager}
  export OMPI_MCA_btl_tcp_max_send_size=${OMPI_MCA_btl_tcp_max_send_size:-$((eager > 131072 ? eager : 131072))}
  MLACP_TESTBED_RATE=$(cat "$state_dir/rate")
  MLACP_TESTBED_DELAY=$(cat "$state_dir/delay")
  export MLACP_TESTBED_RATE MLACP_TESTBED_DELAY
  MLACP_TESTBED_NODES=$(node_count)
  export MLACP_TESTBED_NODES
  exec "$@"
}

[[ $# -ge 1 ]] || usage
sub=$1
shift
case $sub in
  up) preflight; cmd_up "$@" ;;
  down) preflight; cmd_down ;;
  hostfile) cmd_hostfile "$@" ;;
  run) preflight; cmd_run "$@" ;;
  status) preflight; cmd_status ;;
  bytes) preflight; cmd_bytes ;;
  -h | --help | help) usage ;;
  *) echo "netns-cluster: unknown subcommand '$sub'" >&2; usage ;;
esac
