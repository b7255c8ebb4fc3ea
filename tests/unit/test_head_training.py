"""Training a head on the model's own samples with the trunk frozen (recipe/head_training.py): only the MTP layers change,
and distillation (or the acceptance objective) moves the head's draft towards the target's own distribution of token
t+2."""

import copy

import numpy as np
import pytest
import torch

from mtp.checkpoint import load_checkpoint, save_checkpoint
from mtp.loss import depth_weights, draft_vocabulary, expected_acceptance, objective_loss
from mtp.model import MiMoConfig, MiMoForCausalLM
from recipe.head_training import (
    cache_trunk,
    deep_pack_loss,
    draft_and_target,
    held_out_acceptance,
    load_samples,
    pack_loss,
    save_samples,
    train_head,
)
from recipe.sft.train import TokenizedExample


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from recipe.data.task import generate_rows
    from recipe.data.tokenizer import train_tokenizer

    rows = generate_rows(200, seed=0, split="train")
    tokenizer = train_tokenizer([r["extra_info"]["solution"] for r in rows], vocab_size=280)
    model = MiMoForCausalLM(
        MiMoConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2)
    )
    model.init_weights(0, std=0.1)
    return save_checkpoint(model, tokenizer, tmp_path_factory.mktemp("head") / "ckpt", dtype=torch.float32)


def samples(vocab: int, count: int = 48) -> list[TokenizedExample]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        ids = rng.integers(0, vocab, 60)
        out.append(TokenizedExample(ids, np.r_[np.zeros(20, dtype=np.int64), np.ones(40, dtype=np.int64)]))
    return out


@pytest.mark.parametrize("objective", ["distill", "acceptance"])
def test_the_head_alone_trains_towards_the_targets_distribution(checkpoint, tmp_path, objective):
    before = load_checkpoint(checkpoint).state_dict()
    out, history, ceiling = train_head(
        checkpoint, samples(len(before["model.embed_tokens.weight"])), tmp_path / "trained", epochs=6,
        tokens_per_pack=600, lr=3e-3, dtype=torch.float32, objective=objective, progress=False,
    )  # fmt: skip
    after = load_checkpoint(out).state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith("model.mtp_layers.") for k in changed)
    first = np.mean([h["expected_acceptance"] for h in history[:4]])
    last = np.mean([h["expected_acceptance"] for h in history[-4:]])
    assert last > first + 0.05, (first, last)
    assert 0 < ceiling <= 1


def test_an_unknown_objective_is_named(checkpoint, tmp_path):
    with pytest.raises(ValueError, match="objective='kl'"):
        train_head(checkpoint, samples(10), tmp_path / "x", objective="kl", progress=False)


def test_held_out_acceptance_pools_positions_and_leaves_each_responses_last_target_out_of_earned(checkpoint):
    """The scores that compare heads on one text: packed several sequences to a pack, they must equal a sequence-by-
    sequence oracle, and the earned reading must leave out exactly the draft of each response's last token."""
    model = load_checkpoint(checkpoint)
    other = copy.deepcopy(model.model.mtp_layers)
    with torch.no_grad():
        for i, p in enumerate(other.parameters()):
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(i)))
    heads = {"own": model.model.mtp_layers, "other": other}
    rng = np.random.default_rng(1)
    data = []
    for length in (9, 14, 23, 31, 40):  # responses of different lengths, after 6-token prompts
        ids = rng.integers(0, model.config.vocab_size, 6 + length)
        data.append(TokenizedExample(ids, np.r_[np.zeros(6, dtype=np.int64), np.ones(length, dtype=np.int64)]))
    scores = held_out_acceptance(model, heads, data, tokens_per_pack=64)
    head = model.lm_head.weight.detach().float()
    for name, layers in heads.items():
        accepted, earned = [], []
        for sample in data:
            (c,) = cache_trunk(model, [[sample]], progress=False)
            with torch.no_grad():
                per_position = expected_acceptance(*draft_and_target(model, layers, head, c))
            # drafts of response tokens 2..L (the prefill step drafts the second), the last of them earning nothing
            assert per_position.numel() == int(sample.response_mask.sum()) - 1
            accepted += per_position.tolist()
            earned += per_position[:-1].tolist()
        assert scores[name]["accepted"] == pytest.approx(np.mean(accepted), abs=1e-6)
        assert scores[name]["earned"] == pytest.approx(np.mean(earned), abs=1e-6)
    assert abs(scores["own"]["earned"] - scores["other"]["earned"]) > 1e-3


def test_pack_loss_is_the_online_loss_on_cached_states_over_the_vocabulary_or_its_shortlist(checkpoint):
    """The online step's loss: over every token, the acceptance of the head's
    draft against the target's distribution from the cached states; over the top-2 shortlist, that of a head whose
    logits outside it are -inf (so a wrong column order or target remap fails)."""
    model = load_checkpoint(checkpoint)
    layers, head = model.model.mtp_layers, model.lm_head.weight.detach().float()
    (c,) = cache_trunk(model, [samples(model.config.vocab_size, 3)], progress=False)
    with torch.no_grad():
        logits, teacher = draft_and_target(model, layers, head, c)
        full, _ = pack_loss(model, layers, head, c, "acceptance")
        short, _ = pack_loss(model, layers, head, c, "acceptance", vocab_topk=2)
    assert full.item() == pytest.approx(objective_loss("acceptance", logits, c.targets, teacher)[0].item(), rel=1e-6)
    vocab = draft_vocabulary(teacher, c.targets, 2)
    assert vocab.numel() < model.config.vocab_size
    masked = torch.full_like(logits, float("-inf"))
    masked[:, vocab] = logits[:, vocab]
    assert short.item() == pytest.approx(objective_loss("acceptance", masked, c.targets, teacher)[0].item(), rel=1e-6)
    assert abs(short.item() - full.item()) > 1e-3


def test_a_sample_set_reads_back_as_written_and_a_missing_one_is_named(tmp_path):
    written = samples(300, count=5)
    written[2] = TokenizedExample(written[2].ids[:31], written[2].response_mask[:31])  # sets hold ragged responses
    path = tmp_path / "set.pkl"
    save_samples(path, written, {"responses": 5, "seconds": 1.5})
    read, summary = load_samples(path)
    assert summary == {"responses": 5, "seconds": 1.5}
    assert [len(s.ids) for s in read] == [60, 60, 31, 60, 60]
    for a, b in zip(read, written, strict=True):
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.response_mask, b.response_mask)
    with pytest.raises(FileNotFoundError, match="nowhere.pkl: no such sample set"):
        load_samples(tmp_path / "nowhere.pkl")


@pytest.mark.parametrize("objective", ["distill", "acceptance"])
def test_the_deep_loss_over_the_targets_whole_top_k_is_the_whole_vocabulary_loss(checkpoint, objective):
    """With the target's top-k over every token the shortlist holds the whole vocabulary and the cached teacher is the
    whole distribution: the shortlist's loss and per-depth acceptance must equal the whole-vocabulary ones (a wrong
    column map or teacher position fails); a small k must change them."""
    model = load_checkpoint(checkpoint)
    layers, head = model.model.mtp_layers, model.lm_head.weight.detach().float()
    data = [samples(model.config.vocab_size, 3)]
    weights = depth_weights(3, 0.6)
    (full_pack,) = cache_trunk(model, data, progress=False, depth=3)
    (all_k,) = cache_trunk(model, data, progress=False, depth=3, topk=model.config.vocab_size)
    (small_k,) = cache_trunk(model, data, progress=False, depth=3, topk=2)
    with torch.no_grad():
        full, _, full_accepts = deep_pack_loss(model, layers, head, full_pack, objective, weights)
        same, _, same_accepts = deep_pack_loss(model, layers, head, all_k, objective, weights)
        short, _, _ = deep_pack_loss(model, layers, head, small_k, objective, weights)
    assert same.item() == pytest.approx(full.item(), rel=1e-5)
    assert same_accepts == pytest.approx(full_accepts, rel=1e-5)
    assert abs(short.item() - full.item()) > 1e-3
    # depth 1 of the deep loss is the one-token head's loss
    with torch.no_grad():
        logits, teacher = draft_and_target(model, layers, head, full_pack)
        _, _, (first,) = deep_pack_loss(model, layers, head, full_pack, objective, depth_weights(1, 0.6))
    assert first == pytest.approx(float(expected_acceptance(logits, teacher).mean()), rel=1e-5)


def test_a_deep_head_trains_every_depth(checkpoint, tmp_path):
    before = load_checkpoint(checkpoint)
    out, history, _ = train_head(
        checkpoint, samples(before.config.vocab_size), tmp_path / "deep", epochs=6, tokens_per_pack=600, lr=3e-3,
        dtype=torch.float32, objective="distill", progress=False, depth=3, vocab_topk=32,
    )  # fmt: skip
    for d in (1, 2, 3):
        first = np.mean([h[f"expected_acceptance_pos_{d}"] for h in history[:4]])
        last = np.mean([h[f"expected_acceptance_pos_{d}"] for h in history[-4:]])
        assert last > first + 0.03, (d, first, last)
