"""Train an MTP head on the model's own samples with the trunk frozen, and measure its acceptance in vLLM.

The head drafts what the policy will sample, so it learns from the policy's own rollouts (T=1, the prompts RL
trains on), not from reference text. The trunk is frozen: its hidden states are computed once per packed batch (in
the engine's dtype, as vLLM computes the states the head reads when it drafts) and cached, and only the MTP layers
train: by distilling the target's own distribution of the token they draft, or with the CE on the sampled token that
online MTP uses during RL (:mod:`mtp.loss`).
"""

from __future__ import annotations

import copy
import json
import pickle
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from mtp import MTP_OBJECTIVES
from mtp.checkpoint import DEPTH_KEY, load_checkpoint, load_tokenizer, save_checkpoint
from mtp.loss import (
    DEPTH_DECAY,
    depth_weights,
    draft_vocabulary,
    expected_acceptance,
    mtp_loss,
    mtp_targets,
    objective_loss,
)
from mtp.model import packed_positions, rope_cos_sin, run_mtp_layers, run_mtp_unrolled
from recipe.dapo.timeline import RolloutTimeline
from recipe.sft.train import TokenizedExample, pack_batches

WARMUP_PROMPTS = 4  # prompts a fresh engine samples, unmeasured, before a rollout whose tokens/s is reported


def rollout_at_t1(
    ckpt: str | Path,
    spec: dict | None,
    prompts: list[list[int]],
    n: int,
    max_tokens: int,
    seed: int,
    progress: bool,
    dtype: str = "bfloat16",
    warmup: Sequence[list[int]] = (),
):
    """One rollout of ``n`` samples per prompt at T=1 in a fresh in-process vLLM engine with ``spec`` in ``dtype``,
    closed after. ``warmup`` prompts are sampled first (one 32-token sample each, not measured): a fresh engine's
    first steps cost several times a warm one's, which would otherwise land on the measured rollout's tokens/s."""
    from recipe.dapo.rollout import RolloutEngine
    from recipe.engine import EngineOptions

    engine = RolloutEngine(
        str(ckpt), spec, EngineOptions(max_model_len=1024, seed=seed, dtype=dtype), None, free_cache_engine=False
    )
    try:
        if warmup:
            engine.generate(list(warmup), 1, {"temperature": 1.0, "top_p": 1.0, "max_tokens": 32}, False)
        return engine.generate(prompts, n, {"temperature": 1.0, "top_p": 1.0, "max_tokens": max_tokens}, progress)
    finally:
        engine.close()


def own_samples(
    ckpt: str | Path,
    prompts: list[list[int]],
    n: int,
    max_tokens: int,
    seed: int,
    dtype: str = "bfloat16",
    progress: bool = True,
) -> tuple[list[TokenizedExample], dict]:
    """``n`` responses per prompt sampled by the checkpoint itself in vLLM at T=1 (spec off) in ``dtype``, and the
    rollout's summary (tokens, time)."""
    result = rollout_at_t1(ckpt, None, prompts, n, max_tokens, seed, progress, dtype)
    samples = []
    for r in result.responses:
        ids = np.asarray(list(r.prompt_ids) + list(r.token_ids), dtype=np.int64)
        mask = np.zeros(len(ids), dtype=np.int64)
        mask[len(r.prompt_ids) :] = 1
        samples.append(TokenizedExample(ids, mask))
    return samples, result.timeline.summary(8)


def save_samples(path: Path, samples: Sequence[TokenizedExample], summary: dict) -> None:
    """Write a sample set (the responses and how they were made): sampling is the slow part of training a head, so
    recipe/mtp_head.py keeps it beside the checkpoints, and the benches and the replay train on it."""
    arrays = [(s.ids, s.response_mask) for s in samples]
    path.write_bytes(pickle.dumps((arrays, summary)))


def load_samples(path: str | Path) -> tuple[list[TokenizedExample], dict]:
    """A sample set written by :func:`save_samples`, and its summary."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such sample set (recipe/mtp_head.py writes them)")
    arrays, summary = pickle.loads(path.read_bytes())
    return [TokenizedExample(ids, mask) for ids, mask in arrays], summary


@dataclass
class CachedPack:
    cu: torch.Tensor  # sequence boundaries
    positions: torch.Tensor  # per-sequence positions
    hidden: torch.Tensor  # [T, H] frozen trunk's pre-norm hidden states (engine dtype)
    embeds: torch.Tensor  # [T, H] token embeddings
    train_at: torch.Tensor  # stream positions whose MTP target is a response token
    targets: torch.Tensor  # the MTP target at each of those
    deep_targets: torch.Tensor  # [P, depth]: the token drafted at depth d from each of those anchors (t+d+1)
    deep_valid: torch.Tensor  # [P, depth]: whether depth d trains there (t+1..t+d+1 are response tokens)
    teacher_ids: torch.Tensor | None = None  # [T, k]: the target's k likeliest next tokens at every position ...
    teacher_probs: torch.Tensor | None = None  # ... and their probabilities (None: the loss reads the whole vocabulary)


TEACHER_CHUNK = 1024  # positions whose whole-vocabulary logits are held at once while a pack's teacher is cached


@torch.no_grad()
def teacher_topk(model, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's ``k`` likeliest next tokens and their probabilities at every position of ``hidden`` (its pre-norm
    states), a chunk of positions at a time."""
    ids, probs = [], []
    for chunk in hidden.split(TEACHER_CHUNK):
        top = torch.softmax(model.lm_head(model.model.norm(chunk)).float(), dim=-1).topk(k, dim=-1)
        ids.append(top.indices.int())
        probs.append(top.values)
    return torch.cat(ids), torch.cat(probs)


def cache_trunk(
    model, packs: list[list[TokenizedExample]], progress: bool = True, depth: int = 1, topk: int = 0
) -> list[CachedPack]:
    """The frozen trunk's hidden states of every pack, once, and the targets of drafting depths 1..``depth``; with
    ``topk``, the target's top-``topk`` next-token distribution at every position too (:func:`deep_pack_loss`'s
    shortlist)."""
    out = []
    cfg = model.config
    for group in tqdm(packs, desc="trunk states", disable=not progress, dynamic_ncols=True):
        ids = torch.from_numpy(np.concatenate([s.ids for s in group]))
        mask = torch.from_numpy(np.concatenate([s.response_mask for s in group]))
        cu = torch.zeros(len(group) + 1, dtype=torch.long)
        cu[1:] = torch.cumsum(torch.tensor([len(s.ids) for s in group]), 0)
        positions = packed_positions(cu, ids.shape[0])
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)
        with torch.no_grad():
            embeds, hidden = model.trunk(ids, cos, sin, (cu[1:] - cu[:-1]).tolist())
        targets, tmask = mtp_targets(ids, mask, cu, depth=0)
        train_at = torch.nonzero(tmask).flatten()
        deep = [mtp_targets(ids, mask, cu, depth=d) for d in range(depth)]
        deep_targets = torch.stack([t[train_at] for t, _ in deep], dim=1)
        deep_valid = torch.stack([m[train_at].bool() for _, m in deep], dim=1)
        pack = CachedPack(cu, positions, hidden, embeds, train_at, targets[train_at], deep_targets, deep_valid)
        if topk:
            pack.teacher_ids, pack.teacher_probs = teacher_topk(model, hidden, topk)
        out.append(pack)
    return out


def acceptance_ceiling(model, cached: list[CachedPack]) -> float:
    """The mean of the target's own top-1 probability for token t+2 at the positions a head trains on: what a head that
    drafts the target's argmax (vLLM's MTP drafting) would have accepted at T=1 if it knew the target's distribution
    exactly. No one-token drafter of the argmax can beat it."""
    total, count = 0.0, 0
    with torch.no_grad():
        for c in cached:
            rows = c.hidden[c.train_at + 1]  # the target's distribution of token t+2 is its output at t+1
            probs = torch.softmax(model.lm_head(model.model.norm(rows)).float(), dim=-1)
            total += float(probs.max(dim=-1).values.sum())
            count += int(rows.shape[0])
    return total / max(count, 1)


def draft_logits(model, layers: torch.nn.ModuleList, head: torch.Tensor, c: CachedPack) -> torch.Tensor:
    """The MTP ``layers``' logits at the pack's trained positions through the LM head weight ``head`` (its rows for a
    shortlist of the vocabulary, or all of them)."""
    cfg = model.config
    rope = rope_cos_sin(c.positions, cfg.head_dim, cfg.rope_theta)
    return run_mtp_layers(
        layers, c.hidden.float(), c.embeds.float(), head, c.cu, c.positions, rope, mtp_positions=c.train_at
    )[0]


def deep_draft_logits(
    model, layers: torch.nn.ModuleList, head: torch.Tensor, c: CachedPack, depth: int
) -> list[torch.Tensor]:
    """The head's logits at each of depths 1..``depth`` at the pack's anchors, its one layer run on its own output as
    vLLM drafts ``depth`` tokens (:func:`mtp.model.run_mtp_unrolled`)."""
    cfg = model.config
    (layer,) = layers
    return run_mtp_unrolled(
        layer, c.hidden.float(), c.embeds.float(), head, c.cu, c.positions,
        lambda p: rope_cos_sin(p, cfg.head_dim, cfg.rope_theta), depth, mtp_positions=c.train_at,
    )  # fmt: skip


@torch.no_grad()
def target_logits(model, c: CachedPack, depth: int = 1) -> torch.Tensor:
    """The frozen target's logits of the token the head drafts at each trained position at ``depth``: its output
    ``depth`` positions later, from the cached states (clamped to the stream where the depth does not train)."""
    return model.lm_head(model.model.norm(c.hidden[anchors_ahead(c, depth)])).float()


def deep_pack_loss(
    model, layers: torch.nn.ModuleList, head: torch.Tensor, c: CachedPack, objective: str, weights: np.ndarray
) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
    """The head's loss over its drafting depths (``weights`` per depth, :func:`depth_weights`): at depth d, the
    objective's loss at the anchors where depth d trains, against the target's distribution of token t+d+1; its top-1
    accuracy at depth 1; and each depth's mean expected acceptance ``sum(min(p, q))`` there, the chance a depth-d draft
    is accepted given the ones before it were (inputs teacher-forced: an accepted draft is the target's token).

    Where the pack cached the target's top-k (``cache_trunk(topk=k)``) the loss runs over a shortlist, the union of
    those top-k at every drafted token and the sampled tokens, the head's softmax taken over it and the target's mass
    outside its top-k left out (as ``spec.mtp.loss_vocab_topk`` trains online); else over the whole vocabulary."""
    depth = len(weights)
    vocab = None
    if c.teacher_ids is not None:
        drafted = torch.cat([c.teacher_ids[anchors_ahead(c, d)].flatten() for d in range(1, depth + 1)])
        vocab = torch.unique(torch.cat([drafted.long(), c.deep_targets.flatten()]))
    total = head.new_zeros(())
    acc = head.new_zeros(())
    accepts = []
    logits_by_depth = deep_draft_logits(model, layers, head if vocab is None else head[vocab], c, depth)
    for d, logits in enumerate(logits_by_depth, start=1):
        valid = c.deep_valid[:, d - 1]
        targets = c.deep_targets[valid, d - 1]
        if vocab is None:
            teacher = torch.softmax(target_logits(model, c, d), dim=-1)[valid]
        else:
            at = anchors_ahead(c, d)[valid]
            teacher = torch.zeros(int(valid.sum()), vocab.numel())
            teacher.scatter_(1, torch.searchsorted(vocab, c.teacher_ids[at].long()), c.teacher_probs[at])
            targets = torch.searchsorted(vocab, targets)
        loss, top1 = objective_loss(objective, logits[valid], targets, teacher)
        total = total + float(weights[d - 1]) * loss
        acc = top1 if d == 1 else acc
        accepts.append(float(expected_acceptance(logits[valid].detach(), teacher).mean()))
    return total, acc, accepts


def anchors_ahead(c: CachedPack, depth: int) -> torch.Tensor:
    """The stream position ``depth`` after each anchor, whose next-token distribution is the target's for the token
    drafted at that depth (clamped to the stream where the depth does not train)."""
    return (c.train_at + depth).clamp(max=c.hidden.shape[0] - 1)


def draft_and_target(
    model, layers: torch.nn.ModuleList, head: torch.Tensor, c: CachedPack
) -> tuple[torch.Tensor, torch.Tensor]:
    """The MTP ``layers``' logits at the pack's trained positions (LM head weight ``head``) and the frozen target's own
    distribution of the token they draft there."""
    return draft_logits(model, layers, head, c), torch.softmax(target_logits(model, c), dim=-1)


def pack_loss(
    model, layers: torch.nn.ModuleList, head: torch.Tensor, c: CachedPack, objective: str, vocab_topk: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The online MTP loss of ``objective`` (:func:`mtp.loss.mtp_loss`) and top-1 accuracy at the pack's trained
    positions, over the whole vocabulary or, with ``vocab_topk``, :func:`mtp.loss.draft_vocabulary`'s shortlist (as
    ``spec.mtp.loss_vocab_topk`` trains the head during RL)."""
    policy_next = target_logits(model, c)
    vocab = draft_vocabulary(policy_next, c.targets, vocab_topk) if vocab_topk else None
    logits = draft_logits(model, layers, head if vocab is None else head[vocab], c)
    return mtp_loss(objective, logits, c.targets, policy_next, vocab)


def held_out_acceptance(
    model, heads: dict[str, torch.nn.ModuleList], samples: list[TokenizedExample], tokens_per_pack: int = 4096
) -> dict[str, dict[str, float]]:
    """Each head's expected acceptance of one probabilistic draft on ``model``'s trunk, over ``samples`` (responses the
    model sampled itself): ``sum(min(p, q))`` against the model's own distribution of the drafted token, averaged over
    every drafted position (``accepted``, what vLLM counts) and over those whose target is not a response's last token
    (``earned``: a step emits that token whether its draft is accepted or not, and the end cuts off the bonus token).
    No sampling noise: every head is scored on the same text, so two heads' ratio is exact for that text."""
    cached = cache_trunk(model, pack_batches(samples, tokens_per_pack, np.random.default_rng(0)), progress=False)
    head = model.lm_head.weight.detach().float()
    sums = {name: {"accepted": 0.0, "earned": 0.0} for name in heads}
    positions = {"accepted": 0, "earned": 0}
    with torch.no_grad():
        for c in cached:
            # the position whose target (t+2) is a sequence's last token
            earns = ~torch.isin(c.train_at, c.cu[1:] - 3)
            positions["accepted"] += int(c.train_at.numel())
            positions["earned"] += int(earns.sum())
            for name, layers in heads.items():
                accept = expected_acceptance(*draft_and_target(model, layers, head, c))
                sums[name]["accepted"] += float(accept.sum())
                sums[name]["earned"] += float(accept[earns].sum())
    return {name: {k: v / max(positions[k], 1) for k, v in s.items()} for name, s in sums.items()}


def train_head(
    ckpt: str | Path,
    samples: list[TokenizedExample],
    out_dir: str | Path,
    epochs: int = 2,
    tokens_per_pack: int = 4096,
    lr: float = 1e-3,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    objective: str = "distill",
    progress: bool = True,
    depth: int = 1,
    depth_decay: float = DEPTH_DECAY,
    vocab_topk: int = 0,
) -> tuple[Path, list[dict], float]:
    """Train the MTP layers of ``ckpt`` on ``samples`` (trunk, embeddings and LM head frozen) and write the checkpoint
    to ``out_dir``; returns it, the per-step history (loss, top-1 accuracy against the sampled token, the expected
    acceptance of a probabilistic draft ``sum(min(p, q))``, seconds) and the data's :func:`acceptance_ceiling`.

    ``objective``: ``distill`` matches the target's whole distribution of token t+2 (its own output at t+1, from the
    cached states): what a probabilistic draft (vLLM's ``draft_sample_method=probabilistic``) is accepted by, and far
    more signal per token than the sampled token; ``acceptance`` maximises that acceptance itself, ``sum(min(p, q))``
    (one minus the total variation distance; forward KL spreads q over tokens p rarely samples), a fine-tune for a
    head ``distill`` trained; ``sampled``: CE on the sampled token, the loss online MTP uses in RL.

    ``depth`` > 1 trains the one MTP layer to draft that many tokens a step, run on its own output as vLLM runs it
    (:func:`deep_pack_loss`, depth d weighted ``depth_decay ** (d - 1)``); the history then has each depth's expected
    acceptance (``expected_acceptance_pos_<d>``). ``vocab_topk`` > 0 scores the loss over a shortlist of the vocabulary
    (:func:`deep_pack_loss`), which over a large vocabulary is most of a step's time saved."""
    if objective not in MTP_OBJECTIVES:
        raise ValueError(f"objective={objective!r}: {' | '.join(MTP_OBJECTIVES)}")
    if depth < 1:
        raise ValueError(f"depth={depth}: the head drafts at least one token")
    torch.manual_seed(seed)
    model = load_checkpoint(ckpt, dtype)
    model.requires_grad_(False)
    layers = copy.deepcopy(model.model.mtp_layers).float().requires_grad_(True)
    head = model.lm_head.weight.detach().float()
    rng = np.random.default_rng(seed)
    cached = cache_trunk(model, pack_batches(samples, tokens_per_pack, rng), progress, depth, vocab_topk)
    ceiling = acceptance_ceiling(model, cached)
    weights = depth_weights(depth, depth_decay)
    total = epochs * len(cached)
    opt = torch.optim.AdamW(layers.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=total, pct_start=0.05)
    history = []
    start = time.time()
    bar = tqdm(total=total, desc="mtp head", disable=not progress, dynamic_ncols=True)
    for epoch in range(epochs):
        for i in rng.permutation(len(cached)):
            # a probabilistic draft's acceptance at T=1 per depth, logged for every objective
            loss, acc, accepts = deep_pack_loss(model, layers, head, cached[i], objective, weights)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(layers.parameters(), 1.0)
            opt.step()
            sched.step()
            history.append(
                {"step": len(history), "epoch": epoch, "loss": loss.item(), "acc": acc.item(),
                 "expected_acceptance": accepts[0], "s": time.time() - start,
                 **{f"expected_acceptance_pos_{d}": a for d, a in enumerate(accepts, start=1)}}
            )  # fmt: skip
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}", acc=f"{acc.item():.3f}")
    bar.close()
    # the trunk is written back exactly as stored: the original weights, at the checkpoint's own precision
    hf = json.loads((Path(ckpt) / "config.json").read_text())
    stored = getattr(torch, str(hf.get("torch_dtype", "bfloat16")))
    result = load_checkpoint(ckpt, torch.float32)
    result.model.mtp_layers.load_state_dict(layers.state_dict())
    extra = {k: v for k, v in hf.items() if k.startswith("spec_rollout_")} | {DEPTH_KEY: depth}
    out = save_checkpoint(result, load_tokenizer(ckpt), out_dir, extra_config=extra, dtype=stored)
    return out, history, ceiling


def held_out_prompts(checkpoint: str | Path, count: int) -> list[list[int]]:
    """The first ``count`` word problems of the test split, chat-templated with the checkpoint's tokenizer: prompts
    that neither a head nor a policy trained on."""
    from recipe.dapo.data import load_prompts
    from recipe.data.word_problems import write_splits

    _, test_file = write_splits()
    return load_prompts(str(test_file), load_tokenizer(checkpoint), 512, count)[1]


def mtp_rollout(
    ckpt: str | Path,
    prompts: list[list[int]],
    n: int,
    max_tokens: int,
    seed: int,
    progress: bool = True,
    draft_sample_method: str = "greedy",
    dtype: str = "bfloat16",
    warmup: Sequence[list[int]] = (),
    num_speculative_tokens: int = 1,
) -> tuple[dict, RolloutTimeline]:
    """The checkpoint's MTP head drafting in vLLM (method ``mtp``) at T=1 in a fresh engine: the share of its drafts
    accepted, tokens per request-step, tokens per response and the rollout's tokens/s; and the rollout's timeline."""
    from recipe.engine import speculative_config

    spec = speculative_config("mtp", num_speculative_tokens, draft_sample_method=draft_sample_method)
    timeline = rollout_at_t1(ckpt, spec, prompts, n, max_tokens, seed, progress, dtype, warmup).timeline
    return head_figures(timeline, len(prompts) * n), timeline


def head_figures(timeline: RolloutTimeline, responses: int) -> dict:
    """What a head's rollout is read by: drafts accepted and those that earned a token, tokens per request-step and per
    response, tokens/s and the share of its time that prefilled prompts."""
    s = timeline.summary(8)
    return {
        "acceptance": s["accepted_tokens"] / max(s["draft_tokens"], 1.0),
        "earned": s["spec_draft_earned_rate"],
        "tokens_per_request_step": s["tokens_per_request_step"],
        "tokens": s["tokens"],
        "tokens_per_response": s["tokens"] / max(responses, 1),
        "prefill_time_share": s["prefill_time_share"],
        "rollout_tok_s": s["throughput_tok_s"],
        **{k: v for k, v in s.items() if k.startswith("accept_rate_pos_")},
    }


def mtp_acceptance(*args, **kwargs) -> dict:
    """:func:`mtp_rollout`'s figures without the timeline (what the head reports keep)."""
    return mtp_rollout(*args, **kwargs)[0]
