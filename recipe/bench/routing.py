"""SAM on veRL's trainer with one and two vLLM servers: what prompt-affine routing keeps of SAM's sibling and
cross-epoch sharing. Seeded runs of the same short DAPO job (backend=verl on this CPU, spec=sam): one replica;
two replicas with veRL's least-loaded balancer (a prompt's samples spread over both); two replicas with the
recipe's prompt-affinity router (recipe/dapo/routing.py). Each for two prompt pools: 8 prompts, which come back
every other step (siblings and earlier epochs to draft from), and 256, which do not come back within the run
(siblings only). Writes ``results/verl/routing.{md,csv}``.

    python -m recipe.bench routing --steps 6

Rollout metrics are the servers' own (server_timeline.py), averaged over steps 2.. (step 1 has no earlier
epoch to draft from); the routing columns come from the router's log (``server_timeline/routing.jsonl``), which
only the prompt-affinity router writes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from recipe.paths import REPO_ROOT

OUT = REPO_ROOT / "results" / "verl"
CONFIG = [
    "backend=verl", "trainer.device=cpu", "spec=sam",
    "data.train_batch_size=4", "data.gen_batch_size=4", "actor_rollout_ref.rollout.n=8",
    "data.max_response_length=256", "reward.reward_kwargs.overlong_buffer_cfg.len=64", "data.val_max_samples=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "trainer.save_freq=0", "trainer.val_before_train=false", "recipe.progress_bar=false",
]  # fmt: skip
POOLS = (8, 256)  # data.train_max_samples
RUNS = (
    ("1 replica", 1, "configs/router/prompt_affinity.yaml"),
    ("2 replicas, veRL least-loaded", 2, "null"),
    ("2 replicas, prompt affinity", 2, "configs/router/prompt_affinity.yaml"),
)
ROLLOUT = (
    ("spec_accept_length", "accept length"),
    ("spec_draft_acceptance_rate", "draft acceptance"),
    ("tokens_per_request_step", "tokens/request-step"),
    ("tail_tokens_per_request_step", "tail tokens/request-step"),
)


def routing_stats(log: Path) -> dict:
    """Requests per server and the share of prompts whose every request went to one server."""
    if not log.is_file():
        return {}
    rows = pd.DataFrame([json.loads(line) for line in log.read_text().splitlines()])
    servers_per_prompt = rows.groupby("prompt")["server"].nunique()
    per_server = rows["server"].value_counts()
    return {
        "prompts_on_one_server": float((servers_per_prompt == 1).mean()),
        "requests_per_server": "/".join(str(int(v)) for v in sorted(per_server.to_numpy(), reverse=True)),
    }


def run_once(name: str, pool: int, replicas: int, router: str, steps: int, work: Path) -> dict:
    out = work / f"pool{pool}_{name.replace(' ', '_').replace(',', '')}"
    shutil.rmtree(out, ignore_errors=True)
    args = [sys.executable, "-m", "recipe.dapo", *CONFIG, f"data.train_max_samples={pool}", f"trainer.n_gpus_per_node={replicas}",
            f"actor_rollout_ref.rollout.router_config_path={router}", f"trainer.total_training_steps={steps}",
            f"trainer.test_freq={steps}", f"trainer.default_local_dir={out}"]  # fmt: skip
    start = time.perf_counter()
    log = out.with_suffix(".log")
    with log.open("w") as fh:
        code = subprocess.run(args, cwd=REPO_ROOT, stdout=fh, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise RuntimeError(f"{name}: the run exited with {code}; see {log}")
    history = pd.DataFrame([json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()])
    later = history[history["step"] >= 2]
    row = {
        "prompt pool": pool,
        "run": name,
        "replicas": replicas,
        "wall_s": time.perf_counter() - start,
        "steps": steps,
    }
    row.update({label: float(later[f"rollout/{key}"].mean()) for key, label in ROLLOUT})
    row.update(routing_stats(out / "server_timeline" / "routing.jsonl"))
    return row


def write(rows: list[dict], steps: int) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    table = pd.DataFrame(rows)
    one = table.groupby("prompt pool")["tokens/request-step"].transform("first")  # each pool's 1-replica run
    table["vs 1 replica"] = table["tokens/request-step"] / one
    table.to_csv(OUT / "routing.csv", index=False)
    lines = [
        "# SAM with one and two vLLM servers on veRL's trainer: prompt-affine routing",
        "",
        f"`python -m recipe.bench routing --steps {steps}` (backend=verl on the 2-core CPU, spec=sam, "
        "4 prompts x 8 samples per round; a pool of 8 prompts comes back every other step, one of 256 does not "
        "within the run; 256 response tokens; seed 0). Rollout metrics are the servers' own, averaged over "
        "steps 2..; 'vs 1 replica' compares tokens per request-step within a pool.",
        "",
        table.drop(columns=["replicas", "steps"]).to_markdown(index=False, floatfmt=".3f"),
        "",
    ]
    (OUT / "routing.md").write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="training steps per run")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_routing_"))
    rows = []
    runs = [(pool, *run) for pool in POOLS for run in RUNS]
    for i, (pool, name, replicas, router) in enumerate(runs, 1):
        print(f"[{i}/{len(runs)}] pool {pool}: {name} ...", flush=True)
        rows.append(run_once(name, pool, replicas, router, args.steps, work))
        print(json.dumps(rows[-1]), flush=True)
    write(rows, args.steps)
    print(f"wrote {OUT / 'routing.md'}; runs kept in {work}")


if __name__ == "__main__":
    main()
