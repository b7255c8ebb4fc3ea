"""The step-cost model (recipe/cost_model.py): its arithmetic against published parameter counts and the roofline's
reading, and a fit that recovers the parameters it generated data from."""

from __future__ import annotations

import csv
import importlib.metadata
import json
import subprocess
import sys

import pytest

from recipe.cost_model import (
    DEVICES,
    GPU_FIT,
    SHAPES,
    Cell,
    StepCostFit,
    cell_errors,
    device_named,
    fit,
    head_seconds,
    payoff_prior,
    prior_steps,
    step_seconds,
    step_work,
)
from recipe.paths import RESULTS_DIR
from sam.payoff import PRIOR_ENTRY_POINTS, StepCost


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


def test_an_mtp_heads_forward_costs_its_share_of_the_weights_on_a_memory_bound_gpu():
    """One decoder layer and the LM head (622M of Qwen3-8B's 8.2B weights, read once a step at batch 1) add about a
    tenth to the step."""
    shape, device = SHAPES["qwen3-8b"], DEVICES["h100"]
    params = StepCostFit(0.0, 0.5, 4.0, 0.7, 0.0, 0.0, 0.0)  # no fixed, per-token or switch cost: the roofline only
    step = step_seconds(shape, device, params, 1, 2048, 1)
    head = head_seconds(shape, device, params, 1, 2048, 1)
    lm_head = shape.hidden * shape.vocab
    layer = (shape.matmul_params - lm_head) / shape.layers + 2 * shape.hidden**2
    assert head / step == pytest.approx((layer + lm_head) / shape.matmul_params, rel=0.05)
    # a chain 4 deep (the layer run on its own output) reads the head's weights 4 times
    assert head_seconds(shape, device, params, 1, 2048, 0, depth=4) / head_seconds(
        shape, device, params, 1, 2048, 0
    ) == pytest.approx(4.0)
    # a head's cell is the step plus the head, and named apart from K=1's
    cell = Cell("t", 1, 1, 2048.0, 1.0, head=True)
    assert cell.name == "B=1,K=mtp,C=2048" and cell_errors([cell], shape, device, params)[0]["predicted"] == (
        pytest.approx(step + head)
    )


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


def test_the_gpu_fit_the_payoff_prior_uses_is_the_one_results_report():
    fits = json.loads((RESULTS_DIR / "cost_model" / "fits.json").read_text())
    assert GPU_FIT.as_dict() == pytest.approx(fits["h200"], rel=1e-9)


@pytest.mark.parametrize(("shape", "device"), [("qwen3-8b", "h100"), ("qwen3-32b", "h200"), ("smollm2-135m", "a100")])
def test_the_payoff_rules_device_prior_is_what_the_cost_model_predicts(shape, device):
    """The step cost the payoff rule starts from on a GPU (sam.payoff.StepCost seeded with prior_steps) prices every
    step of the engine's range as the roofline does, long contexts and drafts included."""
    steps = prior_steps(SHAPES[shape], DEVICES[device], GPU_FIT, max_rows=256, max_context=32768, k=4)
    cost = StepCost(prior=steps)
    assert cost.priced and cost.known
    for rows, drafted, context, seconds in steps:
        assert cost.seconds(rows, drafted, context) == pytest.approx(seconds, rel=0.02), (rows, drafted, context)


def test_the_device_prior_tells_the_rule_that_long_contexts_make_drafts_cheaper_on_a_7b_gpu_step():
    """Qwen3-8B on an H100, 8 requests verifying 4 drafts each: the prior's step costs the roofline's 1.18x a plain
    step at 1k of context and less at 16k, where reading the KV cache outweighs the drafts' extra compute."""
    cost = StepCost(prior=prior_steps(SHAPES["qwen3-8b"], DEVICES["h100"], GPU_FIT, 256, 32768, 4))
    ratio = {ctx: cost.seconds(8, 32, 8 * ctx) / cost.seconds(8, 0, 8 * ctx) for ctx in (1024, 16384)}
    assert ratio[1024] == pytest.approx(1.18, abs=0.02) and ratio[16384] < ratio[1024] - 0.02, ratio


def test_an_accelerators_name_picks_its_data_sheet_and_a_cpu_gets_none():
    assert device_named("NVIDIA H100 80GB HBM3") is DEVICES["h100"]
    assert device_named("NVIDIA H200") is DEVICES["h200"]
    assert device_named("NVIDIA A100-SXM4-80GB") is DEVICES["a100"]
    assert device_named("Ascend910B") is None and device_named("cpu") is None


def test_the_recipe_registers_its_prior_where_the_sam_proposer_looks_for_one():
    entries = importlib.metadata.entry_points(group=PRIOR_ENTRY_POINTS)
    assert [e.value for e in entries] == ["recipe.cost_model:payoff_prior"]
    assert entries[0].load() is payoff_prior


def test_a_gpu_table_of_another_shape_is_predicted_from_the_h200_fit_never_fitted(tmp_path):
    """What `recipe.bench verify-cost --gpu --shape qwen3-8b` writes (its rows: batch, k, context, plain_ms, step_ms)
    joins validation.csv as held-out cells of its own table, named by the GPU and the shape."""
    shape, device = SHAPES["qwen3-8b"], DEVICES["h100"]
    rows = [
        {"batch": b, "k": k, "context": c, "plain_ms": 1e3 * step_seconds(shape, device, GPU_FIT, b, c, 0),
         "step_ms": 1e3 * step_seconds(shape, device, GPU_FIT, b, c, k)}
        for b in (1, 16) for k in (1, 4) for c in (2048, 16384)
    ]  # fmt: skip
    table = tmp_path / "verify_cost_gpu.json"
    table.write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3", "shape": "qwen3-8b", "rows": rows}))
    run = subprocess.run(
        [sys.executable, "-m", "recipe.bench", "cost-model", "--gpu-table", str(table), "--out", str(tmp_path)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    cells = [r for r in csv.DictReader(open(tmp_path / "validation.csv")) if r["table"] == "h100-qwen3-8b"]
    assert len(cells) == 4 + 8 and {r["fitted"] for r in cells} == {"no"}
    # generated by the H200 fit on the H100's data sheet: predicted back exactly
    assert max(abs(float(r["error"])) for r in cells) < 0.002
