"""Graft a MiMo-layout MTP head onto a Llama checkpoint that has none (SmolLM2-135M-Instruct).

vLLM serves MiMo's MTP drafter on a Qwen2 trunk. A Qwen2 decoder is a Llama decoder plus q/k/v biases, so a Llama
trunk loads into MiMo's layout unchanged with those biases at zero, and the trunk's tokens stay exactly what the
Llama checkpoint gives (tests/integration/test_mtp_graft.py compares them token for token in vLLM). The new MTP
layer starts as a copy of the trunk's last decoder layer, with the trunk's final norm as its output norm and an
input projection that adds the normalised hidden state and next-token embedding: a start from which training on the
model's own samples (:mod:`recipe.head_training`) moves quickly. The embeddings and LM head stay tied, as SmolLM2 ties
them; vLLM's MTP drafter shares the target's embedding and LM head.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from mtp.checkpoint import is_complete, save_checkpoint
from mtp.model import MiMoConfig, MiMoForCausalLM

GRAFTABLE_ARCHITECTURES = ("LlamaForCausalLM",)


class GraftError(ValueError):
    """A checkpoint the graft cannot turn into a MiMo one; the message names the file and the field."""


def mimo_config_from_llama(hf: dict, num_mtp_layers: int, source: str = "config.json") -> MiMoConfig:
    """The MiMo config of a Llama trunk, refusing what Qwen2's layout cannot reproduce exactly."""
    arch = (hf.get("architectures") or [None])[0]
    if arch not in GRAFTABLE_ARCHITECTURES:
        raise GraftError(f"{source}: architecture {arch!r}; the MTP graft takes {', '.join(GRAFTABLE_ARCHITECTURES)}")
    for key, ok in (
        ("attention_bias", not hf.get("attention_bias", False)),
        ("mlp_bias", not hf.get("mlp_bias", False)),
        ("hidden_act", hf.get("hidden_act", "silu") == "silu"),
        ("rope_scaling", not hf.get("rope_scaling")),
        ("rope_parameters.rope_type", (hf.get("rope_parameters") or {}).get("rope_type", "default") == "default"),
        ("head_dim", hf.get("head_dim", hf["hidden_size"] // hf["num_attention_heads"])
         == hf["hidden_size"] // hf["num_attention_heads"]),
    ):  # fmt: skip
        if not ok:
            raise GraftError(f"{source}: {key}={hf.get(key.split('.')[0])!r} has no equivalent in MiMo's Qwen2 trunk")
    if num_mtp_layers < 1:
        raise GraftError(f"num_mtp_layers={num_mtp_layers}: a graft needs at least one MTP layer")
    cfg = MiMoConfig.from_hf_dict({**hf, "num_nextn_predict_layers": num_mtp_layers})
    return cfg


def load_llama_state(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint's safetensors files (one file or shards)."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise GraftError(f"{path}: no *.safetensors file")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def grafted_model(path: Path, num_mtp_layers: int = 1) -> MiMoForCausalLM:
    """The Llama checkpoint at ``path`` as a float32 MiMo model with fresh MTP layers."""
    hf = json.loads((path / "config.json").read_text())
    cfg = mimo_config_from_llama(hf, num_mtp_layers, str(path / "config.json"))
    model = MiMoForCausalLM(cfg)
    state = load_llama_state(path)
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    trunk = {k: v for k, v in model.state_dict().items() if not k.startswith("model.mtp_layers.")}
    if cfg.tie_word_embeddings:
        trunk.pop("lm_head.weight")
    biases = {k for k in trunk if k.endswith("_proj.bias")}
    missing = sorted(set(trunk) - set(state) - biases)
    unexpected = sorted(set(state) - set(trunk))
    if missing or unexpected:
        raise GraftError(
            f"{path}: weights do not match a Llama trunk: missing {missing[:4]}, unexpected {unexpected[:4]}"
        )
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name in trunk:
            if name in biases:
                params[name].zero_()
            else:
                params[name].copy_(state[name].float())
        last = model.model.layers[cfg.num_hidden_layers - 1]
        eye = torch.eye(cfg.hidden_size)
        for layer in model.model.mtp_layers:
            layer.load_state_dict(last.state_dict(), strict=False)
            layer.hidden_layernorm.weight.fill_(1.0)
            layer.token_layernorm.weight.fill_(1.0)
            layer.final_layernorm.weight.copy_(model.model.norm.weight)
            layer.input_proj.weight.copy_(torch.cat([eye, eye], dim=1))
    return model


def graft_mtp(llama_dir: str | Path, out_dir: str | Path, num_mtp_layers: int = 1) -> Path:
    """Write ``out_dir``: the Llama checkpoint as a MiMo checkpoint with untrained MTP layers (reused if complete)."""
    from transformers import AutoTokenizer

    llama_dir, out_dir = Path(llama_dir), Path(out_dir)
    if is_complete(out_dir):
        return out_dir
    model = grafted_model(llama_dir, num_mtp_layers)
    tokenizer = AutoTokenizer.from_pretrained(str(llama_dir))
    if not tokenizer.chat_template:
        raise GraftError(f"{llama_dir}: the tokenizer has no chat template")
    return save_checkpoint(model, tokenizer, out_dir, extra_config={"spec_rollout_grafted_from": str(llama_dir)})


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m mtp.graft",
        description="Write a MiMo checkpoint of a Llama model with untrained MTP layers (train them with "
        "python -m recipe.mtp_head, which also takes a built-in model name, or online during DAPO with spec=mtp).",
    )
    parser.add_argument("model", help="a HF Llama checkpoint directory")
    parser.add_argument("out", help="the MiMo checkpoint directory to write")
    parser.add_argument("--mtp-layers", type=int, default=1)
    args = parser.parse_args(argv)
    print(graft_mtp(args.model, args.out, args.mtp_layers))


if __name__ == "__main__":
    main()
