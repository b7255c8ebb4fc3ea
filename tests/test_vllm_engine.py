"""The embedded checkpoint in real vLLM: loaded as MiMoForCausalLM, same greedy tokens as the training
module, and its MTP layer drafts (method "mtp")."""

import pytest
import torch
from lossless_harness import GREEDY_PROMPTS, prompt_ids

from mtp.checkpoint import load_checkpoint
from recipe.engine import EngineOptions, make_llm, spec_counters, speculative_config


@pytest.fixture(scope="module")
def fp32_engine(harness_model):
    llm = make_llm(str(harness_model), speculative_config("mtp", 1), EngineOptions(max_model_len=512, dtype="float32"))
    yield llm
    del llm


@pytest.mark.slow
def test_vllm_loads_mimo_with_its_mtp_drafter(fp32_engine):
    config = fp32_engine.llm_engine.vllm_config
    assert config.model_config.hf_config.architectures == ["MiMoForCausalLM"]
    assert config.speculative_config.method == "mtp"


@pytest.mark.slow
def test_greedy_tokens_match_training_module_and_mtp_drafts(fp32_engine, harness_model):
    from vllm import SamplingParams, TokensPrompt

    model = load_checkpoint(harness_model).eval()
    prompts = [prompt_ids(str(harness_model), m) for m in GREEDY_PROMPTS[:4]]
    before = spec_counters(fp32_engine)
    outs = fp32_engine.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts],
        SamplingParams(temperature=0, max_tokens=40),
        use_tqdm=False,
    )
    counters = spec_counters(fp32_engine) - before
    for ids, out in zip(prompts, outs, strict=True):
        seq = list(ids)
        with torch.no_grad():
            for _ in range(len(out.outputs[0].token_ids)):
                seq.append(int(model(torch.tensor(seq), with_mtp=False).logits[-1].argmax()))
        assert seq[len(ids) :] == list(out.outputs[0].token_ids)
    assert counters.num_drafts > 0 and counters.num_accepted_tokens > 0
