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


def test_the_step_table_runs_on_the_cpu_with_a_tiny_shape_and_names_each_context(tmp_path, monkeypatch):
    """The GPU twin's whole path from the CLI (model, twin check, steps by context, batch and K, table) on the CPU:
    what a lent GPU runs with ``verify-cost --gpu --shape qwen3-8b``, in seconds here."""
    import json
    import sys

    from recipe.bench.__main__ import main

    argv = ["verify-cost", "--gpu", "--shape", "tiny", "--device", "cpu", "--batches", "1,2", "--ks", "1,3",
            "--contexts", "8,24", "--repeats", "2", "--out", str(tmp_path)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    main(argv)  # the CLI's --gpu runs this twin of the CPU benchmark
    table = json.loads((tmp_path / "verify_cost_gpu.json").read_text())
    assert table["shape"] == "tiny" and table["check_vs_transformers_fp32"] < 1e-4
    assert {(r["context"], r["batch"], r["k"]) for r in table["rows"]} == {
        (c, b, k) for c in (8, 24) for b in (1, 2) for k in (1, 3)
    }
    assert all(r["step_ms"] > 0 and r["cost_vs_plain"] > 0 for r in table["rows"])
    assert "Context 24:" in (tmp_path / "verify_cost_gpu.md").read_text()


def test_a_cuda_run_without_a_gpu_names_the_cpu_option(tmp_path, monkeypatch):
    import sys

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    monkeypatch.setattr(sys, "argv", ["verify-cost --gpu", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--device cpu"):
        bench.main()
