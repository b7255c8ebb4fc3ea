"""The sbatch path for real: a Slurm cluster started on this machine (scripts/slurm/local_cluster.sh: slurmctld and two
slurmd daemons, nodes n1 at 127.0.0.1 and n2 at 127.0.0.2), ``sbatch scripts/slurm/dapo_cpu.sbatch`` on both nodes:
Ray's head on n1 and a worker joining from n2 (ray_cluster.sh), veRL's trainer on that two-node cluster with SAM.

- The job appears in ``squeue``, checkpoints step 1, and ``scancel`` in the middle of step 2 leaves no process and no
  /dev/shm entry behind.
- The same job submitted again resumes from the checkpoint and runs to the end: every step's metrics are in the run
  directory, and the job leaves the queue.
- A submission whose checkout path does not exist is named in the job's output before any Ray process starts.

Needs Debian's slurmctld, slurmd, slurm-client and munge; ``make test-slurm`` installs them and runs it
(.ci/run does; results/verl/slurm.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from recipe.dapo.job import shm_entries

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "scripts" / "slurm" / "local_cluster.sh"
SBATCH = REPO / "scripts" / "slurm" / "dapo_cpu.sbatch"
STEPS = 2

pytestmark = [
    pytest.mark.skipif(
        shutil.which("slurmctld") is None, reason="Slurm is not installed (make slurm-deps installs Debian's slurm-wlm)"
    ),
    pytest.mark.skipif(
        os.environ.get("SPEC_ROLLOUT_SLURM_TEST") != "1",
        reason="make test-slurm runs it (SPEC_ROLLOUT_SLURM_TEST=1), as CI does: about 7 minutes of two Ray nodes",
    ),
]


def _job_processes(job: str) -> list[str]:
    """Live processes of the Slurm job ``job`` (Slurm puts SLURM_JOB_ID in the environment of everything a job starts:
    the batch script, srun's steps, the Ray daemons they run and every Ray worker and vLLM process under them)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.environ().get("SLURM_JOB_ID") == job:
                found.append(f"{proc.info['pid']}: {' '.join(proc.info['cmdline'] or [])[:160]}")
        except psutil.Error:
            continue
    return found


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """``SLURM_CONF`` of a running two-node cluster; the cluster is stopped and its state removed afterwards."""
    state = tmp_path_factory.mktemp("slurm")
    try:  # a cluster that came up only in part is stopped too
        subprocess.run(["bash", str(CLUSTER), "up", str(state)], check=True, timeout=120)
        yield {**os.environ, "SLURM_CONF": str(state / "slurm.conf")}
    finally:
        subprocess.run(["bash", str(CLUSTER), "down", str(state)], timeout=120)


def _submit(env: dict, out: Path, *args: str) -> str:
    done = subprocess.run(
        ["sbatch", "--parsable", f"--output={out}", str(SBATCH), *args],
        env=env, cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip().split(";")[0]


def _queued(env: dict, job: str) -> str:
    """The job's state in squeue ('' once it has left the queue)."""
    return subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%T"], env=env, capture_output=True, text=True
    ).stdout.strip()


def _wait(predicate, timeout_s: float, what: str, log: Path, job: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            tail = log.read_text()[-3000:] if log.is_file() else ""
            raise TimeoutError(f"{what} not within {timeout_s} s; live: {_job_processes(job)}; job output:\n{tail}")
        time.sleep(2)


def _run_args(model: Path, out: Path) -> list[str]:
    data = model.parent / "data"
    return [
        "spec=sam", "spec.sam.payoff=false", f"actor_rollout_ref.model.path={model}",
        f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'test.parquet'}",
        "data.train_batch_size=2", "data.gen_batch_size=2", "actor_rollout_ref.rollout.n=4",
        "data.max_response_length=96", "reward.reward_kwargs.overlong_buffer_cfg.len=32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        f"trainer.default_local_dir={out}", f"trainer.total_training_steps={STEPS}", "trainer.save_freq=1",
        "trainer.test_freq=-1", "trainer.val_before_train=false", "recipe.progress_bar=false",
    ]  # fmt: skip


def _logged_step(run: Path) -> int:
    """The last step whose metrics veRL's file logger wrote (it saves a step's checkpoint first, then logs the step)."""
    rows = [json.loads(line) for f in run.glob("tracking_from_step_*.jsonl") for line in f.read_text().splitlines()]
    return max((int(r["step"]) for r in rows if "step" in r), default=0)


def _saved_step(run: Path) -> int:
    latest = run / "latest_checkpointed_iteration.txt"
    return int(latest.read_text().strip() or 0) if latest.is_file() else 0


def test_a_job_cancelled_mid_step_leaves_nothing_and_its_resubmission_resumes(slurm, harness_model, tmp_path):
    run, shm_before = tmp_path / "run", shm_entries()
    args = _run_args(harness_model, run)
    first_log = tmp_path / "first.out"
    first = _submit(slurm, first_log, *args)
    _wait(lambda: _queued(slurm, first) == "RUNNING", 60, "the job running", first_log, first)
    # step 1 over (checkpoint saved and its metrics logged): the cancel falls in step 2. A cancel between the two
    # loses step 1's row for good (the relaunch says so and resumes from the checkpoint), which is veRL's order.
    _wait(lambda: _saved_step(run) >= 1 and _logged_step(run) >= 1, 900, "step 1 saved and logged", first_log, first)
    assert "ray: 2/2 nodes alive" in first_log.read_text()  # the worker joined from the second node

    subprocess.run(["scancel", first], env=slurm, check=True)
    _wait(lambda: _queued(slurm, first) == "", 120, "the cancelled job leaving the queue", first_log, first)
    # Ray drains its nodes for up to 30 s on SIGTERM; Slurm sends SIGKILL KillWait (20 s) after its SIGTERM
    _wait(lambda: not _job_processes(first), 120, "the cancelled job's processes ending", first_log, first)
    assert not shm_entries() - shm_before, f"/dev/shm entries left: {sorted(shm_entries() - shm_before)}"
    assert not (run / "metrics.jsonl").is_file() or _saved_step(run) < STEPS  # it was stopped before the end

    second_log = tmp_path / "second.out"
    second = _submit(slurm, second_log, *args)
    _wait(lambda: _queued(slurm, second) == "", 900, "the resubmitted job finishing", second_log, second)
    history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in history if row["step"] > 0] == list(range(1, STEPS + 1)), second_log.read_text()[
        -3000:
    ]
    assert (run / "tracking_from_step_1.jsonl").is_file()  # the second launch started from the saved step
    # SAM drafted in every vLLM server of both jobs (two servers a launch, one engine file each) and its drafts were
    # accepted over the run (a resumed server starts without the earlier epochs' text, and one short step of 8
    # responses may accept nothing)
    engines = [
        [json.loads(line) for line in f.read_text().splitlines()] for f in (run / "server_timeline").glob("engine-*")
    ]
    assert len(engines) == 4 and all(any(r["draft_tokens"] for r in rows) for rows in engines), [
        len(e) for e in engines
    ]
    assert sum(r["accepted_tokens"] for rows in engines for r in rows) > 0
    _wait(lambda: not _job_processes(second), 120, "the finished job's processes ending", second_log, second)
    assert not shm_entries() - shm_before, f"/dev/shm entries left: {sorted(shm_entries() - shm_before)}"


def test_a_checkout_path_missing_on_the_nodes_is_named_before_ray_starts(slurm, tmp_path):
    log = tmp_path / "missing.out"
    job = _submit({**slurm, "REPO": "/nonexistent/checkout"}, log)
    _wait(lambda: _queued(slurm, job) == "", 60, "the job ending", log, job)
    text = log.read_text()
    assert "/nonexistent/checkout" in text and "ray:" not in text
