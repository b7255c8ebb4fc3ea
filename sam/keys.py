"""A prompt's identity, the one hash both sides of the rollout agree on.

SAM groups a request with its siblings by this key (``sam/vllm.py``), and the prompt-affine router
(``recipe/dapo/routing.py``) keeps every request with the same key on one vLLM server so that the group's
material is where its siblings run. Two hashes that disagree on what "the same prompt" is would split groups
silently, so both call :func:`prompt_key`. Imports nothing heavy: vLLM's workers load this before numba.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np


def prompt_key(prompt_ids: Sequence[int] | np.ndarray) -> bytes:
    """16-byte BLAKE2b digest of the prompt's token ids as int32 (every vocabulary fits; a list and an array of
    the same ids give the same key)."""
    return hashlib.blake2b(np.asarray(prompt_ids, dtype=np.int32).tobytes(), digest_size=16).digest()
