#!/usr/bin/env bash
# Runs a command on a simulated cluster link: inside a private network namespace (unshare -n) whose loopback is
# rate-limited with a token-bucket filter, with Open MPI forced onto TCP over that loopback. Every rank of an mpirun
# started by the command talks through the limited link (shared memory is switched off).
#
#   sudo ./scripts/netns-link.sh mpirun -n 2 build-release/perf_tests/mlacp-perf-overlap --transport-label tcp-lo
#   RATE=10gbit ./scripts/netns-link.sh ...      # default 2gbit; any tc rate (e.g. 500mbit)
#   BURST=256kb LATENCY=50ms                     # the tbf's other parameters (defaults as shown)
#
# Needs root (CAP_SYS_ADMIN for the namespace, CAP_NET_ADMIN for tc) and tc from iproute2.
set -euo pipefail

rate=${RATE:-2gbit}
burst=${BURST:-256kb}
latency=${LATENCY:-50ms}

if [[ $# -eq 0 ]]; then
  echo "usage: [RATE=2gbit] $0 <command> [args...]" >&2
  exit 2
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "netns-link: needs root (a private network namespace and tc); run it with sudo" >&2
  exit 1
fi
if ! command -v tc >/dev/null 2>&1; then
  echo "netns-link: tc not found: install iproute2 (scripts/setup-deps.sh installs it)" >&2
  exit 1
fi
if ! command -v unshare >/dev/null 2>&1; then
  echo "netns-link: unshare not found: install util-linux" >&2
  exit 1
fi

# Open MPI: TCP over lo only (no shared memory, no other interface), as environment so that any mpirun inherits it.
export OMPI_MCA_btl=tcp,self
export OMPI_MCA_btl_tcp_if_include=lo
export OMPI_MCA_oob_tcp_if_include=lo
export OMPI_MCA_btl_vader_single_copy_mechanism=none

exec unshare -n -- bash -c '
set -euo pipefail
ip link set lo up
if ! tc qdisc add dev lo root tbf rate "$1" burst "$2" latency "$3"; then
  echo "netns-link: tc qdisc add dev lo root tbf rate $1 burst $2 latency $3 failed" >&2
  exit 1
fi
echo "netns-link: $(tc qdisc show dev lo | head -n 1)" >&2
shift 3
exec "$@"
' netns-link "$rate" "$burst" "$latency" "$@"
