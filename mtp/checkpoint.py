"""HuggingFace-format MiMo checkpoints: atomic save, validated load.

A checkpoint directory holds ``config.json``, ``model.safetensors``, the tokenizer files and a
``COMPLETE`` marker written last (after an fsync of everything else), so a crash mid-save leaves a
directory that :func:`is_complete` rejects and the caller rebuilds instead of loading.
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
WEIGHTS_FILE = "model.safetensors"
COMPLETE_MARKER = "COMPLETE"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
REQUIRED_FILES = (CONFIG_FILE, WEIGHTS_FILE, *TOKENIZER_FILES)


class CheckpointError(RuntimeError):
    """A checkpoint directory that cannot be loaded; the message names the offending file."""


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
    (tmp / CONFIG_FILE).write_text(json.dumps(cfg, indent=2))
    tokenizer.save_pretrained(str(tmp))
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    (tmp / COMPLETE_MARKER).write_text("ok\n")
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return path


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
