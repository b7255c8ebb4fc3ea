"""backend=verl for real: ``python -m recipe.dapo backend=verl`` runs veRL 0.9.1's own Ray trainer on this CPU
(FSDP2 actor, a vLLM server, TransferQueue, the dapo reward manager, dynamic filtering) with SAM drafting inside
the server, validation and checkpoints; the launcher is then killed with SIGKILL and a relaunch resumes from
the saved step. Every process of both launches and every /dev/shm file they made are gone at the end, also
when an assertion fails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from recipe.dapo.server_timeline import STEP_MARKS
from recipe.dapo.verl_backend import JOB_ENV, _shm_entries, cleanup_job, job_processes

REPO = Path(__file__).resolve().parents[1]
MAX_RESPONSE = 128
STEPS = 3


def launch_args(model: Path, out: Path, *extra: str) -> list[str]:
    data = model.parent / "data"
    return [
        sys.executable, "-m", "recipe.dapo", "backend=verl", "trainer.device=cpu", "spec=sam",
        f"actor_rollout_ref.model.path={model}", f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'test.parquet'}", "data.val_max_samples=8",
        "data.train_batch_size=2", "data.gen_batch_size=2", "actor_rollout_ref.rollout.n=4",
        f"data.max_response_length={MAX_RESPONSE}", "reward_model.overlong_buffer.len=32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        f"trainer.total_training_steps={STEPS}", "trainer.save_freq=1", f"trainer.test_freq={STEPS}",
        f"trainer.default_local_dir={out}", *extra,
    ]  # fmt: skip


def wait_for_checkpoint(proc: subprocess.Popen, out: Path, step: int, timeout_s: float) -> None:
    """Until ``step`` is checkpointed and the launcher has noted when its metrics were logged (veRL logs them
    after the checkpoint; a launcher killed in between leaves that step without rollout/* metrics)."""
    latest, marks = out / "latest_checkpointed_iteration.txt", out / STEP_MARKS
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        saved = latest.is_file() and latest.read_text().strip() and int(latest.read_text()) >= step
        if saved and marks.is_file() and any(json.loads(m)["step"] >= step for m in marks.read_text().splitlines()):
            return
        assert proc.poll() is None, f"the launcher exited with {proc.returncode} before checkpoint {step}"
        time.sleep(1)
    raise TimeoutError(f"no checkpoint of step {step} within {timeout_s} s")


@pytest.mark.slow
def test_verl_trainer_runs_dapo_with_sam_and_resumes_after_kill_9(harness_model, tmp_path):
    out = tmp_path / "run"
    first_job = f"test-{uuid.uuid4().hex}"
    shm_before = _shm_entries()
    log = (tmp_path / "launch1.log").open("w")
    try:
        first = subprocess.Popen(
            launch_args(harness_model, out), cwd=REPO, env={**os.environ, JOB_ENV: first_job},
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        wait_for_checkpoint(first, out, 1, timeout_s=900)
        first.send_signal(signal.SIGKILL)
        first.wait()
        assert job_processes(first_job), "the killed launcher's job should still be running (it has no finally)"

        second = subprocess.run(launch_args(harness_model, out), cwd=REPO, capture_output=True, text=True, timeout=900)
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        assert not job_processes(first_job), "the relaunch should have ended the killed launcher's job"

        history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert [row["step"] for row in history] == list(range(STEPS + 1))
        resumed_from = sorted(int(p.stem.rsplit("_", 1)[1]) for p in out.glob("tracking_from_step_*.jsonl"))
        assert resumed_from[0] == 0 and resumed_from[-1] >= 1  # the relaunch continued from a saved step
        assert "val-core/tiny_sum/acc/mean@1" in history[0] and "val-core/tiny_sum/acc/mean@1" in history[-1]
        assert not any(k.startswith("val-") for k in history[1])  # no evaluation at the resumed step
        for row in history[1:]:
            assert row["timing_s/gen"] > 0 and row["timing_s/update_actor"] > 0
            assert -1.0 <= row["critic/score/mean"] <= 1.0
            # answers end at the end token the checkpoint names, not at the length limit
            assert row["response_length/mean"] < MAX_RESPONSE
            # the timeline recorded inside the vLLM server: SAM drafted there and vLLM accepted some of it
            assert row["rollout/spec_accept_length"] > 1.0 and row["rollout/throughput_tok_s"] > 0
            assert row["rollout/tokens_per_request_step"] > 1.0
        assert (out / "curves.png").stat().st_size > 0
        assert sorted(p.name.split("_")[0] for p in (out / "timelines").glob("*.json"))[-1] == f"step{STEPS:06d}"
        assert not (out / "verl_job.id").exists()
    finally:
        log.close()
        cleanup_job(first_job, shm_before)
    leftover = _shm_entries() - shm_before
    assert not leftover, f"/dev/shm entries left by the runs: {sorted(leftover)}"
