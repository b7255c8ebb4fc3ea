"""The training-side MiMo model: a Qwen2 trunk plus MiMo-style MTP layers, in plain torch.

One forward returns the LM logits, the trunk's last hidden states (before the final norm, which is what
vLLM's MiMo passes to its MTP drafter) and the MTP logits. Parameter names are the HuggingFace MiMo names
(``model.layers.*``, ``model.mtp_layers.{i}.*``, ``lm_head``), so ``state_dict()`` is the checkpoint.

Sequences may be packed: ``cu_seqlens`` marks boundaries, attention is block-diagonal causal and
positions restart at 0 per sequence, so a packed forward equals the per-sequence forwards.

MTP layer i at position t sees the trunk hidden state at t and the embedding of token t+1 (concatenated
in that order, ``[hidden, embedding]``) and predicts token t+2. As in vLLM's MiMo MTP, the embedding at
position 0 of each sequence is zeroed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mtp.loss import roll_packed, sequence_of


@dataclass
class MiMoConfig:
    """The subset of the HF Qwen2/MiMo config this model needs; field names follow HF."""

    vocab_size: int
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    num_nextn_predict_layers: int = 1

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_hf_dict(self, extra: dict | None = None) -> dict:
        """The ``config.json`` vLLM and transformers read (Qwen2 fields, MiMo architecture)."""
        d = {
            "architectures": ["MiMoForCausalLM"],
            "model_type": "qwen2",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "max_window_layers": self.num_hidden_layers,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "hidden_act": "silu",
            "attention_dropout": 0.0,
            "use_sliding_window": False,
            "tie_word_embeddings": self.tie_word_embeddings,
            "num_nextn_predict_layers": self.num_nextn_predict_layers,
            "torch_dtype": "bfloat16",
        }
        d.update(extra or {})
        return d

    @classmethod
    def from_hf_dict(cls, d: dict) -> MiMoConfig:
        theta = d.get("rope_theta") or (d.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        fields = {k: d[k] for k in cls.__dataclass_fields__ if k in d and k != "rope_theta"}
        return cls(rope_theta=float(theta), **fields)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: MiMoConfig):
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_attention_heads * hd, bias=True)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * hd, bias=True)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * hd, bias=True)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, cfg.hidden_size, bias=False)

    def project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values of ``x`` [T, H], heads first ([heads, T, d]), queries and keys rotated."""
        t = x.shape[0]
        cfg = self.cfg
        q = self.q_proj(x).view(t, cfg.num_attention_heads, cfg.head_dim).transpose(0, 1)
        k = self.k_proj(x).view(t, cfg.num_key_value_heads, cfg.head_dim).transpose(0, 1)
        v = self.v_proj(x).view(t, cfg.num_key_value_heads, cfg.head_dim).transpose(0, 1)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        lengths: list[int],
        prefixes: list[tuple[int, int]] | None = None,
    ) -> torch.Tensor:
        """Causal attention within each sequence of a packed stream ``x`` [T, H] (``lengths`` sum to T). With
        ``prefixes`` (per sequence: the start and length of stream rows it continues, ``(0, 0)`` for none) a sequence
        attends to those rows' keys and values before its own: a prompt that sequences share, run once
        (:class:`SharedPrompts`).

        One causal SDPA call per sequence: a dense block-diagonal [T, T] mask would cost O(T^2) for a
        micro-batch of many short sequences (and force SDPA's unfused path on CPU). Inputs are 4-D
        ([1, heads, L, d]): 3-D inputs also take the unfused path on CPU."""
        t = x.shape[0]
        cfg = self.cfg
        q, k, v = self.project(x, cos, sin)
        rep = cfg.num_attention_heads // cfg.num_key_value_heads
        k, v = k.repeat_interleave(rep, dim=0), v.repeat_interleave(rep, dim=0)
        scale = 1.0 / math.sqrt(cfg.head_dim)
        q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
        parts = []
        for i, (qs, ks, vs) in enumerate(
            zip(q.split(lengths, 2), k.split(lengths, 2), v.split(lengths, 2), strict=True)
        ):
            start, shared = prefixes[i] if prefixes is not None else (0, 0)
            if not shared:
                parts.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale))
                continue
            ks = torch.cat([k[:, :, start : start + shared], ks], dim=2)
            vs = torch.cat([v[:, :, start : start + shared], vs], dim=2)
            # query j reads the whole prefix and its own sequence up to j
            mask = torch.ones(qs.shape[2], ks.shape[2], dtype=torch.bool, device=x.device).tril(shared)
            parts.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale))
        out = torch.cat(parts, dim=2)[0]
        return self.o_proj(out.transpose(0, 1).reshape(t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: MiMoConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: MiMoConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        lengths: list[int],
        keep: torch.Tensor | None = None,
        prefixes: list[tuple[int, int]] | None = None,
    ) -> torch.Tensor:
        """One block over a packed stream (``prefixes``: :meth:`Attention.forward`'s). With ``keep`` (position
        indices) only those rows come out: attention still reads every position, and the position-wise rest
        (residual, MLP) runs only there."""
        attended = self.self_attn(self.input_layernorm(x), cos, sin, lengths, prefixes)
        if keep is not None:
            x, attended = x[keep], attended[keep]
        x = x + attended
        return x + self.mlp(self.post_attention_layernorm(x))


class MTPLayer(DecoderLayer):
    """MiMo MTP layer: norms on both inputs, ``input_proj([hidden, embedding])``, a decoder block, a norm."""

    def __init__(self, cfg: MiMoConfig):
        super().__init__(cfg)
        self.token_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_proj = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.final_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(  # type: ignore[override]
        self,
        hidden: torch.Tensor,
        next_embeds: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        lengths: list[int],
        keep: torch.Tensor | None = None,
        prefixes: list[tuple[int, int]] | None = None,
    ) -> torch.Tensor:
        x = self.input_proj(torch.cat([self.hidden_layernorm(hidden), self.token_layernorm(next_embeds)], dim=-1))
        return self.final_layernorm(super().forward(x, cos, sin, lengths, keep, prefixes))


class TrunkModel(nn.Module):
    """``model.*`` of the checkpoint: embeddings, decoder layers, final norm and the MTP layers."""

    def __init__(self, cfg: MiMoConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mtp_layers = nn.ModuleList(MTPLayer(cfg) for _ in range(cfg.num_nextn_predict_layers))


@dataclass
class MiMoOutput:
    logits: torch.Tensor  # [T, V]: next-token logits (or [P, V] at output_from_states' logit_positions)
    hidden: torch.Tensor  # [T, H]: last trunk hidden state before the final norm
    embeds: torch.Tensor  # [T, H]: the token embeddings (the MTP layers read token t+1's)
    mtp_logits: list[torch.Tensor]  # per MTP layer k: [T, V] (or [P, V] at mtp_positions): t predicts token t+2+k


def packed_positions(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """Position ids that restart at 0 at every sequence start of a packed stream."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    starts = torch.repeat_interleave(cu_seqlens[:-1], lengths)
    return torch.arange(total, device=cu_seqlens.device) - starts


@dataclass
class SharedPrompts:
    """Sequences of a packed stream that open with the same prompt, as a DAPO group's responses do: ``first[i]`` is
    the first sequence with sequence i's prompt (i for that one) and ``prompt_lens[i]`` the prompt's length. MTP
    layer k's inputs at position t are the layer's input state there and the embedding of token t+1+k, the same in
    every sequence of a group until t+1+k reaches the response, so the layers run over that much of the prompt once
    (:func:`mtp_rows`) and each other sequence of the group attends to it."""

    first: list[int]
    prompt_lens: list[int]


def shared_prompts(input_ids: torch.Tensor, response_mask: torch.Tensor, cu_seqlens: torch.Tensor) -> SharedPrompts:
    """Each sequence's prompt in a packed stream (its tokens before the first response token) and the first sequence
    that opens with the same tokens. Exact wherever the tokens match: a causal trunk's states there are the same."""
    bounds = cu_seqlens.tolist()
    first, lengths, seen = [], [], {}
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        response = response_mask[start:end].nonzero()
        length = int(response[0]) if len(response) else end - start
        lengths.append(length)
        first.append(seen.setdefault(tuple(input_ids[start : start + length].tolist()), i))
    return SharedPrompts(first, lengths)


@dataclass
class MTPRows:
    """Where the MTP layers run for logits at a set of positions (:func:`mtp_rows`)."""

    rows: torch.Tensor  # [R] stream indices the layers run on, a packed sub-stream
    cu_seqlens: torch.Tensor  # its sequence boundaries
    keep: torch.Tensor  # [P] the sub-stream row whose output is each position's
    prefixes: list[tuple[int, int]] | None  # per sub-stream sequence: the shared prompt rows it continues


def mtp_rows(
    mtp_positions: torch.Tensor, cu_seqlens: torch.Tensor, prompts: SharedPrompts | None = None, depth: int = 1
) -> MTPRows:
    """The stream rows ``depth`` MTP layers must run on for logits at ``mtp_positions`` (sorted): each sequence holding
    one, from its start to its last such position (causal attention reads nothing later). With ``prompts`` a sequence
    whose prompt an earlier held sequence opens with runs only from where its inputs differ (its prompt length minus
    ``depth``), continuing that sequence's rows, and its positions before that read that sequence's outputs."""
    bounds = cu_seqlens.tolist()
    seq = sequence_of(mtp_positions, cu_seqlens)
    held, counts = torch.unique_consecutive(seq, return_counts=True)
    spans: list[tuple[int, int]] = []
    prefixes: list[tuple[int, int]] = []
    keep: list[torch.Tensor] = []
    opened: dict[int, int] = {}  # a prompt's first held sequence -> where its rows start in the sub-stream
    offset = 0
    for s, positions in zip(held.tolist(), mtp_positions.split(counts.tolist()), strict=True):
        start, local = bounds[s], positions - bounds[s]
        shared = 0 if prompts is None else max(0, prompts.prompt_lens[s] - depth)
        group = s if prompts is None else prompts.first[s]
        end = int(local[-1]) + 1
        if group in opened and shared:
            keep.append(torch.where(local < shared, opened[group] + local, offset + local - shared))
            if end > shared:
                spans.append((start + shared, start + end))
                prefixes.append((opened[group], shared))
                offset += end - shared
            continue
        opened[group] = offset
        length = max(end, shared)  # the prompt's rows, for the sequences that continue them
        keep.append(offset + local)
        spans.append((start, start + length))
        prefixes.append((0, 0))
        offset += length
    lengths = torch.tensor([b - a for a, b in spans], dtype=torch.long)
    rows = torch.cat([torch.arange(a, b, device=mtp_positions.device) for a, b in spans])
    sub_cu = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])
    shares = any(shared for _, shared in prefixes)
    return MTPRows(rows, sub_cu, torch.cat(keep), prefixes if shares else None)


def run_mtp_layers(
    mtp_layers: nn.ModuleList,
    hidden: torch.Tensor,
    embeds: torch.Tensor,
    head: torch.Tensor,
    cu_seqlens: torch.Tensor,
    positions: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor],
    detach_inputs: bool = True,
    mtp_positions: torch.Tensor | None = None,
    prompts: SharedPrompts | None = None,
) -> list[torch.Tensor]:
    """MTP logits of every layer over a packed stream: layer k at t reads layer k-1's output (the trunk's pre-norm
    hidden state for k=0) and the embedding of token t+1+k, and predicts token t+2+k through the LM head ``head``.
    With ``detach_inputs`` the hidden states, embeddings and head are detached (online MTP: the loss trains only the
    MTP layers). With ``mtp_positions`` (sorted) every layer's logits are only there, and the layers run only on the
    rows those need (:func:`mtp_rows`, a prompt that ``prompts`` says sequences share once). Shared by the in-process
    model and veRL's FSDP actor (mtp/verl_fsdp.py)."""
    if detach_inputs:
        hidden, embeds, head = hidden.detach(), embeds.detach(), head.detach()
    cos, sin = rope
    rows = keep = prefixes = None
    sub_cu = cu_seqlens
    if mtp_positions is not None and mtp_positions.numel() > 0:
        plan = mtp_rows(mtp_positions, cu_seqlens, prompts, len(mtp_layers))
        rows, sub_cu, keep, prefixes = plan.rows, plan.cu_seqlens, plan.keep, plan.prefixes
        hidden, positions, cos, sin = hidden[rows], positions[rows], cos[rows], sin[rows]
    lengths = (sub_cu[1:] - sub_cu[:-1]).tolist()
    out, prev, last = [], hidden, len(mtp_layers) - 1
    for k, layer in enumerate(mtp_layers):
        next_embeds = roll_packed(embeds, cu_seqlens, shift=-(k + 1))
        next_embeds = next_embeds if rows is None else next_embeds[rows]
        next_embeds = next_embeds.masked_fill((positions == 0)[:, None], 0.0)
        prev = layer(prev, next_embeds, cos, sin, lengths, keep if k == last else None, prefixes)
        logits_rows = prev if keep is None or k == last else prev[keep]
        out.append(F.linear(logits_rows, head))
    return out


def unrolled_attention(
    attn: Attention,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    lengths: list[int],
    earlier: list[tuple[torch.Tensor, torch.Tensor]],
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Attention of a position-shared MTP layer at its depth ``len(earlier) + 1``, as vLLM's drafter reads its KV cache
    when it runs the layer on its own output (EAGLE-3's training-time test), and this depth's keys and values.

    Rows are anchors: row t of depth d drafts token t+d+1 at position t+d-1. In the engine its query sees the cache of
    depth 1 (written from the trunk's states) up to row t and, of each deeper depth j <= d, the one entry written at
    row t's chain (``earlier[j - 2]``, then its own): a causal block over depth 1 and a diagonal block per later depth.
    ``cos``/``sin`` are this depth's (positions shifted by d-1); ``earlier`` holds the rotated keys and values of
    depths 1..d-1 over the same rows.

    Example, one sequence of 3 rows at depth 2: row 1 attends depth-1 keys of rows 0 and 1 and its own depth-2 key."""
    t = x.shape[0]
    cfg = attn.cfg
    q, k, v = attn.project(x, cos, sin)
    depths = [*earlier, (k, v)]
    rep = cfg.num_attention_heads // cfg.num_key_value_heads
    scale = 1.0 / math.sqrt(cfg.head_dim)
    parts = []
    start = 0
    for length in lengths:
        span = slice(start, start + length)
        keys = torch.cat([kd[:, span] for kd, _ in depths], dim=1).repeat_interleave(rep, dim=0)
        values = torch.cat([vd[:, span] for _, vd in depths], dim=1).repeat_interleave(rep, dim=0)
        causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
        diagonal = torch.eye(length, dtype=torch.bool, device=x.device)
        mask = torch.cat([causal] + [diagonal] * (len(depths) - 1), dim=1)
        out = F.scaled_dot_product_attention(
            q[None, :, span], keys[None], values[None], attn_mask=mask, scale=scale
        )  # fmt: skip
        parts.append(out[0])
        start += length
    out = torch.cat(parts, dim=1)
    return attn.o_proj(out.transpose(0, 1).reshape(t, -1)), (k, v)


def run_mtp_unrolled(
    layer: MTPLayer,
    hidden: torch.Tensor,
    embeds: torch.Tensor,
    head: torch.Tensor,
    cu_seqlens: torch.Tensor,
    positions: torch.Tensor,
    rope_at: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    depth: int,
    detach_inputs: bool = True,
    mtp_positions: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Logits of one MTP layer run ``depth`` times on its own output, as vLLM drafts ``num_speculative_tokens = depth``
    tokens from a checkpoint with one MTP layer: at anchor t, depth 1 reads the trunk's state at t and token t+1 and
    drafts t+2; depth d reads depth d-1's output at t and token t+d (the draft it made, where that draft was accepted)
    and drafts t+d+1, at position t+d-1, attending as :func:`unrolled_attention` says. Gradients flow through the
    earlier depths' outputs (the head is trained on its own states, FastMTP's and EAGLE-3's unroll); with
    ``detach_inputs`` the trunk's states, the embeddings and the LM head ``head`` are detached. ``rope_at`` maps
    positions to rotary ``(cos, sin)``. With ``mtp_positions`` (sorted anchors) each depth's logits are only there
    (the layer runs on the sequences holding one, up to the last); the caller masks the anchors a depth cannot train
    (:func:`mtp.loss.mtp_targets` with ``depth=d-1``).

    Example: depth 2 on the stream ``a b c d``: anchor 0 drafts ``c`` from (h_a, b), then ``d`` from (its own output, c)."""
    if detach_inputs:
        hidden, embeds, head = hidden.detach(), embeds.detach(), head.detach()
    rows = keep = None
    sub_cu = cu_seqlens
    if mtp_positions is not None and mtp_positions.numel() > 0:
        plan = mtp_rows(mtp_positions, cu_seqlens)
        rows, sub_cu, keep = plan.rows, plan.cu_seqlens, plan.keep
        hidden, positions = hidden[rows], positions[rows]
    lengths = (sub_cu[1:] - sub_cu[:-1]).tolist()
    out: list[torch.Tensor] = []
    earlier: list[tuple[torch.Tensor, torch.Tensor]] = []
    prev = hidden
    for d in range(1, depth + 1):
        next_embeds = roll_packed(embeds, cu_seqlens, shift=-d)
        next_embeds = next_embeds if rows is None else next_embeds[rows]
        if d == 1:  # vLLM zeroes the embedding at position 0, which only depth 1 reaches
            next_embeds = next_embeds.masked_fill((positions == 0)[:, None], 0.0)
        cos, sin = rope_at(positions + (d - 1))
        x = layer.input_proj(torch.cat([layer.hidden_layernorm(prev), layer.token_layernorm(next_embeds)], dim=-1))
        attended, kv = unrolled_attention(layer.self_attn, layer.input_layernorm(x), cos, sin, lengths, earlier)
        earlier.append(kv)
        x = x + attended
        prev = layer.final_layernorm(x + layer.mlp(layer.post_attention_layernorm(x)))
        out.append(F.linear(prev if keep is None else prev[keep], head))
    return out


class MiMoForCausalLM(nn.Module):
    def __init__(self, cfg: MiMoConfig):
        super().__init__()
        self.config = cfg
        self.model = TrunkModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def init_weights(self, seed: int, std: float = 0.02) -> None:
        gen = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p) if "norm" in name else nn.init.zeros_(p)
            else:
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=gen) * std)

    def trunk(
        self, input_ids: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lengths: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings and pre-norm last hidden states for a packed stream."""
        embeds = self.model.embed_tokens(input_ids)
        x = embeds
        for layer in self.model.layers:
            x = layer(x, cos, sin, lengths)
        return embeds, x

    def forward(
        self,
        input_ids: torch.Tensor,
        cu_seqlens: torch.Tensor | None = None,
        with_mtp: bool = True,
        detach_mtp_inputs: bool = True,
        mtp_positions: torch.Tensor | None = None,
    ) -> MiMoOutput:
        """Forward a packed stream ``input_ids`` [T] with boundaries ``cu_seqlens`` (default: one sequence).

        With ``detach_mtp_inputs`` (the online-MTP setting) the MTP layers read detached trunk hidden
        states and embeddings and a detached LM head, so MTP losses update only MTP parameters.
        ``mtp_positions`` (sorted indices into the stream) returns MTP logits only there, the positions a loss
        trains: the MTP layers run only on the sequences holding one, up to the last (:func:`mtp_rows`), and
        the last layer's MLP and norms and the LM head on those positions alone, which in RL skips the prompt
        tokens (and, with :func:`mtp.loss.sample_sequences`, the sequences left out).
        """
        total = input_ids.shape[0]
        if cu_seqlens is None:
            cu_seqlens = torch.tensor([0, total])
        positions = packed_positions(cu_seqlens, total)
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta)
        embeds, hidden = self.trunk(input_ids, cos, sin, lengths)
        logits = self.lm_head(self.model.norm(hidden))
        out = MiMoOutput(logits=logits, hidden=hidden, embeds=embeds, mtp_logits=[])
        if with_mtp:
            out.mtp_logits = self.draft_logits(out, cu_seqlens, detach_mtp_inputs, mtp_positions)
        return out

    def output_from_states(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        logit_positions: torch.Tensor,
        vocab: torch.Tensor | None = None,
    ) -> MiMoOutput:
        """A forward's output from the trunk's pre-norm hidden states computed elsewhere (``hidden``, [T, H]: the
        rollout engine's), for training the MTP layers alone: the embeddings, and next-token logits only at
        ``logit_positions`` ([P, V], where a loss reads its teacher; with ``vocab``, sorted token ids, [P, |vocab|]
        over those alone), without autograd. The trunk does not run."""
        with torch.no_grad():
            embeds = self.model.embed_tokens(input_ids)
            head = self.lm_head.weight if vocab is None else self.lm_head.weight[vocab]
            logits = self.model.norm(hidden[logit_positions]) @ head.T
        return MiMoOutput(logits=logits, hidden=hidden, embeds=embeds, mtp_logits=[])

    def draft_logits(
        self,
        out: MiMoOutput,
        cu_seqlens: torch.Tensor,
        detach_inputs: bool = True,
        mtp_positions: torch.Tensor | None = None,
        vocab: torch.Tensor | None = None,
        prompts: SharedPrompts | None = None,
        depth: int = 1,
    ) -> list[torch.Tensor]:
        """The MTP layers' logits (:func:`run_mtp_layers`, ``prompts`` its) on a trunk forward's ``out``; with
        ``vocab`` (sorted token ids) only those columns of the LM head: a loss that scores a shortlist of the vocabulary
        (:func:`mtp.loss.draft_vocabulary`) builds it from that forward's logits, so the head runs after them. With
        ``depth`` > 1 the one MTP layer's logits at depths 1..depth, run on its own output
        (:func:`run_mtp_unrolled`; every sequence runs over its own prompt)."""
        positions = packed_positions(cu_seqlens, out.hidden.shape[0])
        head = self.lm_head.weight if vocab is None else self.lm_head.weight[vocab]
        if depth > 1:
            cfg = self.config
            (layer,) = self.model.mtp_layers
            return run_mtp_unrolled(
                layer, out.hidden, out.embeds, head, cu_seqlens, positions,
                lambda p: rope_cos_sin(p, cfg.head_dim, cfg.rope_theta), depth, detach_inputs, mtp_positions,
            )  # fmt: skip
        rope = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta)
        return run_mtp_layers(
            self.model.mtp_layers, out.hidden, out.embeds, head, cu_seqlens, positions, rope,
            detach_inputs=detach_inputs, mtp_positions=mtp_positions, prompts=prompts,
        )  # fmt: skip

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
