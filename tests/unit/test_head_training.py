"""Training a head on the model's own samples with the trunk frozen (mtp/head_training.py): only the MTP layers change,
and distillation (or the acceptance objective) moves the head's draft towards the target's own distribution of token
t+2."""

import numpy as np
import pytest
import torch

from mtp.checkpoint import load_checkpoint, save_checkpoint
from mtp.head_training import train_head
from mtp.model import MiMoConfig, MiMoForCausalLM
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
