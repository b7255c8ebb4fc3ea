"""How far the policy has moved from where the run started, and what that does to an MTP draft head.

A fixed probe (responses the starting policy sampled to the first validation problems, kept in the run
directory so a resumed run measures on the same text) is scored every step by the starting policy and the
current one. On it:

- ``drift/kl_from_start``: KL(start || now) of the next-token distribution at the rollout temperature,
  mean over response positions (the policy's drift, free of which prompts a step happened to draw);
- ``drift/mtp_accept_start_head`` and ``drift/mtp_accept_head``: the probability the current policy gives
  the top-1 draft of the starting MTP head (what a frozen head drafts) and of the run's head (frozen or
  online), mean over the positions an MTP head drafts for. One greedy draft token is accepted by vLLM's
  rejection sampler with exactly that probability, so these are the expected draft acceptance rates of the
  two heads on the current trunk, measured in the same run;
- ``drift/mtp_accept_sampled_start_head`` and ``drift/mtp_accept_sampled_head``: the same for a draft sampled from
  the head's distribution at the rollout temperature (``spec.draft_sample_method=probabilistic``), which the
  rejection sampler accepts with probability ``sum(min(p, q))`` (p the policy's distribution, q the head's).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from mtp.loss import expected_acceptance, mtp_targets, next_token_targets
from mtp.model import MiMoForCausalLM, packed_positions, rope_cos_sin, run_mtp_layers

DRIFT_PROBE_FILE = "drift_probe.json"  # the probe's token ids, in the run directory
CHUNK_TOKENS = 1024  # probe tokens scored per forward: bounds the [tokens, vocabulary] tensors of a measurement
# what measure() returns for the tables that show it (recipe/summarize.py); the top-1
# agreement columns it also returns are left out of them
METRIC_LABELS = {
    "drift/kl_from_start": "KL from start",
    "drift/mtp_accept_start_head": "start head, argmax",
    "drift/mtp_accept_sampled_start_head": "start head, sampled",
    "drift/mtp_accept_head": "own head, argmax",
    "drift/mtp_accept_sampled_head": "own head, sampled",
}


class ProbeChunk:
    """Whole probe sequences packed into one stream, and the positions the metrics read in it."""

    def __init__(self, sequences: list[dict]):
        ids, mask, lengths = [], [], []
        for s in sequences:
            ids += s["prompt"] + s["response"]
            mask += [0] * len(s["prompt"]) + [1] * len(s["response"])
            lengths.append(len(s["prompt"]) + len(s["response"]))
        self.input_ids = torch.tensor(ids)
        self.cu_seqlens = torch.zeros(len(lengths) + 1, dtype=torch.long)
        self.cu_seqlens[1:] = torch.tensor(lengths).cumsum(0)
        response_mask = torch.tensor(mask)
        # position t scores token t+1 (the next-token distribution) where t+1 is a response token
        _, scored = next_token_targets(self.input_ids, response_mask, self.cu_seqlens)
        self.next_positions = scored.nonzero().squeeze(-1)
        # an MTP head at t drafts token t+2 from the hidden state at t and token t+1; the policy judges it at t+1
        _, drafted = mtp_targets(self.input_ids, response_mask, self.cu_seqlens, depth=0)
        self.draft_positions = drafted.nonzero().squeeze(-1)


def chunk_sequences(sequences: list[dict], max_tokens: int) -> list[ProbeChunk]:
    """Consecutive sequences grouped into chunks of at most ``max_tokens`` tokens (a longer sequence alone)."""
    groups, tokens = [[]], 0
    for s in sequences:
        length = len(s["prompt"]) + len(s["response"])
        if groups[-1] and tokens + length > max_tokens:
            groups.append([])
            tokens = 0
        groups[-1].append(s)
        tokens += length
    return [ProbeChunk(group) for group in groups if group]


class DriftProbe:
    """The fixed sequences, the starting policy's next-token distributions on them, and its MTP head.

    The sequences are scored ``chunk_tokens`` tokens at a time: every [tokens, vocabulary] tensor of a measurement
    then has ``chunk_tokens`` rows, not the probe's (an unchunked pass over a real vocabulary holds several float32
    copies of the whole probe's logits at once: many GB every step). The
    metrics are sums over chunks divided by the probe's position counts, so they do not depend on the chunking."""

    def __init__(
        self, start: MiMoForCausalLM, sequences: list[dict], temperature: float, chunk_tokens: int = CHUNK_TOKENS
    ):
        start = start.eval().requires_grad_(False)
        self.start_head = start.model.mtp_layers  # all of the starting policy that measure() runs again
        self.temperature = temperature
        self.chunks = chunk_sequences(sequences, chunk_tokens)
        with torch.no_grad():
            self.start_logp = [
                F.log_softmax(
                    start(c.input_ids, c.cu_seqlens, with_mtp=False).logits[c.next_positions].float() / temperature,
                    dim=-1,
                )
                for c in self.chunks
            ]

    @torch.no_grad()
    def measure(self, policy: MiMoForCausalLM) -> dict[str, float]:
        """The drift metrics of ``policy`` (the current one) against the starting policy."""
        was_training = policy.training
        policy.eval()
        sums: dict[str, float] = {}
        try:
            for chunk, start_logp in zip(self.chunks, self.start_logp, strict=True):
                for key, value in self._chunk_sums(policy, chunk, start_logp).items():
                    sums[key] = sums.get(key, 0.0) + value
        finally:
            policy.train(was_training)
        scored = sum(c.next_positions.numel() for c in self.chunks)
        drafted = sum(c.draft_positions.numel() for c in self.chunks)
        return {key: value / (scored if key == "drift/kl_from_start" else drafted) for key, value in sums.items()}

    def _chunk_sums(self, policy: MiMoForCausalLM, chunk: ProbeChunk, start_logp: torch.Tensor) -> dict[str, float]:
        """The metrics' sums over one chunk's positions (KL over scored positions, the heads' over drafted ones)."""
        drafts = chunk.draft_positions.numel() > 0
        out = policy(chunk.input_ids, chunk.cu_seqlens, with_mtp=drafts, mtp_positions=chunk.draft_positions)
        now = F.log_softmax(out.logits[chunk.next_positions].float() / self.temperature, dim=-1)
        sums = {"drift/kl_from_start": float((start_logp.exp() * (start_logp - now)).sum())}
        del now
        if not drafts:  # only one-token responses: nothing for a head to draft
            return sums
        embeds = policy.model.embed_tokens(chunk.input_ids)
        positions = packed_positions(chunk.cu_seqlens, chunk.input_ids.shape[0])
        rope = rope_cos_sin(positions, policy.config.head_dim, policy.config.rope_theta)
        start_head = run_mtp_layers(
            self.start_head, out.hidden, embeds, policy.lm_head.weight, chunk.cu_seqlens, positions,
            rope, mtp_positions=chunk.draft_positions,
        )[0]  # fmt: skip
        # the policy's distribution over the drafted token, at t+1
        judge = F.log_softmax(out.logits[chunk.draft_positions + 1].float() / self.temperature, dim=-1)
        greedy = judge.argmax(-1)
        judge_probs = judge.exp()
        for name, logits in (("start_head", start_head), ("head", out.mtp_logits[0])):
            draft = logits.argmax(-1)
            sums[f"drift/mtp_accept_{name}"] = float(judge.gather(-1, draft[:, None]).exp().sum())
            sums[f"drift/mtp_top1_{name}"] = float((draft == greedy).float().sum())
            accepted = expected_acceptance(logits.float() / self.temperature, judge_probs)
            sums[f"drift/mtp_accept_sampled_{name}"] = float(accepted.sum())
        return sums


def load_or_sample_probe(run_dir: Path, sample) -> list[dict]:
    """The probe's sequences from the run directory, or ``sample()`` (the starting policy's responses) saved there
    first, so a resumed run compares on the same text."""
    path = run_dir / DRIFT_PROBE_FILE
    if path.is_file():
        return json.loads(path.read_text())
    sequences = sample()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(sequences))
    tmp.replace(path)
    return sequences
