"""The MTP graft (mtp/graft.py): a Llama checkpoint loads into MiMo's Qwen2 layout with zero q/k/v biases and computes
the same logits as transformers' Llama; what that layout cannot reproduce is refused, naming the field."""

import json

import pytest
import torch
from safetensors.torch import save_file

from mtp.graft import GraftError, grafted_model, mimo_config_from_llama


def tiny_llama(path, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rope_theta=50000.0, tie_word_embeddings=True,
        rms_norm_eps=1e-5, **overrides,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    path.mkdir()
    hf = config.to_dict() | {"architectures": ["LlamaForCausalLM"]}
    (path / "config.json").write_text(json.dumps(hf))
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(path / "model.safetensors"))
    return model


def test_the_grafted_trunk_computes_llamas_logits(tmp_path):
    llama = tiny_llama(tmp_path / "llama")
    grafted = grafted_model(tmp_path / "llama", num_mtp_layers=1).eval()
    ids = torch.randint(0, 96, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = llama(ids).logits[0]
        out = grafted(ids[0])
    torch.testing.assert_close(out.logits, expected, rtol=1e-5, atol=1e-5)
    attn = grafted.model.layers[0].self_attn
    assert not attn.q_proj.bias.any() and not attn.k_proj.bias.any() and not attn.v_proj.bias.any()
    assert grafted.lm_head.weight is grafted.model.embed_tokens.weight  # tied, as SmolLM2's
    # the new head starts from the trunk's last layer and drafts something (its logits are finite and not constant)
    assert len(out.mtp_logits) == 1 and torch.isfinite(out.mtp_logits[0]).all() and out.mtp_logits[0].std() > 0


@pytest.mark.parametrize(
    "change, field",
    [
        ({"attention_bias": True}, "attention_bias"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"architectures": ["Qwen2ForCausalLM"]}, "architecture 'Qwen2ForCausalLM'"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
    ],
)
def test_what_qwen2s_layout_cannot_reproduce_is_named(change, field):
    hf = {
        "architectures": ["LlamaForCausalLM"], "vocab_size": 96, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_act": "silu",
    }  # fmt: skip
    assert mimo_config_from_llama(hf, 1).num_nextn_predict_layers == 1
    with pytest.raises(GraftError, match=field):
        mimo_config_from_llama(hf | change, 1, "model/config.json")


def test_a_graft_without_mtp_layers_is_refused():
    hf = {"architectures": ["LlamaForCausalLM"], "vocab_size": 96, "hidden_size": 64, "num_attention_heads": 4}
    with pytest.raises(GraftError, match="num_mtp_layers=0"):
        mimo_config_from_llama(hf, 0)


def test_a_head_file_carries_the_trained_layer_alone_back_onto_the_trunk(tmp_path):
    """export_head writes the MTP layer's tensors alone; grafting with it gives the trained checkpoint's layer on a fresh
    graft of the same trunk, bit for bit at the stored precision; a head of another shape is refused, naming it."""
    from tokenizers import Tokenizer, models
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from mtp.checkpoint import load_checkpoint, save_checkpoint
    from mtp.graft import HEAD_PREFIX, export_head, graft_mtp

    tiny_llama(tmp_path / "llama")
    vocab = {"<unk>": 0, "<eos>": 1}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")), eos_token="<eos>"
    )
    tok.chat_template = "{{ messages[0]['content'] }}"
    tok.save_pretrained(str(tmp_path / "llama"))
    trained = grafted_model(tmp_path / "llama")
    with torch.no_grad():
        for p in trained.model.mtp_layers.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    ckpt = save_checkpoint(trained, AutoTokenizer.from_pretrained(str(tmp_path / "llama")), tmp_path / "trained")
    head = export_head(ckpt, tmp_path / "head.safetensors")
    from safetensors.torch import load_file

    assert set(load_file(str(head))) == {k for k in trained.state_dict() if k.startswith(HEAD_PREFIX)}
    again = load_checkpoint(graft_mtp(tmp_path / "llama", tmp_path / "again", head=head))
    stored = load_checkpoint(ckpt)
    for name, value in stored.state_dict().items():
        torch.testing.assert_close(again.state_dict()[name], value, rtol=0, atol=0)
    weights = load_file(str(head))
    name = sorted(weights)[0]
    save_file({**weights, name: weights[name][..., :1].contiguous()}, str(tmp_path / "narrow.safetensors"))
    with pytest.raises(GraftError, match=r"narrow.safetensors: not a head for this trunk.*shape \['model.mtp_layers"):
        graft_mtp(tmp_path / "llama", tmp_path / "wrong", head=tmp_path / "narrow.safetensors")
