# shellcheck shell=bash
# Sourced by the simulated cluster's test drivers (test_locality.sh, test_on_nodes.sh): skip() and fail(),
# require_testbed <mpiexec>, which exits 77 (ctest: skipped) without root, network namespaces, the tools
# scripts/netns-cluster.sh needs, or Open MPI's mpirun as the launcher, and start_cluster (below).
skip() {
  echo "skipped: needs root and network namespaces ($*)"
  exit 77
}
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
require_testbed() {
  [[ $(id -u) -eq 0 ]] || skip "not root"
  local tool
  for tool in ip tc unshare nsenter; do
    command -v "$tool" >/dev/null 2>&1 || skip "$tool not installed"
  done
  local probe_ns=mlacp-probe-$$
  ip netns add "$probe_ns" 2>/dev/null || skip "ip netns add is not permitted here"
  ip netns delete "$probe_ns"
  "$1" --version 2>/dev/null | grep -Eq "Open MPI|OpenRTE" || skip "the launcher $1 is not Open MPI's mpirun"
}

# start_cluster <netns-cluster.sh> <nodes>: brings up the cluster, sets `work` to a fresh directory holding its
# hostfile ($work/hosts), and tears both down when the script exits.
start_cluster() {
  work=$(mktemp -d)
  cluster_script=$1
  trap '"$cluster_script" down >/dev/null 2>&1; rm -rf "$work"' EXIT
  "$1" up "$2" || fail "netns-cluster.sh up $2 failed"
  "$1" hostfile "$2" >"$work/hosts" || fail "netns-cluster.sh hostfile failed"
}
