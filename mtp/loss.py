"""Online MTP loss: per-sequence rolls over packed streams, masks, and the masked CE.

Conventions (token-aligned): ``response_mask[j] = 1`` when token j of the packed stream is a response
token. Next-token loss at position t targets token t+1 and trains when ``response_mask[t+1]``. MTP depth k
(0-based) at position t reads token t+1+k and targets token t+2+k; it trains only when every token it
reads or predicts after t is a response token, i.e. ``response_mask[t+1 .. t+2+k]`` are all 1 and they lie
in the same sequence as t. Rolls never cross a ``cu_seqlens`` boundary: what would come from the next
sequence is zero-filled (and masked out).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from mtp import MTP_OBJECTIVES


def roll_packed(x: torch.Tensor, cu_seqlens: torch.Tensor, shift: int) -> torch.Tensor:
    """``out[t] = x[t - shift]`` within each sequence of a packed stream; vacated slots are 0.

    ``shift=-1`` brings the next token to t (``out[t] = x[t+1]``), as ``torch.roll(x, -1)`` does for one
    unpacked sequence, except that the last slot is zero instead of wrapping around.
    """
    total = x.shape[0]
    idx = torch.arange(total, device=x.device)
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(x.device)
    starts = torch.repeat_interleave(cu_seqlens[:-1].to(x.device), lengths)
    ends = torch.repeat_interleave(cu_seqlens[1:].to(x.device), lengths)
    src = idx - shift
    valid = (src >= starts) & (src < ends)
    out = x[src.clamp(0, total - 1)]
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    shape = (-1,) + (1,) * (x.dim() - 1)
    return torch.where(valid.view(shape), out, zero)


def next_token_targets(
    input_ids: torch.Tensor, response_mask: torch.Tensor, cu_seqlens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Targets and mask of the next-token loss: position t predicts token t+1."""
    targets = roll_packed(input_ids, cu_seqlens, -1)
    mask = roll_packed(response_mask, cu_seqlens, -1)
    return targets, mask


def mtp_targets(
    input_ids: torch.Tensor, response_mask: torch.Tensor, cu_seqlens: torch.Tensor, depth: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Targets (token t+2+depth) and mask (all of t+1..t+2+depth are response tokens) of MTP depth ``depth``."""
    targets = roll_packed(input_ids, cu_seqlens, -(2 + depth))
    mask = torch.ones_like(response_mask)
    for ahead in range(1, depth + 3):
        mask = mask * roll_packed(response_mask, cu_seqlens, -ahead)
    return targets, mask


DEPTH_DECAY = 0.6  # depth d of a head's draft chain weighs DEPTH_DECAY ** (d - 1) in its loss (depth_weights)


def depth_weights(depth: int, decay: float = DEPTH_DECAY) -> np.ndarray:
    """Each drafting depth's share of the head's loss: ``decay ** (d - 1)``, normalised. A depth-d draft token counts
    only where depths 1..d-1 were accepted, so deeper depths weigh less (FastMTP's exponentially decaying weights).

    Example: ``depth_weights(3, 0.5)`` is ``[4/7, 2/7, 1/7]``."""
    w = decay ** np.arange(depth, dtype=float)
    return w / w.sum()


def chain_loss(
    objective: str,
    logits: list[torch.Tensor],
    anchors: torch.Tensor,
    labels: list[tuple[torch.Tensor, torch.Tensor]],
    teachers: list[torch.Tensor | None],
    temperatures: list[torch.Tensor | float],
    vocab: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The online MTP loss of a head's draft chain: at each depth d, :func:`mtp_loss` at the ``anchors`` where depth d
    trains (``labels[d-1]``: :func:`mtp_targets` with ``depth=d-1`` over the stream), the head's ``logits[d-1]`` (at the
    anchors) and the policy's ``teachers[d-1]`` (its logits for the token drafted at depth d, at the anchors; None for
    ``sampled``) divided by ``temperatures[d-1]`` (a number, or per anchor [P, 1]), weighted by :func:`depth_weights`;
    and depth 1's top-1 accuracy. Both backends' online losses (recipe/dapo/policy.py, mtp/verl_fsdp.py)."""
    total = logits[0].new_zeros((), dtype=torch.float32)
    acc = total
    for d, (weight, head, (targets, mask), teacher, temperature) in enumerate(
        zip(depth_weights(len(logits)), logits, labels, teachers, temperatures, strict=True), start=1
    ):
        valid = mask[anchors].bool()
        temp = temperature[valid] if isinstance(temperature, torch.Tensor) else temperature
        teacher = None if teacher is None else teacher[valid]
        loss, top1 = mtp_loss(objective, head[valid] / temp, targets[anchors][valid], teacher, vocab)
        total = total + float(weight) * loss
        acc = top1 if d == 1 else acc
    return total, acc


def sequence_of(positions: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """The index of the sequence each stream position lies in."""
    return torch.searchsorted(cu_seqlens[1:].to(positions.device), positions, right=True)


def sample_sequences(positions: torch.Tensor, cu_seqlens: torch.Tensor, fraction: float) -> torch.Tensor:
    """The ``positions`` (sorted stream indices) that lie in a uniformly random ``fraction`` of the sequences holding
    any (at least one), in their order. Whole sequences, not scattered positions: the MTP layer then runs on the
    chosen sequences alone (:func:`mtp.model.run_mtp_layers`), so all of its cost scales with the fraction, where a
    share of positions saved only the vocabulary projection and left the layer's projections and attention over every
    position, whatever the share (results/mtp). The token-mean over the kept positions is an unbiased ratio
    estimate of the mean over all; its variance is that of a sample of sequences."""
    if fraction >= 1.0 or positions.numel() == 0:
        return positions
    seq = sequence_of(positions, cu_seqlens)
    held = seq.unique()
    keep = max(1, math.ceil(fraction * held.numel()))
    chosen = held[torch.randperm(held.numel(), device=held.device)[:keep]]
    return positions[torch.isin(seq, chosen)]


def distill_ce(
    logits: torch.Tensor, teacher_probs: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-mean CE of the MTP logits against the policy's own distribution of the token they draft
    (``teacher_probs``: its output one position later, at the rollout temperature), and top-1 accuracy against the
    sampled ``targets`` (for logging). A probabilistic draft is accepted with ``sum(min(p, q))``; matching the whole of
    p gives every position the signal the sampled token's CE gets from one draw of it."""
    loss = F.cross_entropy(logits.float(), teacher_probs.detach())  # soft targets: one fused op, no [M, V] product
    acc = (logits.argmax(-1) == targets).float().mean()
    return loss, acc.detach()


def expected_acceptance(logits: torch.Tensor, teacher_probs: torch.Tensor) -> torch.Tensor:
    """Per position, the chance that a draft sampled from ``softmax(logits)`` is accepted by a target whose
    distribution is ``teacher_probs``: ``sum(min(p, q))``, one minus their total variation distance (rejection
    sampling's acceptance, what vLLM's ``draft_sample_method=probabilistic`` verifies with). Differentiable in the
    logits."""
    return torch.minimum(teacher_probs.detach(), torch.softmax(logits.float(), dim=-1)).sum(-1)


def acceptance_loss(
    logits: torch.Tensor, teacher_probs: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Minus the mean :func:`expected_acceptance`, and top-1 accuracy against the sampled ``targets`` (for logging).
    Forward KL (:func:`distill_ce`) spreads the draft over tokens the target rarely samples; this trains the quantity a
    probabilistic draft is accepted by, so a head fine-tuned on it offline is not pulled back to the KL optimum."""
    acc = (logits.argmax(-1) == targets).float().mean()
    return -expected_acceptance(logits, teacher_probs).mean(), acc.detach()


def draft_vocabulary(policy_logits: torch.Tensor, targets: torch.Tensor, topk: int) -> torch.Tensor:
    """The token ids an online MTP loss scores with ``spec.mtp.loss_vocab_topk``: the union, over the trained
    positions, of the policy's ``topk`` likeliest tokens for the drafted token (``policy_logits``, its logits at t+1)
    and the token sampled there (``targets``), sorted. The head's logits then need the LM head's rows for these alone:
    over SmolLM2's whole vocabulary (49,152 rows) the head's loss cost several times its MTP layer. A token outside it
    gets no gradient of its own; one the policy ranks highly anywhere in the micro-batch is scored at every position,
    so the head's mass on tokens a position's policy does not expect is still pushed down."""
    top = policy_logits.detach().topk(min(topk, policy_logits.shape[-1]), dim=-1).indices
    return torch.unique(torch.cat([top.flatten(), targets.to(top.device)]))


def teacher_probs_from_logprob(
    policy_logits: torch.Tensor, target_index: torch.Tensor, target_logprob: torch.Tensor
) -> torch.Tensor:
    """The policy's probabilities over a shortlist (:func:`draft_vocabulary`) from its tempered logits over those
    tokens alone (``policy_logits`` [P, |vocab|]) and one whole-vocabulary log-prob a position, the sampled token's
    (``target_logprob`` [P], at shortlist column ``target_index``; the rollout engine reports it): the normaliser is
    ``logit - logprob`` of that token, so this equals ``softmax(whole-vocabulary logits)[:, vocab]`` without the
    LM head over the whole vocabulary."""
    logits = policy_logits.detach().float()
    log_normaliser = logits.gather(-1, target_index[:, None]) - target_logprob.float()[:, None]
    return torch.exp(logits - log_normaliser)


def mtp_loss(
    objective: str,
    logits: torch.Tensor,
    targets: torch.Tensor,
    teacher_logits: torch.Tensor | None,
    vocab: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The online MTP loss and top-1 accuracy at the trained positions: ``sampled``, CE of the sampled token t+2
    (slime's); ``distill``, :func:`distill_ce`, and ``acceptance``, :func:`acceptance_loss`, against
    ``softmax(teacher_logits)``, the policy's logits at t+1 (detached here; ``sampled`` does not read them).

    Both ``logits`` (the head's) and ``teacher_logits`` come divided by the rollout temperature: vLLM samples a
    probabilistic draft from ``softmax(head logits / T)`` (``compute_probs_and_sample_next_token``), so that is the
    distribution to train, as the drift probe scores it. Raw head logits trained against the tempered policy would
    be tempered a second time at T != 1.

    With ``vocab`` (:func:`draft_vocabulary`) the head's ``logits`` are over those tokens alone and the head's softmax
    is taken over them; the teacher keeps its whole vocabulary's softmax, read at those tokens."""
    if objective != "sampled" and teacher_logits is None:
        raise ValueError(
            f"spec.mtp.objective={objective} needs the policy's logits one position later (teacher_logits)"
        )
    teacher = None if objective == "sampled" else torch.softmax(teacher_logits.detach().float(), dim=-1)
    if vocab is not None:
        teacher = None if teacher is None else teacher[:, vocab]
        targets = torch.searchsorted(vocab, targets)
    return objective_loss(objective, logits, targets, teacher)


def objective_loss(
    objective: str, logits: torch.Tensor, targets: torch.Tensor, teacher_probs: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`mtp_loss` given the teacher's probabilities (offline head training has them from cached states)."""
    if objective == "sampled":
        return masked_ce(logits, targets, torch.ones_like(targets))
    if objective not in MTP_OBJECTIVES:
        raise ValueError(f"spec.mtp.objective={objective!r}: {' | '.join(MTP_OBJECTIVES)}")
    return (distill_ce if objective == "distill" else acceptance_loss)(logits, teacher_probs, targets)


def masked_ce(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-mean CE over masked positions, and top-1 accuracy there (for logging)."""
    m = mask.bool()
    n = m.sum().clamp(min=1)
    ce = F.cross_entropy(logits.float(), targets.long(), reduction="none")
    loss = (ce * m).sum() / n
    acc = ((logits.argmax(-1) == targets) & m).sum().float() / n
    return loss, acc.detach()
