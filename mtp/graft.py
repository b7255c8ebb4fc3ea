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
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from mtp.checkpoint import DEPTH_KEY, is_complete, save_checkpoint, trained_depth
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


HEAD_PREFIX = "model.mtp_layers."  # a MiMo checkpoint's MTP layers: what a head file holds


def export_head(checkpoint: str | Path, out_file: str | Path, metadata: dict[str, str] | None = None) -> Path:
    """Write the MTP layers of a MiMo checkpoint alone (``model.mtp_layers.*``, as stored) to a safetensors file: the
    part of a grafted head training changes, a few MB where the checkpoint is the whole model. :func:`graft_mtp`
    with ``head=`` puts it back onto the trunk it was trained on."""
    state = load_llama_state(Path(checkpoint))
    head = {k: v.contiguous() for k, v in state.items() if k.startswith(HEAD_PREFIX)}
    if not head:
        raise GraftError(f"{checkpoint}: no {HEAD_PREFIX}* tensors (not a MiMo checkpoint with an MTP layer)")
    out_file = Path(out_file)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    depth = str(trained_depth(checkpoint))
    save_file(head, str(out_file), metadata={"format": "pt", DEPTH_KEY: depth, **(metadata or {})})
    return out_file


def load_head(model: MiMoForCausalLM, head: Path) -> int:
    """Load a head file (:func:`export_head`) into ``model``'s MTP layers, every layer tensor there and in shape, and
    return the depth it was trained to draft."""
    with safe_open(str(head), "pt") as f:
        depth = int((f.metadata() or {}).get(DEPTH_KEY, 1))
    weights = load_file(str(head))
    want = {k: v for k, v in model.state_dict().items() if k.startswith(HEAD_PREFIX)}
    missing, unexpected = sorted(set(want) - set(weights)), sorted(set(weights) - set(want))
    wrong = sorted(k for k in set(want) & set(weights) if want[k].shape != weights[k].shape)
    if missing or unexpected or wrong:
        raise GraftError(
            f"{head}: not a head for this trunk: missing {missing[:3]}, unexpected {unexpected[:3]}, shape {wrong[:3]}"
        )
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name, value in weights.items():
            params[name].copy_(value.float())
    return depth


def graft_mtp(llama_dir: str | Path, out_dir: str | Path, num_mtp_layers: int = 1, head: Path | None = None) -> Path:
    """Write ``out_dir``: the Llama checkpoint as a MiMo checkpoint with untrained MTP layers, or with the trained ones
    of a ``head`` file (:func:`export_head`); reused if complete."""
    from transformers import AutoTokenizer

    llama_dir, out_dir = Path(llama_dir), Path(out_dir)
    if is_complete(out_dir):
        return out_dir
    model = grafted_model(llama_dir, num_mtp_layers)
    extra = {"spec_rollout_grafted_from": str(llama_dir)}
    if head is not None:
        extra[DEPTH_KEY] = load_head(model, head)
        extra["spec_rollout_head"] = str(head)
    tokenizer = AutoTokenizer.from_pretrained(str(llama_dir))
    if not tokenizer.chat_template:
        raise GraftError(f"{llama_dir}: the tokenizer has no chat template")
    return save_checkpoint(model, tokenizer, out_dir, extra_config=extra)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m mtp.graft",
        description="Write a MiMo checkpoint of a Llama model with untrained MTP layers (train them with "
        "python -m recipe.mtp_head, which also takes a built-in model name, or online during DAPO with spec=mtp).",
    )
    parser.add_argument("model", help="a HF Llama checkpoint directory (with --export: a trained MiMo checkpoint)")
    parser.add_argument("out", help="the MiMo checkpoint directory to write (with --export: the head file)")
    parser.add_argument("--mtp-layers", type=int, default=1)
    parser.add_argument("--head", type=Path, help="a head file (--export's) whose trained MTP layers the graft takes")
    parser.add_argument("--export", action="store_true", help="write the MTP layers of a MiMo checkpoint alone")
    args = parser.parse_args(argv)
    if args.export:
        print(export_head(args.model, args.out))
        return
    if args.head is not None and not args.head.is_file():
        parser.error(f"--head {args.head}: no such file (python -m mtp.graft --export CHECKPOINT FILE writes one)")
    print(graft_mtp(args.model, args.out, args.mtp_layers, args.head))


if __name__ == "__main__":
    main()
