"""recipe/vllm_tokenizer.py: vLLM loads a recipe checkpoint's tokenizer/ under the recipe's mode as transformers saved
it, without probing the directory for a model config (an ERROR line and a retry in every process)."""

from __future__ import annotations

import logging

import torch
from test_mtp import tiny_model

from mtp.checkpoint import save_checkpoint
from recipe.vllm_tokenizer import TOKENIZER_MODE, register, tokenizer_args


def test_the_recipes_checkpoint_loads_in_vllm_as_saved_and_quietly(tmp_path, caplog):
    from vllm.tokenizers.registry import get_tokenizer

    from recipe.data.task import generate_rows
    from recipe.data.tokenizer import train_tokenizer

    rows = generate_rows(200, seed=0, split="train")
    tokenizer = train_tokenizer([r["extra_info"]["solution"] for r in rows], vocab_size=280)
    checkpoint = save_checkpoint(tiny_model(seed=0), tokenizer, tmp_path / "ckpt", dtype=torch.float32)
    args = tokenizer_args(checkpoint)
    assert args == {"tokenizer": str(checkpoint / "tokenizer"), "tokenizer_mode": TOKENIZER_MODE}
    assert tokenizer_args(tmp_path) == {"tokenizer": str(tmp_path)}  # another HF model: its own directory, vLLM's mode

    register()
    register()  # every vLLM process calls it; a second call changes nothing
    with caplog.at_level(logging.WARNING):
        loaded = get_tokenizer(args["tokenizer"], tokenizer_mode=args["tokenizer_mode"])
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.records
    text = [r["extra_info"]["solution"] for r in rows[:5]]
    assert [loaded(t).input_ids for t in text] == [tokenizer(t).input_ids for t in text]
    assert loaded.eos_token_id == tokenizer.eos_token_id
