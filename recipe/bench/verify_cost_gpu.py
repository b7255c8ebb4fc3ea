"""What verifying drafts costs a decode step on a GPU, by batch size, draft length and context: SmolLM2-135M's shape
(default) or Qwen3-8B's (``--shape qwen3-8b``), the table the step-cost model reads (recipe/cost_model.py).

The CPU numbers (results/real/verify_cost) price the payoff rule's inputs where the recipe's tests run; this is
the same question on an accelerator. The lent GPU machine has no vLLM and cannot install one, so the step is
a Llama decode step written as plain torch ops over a static KV cache (``GraphDecoder``, checked against
transformers' own Llama forward before anything is timed) and replayed as a CUDA graph, as vLLM replays its decode
steps: eager PyTorch spends longer launching a 30-layer step's kernels than the GPU takes to run them, which hides
what drafting costs. B requests hold C tokens of KV cache (each of ``--contexts``, where weights and cache fit in the
device's free memory); a step feeds each request 1 + K tokens (K drafts) and computes their logits and argmax.
Weights are random in the shape (a step's cost does not depend on their values; Qwen3's q/k norms, two small
element-wise ops, are left out). Median of ``--repeats`` replays, each timed by CUDA events. ``--device cpu`` times
eager steps with a wall clock instead (the tests run a tiny shape that way).

``--tokens-per-step NAME:K:T`` adds a table of the speed-up a drafter that yields T tokens per request-step at
draft length K would reach at each batch size on this GPU (T / cost), e.g. the tail figures measured on this model
on the CPU (results/real, results/real/mtp_head): acceptance does not depend on the hardware.

    python -m recipe.bench verify-cost --gpu   # on a machine with a CUDA GPU -> results/real/verify_cost/
    python -m recipe.bench verify-cost --gpu --shape qwen3-8b --batches 1,4,16,64,256 --ks 1,2,4,8 \
        --contexts 2048,16384 --repeats 20 --out results/cost_model   # a few minutes on an H100 (not run yet)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from recipe.cost_model import SHAPES, ModelShape
from recipe.models import BUILTIN_SHAPES
from recipe.paths import RESULTS_DIR

SMOLLM2_135M = BUILTIN_SHAPES["smollm2-135m-instruct"]


def llama_config(shape: ModelShape) -> dict:
    """transformers' LlamaConfig fields of a cost-model shape (rope and norm settings do not change a step's cost)."""
    return dict(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim, rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=40960,
        tie_word_embeddings=False,
    )  # fmt: skip


STEP_SHAPES = {  # what --shape names: SmolLM2 as recipe.models builds it, the others from recipe.cost_model.SHAPES
    "smollm2-135m": SMOLLM2_135M,
    "qwen3-8b": llama_config(SHAPES["qwen3-8b"]),
    "tiny": dict(SMOLLM2_135M, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16),
}  # fmt: skip


class GraphDecoder:
    """A Llama decode step over a static KV cache of ``batch`` x ``max_len`` positions, in torch ops that a CUDA
    graph can capture (no host sync, no allocation that depends on values). Weights are read from a transformers
    ``LlamaForCausalLM``; ``step`` writes the new tokens' keys and values at ``positions`` and returns their logits."""

    def __init__(self, hf_model: torch.nn.Module, batch: int, max_len: int):
        cfg = hf_model.config
        inner = hf_model.model
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.eps = cfg.rms_norm_eps
        self.embed, self.norm, self.lm_head = inner.embed_tokens.weight, inner.norm.weight, hf_model.lm_head.weight
        self.layers = [
            (
                layer.input_layernorm.weight,
                layer.self_attn.q_proj.weight,
                layer.self_attn.k_proj.weight,
                layer.self_attn.v_proj.weight,
                layer.self_attn.o_proj.weight,
                layer.post_attention_layernorm.weight,
                layer.mlp.gate_proj.weight,
                layer.mlp.up_proj.weight,
                layer.mlp.down_proj.weight,
            )
            for layer in inner.layers
        ]
        device, dtype = self.embed.device, self.embed.dtype
        shape = (len(self.layers), batch, self.kv_heads, max_len, self.head_dim)
        self.k_cache = torch.zeros(shape, device=device, dtype=dtype)
        self.v_cache = torch.zeros(shape, device=device, dtype=dtype)
        theta = cfg.rope_parameters["rope_theta"] if getattr(cfg, "rope_parameters", None) else cfg.rope_theta
        self.inv_freq = 1.0 / theta ** (torch.arange(0, self.head_dim, 2, device=device).float() / self.head_dim)
        self.key_index = torch.arange(max_len, device=device)

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def step(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits [B, Q, V] of tokens ``ids`` [B, Q] at cache slots ``positions`` [Q] (the same for every row)."""
        b, q = ids.shape
        dtype = self.embed.dtype
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        angles = torch.cat([freqs, freqs], dim=-1)
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        mask = self.key_index[None, :] <= positions[:, None]
        half = self.head_dim // 2

        def rope(t: torch.Tensor) -> torch.Tensor:
            return t * cos + torch.cat([-t[..., half:], t[..., :half]], dim=-1) * sin

        x = F.embedding(ids, self.embed)
        for i, (ln1, wq, wk, wv, wo, ln2, wg, wu, wd) in enumerate(self.layers):
            h = self._rms(x, ln1)
            qh = rope(F.linear(h, wq).view(b, q, self.heads, self.head_dim).transpose(1, 2))
            kh = rope(F.linear(h, wk).view(b, q, self.kv_heads, self.head_dim).transpose(1, 2))
            vh = F.linear(h, wv).view(b, q, self.kv_heads, self.head_dim).transpose(1, 2)
            self.k_cache[i].index_copy_(2, positions, kh)
            self.v_cache[i].index_copy_(2, positions, vh)
            attn = F.scaled_dot_product_attention(qh, self.k_cache[i], self.v_cache[i], attn_mask=mask, enable_gqa=True)
            x = x + F.linear(attn.transpose(1, 2).reshape(b, q, -1), wo)
            h = self._rms(x, ln2)
            x = x + F.linear(F.silu(F.linear(h, wg)) * F.linear(h, wu), wd)
        return F.linear(self._rms(x, self.norm), self.lm_head)


def check_against_transformers(hf_model: torch.nn.Module, prefix: int = 8, ahead: int = 4, atol: float = 1e-4) -> float:
    """Max |logit difference| between ``GraphDecoder`` (a prefill of ``prefix`` tokens, then one step of ``ahead``)
    and transformers' forward over the whole sequence; raises if it exceeds ``atol``."""
    device = hf_model.lm_head.weight.device
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, hf_model.config.vocab_size, (2, prefix + ahead), generator=gen).to(device)
    with torch.no_grad():
        want = hf_model(ids).logits[:, prefix:].float()
        decoder = GraphDecoder(hf_model, batch=2, max_len=prefix + ahead + 3)
        decoder.step(ids[:, :prefix], torch.arange(prefix, device=device))
        got = decoder.step(ids[:, prefix:], torch.arange(prefix, prefix + ahead, device=device)).float()
    err = (got - want).abs().max().item()
    if err > atol:
        raise AssertionError(f"GraphDecoder's logits differ from transformers' by {err:.3g} (> {atol})")
    return err


def wall_step_ms(decoder: GraphDecoder, batch: int, context: int, q: int, repeats: int) -> float:
    """Median milliseconds of an eager step on the CPU (no graphs, no device events)."""
    ids = torch.randint(0, decoder.embed.shape[0], (batch, q))
    positions = torch.arange(context, context + q)
    times = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        decoder.step(ids, positions).argmax(-1)
        if i:
            times.append(1e3 * (time.perf_counter() - start))
    times.sort()
    return times[len(times) // 2]


def graph_step_ms(decoder: GraphDecoder, batch: int, context: int, q: int, repeats: int) -> float:
    """Median milliseconds of one replayed CUDA graph of a step feeding each of ``batch`` requests ``q`` tokens."""
    if decoder.embed.device.type != "cuda":
        return wall_step_ms(decoder, batch, context, q, repeats)
    vocab = decoder.embed.shape[0]
    ids = torch.randint(0, vocab, (batch, q), device="cuda")
    positions = torch.arange(context, context + q, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            decoder.step(ids, positions).argmax(-1)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decoder.step(ids, positions).argmax(-1)
    for _ in range(5):
        graph.replay()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del graph
    times.sort()
    return times[len(times) // 2]


def eager_step_ms(decoder: GraphDecoder, batch: int, context: int, repeats: int) -> float:
    """Median milliseconds of the same plain step run eagerly (kernel launches from Python), for reference."""
    if decoder.embed.device.type != "cuda":
        return wall_step_ms(decoder, batch, context, 1, repeats)
    ids = torch.randint(0, decoder.embed.shape[0], (batch, 1), device="cuda")
    positions = torch.arange(context, context + 1, device="cuda")
    times = []
    for i in range(repeats + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        decoder.step(ids, positions).argmax(-1)
        end.record()
        end.synchronize()
        if i >= 3:
            times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def parse_tokens_per_step(spec: str) -> list[tuple[str, int, float]]:
    """``NAME:K:T,...`` -> [(name, k, tokens per request-step)]; names the bad item."""
    out = []
    for item in filter(None, spec.split(",")):
        parts = item.split(":")
        if len(parts) != 3:
            raise SystemExit(f"--tokens-per-step item {item!r}: expected NAME:K:TOKENS, e.g. sam:6:1.12")
        out.append((parts[0], int(parts[1]), float(parts[2])))
    return out


def fits(model: torch.nn.Module, batch: int, max_len: int, device: str) -> bool:
    """Whether ``batch`` requests of ``max_len`` tokens of KV cache fit beside the weights (with room for a step)."""
    if device != "cuda":
        return True
    cfg = model.config
    kv = 2 * cfg.num_hidden_layers * batch * cfg.num_key_value_heads * max_len * cfg.head_dim * 2  # bf16 K and V
    logits = batch * 9 * cfg.vocab_size * 4 * 3  # a K=8 step's logits, with argmax's and softmax's copies
    return kv + logits < 0.85 * torch.cuda.mem_get_info()[0]


def main() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="smollm2-135m", choices=sorted(STEP_SHAPES))
    parser.add_argument("--batches", default="1,2,4,8,16,32,64,128,256")
    parser.add_argument("--ks", default="1,2,4,6,8")
    parser.add_argument("--contexts", default="320", help="tokens already in each request's KV cache, comma-separated")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tokens-per-step", default="", help="NAME:K:T,... drafters to project (module docstring)")
    parser.add_argument("--out", default=str(RESULTS_DIR / "real" / "verify_cost"))
    args = parser.parse_args()
    try:
        batches = [int(b) for b in args.batches.split(",")]
        ks = [int(k) for k in args.ks.split(",")]
        contexts = [int(c) for c in args.contexts.split(",")]
    except ValueError as err:
        parser.error(f"--batches/--ks/--contexts: comma-separated integers ({err})")
    drafters = parse_tokens_per_step(args.tokens_per_step)
    missing = sorted({k for _, k, _ in drafters} - set(ks))
    if missing:
        raise SystemExit(f"--tokens-per-step names K={missing}, which --ks {args.ks} does not measure")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here (--device cpu times a step on this CPU)")

    config = LlamaConfig(**STEP_SHAPES[args.shape])
    torch.manual_seed(0)
    with torch.device(args.device):  # a 2-layer twin in float32 checks the hand-written step against transformers
        twin = LlamaForCausalLM(LlamaConfig(**dict(STEP_SHAPES[args.shape], num_hidden_layers=2))).eval()
    check_err = check_against_transformers(twin)
    del twin
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bf16: an 8B model's float32 copy would double the peak
    try:
        with torch.device(args.device):
            model = LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default_dtype)
    rows = []
    started = time.perf_counter()
    with torch.no_grad():
        for context in contexts:
            for b in batches:
                if not fits(model, b, context + 1 + max(ks), args.device):
                    print(f"context {context}, batch {b}: the KV cache does not fit, skipped", flush=True)
                    continue
                decoder = GraphDecoder(model, batch=b, max_len=context + 1 + max(ks))
                # the cache's first ``context`` slots hold random keys and values, as a prefill would leave some (a
                # step's cost does not depend on them; a real prefill would compute logits for every cached token)
                decoder.k_cache.normal_()
                decoder.v_cache.normal_()
                times = {q: graph_step_ms(decoder, b, context, q, args.repeats) for q in [1, *[1 + k for k in ks]]}
                eager = eager_step_ms(decoder, b, context, args.repeats)
                rows += [
                    {"batch": b, "k": k, "context": context, "plain_ms": times[1], "eager_plain_ms": eager,
                     "step_ms": times[1 + k], "cost_vs_plain": times[1 + k] / times[1]}
                    for k in ks
                ]  # fmt: skip
                print(context, b, f"eager {eager:.3f}", {q: round(t, 3) for q, t in times.items()}, flush=True)
                del decoder
                if args.device == "cuda":
                    torch.cuda.empty_cache()

    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "verify_cost_gpu.json").write_text(
        json.dumps(
            {
                "device": device,
                "shape": args.shape,
                "check_vs_transformers_fp32": check_err,
                "seconds": time.perf_counter() - started,
                "rows": rows,
            },
            indent=1,
        )  # fmt: skip
    )
    cost = {(r["context"], r["batch"], r["k"]): r for r in rows}
    command = (
        f"python -m recipe.bench verify-cost --gpu --shape {args.shape} --batches {args.batches} --ks {args.ks} "
        f"--contexts {args.contexts} --repeats {args.repeats}"
        + (f" --device {args.device}" if args.device != "cuda" else "")
        + (f" --tokens-per-step {args.tokens_per_step}" if drafters else "")
    )
    lines = [
        f"# Verification cost of a decode step on {device}, {args.shape}'s shape"
        + (", CUDA graphs" if args.device == "cuda" else ""),
        "",
        f"Produced by `{command}` (torch {torch.__version__}, transformers "
        f"{__import__('transformers').__version__}, bf16, random weights in the model's shape). The step is a Llama "
        "decode step in plain torch ops over a static KV cache"
        + (", replayed as a CUDA graph (vLLM's way on a GPU)" if args.device == "cuda" else "")
        + f"; a 2-layer twin's logits matched transformers' Llama forward to {check_err:.1e} in fp32 before timing. "
        "B requests, each with C tokens cached, fed 1 + K tokens (logits and argmax of all of them); cost as a "
        f"multiple of the plain step (1 token each); median of {args.repeats} runs. The eager column is the same plain "
        "step launched from Python.",
    ]
    for context in contexts:
        measured = [b for b in batches if (context, b, ks[0]) in cost]
        lines += [
            "",
            f"Context {context}:",
            "",
            "| batch | eager ms/step | step ms | " + " | ".join(f"K={k}" for k in ks) + " |",
            "|---|---|---|" + "---|" * len(ks),
        ]
        for b in measured:
            cells = " | ".join(f"{cost[context, b, k]['cost_vs_plain']:.2f}x" for k in ks)
            first = cost[context, b, ks[0]]
            lines.append(f"| {b} | {first['eager_plain_ms']:.2f} | {first['plain_ms']:.3f} | {cells} |")
        if drafters and measured:
            lines += [
                "",
                "Speed-up over spec off a drafter would reach at each batch size here: its tokens per request-step "
                "(measured on the CPU; acceptance does not depend on the hardware) divided by the step's cost at its "
                "K. It leaves out the drafter's own time and vLLM's rejection sampler, so it is a ceiling.",
                "",
                "| drafter | K | tokens/request-step | " + " | ".join(f"B={b}" for b in measured) + " |",
                "|---|---|---|" + "---|" * len(measured),
            ]
            for name, k, tokens in drafters:
                cells = " | ".join(f"{tokens / cost[context, b, k]['cost_vs_plain']:.2f}x" for b in measured)
                lines.append(f"| {name} | {k} | {tokens:.2f} | {cells} |")
    (out / "verify_cost_gpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
