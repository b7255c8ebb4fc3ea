"""backend=verl for real: ``python -m recipe.dapo backend=verl`` runs veRL 0.9.1's own Ray trainer on this CPU
(FSDP2 actor, vLLM servers, TransferQueue, the dapo reward manager, dynamic filtering). Launches, each covering
what the other does not:
- The built-in real model (SmolLM2) with its shipped head frozen, spec=hybrid: the servers load the head from the
  checkpoint (veRL's default "dummy" load would leave it random), validation and checkpoints; the launcher is then
  killed with SIGKILL and a relaunch resumes from the saved step, the servers' drafter memory with it.
- Two replicas of spec=hybrid with the head trained online on the FSDP actor: the prompt-affinity router keeps each
  prompt on one server, the head trains, weight sync brings it to both servers, then a head broken on purpose, which
  the acceptance canary names (its drill).
In every run the actor computes as the servers sample (float32): its log-probs before the update are the rollout's.
spec=off needs no launch of its own: its servers' timeline is checked on a vLLM server (test_vllm_server.py).
Every process of the launches and every /dev/shm file they made are gone at the end, also when an assertion
fails."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from recipe.dapo.canary import MIN_DRAFTS
from recipe.dapo.job import JOB_ENV, cleanup_job, job_processes, shm_entries
from recipe.dapo.server_timeline import canary_rows
from recipe.dapo.step_marks import STEP_MARKS, read_marks, step_windows
from recipe.dapo.timeline import saved_timelines

REPO = Path(__file__).resolve().parents[2]
MAX_RESPONSE = 128
STEPS = 2  # the kill -9 run's: killed after step 1's checkpoint, the relaunch runs step 2


def launch_args(model: Path, out: Path, *extra: str, backend: str = "verl", spec: str = "sam") -> list[str]:
    data = model.parent / "data"
    return [
        sys.executable, "-m", "recipe.dapo", f"backend={backend}", "trainer.device=cpu", f"spec={spec}",
        f"actor_rollout_ref.model.path={model}", f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'test.parquet'}", "data.val_max_samples=8",
        "data.train_batch_size=2", "data.gen_batch_size=2", "actor_rollout_ref.rollout.n=4",
        f"data.max_response_length={MAX_RESPONSE}", "reward.reward_kwargs.overlong_buffer_cfg.len=32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        f"trainer.default_local_dir={out}", *extra,
    ]  # fmt: skip


def wait_for_checkpoint(proc: subprocess.Popen, out: Path, step: int, timeout_s: float) -> None:
    """Until ``step`` is checkpointed and the job has marked when its metrics were logged (veRL logs them after
    the checkpoint)."""
    latest, marks = out / "latest_checkpointed_iteration.txt", out / STEP_MARKS
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        saved = latest.is_file() and latest.read_text().strip() and int(latest.read_text()) >= step
        if saved and marks.is_file() and any(json.loads(m)["step"] >= step for m in marks.read_text().splitlines()):
            return
        assert proc.poll() is None, f"the launcher exited with {proc.returncode} before checkpoint {step}"
        time.sleep(1)
    raise TimeoutError(f"no checkpoint of step {step} within {timeout_s} s")


@pytest.fixture
def verl_job():
    """A job id for a launch to run under; the job's processes and /dev/shm files are gone afterwards."""
    job, shm_before = f"test-{uuid.uuid4().hex}", shm_entries()
    yield job
    cleanup_job(job, shm_before)
    leftover = shm_entries() - shm_before
    assert not leftover, f"/dev/shm entries left by the run: {sorted(leftover)}"


def run_to_end(args: list[str], job: str, timeout_s: float = 900) -> str:
    """Runs the launch to its end; its output."""
    run = subprocess.run(
        args, cwd=REPO, env={**os.environ, JOB_ENV: job}, capture_output=True, text=True, timeout=timeout_s
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout + run.stderr


def logged_rows(out: Path) -> list[dict]:
    """The run's metrics.jsonl, one dict a step."""
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# the checkpoint's head, which the servers load (load_format=auto): a random head accepts under 1% of its drafts
FROZEN_MTP = ("spec.mtp.train=frozen",)
HEAD_ACCEPTANCE = 0.15  # the heads here accept 0.3-0.5 of their draft tokens


def test_verl_trainer_runs_dapo_on_the_real_model_with_its_frozen_head_and_resumes_after_kill_9(tmp_path):
    """The built-in real model with its shipped head (SmolLM2-135M-Instruct, grafted at start, a Qwen2 checkpoint to
    veRL's FSDP actor) through veRL's trainer on its word problems, spec=hybrid with the head frozen: the servers load
    the head from the checkpoint (veRL's default "dummy" load would leave it random) and both sources draft (drafts
    priced nearly free, so that the CPU's payoff rule does not send nothing). Validation runs before training and at
    the end; each step is checkpointed. The launcher is killed with SIGKILL after the first checkpoint and a relaunch
    resumes from the saved step, loading each server's drafter memory from it (recipe/dapo/verl_drafter_state.py).
    Without dynamic filtering: at T=1 and 64 tokens nearly every group of this model is all wrong, and veRL's trainer
    (no cap on generation rounds) took 14 minutes for one step."""
    out = tmp_path / "run"
    first_job = f"test-{uuid.uuid4().hex}"
    shm_before = shm_entries()
    log = (tmp_path / "launch1.log").open("w")
    launch = [
        sys.executable, "-m", "recipe.dapo", "backend=verl", "trainer.device=cpu", "spec=hybrid", *FROZEN_MTP,
        "spec.sam.payoff_cost=[0.01,0.001,0.000001,0.0,0.0]", "spec.hybrid.head_cost=0.0",
        "actor_rollout_ref.model.path=smollm2-135m-instruct-mtp", "data.val_max_samples=4",
        "data.train_max_samples=64", "data.train_batch_size=2", "data.gen_batch_size=2",
        "actor_rollout_ref.rollout.n=4", "data.max_prompt_length=256", "data.max_response_length=64",
        "reward.reward_kwargs.overlong_buffer_cfg.len=16", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.optim.lr=2e-6",
        f"trainer.total_training_steps={STEPS}", "trainer.save_freq=1", f"trainer.test_freq={STEPS}",
        "algorithm.filter_groups.enable=false", f"trainer.default_local_dir={out}",
    ]  # fmt: skip
    try:
        first = subprocess.Popen(
            launch, cwd=REPO, env={**os.environ, JOB_ENV: first_job}, stdout=log, stderr=subprocess.STDOUT
        )
        wait_for_checkpoint(first, out, 1, timeout_s=1200)
        first.send_signal(signal.SIGKILL)
        first.wait()
        assert job_processes(first_job), "the killed launcher's job should still be running (it has no finally)"

        second = subprocess.run(launch, cwd=REPO, capture_output=True, text=True, timeout=1200)
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        assert not job_processes(first_job), "the relaunch should have ended the killed launcher's job"

        # the killed launcher's job trains on until the relaunch ends it: when it saved a step and was ended before
        # logging it, the relaunch runs that step again (run_dir.rewind_to_logged_checkpoint), so no row is missing
        history = logged_rows(out)
        assert [row["step"] for row in history] == list(range(STEPS + 1))
        resumed_from = sorted(int(p.stem.rsplit("_", 1)[1]) for p in out.glob("tracking_from_step_*.jsonl"))
        assert resumed_from[0] == 0 and 1 <= resumed_from[-1] < STEPS  # the relaunch ran a step of its own
        assert "val-core/word_problems/acc/mean@4" in history[0] and "val-core/word_problems/acc/mean@4" in history[-1]
        assert not any(k.startswith("val-") for k in history[1])  # no evaluation at the resumed step
        for row in history[1:]:
            assert row["timing_s/gen"] > 0 and row["timing_s/update_actor"] > 0 and np.isfinite(row["actor/pg_loss"])
            assert_actor_computes_as_the_rollout_samples(row)
            assert -2.0 <= row["critic/score/mean"] <= 1.0  # a wrong answer -1, an overlong one down to -1 more
            # the timeline recorded inside the vLLM server gives every step its rollout metrics
            assert row["rollout/spec_accept_length"] >= 1.0 and row["rollout/throughput_tok_s"] > 0
        assert np.mean([row["rollout/tokens_per_request_step"] for row in history[1:]]) > 1.01  # spec off: 1.0
        # both launches' servers drafted from both sources, and accepted the checkpoint's head (its drafter counts,
        # sam/counts.py, cumulative per server). Not asserted per step: veRL's V1 replay buffer refills while the
        # previous step trains, so a step's time window can hold only a short refill round
        drafters = [[json.loads(line) for line in p.read_text().splitlines()]
                    for p in (out / "server_timeline").glob("drafter-*.jsonl")]  # fmt: skip
        head = np.sum([rows[-1]["mtp"] for rows in drafters], axis=0)
        assert head[0] >= MIN_DRAFTS and head[1] / head[0] > HEAD_ACCEPTANCE, head
        assert sum(rows[-1]["sam"][0] for rows in drafters) > 0
        # the acceptance canary checked the steps after the first against those before, and a frozen head never fell
        canary = [row["rollout/canary_mtp_fell"] for row in history if "rollout/canary_mtp_fell" in row]
        assert canary and not any(canary), canary
        # the relaunch's servers started from the resumed checkpoint's drafter memory: the prompts SAM had seen by
        # then are still in the last checkpoint's memory (a fresh server's would hold only the relaunch's prompts)
        resumed, last = (
            pickle.loads((out / f"global_step_{step}" / "drafter" / "server0.pkl").read_bytes())
            for step in (resumed_from[-1], STEPS)
        )
        assert resumed["groups"] and set(resumed["groups"]) <= set(last["groups"]), (
            sorted(resumed["groups"]), sorted(last["groups"]))  # fmt: skip
        assert last["groups"].keys() - resumed["groups"].keys()  # and the relaunch's own
        assert (out / "curves.png").stat().st_size > 0
        assert max(saved_timelines(out / "timelines")) == STEPS
        assert not (out / "verl_job.id").exists()
    finally:
        log.close()
        cleanup_job(first_job, shm_before)
    leftover = shm_entries() - shm_before
    assert not leftover, f"/dev/shm entries left by the runs: {sorted(leftover)}"


# the hybrid drafting on many rows from both sources: drafts nearly free, a confident head (as the lossless harness)
HYBRID_BOTH_SOURCES = ("spec.sam.payoff_cost=[0.01,0.001,0.000001,0.0,0.0]", "spec.hybrid.head_cost=0.0",
                       "spec.hybrid.head_acceptance=0.9")  # fmt: skip


def test_two_replicas_draft_with_the_synced_online_head_and_the_canary_names_a_broken_one(
    harness_model, tmp_path, verl_job
):
    """spec=hybrid (the MTP head beside SAM in one engine) with the head trained online on veRL's FSDP actor
    (mtp/verl_fsdp.py) and two replicas, whose servers start from veRL's random "dummy" weights. At step 1 both
    servers accept the head's drafts: only weight sync can have put the actor's head there (into vLLM's MTP drafter,
    which spec=mtp drafts with too). Step 1's update then moves the head by a learning rate of 100 (AdamW moves every
    weight by about the rate), and the sync carries the broken head to both servers before step 2's rollout, as a
    sync that leaves the drafter with wrong weights would: the launcher warns while the job trains on (step 3 still
    to come), naming the source and the step, and logs the fall as a metric (the canary's quiet side on veRL: the
    frozen head's run above)."""
    out = tmp_path / "verl"
    launch = launch_args(harness_model, out, "spec.mtp.train=online", "spec.mtp.lr=100", "trainer.total_training_steps=3",
                         "trainer.save_freq=3", "trainer.test_freq=-1", "trainer.val_before_train=false",
                         "trainer.n_gpus_per_node=2", *HYBRID_BOTH_SOURCES, spec="hybrid")  # fmt: skip
    output = run_to_end(launch, verl_job)
    assert OmegaConf.load(out / "verl_config.yaml").actor_rollout_ref.rollout.load_format == "dummy"

    # every request of a prompt (its samples, every refill round, both steps) went to one server, both served
    routes = [json.loads(line) for line in (out / "server_timeline" / "routing.jsonl").read_text().splitlines()]
    servers_of: dict[str, set] = {}
    for r in routes:
        servers_of.setdefault(r["prompt"], set()).add(r["server"])
    assert all(len(s) == 1 for s in servers_of.values()), servers_of
    per_server = sorted(sum(r["server"] == s for r in routes) for s in {r["server"] for r in routes})
    # and the servers' own timelines finished exactly those requests, one engine file per server
    engines = [[json.loads(line) for line in p.read_text().splitlines()]
               for p in (out / "server_timeline").glob("engine-*.jsonl")]  # fmt: skip
    finished = sorted(sum(len(row["finished"]) for row in rows) for rows in engines)
    assert len(per_server) == 2 and finished == per_server

    # each server's hybrid drafter counts its head's drafts apart from SAM's (sam/counts.py, cumulative rows): in
    # step 1 each accepted the synced head's drafts, and over the run each sent SAM's too (not asserted in step 1: at
    # a confident head's prior SAM first wins rows once the head's own acceptance is counted, which a slow machine's
    # short step-1 window can end before)
    start, end = step_windows(read_marks(out))[1]
    drafters = [[json.loads(line) for line in p.read_text().splitlines()]
                for p in (out / "server_timeline").glob("drafter-*.jsonl")]  # fmt: skip
    assert len(drafters) == 2
    for rows in drafters:
        before = next((r for r in reversed(rows) if r["t"] <= start), {"mtp": [0, 0], "sam": [0, 0]})
        after = next(r for r in reversed(rows) if r["t"] <= end)
        drafted, accepted = (after["mtp"][i] - before["mtp"][i] for i in (0, 1))
        assert drafted >= MIN_DRAFTS and accepted / drafted > HEAD_ACCEPTANCE, (before, after)
        assert rows[-1]["sam"][0] > 0, rows[-1]

    canary = [row for row in logged_rows(out) if row.get("rollout/canary_mtp_fell") == 1.0]
    assert canary and canary[0]["step"] == 2, canary
    assert canary[0]["rollout/canary_mtp_acceptance"] < 0.5 * canary[0]["rollout/canary_mtp_level_before"]
    assert "acceptance canary: step 2, mtp drafts accepted" in output
    # warned live: before the job marked its last step, not when the launcher collected the run afterwards
    last_mark = max(m["t"] for m in read_marks(out) if m["step"] == 3)
    assert canary_rows(out)[2]["warned_at"] < last_mark

    # the checkpoint of step 3 holds each server's drafter memory (recipe/dapo/verl_drafter_state.py): SAM's prompt
    # histories and what the hybrid learned of its head, which a run resumed from it loads back into its servers
    saved = [pickle.loads((out / "global_step_3" / "drafter" / f"server{i}.pkl").read_bytes()) for i in range(2)]
    for state in saved:
        assert state["groups"] and state["head"]["acceptance"]["drafts"][0] > 0, sorted(state)
    assert not set(saved[0]["groups"]) & set(saved[1]["groups"])  # each server its own prompts (affinity routing)

    trained = [row for row in logged_rows(out) if "actor/mtp/loss" in row]  # veRL prefixes the actor's metrics
    assert [row["step"] for row in trained] == [1, 2, 3]
    assert 0 < trained[0]["actor/mtp/loss"] < 10 and 0 < trained[0]["actor/mtp/acc"] <= 1  # before the broken update
    for row in trained:
        assert_actor_computes_as_the_rollout_samples(row)
        # answers end at the end token the checkpoint names, not at the length limit
        assert row["response_length/mean"] < MAX_RESPONSE


def assert_actor_computes_as_the_rollout_samples(row: dict) -> None:
    """The actor's log-probs of the step's responses, before its update, are the servers' (both float32): veRL's FSDP
    engine computes in ``fsdp_config.mixed_precision.param_dtype``, bfloat16 when unset, and then differed from the
    rollout's probabilities by 0.004-0.05 at most per token."""
    assert row["training/rollout_probs_diff_max"] < 1e-3, row["training/rollout_probs_diff_max"]
