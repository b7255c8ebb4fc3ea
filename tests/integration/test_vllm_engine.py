"""The embedded checkpoint in real vLLM: loaded as MiMoForCausalLM, same greedy tokens as the training
module, and its MTP layer drafts (method "mtp")."""

import json

import numpy as np
import pytest
import torch

from mtp.checkpoint import load_checkpoint
from recipe.cost_model import DEVICES, GPU_FIT, prior_steps, shape_from_config
from recipe.engine import EngineOptions, SpecCounters, make_llm, spec_counters, speculative_config
from recipe.lossless_harness import GREEDY_PROMPTS, prompt_ids

pytestmark = pytest.mark.vllm_side


@pytest.fixture(scope="module")
def fp32_engine(harness_model):
    llm = make_llm(str(harness_model), speculative_config("mtp", 1), EngineOptions(max_model_len=512, dtype="float32"))
    yield llm
    del llm


def test_vllm_loads_mimo_with_its_mtp_drafter(fp32_engine):
    config = fp32_engine.llm_engine.vllm_config
    assert config.model_config.hf_config.architectures == ["MiMoForCausalLM"]
    assert config.speculative_config.method == "mtp"


def prometheus_spec_counters(llm) -> SpecCounters:
    """vLLM's process-wide ``vllm:spec_decode_*`` counters, per-depth ones included (every engine of the process adds
    to them)."""
    metrics = llm.get_metrics()
    values = {m.name: int(getattr(m, "value", 0)) for m in metrics}
    names = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
    per_pos = next((m.values for m in metrics if m.name == "vllm:spec_decode_num_accepted_tokens_per_pos"), ())
    return SpecCounters(*(values.get(f"vllm:spec_decode_{n}", 0) for n in names), tuple(int(v) for v in per_pos))


def test_greedy_tokens_match_training_module_and_mtp_drafts(fp32_engine, harness_model):
    from vllm import SamplingParams, TokensPrompt

    model = load_checkpoint(harness_model).eval()
    prompts = [prompt_ids(str(harness_model), m) for m in GREEDY_PROMPTS[:4]]
    before, prometheus_before = spec_counters(fp32_engine), prometheus_spec_counters(fp32_engine)
    outs = fp32_engine.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts],
        SamplingParams(temperature=0, max_tokens=40),
        use_tqdm=False,
    )
    counters = spec_counters(fp32_engine) - before
    # the recipe's per-engine stat logger counts what vLLM's own Prometheus counters count
    assert counters == prometheus_spec_counters(fp32_engine) - prometheus_before
    for ids, out in zip(prompts, outs, strict=True):
        seq = list(ids)
        with torch.no_grad():
            for _ in range(len(out.outputs[0].token_ids)):
                seq.append(int(model(torch.tensor(seq), with_mtp=False).logits[-1].argmax()))
        assert seq[len(ids) :] == list(out.outputs[0].token_ids)
    assert counters.num_drafts > 0 and counters.num_accepted_tokens > 0


def _drafter_mismatch(worker, payload: bytes) -> dict[str, float]:
    """Runs in the vLLM worker: for every drafter parameter, the largest difference from ``payload``.

    Linear layers are probed through their forward (on CPU vLLM may keep only a repacked copy of the
    weight), everything else is compared directly."""
    import torch.nn.functional as F
    from safetensors.torch import load
    from vllm.model_executor.layers.linear import LinearBase

    expected = load(payload)
    gen = torch.Generator().manual_seed(0)
    worst: dict[str, float] = {}
    for name, mod in worker.model_runner.drafter.model.named_modules():
        if isinstance(mod, LinearBase):
            w, b = expected[f"{name}.weight"], expected.get(f"{name}.bias")
            x = torch.randn(3, w.shape[1], generator=gen)
            got = mod(x)
            got = got[0] if isinstance(got, tuple) else got
            worst[f"{name}.weight"] = float((got - F.linear(x, w, b)).abs().max())
            continue
        for p_name, param in mod.named_parameters(recurse=False):
            key = f"{name}.{p_name}"
            ref = expected[key]
            worst[key] = float((param.data[: ref.shape[0]] - ref).abs().max())
    return worst


def test_engine_drafter_receives_the_trained_mtp_head(fp32_engine, harness_model):
    """After a weight sync the engine's MTP drafter holds exactly the trained head (run last: it changes
    the engine's weights)."""
    from recipe.dapo.rollout import sync_weights, vllm_weights_payload

    policy = load_checkpoint(harness_model)
    original = {k: v.clone() for k, v in policy.state_dict().items()}
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # stands in for an online-MTP update: only the MTP layer moves
        for p in policy.model.mtp_layers.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    sync_weights(fp32_engine, policy.state_dict())
    trained = fp32_engine.collective_rpc(
        _drafter_mismatch, args=(vllm_weights_payload(fp32_engine, policy.state_dict()),)
    )[0]
    stale = fp32_engine.collective_rpc(_drafter_mismatch, args=(vllm_weights_payload(fp32_engine, original),))[0]
    assert max(trained.values()) < 1e-5, {k: v for k, v in trained.items() if v >= 1e-5}
    moved = [k for k, v in stale.items() if v > 1e-3]
    assert any("input_proj" in k for k in moved) and any("mtp_block" in k for k in moved)  # the check can fail


def _payoff_state(worker) -> dict:
    """Runs in the vLLM worker: what SAM's payoff rule learned from the engine's own steps, and the device prior this
    engine's config would give it on an H100."""
    from recipe.cost_model import engine_prior

    proposer = worker.model_runner.drafter
    fit = proposer.step_cost
    return {
        "h100_prior": engine_prior(worker.vllm_config, DEVICES["h100"]),
        "cost": fit.coef.tolist(),
        "mean_step_s": float(fit.xty[0] / fit.steps),  # the (decayed) mean of the steps it timed ...
        "fitted_mean_step_s": float(fit.coef @ (fit.xtx[0] / fit.steps)),  # ... and what its fit says they cost
        "known": proposer.step_cost.known,
        "settled_drafts": proposer.acceptance.observed,
        "drafted_steps": proposer.step_cost.drafted_steps,
        "from_prior": proposer.step_cost.from_prior,
    }


def test_sam_default_learns_its_step_cost_and_acceptance_inside_the_engine(harness_model):
    """configs/spec/sam.yaml's SAM (payoff rule on) in a real engine: it times the engine's steps and settles shadow
    drafts against the verified tokens; until steps with drafts are observed, a draft token is priced as a request
    (the decisions themselves: tests/unit/test_sam_payoff.py, on a clock with known costs)."""
    from vllm import SamplingParams, TokensPrompt

    from recipe.dapo.config import spec_group
    from recipe.engine import spec_from_config

    spec, extra = spec_from_config(spec_group("sam"))
    assert extra["sam"]["payoff"] is True
    llm = make_llm(str(harness_model), spec, EngineOptions(max_model_len=512, dtype="float32"), extra)
    try:
        prompts = [TokensPrompt(prompt_token_ids=prompt_ids(str(harness_model), m)) for m in GREEDY_PROMPTS[:4]] * 8
        params = SamplingParams(temperature=1.0, max_tokens=200)
        before = spec_counters(llm)
        for _ in range(2):
            llm.generate(prompts, params, use_tqdm=False)
        counters = spec_counters(llm) - before
        state = llm.collective_rpc(_payoff_state)[0]
    finally:
        llm.llm_engine.engine_core.shutdown()
    a, b, c, e, f, g, h = state["cost"]
    assert not state["from_prior"], state  # a CPU engine: no device prior (recipe.cost_model.payoff_prior), as before
    # on an H100 the prior would be the cost model's steps for this engine's model, batch and context range and K
    config = json.loads((harness_model / "config.json").read_text())
    shape = shape_from_config(str(harness_model), config, 4)
    want = prior_steps(
        shape, DEVICES["h100"], GPU_FIT, EngineOptions().max_num_seqs, 512, spec["num_speculative_tokens"]
    )
    assert np.allclose(state["h100_prior"], want, rtol=1e-9), (state["h100_prior"][:3], want[:3])
    # which of a and b a tiny model's steps show depends on the machine (CI fitted b = 0, this one a = 0, 5% off the
    # mean through the origin): what must hold is that the fit prices the steps the engine timed, and that a draft
    # token has a price (where b = 0 the prior's is none, and the exploring steps' drafts give it one)
    assert state["known"] and state["mean_step_s"] > 0, state
    assert abs(state["fitted_mean_step_s"] - state["mean_step_s"]) < 0.2 * state["mean_step_s"], state
    assert state["settled_drafts"] > 100, state  # shadow drafts settled against verified tokens
    drafted = counters.num_draft_tokens > 0
    assert drafted == (state["drafted_steps"] > 0), (state, counters)  # the cost fit saw every step that drafted
    if not drafted:
        assert abs(c - b) <= 1e-3 * b + 1e-9 and abs(f - b) <= 1e-3 * b + 1e-9, (
            state
        )  # priced as a request until drafting is seen
