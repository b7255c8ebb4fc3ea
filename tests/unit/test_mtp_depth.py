"""Drafting deep with one MTP layer (mtp/model.py run_mtp_unrolled): the training-time unroll must give the logits
vLLM's drafter computes when it runs the layer on its own output, and its gradients must reach the layer through
every depth."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mtp.loss import depth_weights, mtp_targets
from mtp.model import (
    MiMoConfig,
    MiMoForCausalLM,
    apply_rope,
    packed_positions,
    rope_cos_sin,
    run_mtp_layers,
    run_mtp_unrolled,
)


def model_and_stream(lengths: list[int], seed: int = 0) -> tuple[MiMoForCausalLM, torch.Tensor, torch.Tensor]:
    cfg = MiMoConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2)  # fmt: skip
    model = MiMoForCausalLM(cfg)
    model.init_weights(seed, std=0.3)
    ids = torch.randint(0, cfg.vocab_size, (sum(lengths),), generator=torch.Generator().manual_seed(seed))
    cu = torch.zeros(len(lengths) + 1, dtype=torch.long)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    return model, ids, cu


def unrolled(model: MiMoForCausalLM, ids, cu, depth: int, mtp_positions=None) -> list[torch.Tensor]:
    out = model(ids, cu, with_mtp=False)
    cfg = model.config
    positions = packed_positions(cu, ids.shape[0])
    return run_mtp_unrolled(
        model.model.mtp_layers[0], out.hidden, out.embeds, model.lm_head.weight, cu, positions,
        lambda p: rope_cos_sin(p, cfg.head_dim, cfg.rope_theta), depth, mtp_positions=mtp_positions,
    )  # fmt: skip


def engine_drafts(model: MiMoForCausalLM, ids: torch.Tensor, anchor: int, depth: int) -> list[torch.Tensor]:
    """vLLM's drafting loop for one sequence, token by token with an explicit KV cache: the layer writes a cache entry
    at every position 0..anchor from the trunk's states and the next token; then for each deeper depth it reads its own
    last output and the next (accepted) token at the next position, appending to the cache, as llm_base_proposer's
    loop does. Returns the logits of depths 1..depth at ``anchor``."""
    layer = model.model.mtp_layers[0]
    attn = layer.self_attn
    cfg = model.config
    with torch.no_grad():
        out = model(ids, with_mtp=False)
    keys, values = [], []

    def step(hidden: torch.Tensor, token: int | None, position: int) -> torch.Tensor:
        embed = torch.zeros(cfg.hidden_size) if token is None else model.model.embed_tokens.weight[token]
        x = layer.input_proj(torch.cat([layer.hidden_layernorm(hidden), layer.token_layernorm(embed)]))[None]
        h = layer.input_layernorm(x)
        cos, sin = rope_cos_sin(torch.tensor([position]), cfg.head_dim, cfg.rope_theta)
        q = apply_rope(attn.q_proj(h).view(1, cfg.num_attention_heads, cfg.head_dim).transpose(0, 1), cos, sin)
        k = apply_rope(attn.k_proj(h).view(1, cfg.num_key_value_heads, cfg.head_dim).transpose(0, 1), cos, sin)
        v = attn.v_proj(h).view(1, cfg.num_key_value_heads, cfg.head_dim).transpose(0, 1)
        keys.append(k)
        values.append(v)
        rep = cfg.num_attention_heads // cfg.num_key_value_heads
        kk = torch.cat(keys, dim=1).repeat_interleave(rep, dim=0)
        vv = torch.cat(values, dim=1).repeat_interleave(rep, dim=0)
        weights = torch.softmax(q @ kk.transpose(1, 2) / math.sqrt(cfg.head_dim), dim=-1)
        x = x + attn.o_proj((weights @ vv).transpose(0, 1).reshape(1, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        return layer.final_layernorm(x)[0]

    with torch.no_grad():
        for p in range(anchor + 1):  # the cache of depth 1, written from the trunk's states
            prev = step(out.hidden[p], int(ids[p + 1]) if p > 0 else None, p)
        logits = [F.linear(prev, model.lm_head.weight)]
        for d in range(2, depth + 1):
            prev = step(prev, int(ids[anchor + d]), anchor + d - 1)
            logits.append(F.linear(prev, model.lm_head.weight))
    return logits


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_the_unroll_gives_what_the_engine_drafts_at_every_anchor_and_depth(depth):
    model, ids, cu = model_and_stream([12])
    with torch.no_grad():
        got = unrolled(model, ids, cu, depth)
    for anchor in (0, 3, 7, 12 - depth - 1):
        want = engine_drafts(model, ids, anchor, depth)
        for d in range(depth):
            torch.testing.assert_close(got[d][anchor], want[d], rtol=1e-4, atol=1e-4)


def test_the_unroll_keeps_packed_sequences_apart_and_matches_the_anchors_it_is_asked_for():
    model, ids, cu = model_and_stream([9, 14, 6], seed=1)
    with torch.no_grad():
        whole = unrolled(model, ids, cu, 3)
        alone = unrolled(model, ids[9:23], torch.tensor([0, 14]), 3)
        anchors = torch.tensor([10, 12, 17])
        picked = unrolled(model, ids, cu, 3, mtp_positions=anchors)
    for d in range(3):
        torch.testing.assert_close(whole[d][9:23], alone[d], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(picked[d], whole[d][anchors], rtol=1e-4, atol=1e-4)


def test_depth_one_is_the_one_token_head():
    model, ids, cu = model_and_stream([10, 7], seed=2)
    out = model(ids, cu, with_mtp=False)
    positions = packed_positions(cu, ids.shape[0])
    rope = rope_cos_sin(positions, model.config.head_dim, model.config.rope_theta)
    with torch.no_grad():
        (one,) = run_mtp_layers(
            model.model.mtp_layers, out.hidden, out.embeds, model.lm_head.weight, cu, positions, rope
        )
        (deep,) = unrolled(model, ids, cu, 1)
    torch.testing.assert_close(deep, one, rtol=1e-5, atol=1e-5)


def test_a_deep_loss_trains_the_layer_through_its_own_earlier_output_and_not_the_trunk():
    model, ids, cu = model_and_stream([16], seed=3)
    targets, mask = mtp_targets(ids, torch.ones_like(ids), cu, depth=1)
    logits = unrolled(model, ids, cu, 2)[1]
    F.cross_entropy(logits[mask.bool()], targets[mask.bool()]).backward()
    layer = model.model.mtp_layers[0]
    assert layer.input_proj.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in model.model.layers.parameters())
    assert model.lm_head.weight.grad is None


@pytest.mark.parametrize(
    ("depth", "decay", "expected"),
    [(1, 0.6, [1.0]), (2, 1.0, [0.5, 0.5]), (3, 0.5, [4 / 7, 2 / 7, 1 / 7])],
)
def test_depth_weights_decay_and_sum_to_one(depth, decay, expected):
    np.testing.assert_allclose(depth_weights(depth, decay), expected)
