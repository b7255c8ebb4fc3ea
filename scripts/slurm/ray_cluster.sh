#!/usr/bin/env bash
# A DAPO job's set-up inside a Slurm allocation, sourced by the sbatch scripts of this folder.
#
#   job_start                                                          checks that every node sees the checkout
#                                                                      ($REPO), activates its .venv, exports what
#                                                                      every process needs
#   ray_cluster_up <accelerators per node> [extra `ray start` args...]   head on the first node, workers on
#                                                                      the rest (srun), waits until all
#                                                                      nodes joined; exports RAY_ADDRESS
#   ray_cluster_down                                                   stops Ray on every node
#
# Environment: REPO (the checkout, default the submit directory), VENV ($REPO/.venv), RAY_PORT (6379),
# RAY_WAIT_S (600, how long to wait for the workers).

job_start() {
  # the checkout must be on a filesystem every node mounts: name it before anything starts
  if ! srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --overlap test -f "$REPO/pyproject.toml"; then
    echo "slurm: the checkout $REPO (REPO) is not on every node of $SLURM_JOB_NODELIST; put it and its .venv on a" \
      "filesystem all nodes mount and submit from there (or set REPO)" >&2
    return 2
  fi
  # shellcheck source=/dev/null
  source "${VENV:-$REPO/.venv}/bin/activate"
  export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" # sam.vllm.SAMProposer must import in every vLLM worker
  export VLLM_ALLOW_INSECURE_SERIALIZATION=1
  cd "$REPO" || return 2
}

# The address Slurm reaches a node at (its NodeAddr, the node's name unless slurm.conf says otherwise), as an IP.
node_ip() {
  local addr
  addr=$(scontrol show node "$1" | grep -oP 'NodeAddr=\K\S+')
  getent ahostsv4 "$addr" | awk 'NR == 1 {print $1}'
}

ray_cluster_up() {
  local per_node=$1
  shift
  local -a nodes
  mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
  local head=${nodes[0]}
  local port=${RAY_PORT:-6379}
  local head_ip
  head_ip=$(node_ip "$head")
  export RAY_ADDRESS="$head_ip:$port"
  # one authentication mode for the head, the workers and every client (the launcher, veRL's driver): `ray start`
  # turns token authentication on by default while a client without RAY_AUTH_MODE does not send the token
  export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}
  echo "ray: head $head ($RAY_ADDRESS), ${#nodes[@]} node(s), $per_node accelerator(s) each"
  srun --nodes=1 --ntasks=1 --overlap -w "$head" \
    ray start --head --node-ip-address="$head_ip" --port="$port" "$@" --block &
  sleep 15
  local node
  for node in "${nodes[@]:1}"; do
    srun --nodes=1 --ntasks=1 --overlap -w "$node" \
      ray start --address="$RAY_ADDRESS" --node-ip-address="$(node_ip "$node")" "$@" --block &
  done
  local deadline=$((SECONDS + ${RAY_WAIT_S:-600}))
  # the head's address, not "auto": that reads /tmp/ray's pointer to the last cluster started on this host, which can
  # be another job's (or a dead one's)
  until python - "${#nodes[@]}" "$RAY_ADDRESS" <<'PY'
import sys

import ray

ray.init(address=sys.argv[2], logging_level="ERROR")
alive = sum(1 for n in ray.nodes() if n["Alive"])
print(f"ray: {alive}/{sys.argv[1]} nodes alive")
sys.exit(0 if alive >= int(sys.argv[1]) else 1)
PY
  do
    if ((SECONDS > deadline)); then
      echo "ray: workers did not join within ${RAY_WAIT_S:-600}s" >&2
      return 1
    fi
    sleep 10
  done
}

ray_cluster_down() {
  srun --overlap --ntasks-per-node=1 ray stop --force >/dev/null 2>&1 || true
}
