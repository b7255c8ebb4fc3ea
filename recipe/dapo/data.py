"""Prompt stream for DAPO rounds: seeded epoch shuffles with a resumable cursor."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from recipe.data.loader import Problem, load_problems
from recipe.sft.train import encode_prompt

logger = logging.getLogger(__name__)


def load_prompts(
    path: str, tokenizer, max_prompt_length: int, max_rows: int | None = None
) -> tuple[list[Problem], list[list[int]]]:
    """Problems and their chat-templated prompt ids; prompts over ``max_prompt_length`` are skipped (counted)."""
    problems = load_problems(path, max_rows=max_rows)
    kept, ids = [], []
    for p in problems:
        tokens = encode_prompt(tokenizer, p.messages)
        if len(tokens) <= max_prompt_length:
            kept.append(p)
            ids.append(tokens)
    if len(kept) < len(problems):
        logger.warning(
            "%s: skipped %d of %d prompts longer than data.max_prompt_length=%d",
            path,
            len(problems) - len(kept),
            len(problems),
            max_prompt_length,
        )
    if not kept:
        raise ValueError(f"{path}: no prompt fits data.max_prompt_length={max_prompt_length}")
    return kept, ids


@dataclass
class PromptCursor:
    """Where the stream is: epoch and position in that epoch's permutation (checkpointed)."""

    epoch: int = 0
    position: int = 0


class PromptStream:
    def __init__(self, problems: list[Problem], prompt_ids: list[list[int]], seed: int, shuffle: bool):
        self.problems, self.prompt_ids = problems, prompt_ids
        self.seed, self.shuffle = seed, shuffle
        self.cursor = PromptCursor()

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.problems))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.problems))

    def next(self, count: int) -> tuple[list[Problem], list[list[int]]]:
        """The next ``count`` prompts, rolling into the next epoch (reshuffled) when one runs out."""
        picked: list[int] = []
        while len(picked) < count:
            order = self._order(self.cursor.epoch)
            take = order[self.cursor.position : self.cursor.position + count - len(picked)]
            picked.extend(int(i) for i in take)
            self.cursor.position += len(take)
            if self.cursor.position >= len(order):
                self.cursor = PromptCursor(self.cursor.epoch + 1, 0)
        return [self.problems[i] for i in picked], [self.prompt_ids[i] for i in picked]
