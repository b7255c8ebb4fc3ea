"""recipe/bench/verify_cost_gpu.py times a hand-written decode step; it must be SmolLM2's step (transformers' Llama)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from recipe.bench import verify_cost_gpu as bench

REPO = Path(__file__).resolve().parents[2]

SMALL = dict(bench.SMOLLM2_135M, vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=3)
SMALL.update(num_attention_heads=4, num_key_value_heads=2, head_dim=32)


def small_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**SMALL)).eval()


def test_graph_decoder_prefill_then_draft_step_matches_transformers_logits():
    assert bench.check_against_transformers(small_llama(), prefix=8, ahead=5) < 1e-4


def test_graph_decoder_check_catches_a_wrong_rope():
    model = small_llama()
    model.config.rope_parameters["rope_theta"] = 10000.0
    with pytest.raises(AssertionError, match="differ from transformers"):
        bench.check_against_transformers(model)


def test_tokens_per_step_names_the_bad_item():
    assert bench.parse_tokens_per_step("sam:6:1.12,mtp:1:1.41") == [("sam", 6, 1.12), ("mtp", 1, 1.41)]
    with pytest.raises(SystemExit, match="'sam:1.12'"):
        bench.parse_tokens_per_step("sam:1.12")
