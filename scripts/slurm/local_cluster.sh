#!/usr/bin/env bash
# A real Slurm cluster on this one machine, for testing the sbatch scripts: munge, slurmctld and two slurmd
# daemons emulating nodes n1 (127.0.0.1) and n2 (127.0.0.2), configured by a slurm.conf written here.
#
#   scripts/slurm/local_cluster.sh up   DIR    writes DIR/slurm.conf, starts the daemons, waits for both nodes
#   scripts/slurm/local_cluster.sh down DIR    cancels every job, stops the daemons, removes their state
#
# Needs Debian's slurmctld, slurmd, slurm-client and munge (apt-get install -y slurmctld slurmd slurm-client
# munge) and root (slurmd runs jobs as their user). Clients use the cluster with SLURM_CONF=DIR/slurm.conf.
set -euo pipefail

cmd=${1:?up|down}
dir=$(realpath -m "${2:?state directory}")
conf=$dir/slurm.conf
ports=${SLURM_TEST_PORT_BASE:-16810}

up() {
  mkdir -p "$dir/state" "$dir/spool"
  local host cpus mem_mb
  host=$(hostname -s)
  cpus=$(nproc)
  mem_mb=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2))
  cat >"$conf" <<EOF
ClusterName=specrollout
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ports
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/linear
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
KillWait=20
InactiveLimit=0
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$((ports + 1)) CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.2 Port=$((ports + 2)) CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=local Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
  mkdir -p "$dir/spool/n1" "$dir/spool/n2"
  if ! munge -n >/dev/null 2>&1; then # no munged answering: start one (stopped by `down`)
    mkdir -p /run/munge && chown munge:munge /run/munge
    local tries=0
    until munge -n >/dev/null 2>&1; do
      if ((tries % 10 == 0)); then
        runuser -u munge -- /usr/sbin/munged --force 2>/dev/null || true
      fi
      if ((++tries > 30)); then
        echo "slurm: munged did not start" >&2
        return 1
      fi
      sleep 1
    done
    pgrep -x munged >"$dir/munged.pid"
  fi
  SLURM_CONF=$conf slurmctld -i
  SLURM_CONF=$conf slurmd -N n1
  SLURM_CONF=$conf slurmd -N n2
  local deadline=$((SECONDS + 60))
  until [[ $(SLURM_CONF=$conf sinfo -h -N -t idle -o %N | sort -u | wc -l) -eq 2 ]]; do
    if ((SECONDS > deadline)); then
      echo "slurm: nodes not idle within 60 s" >&2
      SLURM_CONF=$conf sinfo -N >&2 || true
      tail -n 20 "$dir"/*.log >&2 || true
      return 1
    fi
    sleep 1
  done
  echo "slurm: cluster up, SLURM_CONF=$conf"
}

down() {
  [[ -f $conf ]] || return 0
  SLURM_CONF=$conf scancel --full --quiet --partition=local 2>/dev/null || true
  local pid_file
  for pid_file in "$dir"/slurmd-*.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
    if [[ -f $pid_file ]]; then
      xargs -r kill <"$pid_file" 2>/dev/null || true
    fi
  done
  sleep 2
  rm -rf "$dir/state" "$dir/spool" "$dir/munged.pid"
}

"$cmd"
