"""The in-process policy of the local backend: log-probs of response tokens from packed batches, and one
DAPO update with veRL's GRPO advantage and policy loss, plus the online MTP loss (mtp/)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mtp.loss import masked_ce, mtp_targets, roll_packed
from mtp.model import MiMoForCausalLM


@dataclass
class PackedRows:
    """Rows of a veRL batch (prompt + response, no padding) packed into one stream."""

    input_ids: torch.Tensor  # [T]
    response_mask: torch.Tensor  # [T], 1 on response tokens
    cu_seqlens: torch.Tensor  # [B+1]
    prompt_lens: list[int]
    response_lens: list[int]


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


def forward_rows(model: MiMoForCausalLM, batch, temperature: float, with_mtp: bool, grad: bool = True) -> ForwardOut:
    """Response-token log-probs (and the online MTP loss on the same forward, inputs detached)."""
    rows = pack_rows(batch)
    width = batch.batch["responses"].shape[1]
    with torch.set_grad_enabled(grad):
        out = model(rows.input_ids, rows.cu_seqlens, with_mtp=with_mtp, detach_mtp_inputs=True)
        logits = out.logits.float() / temperature
        logp_all = F.log_softmax(logits, dim=-1)
        targets = roll_packed(rows.input_ids, rows.cu_seqlens, -1)
        token_logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        mtp_loss = mtp_acc = None
        if with_mtp:
            t, m = mtp_targets(rows.input_ids, rows.response_mask, rows.cu_seqlens, depth=0)
            mtp_loss, mtp_acc = masked_ce(out.mtp_logits[0], t, m)
    return ForwardOut(
        unpack_to_responses(token_logp, rows, width),
        unpack_to_responses(entropy.detach(), rows, width),
        mtp_loss,
        mtp_acc,
    )
