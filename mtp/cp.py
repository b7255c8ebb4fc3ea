"""Context parallelism for the MTP roll: the zigzag layout of packed sequences and the roll across it.

Under context parallelism (CP) every sequence of a packed stream is padded with zeros to a multiple of
``2 * cp`` and cut into ``2 * cp`` equal chunks; rank ``r`` holds chunks ``r`` and ``2 * cp - 1 - r`` of
every sequence (zigzag: each rank gets an early and a late chunk, which balances causal attention), one
sequence after the other. Local boundaries are ``padded_cu_seqlens // cp``.

The MTP roll (``out[t] = x[t + s]`` within a sequence) then needs, at the end of each chunk, the first ``s``
tokens that follow it, which live in chunks held by other ranks. :func:`chunk_heads` is what a rank
contributes to that exchange (the first ``s`` tokens of each of its chunks: an all-gather in a real job),
and :func:`roll_zigzag_local` finishes the roll on one rank from its shard and everyone's heads. Positions
past a sequence's real end read the zero padding, so the result equals the unsplit
:func:`mtp.loss.roll_packed` (which zero-fills there) on every real position. Megatron's packed-sequence CP
roll gets this wrong when ``cu_seqlens`` are not padded (Megatron PR #4494); the tests cover odd lengths.

Who calls it: only tests/unit/test_mtp.py. Neither of the recipe's actors runs context parallelism (the local torch
actor; veRL's FSDP actor here); this module is the reference that an MTP roll under Megatron CP is checked
against, and the code to port into a CP actor when one trains the head online.
"""

from __future__ import annotations

import torch


def padded_cu_seqlens(cu_seqlens: torch.Tensor, cp: int) -> torch.Tensor:
    """Boundaries after padding every sequence to a multiple of ``2 * cp``."""
    if cp < 1:
        raise ValueError(f"context parallel size must be >= 1, got {cp}")
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    unit = 2 * cp
    padded = (lengths + unit - 1) // unit * unit
    out = torch.zeros_like(cu_seqlens)
    out[1:] = padded.cumsum(0)
    return out


def _rank_chunks(rank: int, cp: int) -> tuple[int, int]:
    return rank, 2 * cp - 1 - rank


def zigzag_split(x: torch.Tensor, cu_seqlens: torch.Tensor, cp: int) -> list[torch.Tensor]:
    """The per-rank shards of a packed stream ``x`` ([T, ...], real boundaries ``cu_seqlens``)."""
    padded = padded_cu_seqlens(cu_seqlens, cp)
    full = x.new_zeros((int(padded[-1]),) + tuple(x.shape[1:]))
    for j in range(len(cu_seqlens) - 1):
        n = int(cu_seqlens[j + 1] - cu_seqlens[j])
        full[int(padded[j]) : int(padded[j]) + n] = x[int(cu_seqlens[j]) : int(cu_seqlens[j + 1])]
    shards = []
    for rank in range(cp):
        parts = []
        for j in range(len(cu_seqlens) - 1):
            size = int(padded[j + 1] - padded[j]) // (2 * cp)
            for c in _rank_chunks(rank, cp):
                start = int(padded[j]) + c * size
                parts.append(full[start : start + size])
        shards.append(torch.cat(parts))
    return shards


def zigzag_merge(shards: list[torch.Tensor], cu_seqlens: torch.Tensor, cp: int) -> torch.Tensor:
    """Inverse of :func:`zigzag_split`: the packed stream with the padding dropped."""
    padded = padded_cu_seqlens(cu_seqlens, cp)
    full = shards[0].new_zeros((int(padded[-1]),) + tuple(shards[0].shape[1:]))
    for rank, shard in enumerate(shards):
        offset = 0
        for j in range(len(cu_seqlens) - 1):
            size = int(padded[j + 1] - padded[j]) // (2 * cp)
            for c in _rank_chunks(rank, cp):
                start = int(padded[j]) + c * size
                full[start : start + size] = shard[offset : offset + size]
                offset += size
    return torch.cat(
        [full[int(padded[j]) : int(padded[j]) + int(cu_seqlens[j + 1] - cu_seqlens[j])] for j in range(len(padded) - 1)]
    )


def chunk_heads(shard: torch.Tensor, rank: int, cu_seqlens: torch.Tensor, cp: int, shift: int) -> dict:
    """What ``rank`` sends: the first ``-shift`` tokens of each chunk it holds, keyed (sequence, chunk)."""
    if shift >= 0:
        raise ValueError(f"the CP roll brings later tokens forward: shift must be < 0, got {shift}")
    padded = padded_cu_seqlens(cu_seqlens, cp)
    heads, offset = {}, 0
    for j in range(len(cu_seqlens) - 1):
        size = int(padded[j + 1] - padded[j]) // (2 * cp)
        for c in _rank_chunks(rank, cp):
            heads[(j, c)] = shard[offset : offset + min(size, -shift)]
            offset += size
    return heads


def roll_zigzag_local(
    shard: torch.Tensor, rank: int, heads: dict, cu_seqlens: torch.Tensor, cp: int, shift: int
) -> torch.Tensor:
    """``rank``'s part of the roll ``out[t] = x[t - shift]`` (``shift < 0``) of the unsplit stream, given
    every rank's :func:`chunk_heads` merged into ``heads``."""
    s = -shift
    padded = padded_cu_seqlens(cu_seqlens, cp)
    parts, offset = [], 0
    for j in range(len(cu_seqlens) - 1):
        size = int(padded[j + 1] - padded[j]) // (2 * cp)
        for c in _rank_chunks(rank, cp):
            chunk = shard[offset : offset + size]
            offset += size
            following = [heads[(j, nxt)] for nxt in range(c + 1, 2 * cp)]
            zeros = chunk.new_zeros((s,) + tuple(chunk.shape[1:]))
            tail = torch.cat([*following, zeros])[:s]
            parts.append(torch.cat([chunk, tail])[s : s + size])
    return torch.cat(parts)


def roll_zigzag(shards: list[torch.Tensor], cu_seqlens: torch.Tensor, cp: int, shift: int) -> list[torch.Tensor]:
    """The CP roll over simulated ranks: gather every rank's heads, then roll each shard locally."""
    heads: dict = {}
    for rank, shard in enumerate(shards):
        heads.update(chunk_heads(shard, rank, cu_seqlens, cp, shift))
    return [roll_zigzag_local(shard, rank, heads, cu_seqlens, cp, shift) for rank, shard in enumerate(shards)]
