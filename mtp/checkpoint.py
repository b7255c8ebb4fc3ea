"""HuggingFace-format MiMo checkpoints: atomic save, validated load.

A checkpoint directory holds ``config.json``, ``model.safetensors``, the tokenizer under ``tokenizer/``
and a ``COMPLETE`` marker written last (after an fsync of everything else), so a crash mid-save leaves a
directory that :func:`is_complete` rejects and the caller rebuilds instead of loading.

Why ``tokenizer/``: transformers 5's ``AutoTokenizer`` picks the tokenizer class registered for the
config's ``model_type`` (``qwen2`` -> ``Qwen2Tokenizer``), which rebuilds Qwen's pre-tokenizer and ignores
ours (a space kept with the digit after it). In a directory without ``config.json`` it uses the saved
``tokenizer.json`` as is. So the tokenizer lives next to the weights, not among them, and every loader
(vLLM's ``tokenizer=``, veRL's ``model.tokenizer_path``, :func:`load_tokenizer`) points there.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from mtp.model import MiMoConfig, MiMoForCausalLM

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
WEIGHTS_FILE = "model.safetensors"
COMPLETE_MARKER = "COMPLETE"
TOKENIZER_DIR = "tokenizer"
TOKENIZER_FILES = (f"{TOKENIZER_DIR}/tokenizer.json", f"{TOKENIZER_DIR}/tokenizer_config.json")
REQUIRED_FILES = (CONFIG_FILE, GENERATION_CONFIG_FILE, WEIGHTS_FILE, *TOKENIZER_FILES)


class CheckpointError(RuntimeError):
    """A checkpoint directory that cannot be loaded; the message names the offending file."""


def has_mtp_layer(path: str | Path) -> bool:
    """Whether the checkpoint directory's config.json declares an MTP layer (``num_nextn_predict_layers``)."""
    config = Path(path) / "config.json"
    return config.is_file() and bool(json.loads(config.read_text()).get("num_nextn_predict_layers"))


DEPTH_KEY = "spec_rollout_mtp_depth"  # config.json: draft tokens a step the checkpoint's MTP layer was trained for


def trained_depth(path: str | Path) -> int:
    """The draft tokens per step the checkpoint's MTP layer was trained to draft (its layer run on its own output;
    ``config.json`` :data:`DEPTH_KEY`, written by head training and by a graft from a head file); 1 where unrecorded."""
    config = Path(path) / "config.json"
    return int(json.loads(config.read_text()).get(DEPTH_KEY, 1)) if config.is_file() else 1


def is_complete(path: str | Path) -> bool:
    path = Path(path)
    return (path / COMPLETE_MARKER).is_file() and all((path / f).is_file() for f in REQUIRED_FILES)


def save_checkpoint(
    model: MiMoForCausalLM,
    tokenizer,
    path: str | Path,
    extra_config: dict | None = None,
    dtype: torch.dtype = torch.bfloat16,
) -> Path:
    """Write the model (as ``dtype``) and tokenizer to ``path`` atomically (temp dir, then rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
    cfg = model.config.to_hf_dict(extra_config)
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    generation = generation_settings(tokenizer)
    cfg.update(generation)
    (tmp / CONFIG_FILE).write_text(json.dumps(cfg, indent=2))
    (tmp / GENERATION_CONFIG_FILE).write_text(json.dumps(generation, indent=2))
    save_tokenizer(tokenizer, tmp / TOKENIZER_DIR)
    for f in tmp.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    (tmp / COMPLETE_MARKER).write_text("ok\n")
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return path


def generation_settings(tokenizer) -> dict[str, int]:
    """The end and padding tokens, for ``config.json`` and ``generation_config.json``: any engine that opens the
    checkpoint (vLLM servers under veRL, HF ``generate``) then stops where the tokenizer's chat turn ends, as the
    in-process engine does, instead of running every answer to the length limit."""
    if tokenizer.eos_token_id is None:
        raise CheckpointError("save_checkpoint: the tokenizer has no eos_token; generation would never stop")
    out = {"eos_token_id": int(tokenizer.eos_token_id)}
    if tokenizer.pad_token_id is not None:
        out["pad_token_id"] = int(tokenizer.pad_token_id)
    if tokenizer.bos_token_id is not None:
        out["bos_token_id"] = int(tokenizer.bos_token_id)
    return out


def save_tokenizer(tokenizer, path: str | Path) -> None:
    """``save_pretrained`` with the class pinned to ``PreTrainedTokenizerFast`` (the saved pre-tokenizer,
    not a model-specific rebuild, is what loads)."""
    tokenizer.save_pretrained(str(path))
    cfg_path = Path(path) / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2))


def tokenizer_path(path: str | Path) -> str:
    """Where a checkpoint's tokenizer is: ``tokenizer/`` for ours, the directory itself for other HF models."""
    sub = Path(path) / TOKENIZER_DIR
    return str(sub if (sub / "tokenizer_config.json").is_file() else path)


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_path(path))


def read_config(path: str | Path) -> MiMoConfig:
    cfg_path = Path(path) / CONFIG_FILE
    if not cfg_path.is_file():
        raise CheckpointError(f"checkpoint {path}: missing {CONFIG_FILE}")
    try:
        return MiMoConfig.from_hf_dict(json.loads(cfg_path.read_text()))
    except (json.JSONDecodeError, TypeError, KeyError) as e:
        raise CheckpointError(f"checkpoint {path}: malformed {cfg_path.name}: {e}") from e


def load_checkpoint(path: str | Path, dtype: torch.dtype = torch.float32) -> MiMoForCausalLM:
    """Load a MiMo checkpoint into the training module, checking every file and tensor shape."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {path} does not exist")
    for f in REQUIRED_FILES:
        if not (path / f).is_file():
            raise CheckpointError(f"checkpoint {path}: missing {f}")
    cfg = read_config(path)
    model = MiMoForCausalLM(cfg)
    try:
        state = load_file(str(path / WEIGHTS_FILE))
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"checkpoint {path}: unreadable {WEIGHTS_FILE}: {e}") from e
    expected = model.state_dict()
    if cfg.tie_word_embeddings:
        expected.pop("lm_head.weight")
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {path}: {WEIGHTS_FILE} does not match {CONFIG_FILE}: "
            f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
        )
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise CheckpointError(
                f"checkpoint {path}: {WEIGHTS_FILE} tensor {name} has shape {tuple(tensor.shape)}, "
                f"{CONFIG_FILE} implies {tuple(expected[name].shape)}"
            )
    model.load_state_dict(state, strict=not cfg.tie_word_embeddings)
    return model.to(dtype)
