#!/usr/bin/env bash
# The simulated cluster's locality test (ctest testbed_locality): on 2 nodes of scripts/netns-cluster.sh with 2 ranks
# each, bytes between ranks of one node never touch the limited links (shared memory), bytes across nodes do (TCP).
#
#   test_locality.sh <locality_probe> <netns-cluster.sh> [<mpiexec> [<mpiexec flags>...]]
#
# 1. ranks 0 and 1 (both on mlacp-node0) exchange 64 MiB each way: every link counter grows by < 1 MiB (the runtime's
#    out-of-band chatter only);
# 2. ranks 0 (mlacp-node0) and 2 (mlacp-node1) exchange 64 MiB each way: each node's tx and rx grow by >= 64 MiB
#    (and < 80 MiB: headers, not a copy too many);
# 3. the ranks report two distinct node names, ranks 0-1 on one and 2-3 on the other.
# Exits 77 (ctest: skipped) without root, network namespaces, the tools, or Open MPI's mpirun. Destroys the cluster
# (and any other netns-cluster.sh cluster: the names are fixed) on exit.
set -uo pipefail

probe=${1:?usage: $0 <locality_probe> <netns-cluster.sh> [mpiexec [flags...]]}
cluster=${2:?usage: $0 <locality_probe> <netns-cluster.sh> [mpiexec [flags...]]}
shift 2
mpiexec=(mpirun)
[[ $# -gt 0 ]] && mpiexec=("$@")
mib=64
# shellcheck source-path=SCRIPTDIR source=testbed_checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/testbed_checks.sh"
require_testbed "${mpiexec[0]}"
[[ -x $probe ]] || fail "no probe at $probe"

start_cluster "$cluster" 2

# bytes_of <file> <node> <tx|rx>
bytes_of() {
  sed -n "s/^$2 .*$3=\([0-9]*\).*/\1/p" "$1"
}

# run_pair <a> <b> <tag>: the probe on 4 ranks, 2 per node, pair (a, b) exchanging; counters before and after.
run_pair() {
  "$cluster" bytes >"$work/$3.before" || fail "netns-cluster.sh bytes failed"
  echo "== ranks $1 and $2 exchange $mib MiB each way"
  if ! timeout 120 "$cluster" run -- "${mpiexec[@]}" -np 4 --hostfile "$work/hosts" --map-by ppr:2:node "$probe" \
    --mib "$mib" "$1" "$2" >"$work/$3.out" 2>&1; then
    cat "$work/$3.out"
    fail "the probe's run for pair $1 $2 failed"
  fi
  cat "$work/$3.out"
  grep -q "pair $1 $2 exchanged $mib MiB each way" "$work/$3.out" || fail "pair $1 $2 did not report its exchange"
  "$cluster" bytes >"$work/$3.after" || fail "netns-cluster.sh bytes failed"
}

delta() { # <tag> <node> <tx|rx>
  echo $(($(bytes_of "$work/$1.after" "$2" "$3") - $(bytes_of "$work/$1.before" "$2" "$3")))
}

host_of() { # <tag> <rank>
  sed -n "s/^rank $2 host \(.*\)$/\1/p" "$work/$1.out" | head -n 1
}

mib_bytes=$((mib * 1024 * 1024))
status=0

run_pair 0 1 intra
for node in mlacp-node0 mlacp-node1; do
  for dir in tx rx; do
    d=$(delta intra "$node" "$dir")
    echo "intra-node pair: $node $dir grew by $d bytes"
    if [[ $d -ge $((1024 * 1024)) ]]; then
      echo "FAIL: $node $dir grew by $d bytes (>= 1 MiB) for a pair inside mlacp-node0: shared memory not used" >&2
      status=1
    fi
  done
done

run_pair 0 2 cross
for node in mlacp-node0 mlacp-node1; do
  for dir in tx rx; do
    d=$(delta cross "$node" "$dir")
    echo "cross-node pair: $node $dir grew by $d bytes ($mib MiB = $mib_bytes)"
    if [[ $d -lt $mib_bytes || $d -ge $((mib_bytes * 5 / 4)) ]]; then
      echo "FAIL: $node $dir grew by $d bytes, expected [$mib_bytes, $((mib_bytes * 5 / 4))) for $mib MiB across" >&2
      status=1
    fi
  done
done

for tag in intra cross; do
  h0=$(host_of "$tag" 0) h1=$(host_of "$tag" 1) h2=$(host_of "$tag" 2) h3=$(host_of "$tag" 3)
  echo "$tag: ranks 0-3 on $h0 $h1 $h2 $h3"
  if [[ ! $h0 =~ ^mlacp-node[01]$ || ! $h2 =~ ^mlacp-node[01]$ || $h0 != "$h1" || $h2 != "$h3" || $h0 == "$h2" ]]; then
    echo "FAIL: expected ranks 0-1 on one mlacp-node and 2-3 on the other, got $h0 $h1 $h2 $h3" >&2
    status=1
  fi
done

[[ $status -eq 0 ]] && echo "testbed locality: OK"
exit "$status"
