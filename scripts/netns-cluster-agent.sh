#!/usr/bin/env bash
# The "ssh" of the simulated cluster (scripts/netns-cluster.sh): Open MPI's plm_rsh calls it as it calls ssh,
#   netns-cluster-agent.sh [options] <host> <command words...>
# and it runs the command inside that node's network and UTS namespaces (/run/netns/<host>, /run/mlacp-uts/<host>),
# with the caller's environment (unlike ssh, nothing is reset: the orted inherits mpirun's OMPI_MCA_* settings).
# Open MPI passes the remote command as words meant for a shell ("PATH=...; export PATH; ... orted ..."), so they are
# joined with spaces and run by /bin/sh -c, as sshd would do.
set -euo pipefail
while [[ $# -gt 0 && $1 == -* ]]; do shift; done # ssh-like options (-x, ...) mean nothing here
if [[ $# -lt 2 ]]; then
  echo "netns-cluster-agent: usage: $0 [options] <host> <command...>" >&2
  exit 255
fi
host=${1%%.*}
shift
if [[ ! -e /run/netns/$host || ! -e /run/mlacp-uts/$host ]]; then
  echo "netns-cluster-agent: no simulated node '$host' (scripts/netns-cluster.sh up N creates them)" >&2
  exit 255
fi
exec nsenter --net="/run/netns/$host" --uts="/run/mlacp-uts/$host" -- /bin/sh -c "$*"
