"""MTP checkpoints on a trained model: a wrongly ordered head costs loss, the conversion CLI round-trips."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mtp.convert import megatron_to_mimo, mimo_to_megatron
from mtp.loss import masked_ce, mtp_targets


def test_wrongly_ordered_head_has_much_higher_mtp_loss(harness_model):
    """A trained head loaded with the projection halves in the wrong order (a converter that forgets the
    swap) drafts far worse than one converted correctly."""
    from mtp.checkpoint import load_checkpoint, load_tokenizer
    from recipe.data.loader import load_problems
    from recipe.sft.train import encode_example

    model = load_checkpoint(harness_model)
    tokenizer = load_tokenizer(harness_model)
    problems = load_problems(harness_model.parent / "data" / "test.parquet", max_rows=24)
    examples = [encode_example(tokenizer, p.messages, p.solution) for p in problems]
    ids = torch.from_numpy(np.concatenate([e.ids for e in examples]))
    m = torch.from_numpy(np.concatenate([e.response_mask for e in examples]))
    cu = torch.tensor([0, *np.cumsum([len(e.ids) for e in examples])])  # cu_seqlens of the packed stream

    def mtp_loss(state: dict) -> float:
        model.load_state_dict(state)
        with torch.no_grad():
            out = model(ids, cu)
        t, mask = mtp_targets(ids, m, cu)
        return float(masked_ce(out.mtp_logits[0], t, mask)[0])

    cfg = model.config
    original = {k: v.clone() for k, v in model.state_dict().items()}
    mc = mimo_to_megatron(original, cfg)
    correct = mtp_loss(megatron_to_mimo(mc, cfg))
    naive = dict(megatron_to_mimo(mc, cfg))
    naive["model.mtp_layers.0.input_proj.weight"] = mc["mtp.layers.0.eh_proj.weight"]  # renamed, not swapped
    wrong = mtp_loss(naive)
    assert correct == pytest.approx(mtp_loss(original), abs=1e-6)
    assert wrong > correct + 1.0, (correct, wrong)


def test_convert_cli_round_trips_a_checkpoint_through_megatron_and_names_a_config_of_another_shape(
    harness_model, tmp_path
):
    """``python -m mtp.convert``, as a user runs it: HF -> Megatron file -> HF gives back every tensor and a
    checkpoint that loads; a config of another depth is refused with the tensors it cannot place."""
    import json
    import shutil
    import subprocess
    import sys

    from mtp.checkpoint import load_checkpoint

    def convert(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "mtp.convert", *args], capture_output=True, text=True)

    megatron = tmp_path / "iter_0000001" / "mp_rank_00" / "model_optim_rng.pt"
    assert convert("to-megatron", str(harness_model), str(megatron)).returncode == 0
    state = torch.load(megatron)["model"]
    assert "mtp.layers.0.eh_proj.weight" in state and not any(k.startswith("model.") for k in state)
    back = tmp_path / "hf"
    done = convert("to-mimo", str(megatron), str(harness_model), str(back))
    assert done.returncode == 0, done.stderr
    original, converted = load_checkpoint(harness_model).state_dict(), load_checkpoint(back).state_dict()
    assert set(converted) == set(original)
    for name, tensor in original.items():
        assert torch.equal(converted[name], tensor), name

    shallower = tmp_path / "shallower"
    shutil.copytree(harness_model, shallower)
    cfg = json.loads((shallower / "config.json").read_text())
    cfg["num_hidden_layers"] -= 1
    (shallower / "config.json").write_text(json.dumps(cfg))
    refused = convert("to-mimo", str(megatron), str(shallower), str(tmp_path / "refused"))
    assert refused.returncode == 2 and "num_hidden_layers" in refused.stderr, refused.stderr
    assert not (tmp_path / "refused").exists()
