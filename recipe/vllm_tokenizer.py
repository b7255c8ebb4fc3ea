"""A vLLM tokenizer mode for the recipe's own checkpoints (``tokenizer_mode="spec_rollout"``).

The recipe's checkpoints keep their tokenizer in ``tokenizer/`` (mtp/checkpoint.py). Loading a tokenizer in its
``hf`` mode, vLLM first parses a model config from the tokenizer's directory so that transformers can pick the
tokenizer class; there is none there, so it logs ``ERROR ... Error parsing config for .../tokenizer``, sleeps and
retries, and logs it again, in every process that loads the tokenizer: a healthy run that prints an ERROR and waits
seconds at every engine start. A config beside the tokenizer would not do: given one, transformers loads the model
type's own tokenizer class (Qwen2's, for the recipe's MiMo layout) instead of the saved ``PreTrainedTokenizerFast``,
and tokenizes the recipe's own tokenizer's text differently.

This mode loads the tokenizer exactly as ``hf`` does (vLLM's ``CachedHfTokenizer``, rendered by its ``HfRenderer``);
vLLM probes for a model config only for ``hf``'s own class, so nothing is logged and nothing waits. Registered in
every vLLM process by the ``vllm.general_plugins`` entry point; :func:`tokenizer_args` gives an engine both the
tokenizer's path and the mode.

    >>> tokenizer_args("artifacts/models/smollm2-135m-instruct-mtp")  # doctest: +SKIP
    {'tokenizer': '.../smollm2-135m-instruct-mtp/tokenizer', 'tokenizer_mode': 'spec_rollout'}
"""

from __future__ import annotations

from pathlib import Path

from vllm.tokenizers.hf import CachedHfTokenizer

TOKENIZER_MODE = "spec_rollout"


class CheckpointTokenizer(CachedHfTokenizer):
    """vLLM's cached HF tokenizer under the recipe's mode (module docstring)."""


def register() -> None:
    """The mode's tokenizer and renderer, in vLLM's registries (idempotent)."""
    from vllm.renderers.registry import RENDERER_REGISTRY
    from vllm.tokenizers.registry import TokenizerRegistry

    if TOKENIZER_MODE not in TokenizerRegistry.tokenizers:
        TokenizerRegistry.register(TOKENIZER_MODE, __name__, CheckpointTokenizer.__name__)
    if TOKENIZER_MODE not in RENDERER_REGISTRY.renderers:
        RENDERER_REGISTRY.register(TOKENIZER_MODE, "vllm.renderers.hf", "HfRenderer")


def tokenizer_args(model: str | Path) -> dict[str, str]:
    """An engine's ``tokenizer`` (and, for the recipe's checkpoints, ``tokenizer_mode``) for ``model``: the
    checkpoint's ``tokenizer/`` under this module's mode, or the model directory itself for other HF models."""
    from mtp.checkpoint import tokenizer_path

    path = tokenizer_path(model)
    return {"tokenizer": path} if path == str(model) else {"tokenizer": path, "tokenizer_mode": TOKENIZER_MODE}
