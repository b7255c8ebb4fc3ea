"""Checkpoint converters between the HF MiMo layout and Megatron-core's GPT + MTP layout.

The one non-mechanical difference: MiMo's MTP layer projects ``cat([hidden, embedding])``
(``model.mtp_layers.{k}.input_proj``), Megatron and DeepSeek project ``cat([embedding, hidden])``
(``mtp.layers.{k}.eh_proj``), so the two column halves of that weight swap in both directions. Getting it
wrong loads without any error and silently ruins the draft head (tests/unit/test_mtp.py measures how much).

The rest is Megatron's naming: fused ``linear_qkv`` (query heads of each KV group followed by that group's
key and value), ``linear_fc1`` = ``[gate; up]``, pre-norm weights stored on the following linear layer, and
the MTP decoder block under ``transformer_layer``.

As a tool (``python -m mtp.convert --help``)::

    python -m mtp.convert to-megatron HF_DIR OUT.pt             # {"model": state dict}, Megatron's legacy layout
    python -m mtp.convert to-mimo MEGATRON.pt CONFIG_DIR OUT_DIR  # an HF checkpoint vLLM and transformers load

``to-mimo`` takes the model's shape and tokenizer from ``CONFIG_DIR`` (an HF MiMo checkpoint of the same
architecture, e.g. the one converted to Megatron before training) and writes ``OUT_DIR`` as
:func:`mtp.checkpoint.save_checkpoint` does (atomic, with the tokenizer under ``tokenizer/``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from mtp.model import MiMoConfig

_MTP_NORMS = {"token_layernorm": "enorm", "hidden_layernorm": "hnorm", "final_layernorm": "final_layernorm"}
_LAYER = {
    "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
    "input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
    "post_attention_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
    "mlp.down_proj.weight": "mlp.linear_fc2.weight",
}
_TOP = {
    "model.embed_tokens.weight": "embedding.word_embeddings.weight",
    "model.norm.weight": "decoder.final_layernorm.weight",
    "lm_head.weight": "output_layer.weight",
}


def swap_halves(weight: torch.Tensor) -> torch.Tensor:
    """``[A | B]`` -> ``[B | A]`` along the input dimension (MiMo <-> Megatron/DeepSeek MTP projection)."""
    first, second = weight.chunk(2, dim=1)
    return torch.cat([second, first], dim=1)


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: MiMoConfig) -> torch.Tensor:
    groups, per = cfg.num_key_value_heads, cfg.num_attention_heads // cfg.num_key_value_heads
    hd = cfg.head_dim
    q = q.reshape(groups, per * hd, *q.shape[1:])
    k = k.reshape(groups, hd, *k.shape[1:])
    v = v.reshape(groups, hd, *v.shape[1:])
    return torch.cat([q, k, v], dim=1).reshape(-1, *q.shape[2:])


def _split_qkv(qkv: torch.Tensor, cfg: MiMoConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    groups, per = cfg.num_key_value_heads, cfg.num_attention_heads // cfg.num_key_value_heads
    hd = cfg.head_dim
    g = qkv.reshape(groups, (per + 2) * hd, *qkv.shape[1:])
    q, k, v = g.split([per * hd, hd, hd], dim=1)
    return q.reshape(-1, *qkv.shape[1:]), k.reshape(-1, *qkv.shape[1:]), v.reshape(-1, *qkv.shape[1:])


def _layer_to_megatron(prefix: str, out_prefix: str, cfg: MiMoConfig, out: dict, hf: dict[str, torch.Tensor]) -> None:
    """Decoder layer ``prefix`` of an HF MiMo state dict ``hf`` into ``out`` under Megatron's ``out_prefix``."""
    for name, dst in _LAYER.items():
        out[out_prefix + dst] = hf[prefix + name]
    for part in ("weight", "bias"):
        q, k, v = (hf[f"{prefix}self_attn.{p}_proj.{part}"] for p in "qkv")
        out[f"{out_prefix}self_attention.linear_qkv.{part}"] = _fuse_qkv(q, k, v, cfg)
    gate, up = hf[prefix + "mlp.gate_proj.weight"], hf[prefix + "mlp.up_proj.weight"]
    out[out_prefix + "mlp.linear_fc1.weight"] = torch.cat([gate, up], dim=0)


def _layer_to_hf(prefix: str, out_prefix: str, cfg: MiMoConfig, out: dict, mc: dict[str, torch.Tensor]) -> None:
    """Decoder layer ``prefix`` of a Megatron state dict ``mc`` into ``out`` under HF MiMo's ``out_prefix``."""
    for dst, name in _LAYER.items():
        out[out_prefix + dst] = mc[prefix + name]
    for part in ("weight", "bias"):
        q, k, v = _split_qkv(mc[f"{prefix}self_attention.linear_qkv.{part}"], cfg)
        for name, t in zip("qkv", (q, k, v), strict=True):
            out[f"{out_prefix}self_attn.{name}_proj.{part}"] = t
    gate, up = mc[prefix + "mlp.linear_fc1.weight"].chunk(2, dim=0)
    out[out_prefix + "mlp.gate_proj.weight"] = gate
    out[out_prefix + "mlp.up_proj.weight"] = up


class _Tracked(dict):
    """A state dict that remembers which tensors were read, so nothing is silently dropped."""

    def __init__(self, d: dict):
        super().__init__(d)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> torch.Tensor:
        self.read.add(key)
        return super().__getitem__(key)


def _check_consumed(src: _Tracked, layout: str) -> None:
    unmapped = sorted(set(src) - src.read)
    if unmapped:
        raise ValueError(
            f"{layout} state dict has {len(unmapped)} tensor(s) the config does not account for, e.g. "
            f"{unmapped[:4]}; check num_hidden_layers / num_nextn_predict_layers"
        )


def _convert(src: dict[str, torch.Tensor], cfg: MiMoConfig, to_megatron: bool) -> dict[str, torch.Tensor]:
    """One walk over every tensor of both layouts, read from ``src``'s side (HF MiMo names when ``to_megatron``)."""
    src = _Tracked(src)
    layer = _layer_to_megatron if to_megatron else _layer_to_hf

    def pair(hf_name: str, mc_name: str) -> tuple[str, str]:  # (read, write)
        return (hf_name, mc_name) if to_megatron else (mc_name, hf_name)

    out = {}
    for hf_name, mc_name in _TOP.items():
        read, write = pair(hf_name, mc_name)
        out[write] = src[read]
    for i in range(cfg.num_hidden_layers):
        layer(*pair(f"model.layers.{i}.", f"decoder.layers.{i}."), cfg, out, src)
    for k in range(cfg.num_nextn_predict_layers):
        hf_mtp, mc_mtp = f"model.mtp_layers.{k}.", f"mtp.layers.{k}."
        layer(*pair(hf_mtp, mc_mtp + "transformer_layer."), cfg, out, src)
        for hf_norm, mc_norm in _MTP_NORMS.items():
            read, write = pair(f"{hf_mtp}{hf_norm}.weight", f"{mc_mtp}{mc_norm}.weight")
            out[write] = src[read]
        read, write = pair(hf_mtp + "input_proj.weight", mc_mtp + "eh_proj.weight")
        out[write] = swap_halves(src[read])
    _check_consumed(src, "HF MiMo" if to_megatron else "Megatron")
    return out


def mimo_to_megatron(hf: dict[str, torch.Tensor], cfg: MiMoConfig) -> dict[str, torch.Tensor]:
    """HF MiMo state dict -> Megatron-core GPT + MTP names and layouts."""
    return _convert(hf, cfg, to_megatron=True)


def megatron_to_mimo(mc: dict[str, torch.Tensor], cfg: MiMoConfig) -> dict[str, torch.Tensor]:
    """Megatron-core GPT + MTP state dict -> HF MiMo names and layouts (what vLLM and transformers load)."""
    return _convert(mc, cfg, to_megatron=False)


def load_megatron_state(path: str | Path) -> dict[str, torch.Tensor]:
    """The model state dict in a ``torch.save`` file: its ``model`` entry (Megatron's ``model_optim_rng.pt``) or the
    file's dict itself, without Transformer Engine's ``_extra_state`` entries (no weights)."""
    saved = torch.load(path, map_location="cpu", weights_only=False)
    state = saved.get("model", saved) if isinstance(saved, dict) else None
    if isinstance(state, dict):
        state = {k: v for k, v in state.items() if not k.endswith("._extra_state")}
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path}: not a Megatron state dict (a dict of tensors, or one under 'model')")
    return state


def hf_to_megatron_file(checkpoint: str | Path, out: str | Path) -> Path:
    """Convert the HF MiMo checkpoint directory ``checkpoint`` to ``out`` (``torch.save({"model": ...})``)."""
    from mtp.checkpoint import load_checkpoint

    model = load_checkpoint(checkpoint)  # its state dict names lm_head.weight also when tied to the embeddings
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": mimo_to_megatron(model.state_dict(), model.config)}, out)
    return out


def megatron_file_to_hf(megatron: str | Path, config_dir: str | Path, out: str | Path) -> Path:
    """Convert the Megatron state dict in ``megatron`` to an HF checkpoint at ``out``, shaped as ``config_dir``'s."""
    from mtp.checkpoint import load_tokenizer, read_config, save_checkpoint
    from mtp.model import MiMoForCausalLM

    cfg = read_config(config_dir)
    state = megatron_to_mimo(load_megatron_state(megatron), cfg)
    model = MiMoForCausalLM(cfg)
    model.load_state_dict(state)
    dtype = next(iter(state.values())).dtype
    return save_checkpoint(model, load_tokenizer(config_dir), out, dtype=dtype)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m mtp.convert", description="Convert MiMo checkpoints (with MTP layers) between HF and Megatron."
    )
    sub = parser.add_subparsers(dest="direction", required=True)
    to_megatron = sub.add_parser("to-megatron", help="HF MiMo checkpoint directory -> Megatron-core state dict file")
    to_megatron.add_argument("checkpoint", help="HF MiMo checkpoint directory (config.json, model.safetensors)")
    to_megatron.add_argument("out", help="file to write, e.g. iter_0000000/mp_rank_00/model_optim_rng.pt")
    to_mimo = sub.add_parser("to-mimo", help="Megatron-core state dict file -> HF MiMo checkpoint directory")
    to_mimo.add_argument("megatron", help="torch.save file with the state dict (under 'model', as Megatron saves it)")
    to_mimo.add_argument("config_dir", help="HF MiMo checkpoint of the same shape: config.json and tokenizer/")
    to_mimo.add_argument("out", help="directory to write (replaced if it exists)")
    args = parser.parse_args(argv)
    try:
        if args.direction == "to-megatron":
            written = hf_to_megatron_file(args.checkpoint, args.out)
        else:
            written = megatron_file_to_hf(args.megatron, args.config_dir, args.out)
    except (ValueError, OSError, RuntimeError) as e:  # CheckpointError is a RuntimeError
        parser.exit(2, f"python -m mtp.convert {args.direction}: {e}\n")
    print(f"wrote {written}")


if __name__ == "__main__":
    main()
