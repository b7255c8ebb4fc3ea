"""SAM inside a real vLLM engine whose KV cache is too small for its batch, so vLLM preempts requests and resumes
them later (the normal state of a busy GPU rollout). The proposer tracks requests by vLLM's request ids: a
preempted request keeps its drafter and is filed into its prompt's group once, whole, when it finishes; greedy
output is token-identical to spec off. With the payoff rule at a cost no draft pays, the drafter leaves its work to
later steps and reads the tokens it skipped from vLLM's token history and request states: the same responses are
filed."""

from __future__ import annotations

import pytest

from recipe.engine import EngineOptions, make_llm, speculative_config

pytestmark = pytest.mark.vllm_side

PROMPTS = 4
SAMPLES = 4
MAX_TOKENS = 96
# vLLM CPU blocks hold 128 tokens: 4 of them hold about 4 requests of this length at a time, for a batch of 16
OPTIONS = EngineOptions(max_model_len=256, max_num_seqs=16, dtype="float32", kv_cache_blocks=4)


def _drafter_state(worker) -> dict:
    """In the engine's worker: SAM's counters and every response its groups hold (finishing the last ones)."""
    proposer = worker.model_runner.drafter
    proposer.finish_tracked()
    state = proposer.state_dict()
    return {
        "preempted_steps": proposer.preempted_steps,
        "deferred_steps": proposer.deferred_steps,
        "responses": sorted(r.tolist() for _lead, responses in state["groups"].values() for r in responses),
    }


@pytest.fixture(scope="module")
def prompts(harness_model):
    import pandas as pd

    rows = pd.read_parquet(harness_model.parent / "data" / "test.parquet").head(PROMPTS)
    from transformers import AutoTokenizer

    from mtp.checkpoint import tokenizer_path

    tok = AutoTokenizer.from_pretrained(tokenizer_path(str(harness_model)))
    texts = [tok.apply_chat_template(list(p), tokenize=False, add_generation_prompt=True) for p in rows["prompt"]]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts] * SAMPLES


def _generate(model, prompts, spec, additional=None):
    from vllm import SamplingParams, TokensPrompt

    llm = make_llm(str(model), spec, OPTIONS, additional)
    try:
        outs = llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts],
            SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
            use_tqdm=False,
        )
        metrics = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
        state = llm.collective_rpc(_drafter_state)[0] if spec else None
        return [list(o.outputs[0].token_ids) for o in outs], metrics, state
    finally:
        del llm


@pytest.fixture(scope="module")
def reference(harness_model, prompts):
    return _generate(harness_model, prompts, None)


@pytest.mark.parametrize("payoff", [False, True])
def test_sam_under_preemption_keeps_its_requests_and_is_lossless(harness_model, prompts, reference, payoff):
    reference, ref_metrics, _ = reference
    sam = speculative_config("sam", 3)
    options = {"sam": {"batch_threshold": 64, "group_sharing": True, "cross_epoch": True, "payoff": payoff}}
    if payoff:
        options["sam"]["payoff_cost"] = [0.0, 0.01, 0.01, 0.0, 0.0]  # a draft token costs a request: never sent
    outputs, metrics, state = _generate(harness_model, prompts, sam, options)

    assert metrics["vllm:num_preemptions"] > 0 and ref_metrics["vllm:num_preemptions"] > 0
    assert outputs == reference  # greedy: speculation changes speed, never tokens
    # every request's response is filed once, whole: no partial copy when it was preempted, no restart after.
    # A filed response may run up to K tokens past the output: the last step's accepted drafts beyond the end
    # token or max_tokens are verified tokens, which vLLM's output processor then cuts off.
    assert state["preempted_steps"] > 0
    filed = list(state["responses"])
    for out in sorted(outputs, key=len, reverse=True):
        match = [r for r in filed if r[: len(out)] == out and len(r) - len(out) <= sam["num_speculative_tokens"]]
        assert match, f"no filed response holds the output {out}"
        filed.remove(match[0])
    assert not filed, f"{len(filed)} responses filed that no request produced (partial copies or restarts)"
    if payoff:  # nothing sent, most steps left to later ones
        assert metrics.get("vllm:spec_decode_num_draft_tokens", 0) == 0 and state["deferred_steps"] > 0
    else:  # it kept drafting through it: vLLM accepted a good share of SAM's drafts
        assert metrics["vllm:spec_decode_num_accepted_tokens"] > 0.3 * metrics["vllm:spec_decode_num_draft_tokens"]
