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
# shellcheck source-path=SCRIPTDIR source=testbed_checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/testbed_checks.sh"
require_testbed "${mpiexec[0]}"
[[ -x $binary ]] || fail "no test binary at $binary"

start_cluster "$cluster" 2
timeout 240 "$cluster" run -- "${mpiexec[@]}" -np 4 --hostfile "$work/hosts" --map-by ppr:2:node \
  -x MLACP_TESTBED_NODES=2 -x OPENBLAS_NUM_THREADS=1 "$binary"
