"""The training-side MiMo module and its HF checkpoints."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from mtp.checkpoint import CheckpointError, is_complete, load_checkpoint, save_checkpoint
from mtp.model import MiMoConfig, MiMoForCausalLM


@pytest.fixture(scope="module")
def tokenizer():
    from recipe.data.task import generate_rows
    from recipe.data.tokenizer import train_tokenizer

    rows = generate_rows(200, seed=0, split="train")
    return train_tokenizer([r["extra_info"]["solution"] for r in rows], vocab_size=280)


def tiny_model(vocab: int, seed: int = 0) -> MiMoForCausalLM:
    model = MiMoForCausalLM(MiMoConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2))
    model.init_weights(seed, std=0.1)
    return model


def test_one_forward_returns_logits_hidden_and_mtp_logits():
    model = tiny_model(50)
    out = model(torch.randint(0, 50, (12,)))
    assert out.logits.shape == (12, 50) and out.hidden.shape == (12, 64)
    assert len(out.mtp_logits) == 1 and out.mtp_logits[0].shape == (12, 50)


def test_packed_forward_equals_per_sequence_forward():
    model = tiny_model(50)
    seqs = [torch.randint(0, 50, (n,)) for n in (5, 9, 1, 7)]
    cu = torch.tensor([0, 5, 14, 15, 22])
    packed = model(torch.cat(seqs), cu)
    for i, s in enumerate(seqs):
        single = model(s)
        sl = slice(cu[i], cu[i + 1])
        torch.testing.assert_close(packed.logits[sl], single.logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(packed.mtp_logits[0][sl], single.mtp_logits[0], atol=1e-5, rtol=1e-5)


def test_trunk_matches_transformers_qwen2_from_the_checkpoint(tmp_path, tokenizer):
    from transformers import AutoModelForCausalLM

    model = tiny_model(len(tokenizer))
    save_checkpoint(model, tokenizer, tmp_path / "ckpt", dtype=torch.float32)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32).eval()
    ids = torch.randint(0, len(tokenizer), (20,))
    with torch.no_grad():
        ours = model(ids, with_mtp=False).logits
        theirs = hf(ids[None]).logits[0]
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_checkpoint_round_trip_and_hf_mimo_layout(tmp_path, tokenizer):
    model = tiny_model(len(tokenizer))
    path = save_checkpoint(model, tokenizer, tmp_path / "ckpt", dtype=torch.float32)
    assert is_complete(path)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["MiMoForCausalLM"] and cfg["num_nextn_predict_layers"] == 1
    names = set(load_file(str(path / "model.safetensors")))
    for part in (
        "token_layernorm",
        "hidden_layernorm",
        "input_proj",
        "final_layernorm",
        "self_attn.q_proj",
        "mlp.gate_proj",
        "input_layernorm",
        "post_attention_layernorm",
    ):
        assert any(n.startswith(f"model.mtp_layers.0.{part}") for n in names), part
    loaded = load_checkpoint(path)
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert n1 == n2 and torch.equal(p1, p2)


def test_missing_file_is_named(tmp_path, tokenizer):
    path = save_checkpoint(tiny_model(len(tokenizer)), tokenizer, tmp_path / "ckpt")
    (path / "model.safetensors").unlink()
    assert not is_complete(path)
    with pytest.raises(CheckpointError, match="missing model.safetensors"):
        load_checkpoint(path)


def test_mismatched_shape_names_tensor_and_file(tmp_path, tokenizer):
    path = save_checkpoint(tiny_model(len(tokenizer)), tokenizer, tmp_path / "ckpt")
    state = load_file(str(path / "model.safetensors"))
    state["model.layers.1.mlp.up_proj.weight"] = torch.zeros(3, 3)
    save_file(state, str(path / "model.safetensors"))
    with pytest.raises(
        CheckpointError, match=r"model\.safetensors tensor model\.layers\.1\.mlp\.up_proj\.weight has shape \(3, 3\)"
    ):
        load_checkpoint(path)


def test_malformed_config_is_named(tmp_path, tokenizer):
    path = save_checkpoint(tiny_model(len(tokenizer)), tokenizer, tmp_path / "ckpt")
    (path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="malformed config.json"):
        load_checkpoint(path)
