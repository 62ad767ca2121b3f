#!/usr/bin/env bash
# Runs an MPI test binary on the simulated cluster (scripts/netns-cluster.sh): 2 nodes of 2 ranks each, with
# MLACP_TESTBED_NODES=2 in every rank's environment, so that the checks that depend on placement (ranks on several
# nodes, collectives across them) run where they hold. ctest testbed_* tests call it.
#
#   test_on_nodes.sh <test binary> <netns-cluster.sh> [<mpiexec> [<mpiexec flags>...]]
#
# Exits 77 (ctest: skipped) without root, network namespaces, the tools, or Open MPI's mpirun; otherwise with the
# run's status. Destroys the cluster (and any other netns-cluster.sh cluster: the names are fixed) on exit.
set -uo pipefail

binary=${1:?usage: $0 <test binary> <netns-cluster.sh> [mpiexec [flags...]]}
cluster=${2:?usage: $0 <test binary> <netns-cluster.sh> [mpiexec [flags...]]}
shift 2
mpiexec=(mpirun)
[[ $# -gt 0 ]] && mpiexec=("$@")
skip() {
  echo "skipped: needs root and network namespaces ($*)"
  exit 77
}

[[ $(id -u) -eq 0 ]] || skip "not root"
for tool in ip tc unshare nsenter; do
  command -v "$tool" >/dev/null 2>&1 || skip "$tool not installed"
done
probe_ns=mlacp-probe-$$
ip netns add "$probe_ns" 2>/dev/null || skip "ip netns add is not permitted here"
ip netns delete "$probe_ns"
"${mpiexec[0]}" --version 2>/dev/null | grep -Eq "Open MPI|OpenRTE" || skip "the launcher ${mpiexec[0]} is not Open MPI's mpirun"
[[ -x $binary ]] || { echo "FAIL: no test binary at $binary" >&2; exit 1; }

work=$(mktemp -d)
trap '"$cluster" down >/dev/null 2>&1; rm -rf "$work"' EXIT
"$cluster" up 2 || { echo "FAIL: netns-cluster.sh up 2 failed" >&2; exit 1; }
"$cluster" hostfile 2 >"$work/hosts" || { echo "FAIL: netns-cluster.sh hostfile failed" >&2; exit 1; }
timeout 240 "$cluster" run -- "${mpiexec[@]}" -np 4 --hostfile "$work/hosts" --map-by ppr:2:node \
  -x MLACP_TESTBED_NODES=2 -x OPENBLAS_NUM_THREADS=1 "$binary"
