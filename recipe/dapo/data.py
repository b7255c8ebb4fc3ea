"""DAPO's prompts: the embedded task's unseen RL prompts, and the stream of rounds (seeded epoch shuffles with a
resumable cursor)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from recipe.data.loader import Problem, load_problems
from recipe.data.task import TaskConfig, generate_rows
from recipe.sft.train import encode_prompt

logger = logging.getLogger(__name__)


def num_terms(solution: str) -> int:
    """How many numbers an embedded-task problem adds, from its reference solution (whose first line restates
    them)."""
    return len(solution.splitlines()[0].split()) - 1


def write_unseen_prompts(
    out: str | Path, data_dir: str | Path, num: int, seed: int, max_terms: int, task: TaskConfig = TaskConfig()
) -> Path:
    """RL prompts the base model never saw: ``num`` problems from ``seed`` minus every problem of the SFT train
    split and of the test split in ``data_dir``, of at most ``max_terms`` numbers. Train and test share the
    generator, so nearly all short problems (2 and 3 terms: 81 and 729 lists) are in train and the unseen ones are
    longer, as the test split's are: RL on them shows what transfers to held-out problems, not how it sharpens
    problems SFT already fitted. Written once (atomically) and reused."""
    out = Path(out)
    if out.is_file():
        return out
    seen = {
        messages[0]["content"]
        for split in ("train", "test")
        for messages in pd.read_parquet(Path(data_dir) / f"{split}.parquet")["prompt"]
    }
    rows = [
        r
        for r in generate_rows(num, seed=seed, split="train", cfg=task)
        if r["prompt"][0]["content"] not in seen and num_terms(r["extra_info"]["solution"]) <= max_terms
    ]
    if not rows:
        raise ValueError(f"no unseen problems of at most {max_terms} terms among {num} generated with seed {seed}")
    for index, row in enumerate(rows):
        row["extra_info"]["index"] = index
    tmp = out.with_suffix(".parquet.tmp")
    pd.DataFrame(rows).to_parquet(tmp, index=False)
    tmp.replace(out)
    return out


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
