#!/usr/bin/env bash
# Stops the private Slurm that scripts/slurm/start-slurm.sh started: cancels its jobs, stops slurmd and slurmctld (and
# munged when start-slurm.sh started it) by the pids in their pid files, and removes the pid files. Idempotent; exits
# 0 when nothing runs. `--keep-munge` leaves munged running.
set -euo pipefail
dir=${MLACP_SLURM_DIR:-/run/mlacp-slurm}
keep_munge=0
[[ ${1:-} == --keep-munge ]] && keep_munge=1
export SLURM_CONF=$dir/slurm.conf

# alive <pid> <name>: a live process (not a zombie) of that name.
alive() {
  local stat
  [[ $1 =~ ^[0-9]+$ ]] && stat=$(cat "/proc/$1/stat" 2>/dev/null) && [[ $stat == "$1 ($2) "[^Z]* ]]
}
# pid_of <name>: the pid in $dir/<name>.pid when it names a live <name> (a stale pid file may name another process).
pid_of() {
  local pid=""
  [[ -r $dir/$1.pid ]] && pid=$(<"$dir/$1.pid")
  alive "$pid" "$1" && echo "$pid"
}

# stop <name>... : TERM each daemon, wait up to 10 s for all of them, KILL what is left; remove the pid files.
stop() {
  local name pid left stopped=()
  declare -A pids=()
  for name in "$@"; do
    if pid=$(pid_of "$name"); then
      kill -TERM "$pid" 2>/dev/null || true
      pids[$name]=$pid
      stopped+=("$name ($pid)")
    fi
  done
  for ((i = 0; i < 100; i++)); do
    left=0
    for name in "${!pids[@]}"; do alive "${pids[$name]}" "$name" && left=1; done
    [[ $left -eq 0 ]] && break
    sleep 0.1
  done
  for name in "${!pids[@]}"; do
    if alive "${pids[$name]}" "$name"; then
      echo "stop-slurm: $name (${pids[$name]}) ignored TERM for 10 s; killing it" >&2
      kill -KILL "${pids[$name]}" 2>/dev/null || true
    fi
  done
  for name in "$@"; do rm -f "$dir/$name.pid"; done
  [[ ${#stopped[@]} -eq 0 ]] || echo "stop-slurm: stopped ${stopped[*]}"
}

# Jobs left by a test that timed out (ctest killed srun): cancel them and let them end (up to 20 s) while slurmctld
# still runs, so that their slurmstepd reports the end and exits.
if [[ -r $SLURM_CONF ]] && pid_of slurmctld >/dev/null; then
  mapfile -t jobs < <(timeout 10 squeue -h -o %A 2>/dev/null || true)
  if [[ ${#jobs[@]} -gt 0 ]]; then
    echo "stop-slurm: cancelling jobs ${jobs[*]}"
    timeout 10 scancel "${jobs[@]}" >/dev/null 2>&1 || true
    for ((i = 0; i < 40; i++)); do
      [[ -z $(timeout 5 squeue -h -o %A 2>/dev/null) ]] && break
      sleep 0.5
    done
  fi
fi
stop slurmd slurmctld

# A slurmstepd that outlived its slurmd (it runs in $dir), and the tasks under it.
leftover=()
for proc in /proc/[0-9]*; do
  pid=${proc#/proc/}
  alive "$pid" slurmstepd && [[ $(readlink "$proc/cwd" 2>/dev/null) == "$dir"* ]] && leftover+=("$pid")
done
for ((i = 0; i < ${#leftover[@]}; i++)); do # breadth-first: the children of each are appended
  for proc in /proc/[0-9]*; do
    stat=$(cat "$proc/stat" 2>/dev/null) || continue
    read -r _ ppid _ <<<"${stat##*) }"
    [[ $ppid == "${leftover[i]}" ]] && leftover+=("${proc#/proc/}")
  done
done
if [[ ${#leftover[@]} -gt 0 ]]; then
  echo "stop-slurm: killing leftover slurmstepd and its tasks: ${leftover[*]}"
  kill -KILL "${leftover[@]}" 2>/dev/null || true
fi

# What the jobs left behind, now that none runs (the job ids go on from the state in $dir, so none is reused).
rm -rf "$dir"/pmix/* "$dir"/spool/pmix.* "$dir"/spool/stepd.*

if [[ $keep_munge -eq 0 ]]; then
  # munged removes its own pid file on exit; remove it when a KILL left it.
  ours=0
  [[ -r $dir/munged.pid ]] && cmp -s "$dir/munged.pid" /run/munge/munged.pid && ours=1
  stop munged
  if [[ $ours -eq 1 ]]; then rm -f /run/munge/munged.pid; fi
fi
exit 0
