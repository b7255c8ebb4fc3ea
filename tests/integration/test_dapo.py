"""The DAPO recipe on the local backend: a real 2-3 step job with vLLM, resume after a kill, online vs frozen
MTP, the trainer's log-probs against vLLM's."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TIMING_PREFIXES = (
    "timing_s/",
    "timing_per_token_ms/",
    "perf/",
    "rollout/throughput",
    "rollout/tail_throughput",
    "rollout/tail_request_tok_s",
    "rollout/longest",
    "rollout/tail_time",
    "rollout/drafter",
    "rollout/decode_throughput",
    "rollout/prefill_time_share",
)


def run_args(model: Path, out: Path, steps: int, *extra: str) -> list[str]:
    data = model.parent / "data"
    return [
        sys.executable, "-m", "recipe.dapo",
        f"actor_rollout_ref.model.path={model}", f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'test.parquet'}", f"trainer.default_local_dir={out}",
        f"hydra.run.dir={out}/hydra", f"trainer.total_training_steps={steps}",
        "data.train_batch_size=2", "data.gen_batch_size=3", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.rollout.n=4", "data.max_response_length=128", "reward.reward_kwargs.overlong_buffer_cfg.len=32",
        "data.val_max_samples=8", "trainer.test_freq=0", "trainer.save_freq=1", "recipe.progress_bar=false",
        "trainer.val_before_train=false", "recipe.train_probe.prompts=4", "recipe.train_probe.n=2",
        # rounds until 2 groups with reward variance are kept: the harness model is right on a few percent of its
        # samples, and 4 rounds of 12 sometimes kept none (then step 1 has no update and logs no actor metrics)
        "algorithm.filter_groups.max_num_gen_batches=0",
        *extra,
    ]  # fmt: skip


def run_job(args: list[str], out: Path) -> None:
    """Run a DAPO job in a child process; its output goes to a log whose tail is shown on failure."""
    out.mkdir(parents=True, exist_ok=True)
    log = out / "job.log"
    with open(log, "w") as fh:
        proc = subprocess.run(args, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=fh, stderr=subprocess.STDOUT,
                              cwd=REPO, timeout=900)  # fmt: skip
    assert proc.returncode == 0, log.read_text()[-5000:]
    errors = [line for line in log.read_text().splitlines() if " ERROR " in line]
    assert not errors, errors[:3]  # a healthy run prints no ERROR (a new user reads one as a failure)


def metrics(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)} for r in rows]


def test_two_step_job_then_kill_and_resume_matches_uninterrupted(harness_model, tmp_path):
    # a learning rate that differs at every step; SAM's payoff rule on a pinned step cost (a learned one follows the
    # machine's timing, so its drafts, and the tokens vLLM then samples, differ run to run)
    warmup = (
        "actor_rollout_ref.actor.optim.lr=1e-5",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=3",
        "spec.sam.payoff_cost=[0.0012,0.00004,0.000015,0.0,0.00002]",
    )
    full = tmp_path / "full"
    run_job(run_args(harness_model, full, 3, *warmup), full)
    rows = metrics(full)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["actor/lr"] for r in rows] == pytest.approx([0.0, 1e-5 / 3, 2e-5 / 3])  # veRL's warmup from 0
    for key in (
        "critic/score/mean",
        "response_length/mean",
        "timing_s/gen",
        "timing_s/step",
        "perf/throughput",
        "train/num_gen_batches",
        "rollout/spec_accept_length",
        "actor/pg_loss",
        "val-core/tiny_sum/acc/mean@4",  # sampled, rollout.val_kwargs
        "val-core/tiny_sum/acc/greedy",
        "val-aux/train_probe/acc/mean@2",
        "drift/kl_from_start",
        "drift/mtp_accept_start_head",
    ):
        assert key in rows[-1], key
    assert all(0 < r["rollout/drafter_time_share"] < 1 for r in rows)  # the default SAM drafter's own time
    assert (full / "global_step_3" / "actor" / "model.safetensors").is_file()
    sampled = [json.loads(x) for x in (full / "validation" / "3.jsonl").read_text().splitlines()]
    greedy = [json.loads(x) for x in (full / "validation" / "greedy" / "3.jsonl").read_text().splitlines()]
    assert len(sampled) == 8 * 4 and len(greedy) == 8  # veRL's dump: val_max_samples x val_kwargs.n, greedy once
    assert sum(r["acc"] for r in sampled) / len(sampled) == pytest.approx(rows[-1]["val-core/tiny_sum/acc/mean@4"])
    assert list((full / "timelines").glob("step_00001_round_*.json"))
    console = (full / "job.log").read_text()  # a line per step and a summary; vLLM's INFO lines stay out
    assert "step 3/3  reward" in console and f"run finished: 3 training steps in {full}" in console, console[-3000:]
    assert f"last checkpoint: {full / 'global_step_3'}" in console
    vllm_info = re.findall(r".*INFO \d\d-\d\d \d\d:\d\d:\d\d \[.*", console)
    assert not vllm_info, vllm_info[:5]

    killed = tmp_path / "killed"
    proc = subprocess.Popen(run_args(harness_model, killed, 3, *warmup), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    latest = killed / "latest_checkpointed_iteration.txt"
    deadline = time.time() + 600
    while time.time() < deadline and not (latest.is_file() and latest.read_text().strip() == "2"):
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    run_job(run_args(harness_model, killed, 3, *warmup), killed)
    resumed = metrics(killed)
    assert [r["step"] for r in resumed] == [1, 2, 3]
    assert comparable(resumed) == comparable(rows)  # same seed: same metrics, with or without the kill


@pytest.mark.parametrize(("spec", "train"), [("mtp", "frozen"), ("hybrid", "online")])
def test_mtp_job_trains_the_head_only_when_online(harness_model, tmp_path, spec, train):
    """spec=mtp frozen keeps the base checkpoint's MTP layer, spec=hybrid online (the head trained and synced each
    step, drafting beside SAM in one engine) changes it; both log the head's loss,
    accuracy and vLLM's acceptance every step. Online, the head also trains on the responses the update leaves out
    (spec.mtp.train_on_dropped_groups), at most 3 a step (spec.mtp.dropped_rows_per_step) and at most 1 response token
    per kept token (spec.mtp.dropped_tokens_per_kept_token, against veRL's perf/total_num_tokens), over a top-4 shortlist
    whose teacher the rollout hands over (generate(teacher_topk=4)). Also: data.train_max_samples
    caps the prompt pool (6 prompts, 3 per round: the stream wraps into epoch 1 within two steps)."""
    from mtp.checkpoint import load_checkpoint

    out = tmp_path / train
    caps = ["spec.mtp.dropped_rows_per_step=3", "spec.mtp.dropped_tokens_per_kept_token=1.0"]
    # over a top-4 shortlist, so the left-out rows' teacher comes from the rollout's log-probs
    dropped = (
        ["spec.mtp.train_on_dropped_groups=true", "spec.mtp.loss_vocab_topk=4", *caps] if train == "online" else []
    )
    run_job(
        run_args(
            harness_model, out, 2, f"spec={spec}", f"spec.mtp.train={train}", "data.train_max_samples=6", *dropped
        ),
        out,
    )
    rows = metrics(out)
    for key in ("mtp/head_loss", "mtp/head_acc", "rollout/spec_accept_length"):
        assert all(key in r for r in rows), key
    for key in ("mtp/loss", "mtp/grad_norm", "mtp/dropped_head_loss", "timing_s/mtp_dropped_groups"):
        assert all((key in r) == (train == "online") for r in rows), key
    if train == "online":  # the rows generated less the 2 groups of 4 the update trains on, the head's at most 3
        left_out = [4 * r["train/num_generated_groups"] - 8 for r in rows]
        assert [r["mtp/left_out_responses"] for r in rows] == left_out
        assert all(0 < r["mtp/dropped_responses"] <= min(3, n) for r, n in zip(rows, left_out, strict=True))
        assert all(0 < r["mtp/dropped_response_tokens"] <= r["perf/total_num_tokens"] for r in rows), rows
    assert rows[-1]["training/epoch"] >= 1
    base, trained = load_checkpoint(harness_model), load_checkpoint(out / "global_step_2" / "actor")
    prefix = "model.mtp_layers."
    base_sd, trained_sd = base.state_dict(), trained.state_dict()
    mtp_change = max(float((trained_sd[k] - base_sd[k]).abs().max()) for k in base_sd if k.startswith(prefix))
    trunk_change = max(float((trained_sd[k] - base_sd[k]).abs().max()) for k in base_sd if not k.startswith(prefix))
    assert trunk_change > 0  # the policy trained in both modes
    if train == "online":
        assert mtp_change > 0
    else:
        assert mtp_change == 0.0


def test_trainer_log_probs_equal_vllm_sampling_log_probs(harness_model):
    """The policy scores exactly the tokens vLLM sampled, aligned position by position (float32 engine)."""
    import numpy as np
    from vllm import SamplingParams, TokensPrompt

    from mtp.checkpoint import load_checkpoint
    from recipe.dapo.batch import build_batch
    from recipe.dapo.data import load_prompts
    from recipe.dapo.policy import forward_rows
    from recipe.dapo.rollout import Response
    from recipe.engine import EngineOptions, make_llm

    llm = make_llm(str(harness_model), None, EngineOptions(max_model_len=512, dtype="float32"))
    tok = llm.get_tokenizer()
    problems, ids = load_prompts(str(harness_model.parent / "data" / "test.parquet"), tok, 160, max_rows=6)
    params = SamplingParams(temperature=1.0, max_tokens=120, logprobs=0)
    outs = llm.generate([TokensPrompt(prompt_token_ids=i) for i in ids], params, use_tqdm=False)
    responses = [Response(k, ids[k], list(o.outputs[0].token_ids), o.outputs[0].text, None) for k, o in enumerate(outs)]
    batch = build_batch(responses, problems, [str(k) for k in range(len(ids))], tok.pad_token_id, 160, 128)
    log_probs = forward_rows(load_checkpoint(harness_model), batch, 1.0, with_mtp=False, grad=False).log_probs
    for k, out in enumerate(outs):
        comp = out.outputs[0]
        expected = np.array([step[t].logprob for step, t in zip(comp.logprobs, comp.token_ids, strict=True)])
        np.testing.assert_allclose(log_probs[k, : len(expected)].numpy(), expected, atol=1e-3)
        assert float(log_probs[k, len(expected) :].abs().sum()) == 0.0  # padding scores nothing


def test_the_rollouts_trunk_states_are_the_policys_hidden_states(harness_model):
    """``generate(keep_trunk_states=True)`` on the MTP drafter hands each response the trunk states its tokens were
    sampled from: the policy's own pre-norm hidden states at every position of prompt and response but the last, with
    drafts both accepted and rejected on the way (fails if a rejected draft's state is kept, if a position shifts, or
    if vLLM's suffixed request ids are matched to the wrong response). With ``teacher_topk`` each response token also
    carries the policy's k likeliest tokens and its own log-prob at T=0.8, the distribution it was sampled from (vLLM's
    processed logprobs under speculative decoding; fails if the temperature is not applied or a position shifts). A
    round without them carries none, and more log-probs than the engine was made for are refused."""
    import numpy as np
    import torch

    from mtp.checkpoint import load_checkpoint
    from recipe.dapo.data import load_prompts
    from recipe.dapo.rollout import RolloutEngine
    from recipe.engine import EngineOptions, speculative_config

    temperature, k = 0.8, 4
    engine = RolloutEngine(
        str(harness_model),
        speculative_config("mtp", 1),
        EngineOptions(max_model_len=512, dtype="float32", teacher_topk=k),
        free_cache_engine=False,
    )
    try:
        _, ids = load_prompts(str(harness_model.parent / "data" / "test.parquet"), engine.tokenizer, 160, max_rows=3)
        sampling = {"temperature": temperature, "top_p": 1.0, "max_tokens": 96}
        kept = engine.generate(ids, 4, sampling, keep_trunk_states=True, teacher_topk=k)
        plain = engine.generate(ids[:1], 2, sampling)
        with pytest.raises(ValueError, match="teacher_topk=5.*teacher_topk=4"):
            engine.generate(ids[:1], 1, sampling, keep_trunk_states=True, teacher_topk=k + 1)
    finally:
        engine.close()
    summary = kept.timeline.summary(1)
    assert 0 < summary["accepted_tokens"] < summary["draft_tokens"], summary  # some drafts accepted, some rejected
    assert all(r.trunk_states is None and r.teacher_topk is None for r in plain.responses)
    model = load_checkpoint(harness_model)
    for r in kept.responses:
        with torch.no_grad():
            out = model(torch.tensor(r.prompt_ids + r.token_ids), with_mtp=False)
        hidden = out.hidden[:-1]
        assert r.trunk_states.shape == tuple(hidden.shape)
        np.testing.assert_allclose(r.trunk_states, hidden.numpy(), rtol=1e-3, atol=1e-3)
        # response token j was sampled from the policy's output one position earlier
        logprobs = torch.log_softmax(out.logits[len(r.prompt_ids) - 1 : -1].float() / temperature, dim=-1)
        assert r.teacher_topk.shape == (len(r.token_ids), k)
        expected = logprobs.gather(-1, torch.tensor(r.token_ids)[:, None]).squeeze(-1)
        np.testing.assert_allclose(r.token_logprobs, expected.numpy(), atol=1e-3)
        # the k ids the engine ranked first carry the policy's k largest log-probs (ids themselves may swap on a tie)
        top = logprobs.gather(-1, torch.from_numpy(r.teacher_topk).long())
        np.testing.assert_allclose(top.numpy(), logprobs.topk(k, dim=-1).values.numpy(), atol=1e-3)
