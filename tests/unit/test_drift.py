"""The drift probe (recipe/dapo/drift.py) against a sequence-by-sequence oracle written from the definitions."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from test_mtp import tiny_model

from recipe.dapo.drift import CHUNK_TOKENS, DriftProbe, load_or_sample_probe

TEMPERATURE = 0.7


def probe_sequences(seed: int = 3) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(5, 9), (3, 2), (7, 14), (4, 1)]  # (prompt, response) lengths, a one-token response among them
    return [
        {"prompt": torch.randint(0, 40, (p,), generator=gen).tolist(),
         "response": torch.randint(0, 40, (r,), generator=gen).tolist()}
        for p, r in shapes
    ]  # fmt: skip


@torch.no_grad()
def oracle(start, policy, sequences: list[dict]) -> dict[str, float]:
    """One sequence at a time, position by position: KL(start || policy) where the next token is a response
    token; at t whose t+1 and t+2 are response tokens, the policy's probability (and argmax) at t+1 of each
    head's top-1 draft for t+2, the starting head run on the policy's hidden states and embeddings, and the chance
    that a draft sampled from each head is accepted (sum of min(p, q) over the vocabulary)."""
    kls, accept, top1, sampled = [], {"start_head": [], "head": []}, {"start_head": [], "head": []}, {}
    for s in sequences:
        ids = torch.tensor(s["prompt"] + s["response"])
        p = len(s["prompt"])
        now = policy(ids, with_mtp=True)
        logp = F.log_softmax(now.logits / TEMPERATURE, -1)
        ref = F.log_softmax(start(ids, with_mtp=False).logits / TEMPERATURE, -1)
        hybrid = copy.deepcopy(policy)
        hybrid.model.mtp_layers.load_state_dict(start.model.mtp_layers.state_dict())
        heads = {"head": now.mtp_logits[0], "start_head": hybrid(ids, with_mtp=True).mtp_logits[0]}
        for t in range(len(ids) - 1):
            if t + 1 >= p:
                kls.append(float((ref[t].exp() * (ref[t] - logp[t])).sum()))
            if t + 1 >= p and t + 2 < len(ids):
                for name, logits in heads.items():
                    draft = int(logits[t].argmax())
                    accept[name].append(float(logp[t + 1, draft].exp()))
                    top1[name].append(float(draft == int(logp[t + 1].argmax())))
                    q = F.softmax(logits[t] / TEMPERATURE, -1)
                    chances = zip(logp[t + 1].exp().tolist(), q.tolist(), strict=True)
                    sampled.setdefault(name, []).append(sum(min(a, b) for a, b in chances))
    out = {"drift/kl_from_start": sum(kls) / len(kls)}
    for name in accept:
        out[f"drift/mtp_accept_{name}"] = sum(accept[name]) / len(accept[name])
        out[f"drift/mtp_top1_{name}"] = sum(top1[name]) / len(top1[name])
        out[f"drift/mtp_accept_sampled_{name}"] = sum(sampled[name]) / len(sampled[name])
    return out


@pytest.mark.parametrize("chunk_tokens", [CHUNK_TOKENS, 16])
def test_drift_metrics_equal_the_sequence_by_sequence_oracle_on_a_moved_trunk_and_head(chunk_tokens):
    """At 16 tokens a chunk the probe splits into four chunks (the 21-token sequence alone, over the limit; the
    one-token response alone, with nothing drafted): the metrics must not depend on the chunking."""
    start = tiny_model(seed=0)
    policy = copy.deepcopy(start)
    with torch.no_grad():  # move everything, the MTP head included, as an online run would
        for i, p in enumerate(policy.parameters()):
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(i)) * 0.05)
    sequences = probe_sequences()
    probe = DriftProbe(copy.deepcopy(start), sequences, TEMPERATURE, chunk_tokens=chunk_tokens)
    assert len(probe.chunks) == (1 if chunk_tokens == CHUNK_TOKENS else 4)
    got = probe.measure(policy)
    want = oracle(start.eval(), policy.eval(), sequences)
    assert got.keys() == want.keys()
    for key in want:
        assert abs(got[key] - want[key]) < 1e-5, (key, got[key], want[key])
    assert want["drift/kl_from_start"] > 1e-3  # the perturbation moved the policy: the KL is not trivially 0
    assert abs(want["drift/mtp_accept_head"] - want["drift/mtp_accept_start_head"]) > 1e-4  # the heads differ


def test_an_unmoved_policy_has_no_drift_and_both_heads_agree():
    start = tiny_model(seed=1)
    got = DriftProbe(copy.deepcopy(start), probe_sequences(), TEMPERATURE).measure(start)
    assert abs(got["drift/kl_from_start"]) < 1e-6
    assert got["drift/mtp_accept_head"] == got["drift/mtp_accept_start_head"]


def test_the_probe_is_sampled_once_and_read_back_by_a_resumed_run(tmp_path):
    calls = []

    def sample():
        calls.append(1)
        return probe_sequences()

    first = load_or_sample_probe(tmp_path, sample)
    again = load_or_sample_probe(tmp_path, sample)
    assert calls == [1] and again == first
