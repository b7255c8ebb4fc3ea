"""The same seeded short DAPO run on both backends, side by side: step time broken down (veRL's ``timing_s/*``
names, which the local backend logs too), peak memory (PSS summed over every process of the run) and the
process count, for each speculative mode asked for. Writes ``results/verl/backends.{md,csv}``.

    python -m recipe.bench backends --steps 4 --specs off,sam

Both backends get the embedded base model and the same overrides; the first step of a veRL run includes its
vLLM server's first generation, so the table reports steps 2.. (the mean over them) and the start-up apart.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd
import psutil

from recipe.dapo.job import JOB_ENV, job_processes
from recipe.paths import REPO_ROOT

OUT = REPO_ROOT / "results" / "verl"
PHASES = ("gen", "reward", "old_log_prob", "adv", "update_actor", "update_weights", "testing", "step")
ROLLOUT = (
    ("throughput_tok_s", "rollout tok/s"),
    ("tokens_per_request_step", "tokens/request-step"),
    ("spec_accept_length", "accept length"),
)
CONFIG = [
    "data.train_batch_size=2", "data.gen_batch_size=2", "actor_rollout_ref.rollout.n=4",
    "data.max_response_length=128", "reward.reward_kwargs.overlong_buffer_cfg.len=32", "data.val_max_samples=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "trainer.save_freq=0", "trainer.val_before_train=false", "recipe.progress_bar=false", "trainer.device=cpu",
]  # fmt: skip


class Sampler(threading.Thread):
    """Peak PSS (GiB) and process count of one job, sampled once a second."""

    def __init__(self, job_id: str):
        super().__init__(daemon=True)
        self.job_id, self.peak_gib, self.max_procs, self.done = job_id, 0.0, 0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(1.0):
            procs = job_processes(self.job_id)
            pss = 0
            for p in procs:
                try:
                    pss += p.memory_full_info().pss
                except psutil.Error:
                    pass
            self.peak_gib = max(self.peak_gib, pss / 2**30)
            self.max_procs = max(self.max_procs, len(procs))


def run_once(backend: str, spec: str, steps: int, work: Path) -> dict:
    out = work / f"{backend}-{spec}"
    shutil.rmtree(out, ignore_errors=True)
    job_id = f"bench-{backend}-{spec}-{time.time_ns()}"
    args = [sys.executable, "-m", "recipe.dapo", f"backend={backend}", f"spec={spec}", *CONFIG,
            f"trainer.total_training_steps={steps}", f"trainer.test_freq={steps}", f"trainer.default_local_dir={out}"]  # fmt: skip
    sampler = Sampler(job_id)
    sampler.start()
    start = time.perf_counter()
    log = work / f"{backend}-{spec}.log"
    with log.open("w") as fh:
        code = subprocess.run(
            args, cwd=REPO_ROOT, env={**os.environ, JOB_ENV: job_id}, stdout=fh, stderr=subprocess.STDOUT
        ).returncode
    wall = time.perf_counter() - start
    sampler.done.set()
    sampler.join()
    if code != 0:
        raise RuntimeError(f"{backend} spec={spec} exited with {code}; log: {log}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "timing_s/step" in r]
    later = train[1:] or train
    stats = {f"{p} s": sum(r.get(f"timing_s/{p}", 0.0) for r in later) / len(later) for p in PHASES}
    first_step = train[0]["timing_s/step"]
    return {
        "backend": backend,
        "spec": spec,
        "steps": len(train),
        "wall s": wall,
        "start-up s": wall - sum(r["timing_s/step"] for r in train),
        "step 1 s": first_step,
        **stats,
        "response length": sum(r["response_length/mean"] for r in later) / len(later),
        # the rollout timeline's metrics (recorded by the loop locally, inside the vLLM server on veRL)
        **{label: sum(r.get(f"rollout/{key}", float("nan")) for r in later) / len(later) for key, label in ROLLOUT},
        "peak PSS GiB": sampler.peak_gib,
        "processes": sampler.max_procs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4, help="training steps per run")
    parser.add_argument("--specs", default="off,sam", help="comma-separated spec modes")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_backends_") as tmp:
        for spec in args.specs.split(","):
            for backend in ("local", "verl"):
                print(f"{backend} spec={spec} ...", flush=True)
                results.append(run_once(backend, spec, args.steps, Path(tmp)))
                print(json.dumps(results[-1]), flush=True)
    df = pd.DataFrame(results)
    args.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out / "backends.csv", index=False, float_format="%.3f")
    command = "python -m recipe.bench backends " + " ".join(sys.argv[1:])
    (args.out / "backends.md").write_text(
        "# The same short DAPO run on both backends\n\n"
        f"`{command}` (2-core CPU, 1M-parameter embedded model, 2 prompts x 4 samples, 128 response tokens).\n"
        "Phase columns: mean seconds per training step over steps 2.. (veRL's `timing_s/*` names); start-up: wall "
        "time outside training steps (engine or Ray/vLLM start, validation, shutdown); rollout columns: the rollout "
        "timeline's `rollout/*` metrics (engine time only); peak PSS and processes: over every process of the run, "
        "sampled each second.\n\n" + df.to_markdown(index=False, floatfmt=".2f") + "\n"
    )
    print(df.to_markdown(index=False, floatfmt=".2f"))


if __name__ == "__main__":
    main()
