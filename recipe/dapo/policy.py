"""The in-process policy of the local backend: log-probs of response tokens from packed batches, and one
DAPO update with veRL's GRPO advantage and policy loss, plus the online MTP loss (mtp/)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from mtp import warm_up_group
from mtp.loss import (
    chain_loss,
    draft_vocabulary,
    mtp_loss,
    mtp_targets,
    objective_loss,
    roll_packed,
    sample_sequences,
    teacher_probs_from_logprob,
)
from mtp.model import MiMoForCausalLM, MiMoOutput, SharedPrompts, shared_prompts
from recipe.dapo.timeline import timed
from recipe.engine import HEAD_METHODS

if TYPE_CHECKING:
    from verl import DataProto

logger = logging.getLogger(__name__)

# glibc mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3


@functools.cache
def keep_freed_memory_on_cpu() -> bool:
    """Stop glibc from handing freed activation memory back to the OS between training passes.

    A CPU training step frees megabytes of activations and allocates them again in the next pass; with
    glibc's defaults the freed top of the heap is trimmed and large blocks are mmap'ed afresh, so every pass
    page-faults its memory in again; the online MTP head's forward under autograd paid most of that.
    Process-wide, once; a no-op off glibc."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name)
    if not hasattr(libc, "mallopt"):
        return False
    mib = 1 << 20
    ok = all(
        libc.mallopt(param, value)
        # 32 MiB: the largest mmap threshold glibc documents for 64-bit; activations here are a few MiB
        for param, value in ((M_MMAP_THRESHOLD, 32 * mib), (M_TRIM_THRESHOLD, 1024 * mib), (M_TOP_PAD, 64 * mib))
    )
    logger.info("glibc malloc: freed memory kept for reuse (mmap threshold 32 MiB, trim threshold 1 GiB): %s", ok)
    return ok


@dataclass
class PackedRows:
    """Rows of a veRL batch (prompt + response, no padding) packed into one stream."""

    input_ids: torch.Tensor  # [T]
    response_mask: torch.Tensor  # [T], 1 on response tokens
    cu_seqlens: torch.Tensor  # [B+1]
    prompt_lens: list[int]
    response_lens: list[int]

    def shared_prompts(self) -> SharedPrompts:
        """Which rows open with the same prompt (a DAPO group's responses): the MTP layer runs over it once."""
        return shared_prompts(self.input_ids, self.response_mask, self.cu_seqlens)


def pack_rows(batch) -> PackedRows:
    prompts, responses = batch.batch["prompts"], batch.batch["responses"]
    attn = batch.batch["attention_mask"]
    p_width = prompts.shape[1]
    ids, masks, p_lens, r_lens = [], [], [], []
    for i in range(len(batch)):
        p_len = int(attn[i, :p_width].sum())
        r_len = int(attn[i, p_width:].sum())
        ids.append(torch.cat([prompts[i, p_width - p_len :], responses[i, :r_len]]))
        masks.append(torch.cat([torch.zeros(p_len, dtype=torch.long), torch.ones(r_len, dtype=torch.long)]))
        p_lens.append(p_len)
        r_lens.append(r_len)
    lengths = torch.tensor([a + b for a, b in zip(p_lens, r_lens, strict=True)])
    cu = torch.zeros(len(lengths) + 1, dtype=torch.long)
    cu[1:] = lengths.cumsum(0)
    return PackedRows(torch.cat(ids), torch.cat(masks), cu, p_lens, r_lens)


def unpack_to_responses(values: torch.Tensor, rows: PackedRows, width: int) -> torch.Tensor:
    """[T] per-position values (position t scores token t+1) -> [B, width] aligned with ``responses``."""
    out = values.new_zeros((len(rows.prompt_lens), width))
    for i, (p_len, r_len) in enumerate(zip(rows.prompt_lens, rows.response_lens, strict=True)):
        start = int(rows.cu_seqlens[i]) + p_len - 1  # the position that predicts the first response token
        out[i, :r_len] = values[start : start + r_len]
    return out


@dataclass
class ForwardOut:
    log_probs: torch.Tensor  # [B, R] log p(response token) at the rollout temperature
    entropy: torch.Tensor  # [B, R]
    mtp_loss: torch.Tensor | None
    mtp_acc: torch.Tensor | None


def forward_rows(
    model: MiMoForCausalLM,
    batch,
    temperature: float,
    with_mtp: bool,
    grad: bool = True,
    mtp_fraction: float = 1.0,
    mtp_objective: str = "sampled",
    mtp_vocab_topk: int = 0,
    mtp_depth: int = 1,
) -> ForwardOut:
    """Response-token log-probs (and the MTP loss of ``mtp_objective`` on the same forward, inputs detached, over a
    random ``mtp_fraction`` of the sequences it trains, scored over :func:`~mtp.loss.draft_vocabulary` of this
    forward's logits with ``mtp_vocab_topk``, else the whole vocabulary; all but ``sampled`` take their teacher from
    this forward's logits; with ``mtp_depth`` > 1 over the depths of the head's draft chain, :func:`deep_head_loss`)."""
    rows = pack_rows(batch)
    width = batch.batch["responses"].shape[1]
    mtp_positions = mtp_target_ids = None
    if with_mtp:
        # the MTP head runs past attention only where its loss trains (not on prompt tokens)
        every_target, trained = mtp_targets(rows.input_ids, rows.response_mask, rows.cu_seqlens, depth=0)
        mtp_positions = sample_sequences(trained.nonzero().squeeze(-1), rows.cu_seqlens, mtp_fraction)
        mtp_target_ids = every_target[mtp_positions]
    with torch.set_grad_enabled(grad):
        out = model(rows.input_ids, rows.cu_seqlens, with_mtp=False)
        logits = out.logits.float() / temperature
        logp_all = F.log_softmax(logits, dim=-1)
        targets = roll_packed(rows.input_ids, rows.cu_seqlens, -1)
        token_logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        head_loss = head_acc = None
        if with_mtp and mtp_depth > 1:
            head_loss, head_acc = deep_head_loss(
                model, out, rows, mtp_positions, logits.detach(), temperature, mtp_objective, mtp_vocab_topk, mtp_depth
            )
        elif with_mtp:
            # the policy's distribution of token t+2 (the teacher) is its output at t+1
            head_loss, head_acc = head_loss_at(
                model, out, rows.cu_seqlens, mtp_positions, mtp_target_ids, logits.detach()[mtp_positions + 1],
                temperature, mtp_objective, mtp_vocab_topk, rows.shared_prompts(),
            )  # fmt: skip
    return ForwardOut(
        unpack_to_responses(token_logp, rows, width),
        unpack_to_responses(entropy.detach(), rows, width),
        head_loss,
        head_acc,
    )


def head_loss_at(
    model: MiMoForCausalLM,
    out: MiMoOutput,
    cu_seqlens: torch.Tensor,
    mtp_positions: torch.Tensor,
    targets: torch.Tensor,
    policy_next: torch.Tensor,
    temperature: float,
    objective: str,
    vocab_topk: int,
    prompts: SharedPrompts | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The online MTP loss (and top-1 accuracy) at ``mtp_positions`` of a trunk forward ``out``, given the policy's
    tempered logits one position later (``policy_next``), over the whole vocabulary or, with ``vocab_topk``, over
    :func:`~mtp.loss.draft_vocabulary`; the MTP layer runs over each of ``prompts``' shared prompts once."""
    vocab = draft_vocabulary(policy_next, targets, vocab_topk) if vocab_topk else None
    (head,) = model.draft_logits(out, cu_seqlens, mtp_positions=mtp_positions, vocab=vocab, prompts=prompts)
    teacher = policy_next if objective != "sampled" else None
    return mtp_loss(objective, head / temperature, targets, teacher, vocab)


def deep_head_loss(
    model: MiMoForCausalLM,
    out: MiMoOutput,
    rows: PackedRows,
    anchors: torch.Tensor,
    policy_logits: torch.Tensor,
    temperature: float,
    objective: str,
    vocab_topk: int,
    depth: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The online MTP loss of a head that drafts ``depth`` tokens a step (its layer run on its own output,
    :func:`mtp.model.run_mtp_unrolled`) at ``anchors``, :func:`~mtp.loss.chain_loss`: the token drafted at depth d
    against the policy's distribution of it (its tempered ``policy_logits`` at t+d), over the whole vocabulary or,
    with ``vocab_topk``, :func:`~mtp.loss.draft_vocabulary` of every depth's teacher."""
    last = policy_logits.shape[0] - 1
    teachers = [policy_logits[(anchors + d).clamp(max=last)] for d in range(1, depth + 1)]
    labels = [mtp_targets(rows.input_ids, rows.response_mask, rows.cu_seqlens, depth=d) for d in range(depth)]
    vocab = None
    if vocab_topk:
        vocab = draft_vocabulary(torch.cat(teachers), torch.cat([t[anchors] for t, _ in labels]), vocab_topk)
    logits = model.draft_logits(out, rows.cu_seqlens, mtp_positions=anchors, vocab=vocab, depth=depth)
    teachers = teachers if objective != "sampled" else [None] * depth
    return chain_loss(objective, logits, anchors, labels, teachers, [temperature] * depth, vocab)


def packed_trunk_states(batch, rows: PackedRows, dtype: torch.dtype) -> torch.Tensor:
    """The rows' ``trunk_states`` (the rollout's, :class:`~recipe.dapo.rollout.TrunkStateLog`) as one stream aligned
    with :func:`pack_rows`; each row's last position, which no token was sampled from, is zero."""
    if "trunk_states" not in batch.non_tensor_batch:
        raise ValueError(
            "the rows the head trains on alone carry the rollout's trunk states (generate(keep_trunk_states=True))"
        )
    parts = []
    for i, states in enumerate(batch.non_tensor_batch["trunk_states"]):
        tokens = rows.prompt_lens[i] + rows.response_lens[i]
        if len(states) != tokens - 1:
            raise ValueError(f"row {i}: {len(states)} trunk states for {tokens} tokens (one per token but the last)")
        parts += [torch.from_numpy(states), torch.zeros(1, states.shape[1])]
    return torch.cat(parts).to(dtype)


def own_trunk_states(model: MiMoForCausalLM, batch, teacher_topk: int = 0, temperature: float = 1.0):
    """``batch`` with the policy's own trunk states as ``trunk_states``, the pre-norm hidden state at every position of
    each row but its last: what the rollout engine hands over (:class:`~recipe.dapo.rollout.TrunkStateLog`), for rows
    that no engine generated (tests, recipe/bench/mtp_overhead.py); with ``teacher_topk``, its teacher as well
    (``teacher_topk`` and ``token_logprobs`` at ``temperature``, as ``generate(teacher_topk=...)`` keeps them)."""
    rows = pack_rows(batch)
    with torch.no_grad():
        out = model(rows.input_ids, rows.cu_seqlens, with_mtp=False)
        logprobs = F.log_softmax(out.logits.float() / temperature, dim=-1) if teacher_topk else None
    bounds = rows.cu_seqlens.tolist()
    states, tops, token_logprobs = (np.empty(len(batch), dtype=object) for _ in range(3))
    for i in range(len(batch)):
        states[i] = out.hidden[bounds[i] : bounds[i + 1] - 1].numpy().copy()
        if teacher_topk:  # response token j was sampled from the logits one position earlier
            sampled_from = torch.arange(bounds[i] + rows.prompt_lens[i] - 1, bounds[i + 1] - 1)
            at = logprobs[sampled_from]
            tops[i] = at.topk(teacher_topk, dim=-1).indices.numpy().astype(np.int32)
            token_logprobs[i] = at.gather(-1, rows.input_ids[sampled_from + 1, None]).squeeze(-1).numpy()
    batch.non_tensor_batch["trunk_states"] = states
    if teacher_topk:
        batch.non_tensor_batch["teacher_topk"] = tops
        batch.non_tensor_batch["token_logprobs"] = token_logprobs
    return batch


def packed_rollout_teacher(batch, rows: PackedRows) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The rows' ``teacher_topk`` and ``token_logprobs`` (:class:`~recipe.dapo.rollout.Response`) as streams aligned
    with :func:`pack_rows`, indexed by the token they describe (the distribution token j was sampled from is at j;
    prompt tokens hold -1 and 0); None where the rollout kept none."""
    if "teacher_topk" not in batch.non_tensor_batch:
        return None
    ids, logprobs = [], []
    for i, (top, lp) in enumerate(
        zip(batch.non_tensor_batch["teacher_topk"], batch.non_tensor_batch["token_logprobs"], strict=True)
    ):
        if len(top) != rows.response_lens[i] or len(lp) != rows.response_lens[i]:
            raise ValueError(f"row {i}: the rollout's teacher covers {len(top)} of {rows.response_lens[i]} tokens")
        ids += [torch.full((rows.prompt_lens[i], top.shape[1]), -1, dtype=torch.long), torch.from_numpy(top).long()]
        logprobs += [torch.zeros(rows.prompt_lens[i]), torch.from_numpy(lp)]
    return torch.cat(ids), torch.cat(logprobs)


def head_loss_rows(
    model: MiMoForCausalLM,
    batch,
    temperature: float,
    mtp_fraction: float,
    mtp_objective: str,
    mtp_vocab_topk: int = 0,
    share_prompts: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The online MTP loss of :func:`forward_rows` (and its top-1 accuracy) on rows the policy does not train on, from
    the trunk states the rollout computed for them (:func:`packed_trunk_states`): the trunk does not run again, and a
    prompt the rows share runs the MTP layer once (``share_prompts``; off, every row runs it over its own prompt). The teacher, the policy's distribution of the drafted token, comes with a shortlist
    from the rollout where it kept one (:func:`packed_rollout_teacher`): its top-k ids give the shortlist and the
    sampled token's log-prob the normaliser (:func:`~mtp.loss.teacher_probs_from_logprob`), so the LM head runs over
    the shortlist alone; otherwise over the whole vocabulary where the loss reads it."""
    rows = pack_rows(batch)
    hidden = packed_trunk_states(batch, rows, model.lm_head.weight.dtype)
    every_target, trained = mtp_targets(rows.input_ids, rows.response_mask, rows.cu_seqlens, depth=0)
    mtp_positions = sample_sequences(trained.nonzero().squeeze(-1), rows.cu_seqlens, mtp_fraction)
    targets = every_target[mtp_positions]
    prompts = rows.shared_prompts() if share_prompts else None
    teacher = packed_rollout_teacher(batch, rows) if mtp_vocab_topk else None
    if teacher is None:
        out = model.output_from_states(rows.input_ids, hidden, mtp_positions + 1)
        return head_loss_at(
            model, out, rows.cu_seqlens, mtp_positions, targets, out.logits.float() / temperature, temperature,
            mtp_objective, mtp_vocab_topk, prompts,
        )  # fmt: skip
    top_ids, token_logprobs = teacher
    if top_ids.shape[1] != mtp_vocab_topk:
        raise ValueError(f"the rollout kept a top-{top_ids.shape[1]} teacher for a top-{mtp_vocab_topk} shortlist")
    # the drafted token t+2 was sampled from the policy's output at t+1, what the rollout kept at t+2
    vocab = torch.unique(torch.cat([top_ids[mtp_positions + 2].flatten(), targets]))
    out = model.output_from_states(rows.input_ids, hidden, mtp_positions + 1, vocab=vocab)
    target_index = torch.searchsorted(vocab, targets)
    (head,) = model.draft_logits(out, rows.cu_seqlens, mtp_positions=mtp_positions, vocab=vocab, prompts=prompts)
    teacher_probs = None
    if mtp_objective != "sampled":
        teacher_probs = teacher_probs_from_logprob(
            out.logits.float() / temperature, target_index, token_logprobs[mtp_positions + 2]
        )
    return objective_loss(mtp_objective, head / temperature, target_index, teacher_probs)


def verl_lr_scheduler(
    optimizer: torch.optim.Optimizer, optim: DictConfig, run_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """The learning-rate schedule veRL's FSDP engine builds from ``actor.optim`` (``lr_warmup_steps``, else
    ``lr_warmup_steps_ratio`` of the run; ``lr_scheduler_type`` constant | cosine with ``min_lr_ratio`` and
    ``num_cycles``), from veRL's schedule functions, so both backends follow one schedule. Stepped once per
    training step, as veRL's actor worker does; it scales every parameter group alike (an online MTP head's too).
    The schedule spans ``optim.total_training_steps`` where set (> 0; veRL's trainer sets it to the run's steps), else
    the run's ``run_steps``: a run stopped early on purpose (an A/B turn) keeps the whole run's schedule."""
    from verl.utils.torch_functional import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

    total_steps = optim.total_training_steps if optim.total_training_steps > 0 else run_steps
    warmup = optim.lr_warmup_steps
    if warmup is None or warmup <= 0:
        warmup = int(optim.lr_warmup_steps_ratio * total_steps)
    if optim.lr_scheduler_type == "constant":
        return get_constant_schedule_with_warmup(optimizer, num_warmup_steps=warmup)
    return get_cosine_schedule_with_warmup(
        optimizer,
        num_warmup_steps=warmup,
        num_training_steps=total_steps,
        min_lr_ratio=optim.min_lr_ratio,
        num_cycles=optim.num_cycles,
        zero_indexed_step=optim.zero_indexed_step,
    )


class Actor:
    """The in-process policy and its AdamW: old log-probs, veRL's GRPO advantage and DAPO policy loss over
    ppo mini-batches, and the online MTP loss on the same forward (``spec=mtp``, ``spec.mtp.train=online``).
    The trainer and recipe/bench/mtp_overhead.py both run this update."""

    def __init__(self, policy: MiMoForCausalLM, cfg: DictConfig, mtp_depth: int = 1):
        from verl.trainer.ppo.core_algos import get_policy_loss_fn
        from verl.workers.config import ActorConfig

        self.cfg = cfg
        self.spec_method = str(cfg.spec.method)
        self.mtp_online = self.spec_method in HEAD_METHODS and cfg.spec.mtp.train == "online"
        self.head_trains_on_dropped = self.mtp_online and bool(cfg.spec.mtp.train_on_dropped_groups)
        # only spec=mtp configs carry spec.mtp (a frozen head logs its loss under the same objective)
        self.mtp_objective = str(cfg.spec.mtp.objective) if self.spec_method in HEAD_METHODS else "sampled"
        self.mtp_vocab_topk = int(cfg.spec.mtp.loss_vocab_topk) if self.spec_method in HEAD_METHODS else 0
        self.mtp_depth = mtp_depth  # the head's draft chain the loss trains (recipe.engine.head_draft_depth)
        # the rollout hands the left-out rows' teacher over with their trunk states: the shortlist and the normaliser
        # (head_loss_rows), so the head's steps on them never run the LM head over the whole vocabulary
        self.rollout_teacher_topk = self.mtp_vocab_topk if self.head_trains_on_dropped else 0
        self.policy = policy.train()
        if next(policy.parameters()).device.type == "cpu":
            keep_freed_memory_on_cpu()
        self.mtp_params = list(self.policy.model.mtp_layers.parameters())
        for p in self.mtp_params:
            p.requires_grad_(self.mtp_online)
        head = {id(p) for p in self.mtp_params}
        # the policy's parameters (trunk, embedding, LM head) and the MTP head's are clipped apart: under one
        # global norm the MTP loss would scale the policy's step whenever clipping is active (most steps)
        self.policy_params = [p for p in self.policy.parameters() if p.requires_grad and id(p) not in head]
        actor = cfg.actor_rollout_ref.actor
        head_lr = (
            cfg.spec.mtp.lr if self.spec_method in HEAD_METHODS and cfg.spec.mtp.lr is not None else actor.optim.lr
        )
        self.optimizer = torch.optim.AdamW(
            [{"params": self.policy_params}]
            + ([{"params": self.mtp_params, "lr": head_lr}] if self.mtp_online else []),
            lr=actor.optim.lr,
            betas=tuple(actor.optim.betas),
            weight_decay=actor.optim.weight_decay,
        )
        self.lr_scheduler = verl_lr_scheduler(self.optimizer, actor.optim, cfg.trainer.total_training_steps)
        if self.mtp_online:
            warm_up_group(self.lr_scheduler, 1, int(cfg.spec.mtp.lr_warmup_steps))
        self.policy_loss_fn = get_policy_loss_fn("vanilla")
        self.actor_cfg = ActorConfig(
            strategy="fsdp",
            clip_ratio_low=actor.clip_ratio_low,
            clip_ratio_high=actor.clip_ratio_high,
            clip_ratio_c=actor.clip_ratio_c,
            loss_agg_mode=actor.loss_agg_mode,
            ppo_mini_batch_size=actor.ppo_mini_batch_size,
            ppo_micro_batch_size_per_gpu=actor.ppo_micro_batch_size_per_gpu,
            rollout_n=cfg.actor_rollout_ref.rollout.n,
        )

    def policy_loss(
        self, old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, dict]:
        """veRL's vanilla PPO loss with the run's clip-higher range, dual clip and token-mean aggregation (the
        batch's token count set in ``actor_cfg.global_batch_info`` by :meth:`update`)."""
        return self.policy_loss_fn(
            old_log_prob=old_log_prob,
            log_prob=log_prob,
            advantages=advantages,
            response_mask=mask,
            loss_agg_mode=self.actor_cfg.loss_agg_mode,
            config=self.actor_cfg,
        )

    def mini_batches(self, batch: DataProto) -> Iterator[tuple[DataProto, int, list[tuple[DataProto, float]]]]:
        """Each ppo mini-batch of ``batch``, its response-token count (the token-mean loss's denominator) and its
        micro-batches, each with its share of those tokens: the weight of its mean loss in the mini-batch's."""
        actor = self.cfg.actor_rollout_ref.actor
        mini_rows = actor.ppo_mini_batch_size * self.cfg.actor_rollout_ref.rollout.n
        micro = actor.ppo_micro_batch_size_per_gpu
        for m0 in range(0, len(batch), mini_rows):
            mini = batch[m0 : m0 + mini_rows]
            tokens = int(mini.batch["response_mask"].sum())
            micros = [mini[u0 : u0 + micro] for u0 in range(0, len(mini), micro)]
            yield mini, tokens, [(mb, float(mb.batch["response_mask"].sum()) / max(1, tokens)) for mb in micros]

    def train_head(self, batch, timing: dict[str, float]) -> dict[str, float]:
        """Head-only AdamW steps on responses the policy's update leaves out (``spec.mtp.train_on_dropped_groups``: the
        groups dynamic filtering dropped), one per ppo mini-batch of rows with the update's loss, scale, fraction and
        clipping. The policy's parameters get no gradient here, so AdamW's step moves the head alone; the learning-rate
        schedule is stepped by :meth:`update` only."""
        cfg = self.cfg
        temperature = cfg.actor_rollout_ref.rollout.temperature
        fraction = float(cfg.spec.mtp.loss_sequence_fraction)
        sums: dict[str, list[float]] = {}
        with timed(timing, "mtp_dropped_groups"):
            for _, _, micros in self.mini_batches(batch):
                self.optimizer.zero_grad(set_to_none=True)
                for mb, share in micros:
                    loss, acc = head_loss_rows(
                        self.policy, mb, temperature, fraction, self.mtp_objective, self.mtp_vocab_topk
                    )
                    (cfg.spec.mtp.loss_scaling_factor * loss * share).backward()
                    sums.setdefault("mtp/dropped_head_loss", []).append(loss.item())
                    sums.setdefault("mtp/dropped_head_acc", []).append(acc.item())
                norm = torch.nn.utils.clip_grad_norm_(self.mtp_params, cfg.actor_rollout_ref.actor.grad_clip)
                sums.setdefault("mtp/dropped_grad_norm", []).append(float(norm))
                self.optimizer.step()
        metrics = {k: float(np.mean(v)) for k, v in sums.items()}
        metrics["mtp/dropped_responses"] = float(len(batch))
        metrics["mtp/dropped_response_tokens"] = float(batch.batch["response_mask"].sum())
        return metrics

    def update(self, batch, timing: dict[str, float]) -> dict[str, float]:
        """GRPO advantage + DAPO policy loss (+ online MTP loss), one pass of mini-batches per ppo epoch."""
        from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

        cfg = self.cfg
        actor = cfg.actor_rollout_ref.actor
        temperature = cfg.actor_rollout_ref.rollout.temperature
        micro = actor.ppo_micro_batch_size_per_gpu
        head_metrics: dict[str, list[float]] = {}
        # a frozen head's loss and top-1 accuracy on this step's responses come from the no-grad old-log-prob
        # forward; an online head reports them from its training forward in the update below
        frozen_head = self.spec_method in HEAD_METHODS and not self.mtp_online
        with timed(timing, "old_log_prob"):
            olds = []
            for i in range(0, len(batch), micro):
                out = forward_rows(
                    self.policy, batch[i : i + micro], temperature, with_mtp=frozen_head, grad=False,
                    mtp_objective=self.mtp_objective, mtp_vocab_topk=self.mtp_vocab_topk, mtp_depth=self.mtp_depth,
                )  # fmt: skip
                olds.append(out.log_probs)
                if out.mtp_loss is not None:
                    head_metrics.setdefault("mtp/head_loss", []).append(out.mtp_loss.item())
                    head_metrics.setdefault("mtp/head_acc", []).append(out.mtp_acc.item())
            batch.batch["old_log_probs"] = torch.cat(olds)
        with timed(timing, "adv"):
            adv, returns = compute_grpo_outcome_advantage(
                batch.batch["token_level_rewards"],
                batch.batch["response_mask"],
                batch.non_tensor_batch["uid"],
                norm_adv_by_std_in_grpo=cfg.algorithm.norm_adv_by_std_in_grpo,
            )
            batch.batch["advantages"], batch.batch["returns"] = adv, returns
        sums: dict[str, list[float]] = dict(head_metrics)
        mtp_fraction = float(cfg.spec.mtp.loss_sequence_fraction) if self.mtp_online else 1.0
        with timed(timing, "update_actor"):
            for _ in range(actor.ppo_epochs):
                for mini, tokens, micros in self.mini_batches(batch):
                    self.actor_cfg.global_batch_info.update(
                        dp_size=1, batch_num_tokens=tokens, global_batch_size=len(mini)
                    )
                    self.optimizer.zero_grad(set_to_none=True)
                    for mb, share in micros:
                        out = forward_rows(
                            self.policy, mb, temperature, with_mtp=self.mtp_online, mtp_fraction=mtp_fraction,
                            mtp_objective=self.mtp_objective, mtp_vocab_topk=self.mtp_vocab_topk, mtp_depth=self.mtp_depth,
                        )  # fmt: skip
                        mask = mb.batch["response_mask"]
                        pg_loss, pg_metrics = self.policy_loss(
                            mb.batch["old_log_probs"], out.log_probs, mb.batch["advantages"], mask
                        )
                        loss = pg_loss
                        if self.mtp_online:
                            loss = loss + cfg.spec.mtp.loss_scaling_factor * out.mtp_loss * share
                            for key in ("mtp/loss", "mtp/head_loss"):
                                sums.setdefault(key, []).append(out.mtp_loss.item())
                            for key in ("mtp/acc", "mtp/head_acc"):
                                sums.setdefault(key, []).append(out.mtp_acc.item())
                        loss.backward()
                        sums.setdefault("actor/pg_loss", []).append(pg_loss.item())
                        sums.setdefault("actor/entropy", []).append(
                            float((out.entropy * mask).sum() / mask.sum().clamp(min=1))
                        )
                        for k, v in pg_metrics.items():
                            sums.setdefault(k, []).append(float(v))
                    grad_norm = torch.nn.utils.clip_grad_norm_(self.policy_params, actor.grad_clip)
                    sums.setdefault("actor/grad_norm", []).append(float(grad_norm))
                    if self.mtp_online:
                        mtp_norm = torch.nn.utils.clip_grad_norm_(self.mtp_params, actor.grad_clip)
                        sums.setdefault("mtp/grad_norm", []).append(float(mtp_norm))
                    self.optimizer.step()
        metrics = {k: float(np.mean(v)) for k, v in sums.items()}
        metrics["actor/lr"] = self.lr_scheduler.get_last_lr()[0]
        self.lr_scheduler.step()
        return metrics
