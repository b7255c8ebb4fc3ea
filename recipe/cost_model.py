"""The time of one decode/verify step of a transformer on an accelerator: a roofline over the bytes a step reads and
the FLOPs it computes, plus a fixed cost per step and a cost per token the roofline does not see.

A step of B requests, request i holding ``context[i]`` tokens of KV cache and verifying ``K`` draft tokens, runs
``B * (1 + K)`` tokens through every layer. It reads every weight once and every request's KV cache once (verifying K
tokens reads the cache once, not K times), and computes ``2 * params`` FLOPs per token plus attention over the
context. So

    seconds = fixed + FLOPs / (peak_flops * compute_eff * tokens / (tokens + half_tokens))
                    + bytes / (bandwidth * memory_eff) + per_token * tokens + (switch + switch_row * B) * (K > 0)

Compute and memory time add rather than overlap (a decode step's kernels are each either bound by one or the other,
one after another), and a GEMM over few rows reaches a small share of peak: ``half_tokens`` is the token count at
which it reaches half of ``compute_eff``. A step with drafts runs the verification path (a query of 1 + K tokens per
request, the rejection sampler) instead of the plain one: ``switch + switch_row * B``, the terms the payoff rule's
learned step cost has too (sam/payoff.py). The seven free parameters (:class:`StepCostFit`) are fitted to a measured
table of steps (:func:`fit`) and carried to another model shape on the same kind of device; :func:`cell_errors`
reports each cell's error, fitted or held out. An MTP head's forward is priced on the same roofline and fit
(:func:`head_seconds`).
Shapes are the models' published configs; devices their data-sheet peaks (dense bf16, HBM).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from recipe.models import BUILTIN_SHAPES


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's shape, in Hugging Face config names."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    bytes_per_param: int = 2  # bf16

    @property
    def matmul_params(self) -> int:
        """Parameters every token multiplies through: attention and MLP projections of every layer and the LM head
        (an embedding lookup reads one row)."""
        attention = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attention + mlp) + self.hidden * self.vocab

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes one token of context holds over every layer."""
        return self.layers * 2 * self.kv_heads * self.head_dim * self.bytes_per_param


@dataclass(frozen=True)
class Device:
    """An accelerator's data-sheet peaks: dense bf16 FLOP/s and memory bandwidth in bytes/s."""

    name: str
    peak_flops: float
    bandwidth: float


def shape_from_config(name: str, config: dict, bytes_per_param: int = 2) -> ModelShape:
    """A shape from Hugging Face config fields (a built-in model's, recipe/models.py, or a user's ``config.json``):
    ``head_dim`` defaults to hidden / heads and ``num_key_value_heads`` to the heads, as transformers' do."""
    heads = config["num_attention_heads"]
    return ModelShape(
        name, config["num_hidden_layers"], config["hidden_size"], config["intermediate_size"], heads,
        config.get("num_key_value_heads") or heads, config.get("head_dim") or config["hidden_size"] // heads,
        config["vocab_size"], bytes_per_param,
    )  # fmt: skip


SHAPES = {  # from each model's published config.json
    "smollm2-135m": shape_from_config("smollm2-135m", BUILTIN_SHAPES["smollm2-135m-instruct"]),
    "qwen2.5-7b": ModelShape("qwen2.5-7b", 28, 3584, 18944, 28, 4, 128, 152064),
    "mimo-7b": ModelShape("mimo-7b", 36, 4096, 11008, 32, 8, 128, 151680),
    "qwen3-8b": ModelShape("qwen3-8b", 36, 4096, 12288, 32, 8, 128, 151936),
    "qwen3-32b": ModelShape("qwen3-32b", 64, 5120, 25600, 64, 8, 128, 151936),
}
SHAPES["smollm2-135m-fp32"] = shape_from_config("smollm2-135m-fp32", BUILTIN_SHAPES["smollm2-135m-instruct"], 4)

DEVICES = {  # NVIDIA data sheets (SXM): dense bf16 tensor-core FLOP/s, HBM bytes/s
    "a100": Device("a100", 312e12, 2.039e12),
    "h100": Device("h100", 989e12, 3.35e12),
    "h200": Device("h200", 989e12, 4.8e12),
    # two x86 cores in float32 (AVX2 FMA: 32 FLOP a cycle a core at about 3 GHz) and a DDR channel's share; nominal,
    # the fitted efficiencies carry what the engine reaches
    "cpu-2core": Device("cpu-2core", 1.9e11, 2.0e10),
}


@dataclass(frozen=True)
class StepCostFit:
    """The free parameters: seconds every step pays (launch, host), the share of peak compute a step's GEMMs reach with
    many rows and the token count at which they reach half of it, the share of peak bandwidth, and seconds per token
    the FLOPs do not count (sampling, small kernels); what switching a step to verification costs, and per request."""

    fixed_s: float
    compute_eff: float
    half_tokens: float
    memory_eff: float
    per_token_s: float
    switch_s: float
    switch_row_s: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def per_request(batch: int, context: float | Sequence[float]) -> np.ndarray:
    """Each of ``batch`` requests' context: one number for all, or one per request."""
    return np.full(batch, float(context)) if np.isscalar(context) else np.asarray(context, dtype=np.float64)


def step_work(shape: ModelShape, batch: int, context: float | Sequence[float], k: int) -> tuple[float, float, int]:
    """(FLOPs, bytes, tokens) of one step: ``batch`` requests, each verifying ``k`` drafts over its ``context``
    (one number for all, or one per request)."""
    contexts = per_request(batch, context)
    if contexts.size != batch:
        raise ValueError(f"context: {contexts.size} lengths for a batch of {batch}")
    tokens = batch * (1 + k)
    attention = 4 * shape.layers * shape.heads * shape.head_dim * (1 + k) * float(contexts.sum())  # QK^T and PV
    flops = 2.0 * shape.matmul_params * tokens + attention
    weights = (shape.matmul_params + shape.hidden) * shape.bytes_per_param
    return flops, weights + shape.kv_bytes_per_token * float(contexts.sum()), tokens


def step_seconds(
    shape: ModelShape, device: Device, fit: StepCostFit, batch: int, context: float | Sequence[float], k: int
) -> float:
    """Seconds of one decode (``k=0``) or verify step."""
    flops, nbytes, tokens = step_work(shape, batch, context, k)
    compute = flops / (device.peak_flops * fit.compute_eff * tokens / (tokens + fit.half_tokens))
    switch = (fit.switch_s + fit.switch_row_s * batch) if k > 0 else 0.0
    return fit.fixed_s + compute + nbytes / (device.bandwidth * fit.memory_eff) + fit.per_token_s * tokens + switch


def head_seconds(
    shape: ModelShape,
    device: Device,
    fit: StepCostFit,
    batch: int,
    context: float | Sequence[float],
    k: int,
    depth: int = 1,
) -> float:
    """Seconds an MTP head (vLLM's ``mtp`` drafter: one MiMo layer) adds to a step that verified ``k`` drafts: its
    input projection and decoder layer over the step's ``batch * (1 + k)`` tokens, reading its own layer's KV cache,
    then its draft sampled through the LM head over ``batch`` rows; each later token of a chain ``depth`` deep (the
    layer run on its own output) runs the layer and the LM head over ``batch`` rows again. Priced on the step's
    roofline and fit; the per-token term and the fixed cost in proportion to the weights it multiplies through (one
    layer and the LM head of the step's layers and LM head)."""
    if depth > 1:
        return head_seconds(shape, device, fit, batch, context, k) + (depth - 1) * head_seconds(
            shape, device, fit, batch, context, 0
        )
    contexts = per_request(batch, context)
    tokens = batch * (1 + k)
    lm_head = shape.hidden * shape.vocab
    layer = (shape.matmul_params - lm_head) / shape.layers + 2 * shape.hidden * shape.hidden  # + the input projection
    rows = [(tokens, layer), (batch, lm_head)]  # (tokens through, weights) of each GEMM
    seconds = 4 * shape.heads * shape.head_dim * (1 + k) * float(contexts.sum()) / (device.peak_flops * fit.compute_eff)
    for n, params in rows:
        seconds += 2 * params * n / (device.peak_flops * fit.compute_eff * n / (n + fit.half_tokens))
        seconds += params * shape.bytes_per_param / (device.bandwidth * fit.memory_eff)
        seconds += fit.per_token_s * n * params / shape.matmul_params
    kv = shape.kv_bytes_per_token / shape.layers * float(contexts.sum())
    share = sum(params for _, params in rows) / shape.matmul_params
    return seconds + kv / (device.bandwidth * fit.memory_eff) + fit.fixed_s * share


@dataclass(frozen=True)
class Cell:
    """One measured step: its time in seconds (or, with ``relative``, its time over the same batch's ``k=0`` step)."""

    table: str
    batch: int
    k: int
    context: float
    measured: float
    relative: bool = False
    head: bool = False  # the step also ran an MTP head that drafted its k=1 tokens (:func:`head_seconds`)

    @property
    def name(self) -> str:
        return f"B={self.batch},K={'mtp' if self.head else self.k},C={self.context:.0f}"


def predicted(cell: Cell, shape: ModelShape, device: Device, fit: StepCostFit) -> float:
    seconds = step_seconds(shape, device, fit, cell.batch, cell.context, cell.k)
    if cell.head:
        seconds += head_seconds(shape, device, fit, cell.batch, cell.context, cell.k)
    if cell.relative:
        return seconds / step_seconds(shape, device, fit, cell.batch, cell.context, 0)
    return seconds


def fit(cells: Sequence[Cell], shape: ModelShape, device: Device) -> StepCostFit:
    """The parameters that minimise the squared log error over ``cells`` (a ratio and its inverse weigh alike),
    searched in log space so every parameter stays positive."""
    from scipy.optimize import least_squares

    measured = np.log([c.measured for c in cells])

    def unpack(x: np.ndarray) -> StepCostFit:
        return StepCostFit(*(float(v) for v in np.exp(x)))

    def residuals(x: np.ndarray) -> np.ndarray:
        fit_ = unpack(x)
        return np.log([predicted(c, shape, device, fit_) for c in cells]) - measured

    absolute = [c.measured for c in cells if not c.relative]
    start_fixed = min(absolute) / 2 if absolute else 1e-3
    best = None
    # efficiencies up to 4: a CPU's nominal peaks are estimates, the fit carries the rest
    lower, upper = np.log([1e-7, 1e-4, 1e-2, 1e-3, 1e-12, 1e-9, 1e-12]), np.log([10, 4, 1e5, 4, 1, 1, 1])
    for compute in (0.05, 0.3, 0.7):  # a few starts: the error surface has flat valleys
        for half in (1.0, 64.0, 1024.0):
            x0 = np.log([start_fixed, compute, half, 0.5, 1e-7, start_fixed / 10, 1e-6])
            result = least_squares(residuals, x0, bounds=(lower, upper))
            if best is None or result.cost < best.cost:
                best = result
    return unpack(best.x)


def cell_errors(cells: Sequence[Cell], shape: ModelShape, device: Device, fit_: StepCostFit) -> list[dict]:
    """Each cell's measured and predicted value and the relative error of the prediction."""
    rows = []
    for c in cells:
        p = predicted(c, shape, device, fit_)
        rows.append({"table": c.table, "cell": c.name, "measured": c.measured, "predicted": p,
                     "error": p / c.measured - 1.0})  # fmt: skip
    return rows


def max_abs_error(rows: Sequence[dict]) -> float:
    return max((abs(r["error"]) for r in rows), default=math.nan)


# SmolLM2-135M's step on an H200 fitted (results/cost_model/fits.json, "h200"): a GPU step's fixed, per-token and
# verification-switch costs before an engine has timed its own, carried to other shapes and NVIDIA devices as
# results/cost_model/README.md checks on Qwen2.5-7B (tests/unit/test_cost_model.py keeps the two equal)
GPU_FIT = StepCostFit(
    fixed_s=0.002928995666356179,
    compute_eff=0.26329996242804704,
    half_tokens=2.406708113364643,
    memory_eff=0.4462908216416167,
    per_token_s=1.2297880604858937e-09,
    switch_s=0.00050977697752507,
    switch_row_s=2.4088622656076358e-05,
)
# per-request contexts the payoff prior's steps span (up to the engine's max_model_len)
PRIOR_CONTEXTS = (256, 1024, 4096, 16384, 65536)


def tensor_parallel(device: Device, gpus: int) -> Device:
    """An engine spread over ``gpus`` such devices as one with their summed peaks (the all-reduce not counted)."""
    return Device(f"{device.name}x{gpus}", device.peak_flops * gpus, device.bandwidth * gpus)


def device_named(name: str) -> Device | None:
    """The data-sheet device an accelerator's name names (``torch.cuda.get_device_name()``: "NVIDIA H100 80GB HBM3"),
    or None."""
    lowered = name.lower()
    return next((d for key, d in DEVICES.items() if not key.startswith("cpu") and key in lowered), None)


def prior_steps(
    shape: ModelShape, device: Device, fit_: StepCostFit, max_rows: int, max_context: int, k: int
) -> list[list[float]]:
    """``[rows, drafted, context, seconds]`` steps over an engine's range (rows in powers of two up to ``max_rows``,
    0 to ``k`` drafts a row, per-request contexts of :data:`PRIOR_CONTEXTS` up to ``max_context``): the steps the
    payoff rule's learned cost (sam.payoff.StepCost) starts from."""
    rows = sorted({min(1 << i, max_rows) for i in range(max(1, max_rows).bit_length() + 1)})
    contexts = sorted({min(c, max_context) for c in PRIOR_CONTEXTS})
    return [
        [b, b * kk, b * c, step_seconds(shape, device, fit_, b, c, kk)]
        for b in rows
        for kk in sorted({0, 1, min(2, k), k})
        for c in contexts
    ]


def payoff_prior(vllm_config) -> list[list[float]] | None:
    """sam.payoff.device_prior's entry point (``spec_rollout.step_cost_prior``): this engine's steps as the model
    predicts them on its NVIDIA GPU (:func:`engine_prior`), or None on a CPU, an Ascend NPU or a GPU without data-sheet
    figures here: the payoff rule then starts from its CPU-shaped prior."""
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return None
    import torch

    device = device_named(torch.cuda.get_device_name())
    return None if device is None else engine_prior(vllm_config, device)


def engine_prior(vllm_config, device: Device) -> list[list[float]]:
    """:func:`prior_steps` for a vLLM engine's model (its shape and dtype from the engine's config), batch range,
    context range and K on ``device`` with :data:`GPU_FIT`, tensor parallelism as :func:`tensor_parallel`."""
    import torch

    model = vllm_config.model_config
    text = model.hf_text_config
    fields = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
    config = {key: getattr(text, key) for key in fields}
    config["num_key_value_heads"] = getattr(text, "num_key_value_heads", None) or config["num_attention_heads"]
    config["head_dim"] = getattr(text, "head_dim", None) or config["hidden_size"] // config["num_attention_heads"]
    shape = shape_from_config(str(model.model), config, torch.empty(0, dtype=model.dtype).element_size())
    device = tensor_parallel(device, int(vllm_config.parallel_config.tensor_parallel_size))
    return prior_steps(
        shape, device, GPU_FIT, int(vllm_config.scheduler_config.max_num_seqs), int(model.max_model_len),
        int(vllm_config.speculative_config.num_speculative_tokens),
    )  # fmt: skip


CELL_COLUMNS = ("gpu", "model", "tp", "batch", "context", "k")  # a step to price: what `cost-model predict` reads


def shape_named(model: str) -> ModelShape:
    """A shape in :data:`SHAPES`, or one read from the path of a Hugging Face ``config.json``."""
    if model in SHAPES:
        return SHAPES[model]
    path = Path(model)
    if path.is_file():
        try:
            return shape_from_config(path.parent.name or path.stem, json.loads(path.read_text()))
        except (KeyError, ValueError, TypeError) as err:
            raise ValueError(f"model {model!r}: not a decoder's config.json ({err})") from err
    raise ValueError(f"model {model!r}: neither a built-in shape ({', '.join(SHAPES)}) nor a config.json file")


def predict_step(gpu: str, model: str, tp: int, batch: int, context: float, k: int) -> float:
    """Seconds of one step, as :data:`CELL_COLUMNS` name it: on ``tp`` data-sheet ``gpu`` devices (:data:`DEVICES`,
    not the CPU), ``batch`` requests of ``context`` KV tokens each verifying ``k`` drafts (0: a plain decode step),
    from the fit carried from SmolLM2's H200 step (:data:`GPU_FIT`). Raises ValueError naming a bad value.

    Example: ``predict_step("h100", "qwen3-8b", 1, 16, 2048, 4)`` over ``..., 0)`` is what verifying four drafts a
    request costs a 16-request step of Qwen3-8B, as docs/gains.md reads it."""
    device = DEVICES.get(str(gpu).lower())
    if device is None or device.name.startswith("cpu"):
        known = ", ".join(d for d in DEVICES if not d.startswith("cpu"))
        raise ValueError(f"gpu {gpu!r}: no data sheet here (known: {known})")
    for name, value, low in (("tp", tp, 1), ("batch", batch, 1), ("k", k, 0)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{name} {value!r}: an integer >= {low}")
    if not context >= 0:
        raise ValueError(f"context {context!r}: KV tokens per request, >= 0")
    return step_seconds(shape_named(model), tensor_parallel(device, tp), GPU_FIT, batch, context, k)
