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
# what measure() returns for the tables that show it (scripts/summarize_run.py, scripts/frozen_head_drift.py); the top-1
# agreement columns it also returns are left out of them
METRIC_LABELS = {
    "drift/kl_from_start": "KL from start",
    "drift/mtp_accept_start_head": "start head, argmax",
    "drift/mtp_accept_sampled_start_head": "start head, sampled",
    "drift/mtp_accept_head": "own head, argmax",
    "drift/mtp_accept_sampled_head": "own head, sampled",
}


class DriftProbe:
    """The fixed sequences, the starting policy's next-token distributions on them, and its MTP head."""

    def __init__(self, start: MiMoForCausalLM, sequences: list[dict], temperature: float):
        start = start.eval().requires_grad_(False)
        self.start_head = start.model.mtp_layers  # all of the starting policy that measure() runs again
        self.temperature = temperature
        ids, mask, lengths = [], [], []
        for s in sequences:
            ids += s["prompt"] + s["response"]
            mask += [0] * len(s["prompt"]) + [1] * len(s["response"])
            lengths.append(len(s["prompt"]) + len(s["response"]))
        self.input_ids = torch.tensor(ids)
        self.response_mask = torch.tensor(mask)
        self.cu_seqlens = torch.zeros(len(lengths) + 1, dtype=torch.long)
        self.cu_seqlens[1:] = torch.tensor(lengths).cumsum(0)
        # position t scores token t+1 (the next-token distribution) where t+1 is a response token
        _, scored = next_token_targets(self.input_ids, self.response_mask, self.cu_seqlens)
        self.next_positions = scored.nonzero().squeeze(-1)
        # an MTP head at t drafts token t+2 from the hidden state at t and token t+1; the policy judges it at t+1
        _, drafted = mtp_targets(self.input_ids, self.response_mask, self.cu_seqlens, depth=0)
        self.draft_positions = drafted.nonzero().squeeze(-1)
        with torch.no_grad():
            logits = start(self.input_ids, self.cu_seqlens, with_mtp=False).logits[self.next_positions]
            self.start_logp = F.log_softmax(logits.float() / self.temperature, dim=-1)

    @torch.no_grad()
    def measure(self, policy: MiMoForCausalLM) -> dict[str, float]:
        """The drift metrics of ``policy`` (the current one) against the starting policy."""
        was_training = policy.training
        policy.eval()
        try:
            out = policy(self.input_ids, self.cu_seqlens, with_mtp=True, mtp_positions=self.draft_positions)
            logp = F.log_softmax(out.logits.float() / self.temperature, dim=-1)
            embeds = policy.model.embed_tokens(self.input_ids)
            positions = packed_positions(self.cu_seqlens, self.input_ids.shape[0])
            rope = rope_cos_sin(positions, policy.config.head_dim, policy.config.rope_theta)
            start_head = run_mtp_layers(
                self.start_head, out.hidden, embeds, policy.lm_head.weight, self.cu_seqlens, positions,
                rope, mtp_positions=self.draft_positions,
            )[0]  # fmt: skip
        finally:
            policy.train(was_training)
        now = logp[self.next_positions]
        kl = (self.start_logp.exp() * (self.start_logp - now)).sum(-1).mean()
        judge = logp[self.draft_positions + 1]  # the policy's distribution over the drafted token
        greedy = judge.argmax(-1)
        judge_probs = judge.exp()
        metrics = {"drift/kl_from_start": float(kl)}
        for name, logits in (("start_head", start_head), ("head", out.mtp_logits[0])):
            draft = logits.argmax(-1)
            metrics[f"drift/mtp_accept_{name}"] = float(judge.gather(-1, draft[:, None]).exp().mean())
            metrics[f"drift/mtp_top1_{name}"] = float((draft == greedy).float().mean())
            accepted = expected_acceptance(logits.float() / self.temperature, judge_probs)
            metrics[f"drift/mtp_accept_sampled_{name}"] = float(accepted.mean())
        return metrics


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
