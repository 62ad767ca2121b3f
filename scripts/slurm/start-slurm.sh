#!/usr/bin/env bash
# Starts a private single-node Slurm (munged, slurmctld, slurmd from Debian's packages) on this machine, for the
# ctests labelled `slurm` (cmake/MlacpSlurmTests.cmake). Idempotent: installs the packages when missing, writes
# the config, starts only what is not running, then waits (bounded) until the node is idle. Needs root.
#
#   ./scripts/slurm/start-slurm.sh                  # everything under /run/mlacp-slurm
#   export SLURM_CONF=/run/mlacp-slurm/slurm.conf   # then srun, sinfo, squeue use it
#   ./scripts/slurm/stop-slurm.sh
#
# MLACP_SLURM_DIR (default /run/mlacp-slurm) holds the config, state, logs and pid files; MLACP_SLURM_CPUS
# (default 4) is the CPU count the node advertises, whatever the machine has, so that `srun -n 4` runs on 2 cores;
# MLACP_SLURM_WAIT_S (default 60) bounds the wait for the node.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${MLACP_SLURM_DIR:-/run/mlacp-slurm}
cpus=${MLACP_SLURM_CPUS:-4}
wait_s=${MLACP_SLURM_WAIT_S:-60}
conf=$dir/slurm.conf

die() {
  echo "start-slurm: $*" >&2
  for log in "$dir/slurmctld.log" "$dir/slurmd.log" /var/log/munge/munged.log; do
    [[ -s $log ]] && { echo "---- last lines of $log" >&2; tail -n 15 "$log" >&2; }
  done
  exit 1
}
# alive <pid file> <process name>: the pid file names a live process (not a zombie) of that name.
alive() {
  local pid stat
  [[ -r $1 ]] && pid=$(<"$1") && [[ $pid =~ ^[0-9]+$ ]] && stat=$(cat "/proc/$pid/stat" 2>/dev/null) &&
    [[ $stat == "$pid ($2) "[^Z]* ]]
}

[[ $(id -u) -eq 0 ]] || die "needs root (it starts munged, slurmctld and slurmd)"

# ---- packages (scripts/setup-deps.sh skips what is installed) -----------------------------------------------------
"$here/../setup-deps.sh" munge slurmctld slurmd slurm-client

# ---- munge: use the machine's munged when it answers, else start one (as user munge) ------------------------------
export SLURM_CONF=$conf
install -d -m 0755 "$dir"
if ! timeout 10 munge -n </dev/null 2>/dev/null | timeout 10 unmunge >/dev/null 2>&1; then
  if [[ ! -s /etc/munge/munge.key ]]; then
    echo "start-slurm: creating /etc/munge/munge.key"
    install -d -o munge -g munge -m 0700 /etc/munge
    mungekey --create --keyfile=/etc/munge/munge.key
  fi
  chown munge:munge /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
  rm -f /run/munge/munged.pid
  runuser -u munge -- /usr/sbin/munged </dev/null >/dev/null 2>&1 || die "munged did not start"
  # Ours: stop-slurm.sh stops it.
  cp /run/munge/munged.pid "$dir/munged.pid" 2>/dev/null || die "munged wrote no /run/munge/munged.pid"
  timeout 10 munge -n </dev/null | timeout 10 unmunge >/dev/null || die "munged does not answer"
fi

# ---- slurm.conf ---------------------------------------------------------------------------------------------------
host=$(hostname -s)
install -d -m 0755 "$dir/ctld" "$dir/spool" "$dir/pmix"
cat >"$conf.new" <<CONF
# Written by mlacp's scripts/slurm/start-slurm.sh: a private single-node cluster for the tests.
ClusterName=mlacp
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# No systemd or cgroups here: track processes by parent pid, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# Debian's Open MPI works under srun with PMIx only (pmi2 fails).
MpiDefault=pmix
# The node advertises $cpus CPUs whatever the machine has; a request above that fails at once instead of pending.
SlurmdParameters=config_overrides
EnforcePartLimits=ALL
ReturnToService=2
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MailProg=/bin/true
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
# mpi.conf, next to this file, sets PMIxCliTmpDirBase=$dir/pmix.
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=mlacp Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
# PMIx's per-job directories (spmix_appdir_<uid>_<job>.<step>, in /tmp by default) live with the job id counter
# (StateSaveLocation): a stale one that a killed job left in /tmp fails the launch of a later job with the same id
# once the ids start again from 1 (new state dir, reboot).
printf 'PMIxCliTmpDirBase=%s\n' "$dir/pmix" >"$dir/mpi.conf.new"
if cmp -s "$conf.new" "$conf" && cmp -s "$dir/mpi.conf.new" "$dir/mpi.conf"; then
  rm -f "$conf.new" "$dir/mpi.conf.new"
else
  # A changed config needs fresh daemons.
  mv "$conf.new" "$conf"
  mv "$dir/mpi.conf.new" "$dir/mpi.conf"
  "$here/stop-slurm.sh" --keep-munge >/dev/null
fi

# ---- daemons (they fork into the background; keep them off the caller's stdout so ctest does not wait on them) ----
if ! alive "$dir/slurmctld.pid" slurmctld; then
  rm -f "$dir/slurmctld.pid"
  # This start's log alone; the previous one is kept.
  [[ -f $dir/slurmctld.log ]] && mv -f "$dir/slurmctld.log" "$dir/slurmctld.log.1"
  slurmctld -f "$conf" -c -i </dev/null >/dev/null 2>&1 || die "slurmctld did not start"
fi
if ! alive "$dir/slurmd.pid" slurmd; then
  rm -f "$dir/slurmd.pid"
  [[ -f $dir/slurmd.log ]] && mv -f "$dir/slurmd.log" "$dir/slurmd.log.1"
  slurmd -f "$conf" </dev/null >/dev/null 2>&1 || die "slurmd did not start"
fi

# ---- wait until the node takes jobs -------------------------------------------------------------------------------
state=""
deadline=$((SECONDS + wait_s))
while ((SECONDS < deadline)); do
  state=$(timeout 5 sinfo -h -n "$host" -o %t 2>/dev/null || true)
  case $state in
    idle | mix | alloc | comp) break ;;
    down | drain | drng | fail) timeout 5 scontrol update NodeName="$host" State=RESUME >/dev/null 2>&1 || true ;;
  esac
  sleep 0.5
done
case $state in
  idle | mix | alloc | comp) ;;
  *) die "node $host not idle after ${wait_s}s (sinfo state: '${state:-no answer}')" ;;
esac
echo "start-slurm: node $host up ($state, $cpus CPUs); export SLURM_CONF=$conf"
