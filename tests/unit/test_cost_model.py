"""The step-cost model (recipe/cost_model.py): its arithmetic against published parameter counts and the roofline's
reading, and a fit that recovers the parameters it generated data from."""

from __future__ import annotations

import pytest

from recipe.cost_model import DEVICES, SHAPES, Cell, StepCostFit, cell_errors, fit, step_seconds, step_work


@pytest.mark.parametrize(("shape", "published"), [("qwen3-8b", 8.19e9), ("qwen3-32b", 32.8e9), ("qwen2.5-7b", 7.62e9)])
def test_parameter_counts_match_the_published_ones(shape, published):
    s = SHAPES[shape]
    norms = s.layers * 2 * s.hidden  # RMSNorm weights, tiny
    assert s.matmul_params + s.vocab * s.hidden + norms == pytest.approx(published, rel=0.01)


def test_verifying_k_tokens_reads_the_kv_cache_once_and_computes_k_times_more():
    shape = SHAPES["qwen3-8b"]
    plain_flops, plain_bytes, plain_tokens = step_work(shape, 8, 16384, 0)
    flops, nbytes, tokens = step_work(shape, 8, 16384, 4)
    assert nbytes == plain_bytes and tokens == 5 * plain_tokens and flops == pytest.approx(5 * plain_flops)
    # 8 requests at 16k of context read more KV cache than weights (bf16): the regime the issue names
    kv = shape.kv_bytes_per_token * 8 * 16384
    assert kv > shape.matmul_params * shape.bytes_per_param


def test_longer_context_makes_a_draft_relatively_cheaper_on_a_memory_bound_gpu():
    shape, device = SHAPES["qwen3-8b"], DEVICES["h100"]
    params = StepCostFit(3e-3, 0.5, 4.0, 0.7, 1e-8, 5e-4, 2e-5)
    cost = {ctx: step_seconds(shape, device, params, 8, ctx, 4) / step_seconds(shape, device, params, 8, ctx, 0)
            for ctx in (2048, 16384)}  # fmt: skip
    assert cost[16384] < cost[2048]


def test_fit_recovers_the_step_times_it_was_generated_from():
    shape, device = SHAPES["smollm2-135m"], DEVICES["h200"]
    truth = StepCostFit(2.9e-3, 0.3, 3.0, 0.4, 2e-9, 5e-4, 2.5e-5)
    cells = [
        Cell("synthetic", b, k, 320.0, step_seconds(shape, device, truth, b, 320.0, k))
        for b in (1, 4, 16, 64, 256)
        for k in (0, 1, 4, 8)
    ]
    fitted = fit(cells, shape, device)
    assert max(abs(r["error"]) for r in cell_errors(cells, shape, device, fitted)) < 0.01


def test_a_relative_cell_is_one_without_drafts():
    shape, device = SHAPES["qwen2.5-7b"], DEVICES["h100"]
    params = StepCostFit(3e-3, 0.5, 4.0, 0.7, 1e-8, 5e-4, 2e-5)
    (row,) = cell_errors([Cell("t", 8, 0, 2048.0, 1.0, relative=True)], shape, device, params)
    assert row["predicted"] == pytest.approx(1.0)
