"""Arithmetic word problems for a real pretrained model, in DAPO-Math-17k's schema and prompt.

A problem is a short story with one or two operations on small whole numbers (``Mia has 17 apples. She buys 25
more. How many apples does she have now?``). SmolLM2-135M-Instruct solves some of them and misses many (its greedy
answer to 17 + 25 is 32), so DAPO has somewhere to go. The prompt is DAPO-Math-17k's own instruction (end with
``Answer: <number>``); the model mostly ends with "The answer is 20." instead, so the reward scores the last number
of the response for this data source (``recipe.dapo.reward.compute_score``).

Train and held-out splits come from different seeds with every held-out problem text removed from train, so
held-out accuracy measures what transfers. ``python -m recipe.data.word_problems <out_dir>`` writes both.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from recipe.paths import ARTIFACTS_DIR

DATA_SOURCE = "word_problems"
DEFAULT_DIR = ARTIFACTS_DIR / "word_problems"  # where the default splits live
ABILITY = "math"
# DAPO-Math-17k's prompt, word for word around the problem
PROMPT = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)
NAMES = ("Mia", "Liam", "Ava", "Noah", "Emma", "Omar", "Sofia", "Ravi", "Chen", "Lena", "Kofi", "Yuki")
ITEMS = ("apples", "marbles", "stickers", "books", "pencils", "cookies", "coins", "shells", "cards", "stamps")


@dataclass(frozen=True)
class Story:
    """One operation of a story: the sentence that applies it and how it changes the count."""

    sentence: str
    op: str  # "+", "-" or "*"
    value: int


def _operation(rng: np.random.Generator, count: int, item: str, pronoun: str) -> Story:
    kind = rng.choice(("+", "-", "*")) if count <= 30 else rng.choice(("+", "-"))
    if kind == "+":
        v = int(rng.integers(2, 60))
        verb = rng.choice(("buys", "finds", "is given"))
        return Story(f"{pronoun} {verb} {v} more.", "+", v)
    if kind == "-" and count > 2:
        v = int(rng.integers(1, count))
        verb = rng.choice(("gives away", "loses", "uses"))
        return Story(f"{pronoun} {verb} {v} of them.", "-", v)
    v = int(rng.integers(2, 6))
    return Story(f"Then the number of {item} {pronoun.lower()} has becomes {v} times as many.", "*", v)


def make_problem(rng: np.random.Generator, operations: int) -> tuple[str, int]:
    """A story with ``operations`` operations (1 or 2) and its answer."""
    name = str(rng.choice(NAMES))
    item = str(rng.choice(ITEMS))
    pronoun = "She" if name in ("Mia", "Ava", "Emma", "Sofia", "Lena", "Yuki") else "He"
    count = int(rng.integers(3, 50))
    sentences = [f"{name} has {count} {item}."]
    for _ in range(operations):
        story = _operation(rng, count, item, pronoun)
        sentences.append(story.sentence)
        count = (
            count + story.value if story.op == "+" else count - story.value if story.op == "-" else count * story.value
        )
    sentences.append(f"How many {item} does {name} have now?")
    return " ".join(sentences), count


def generate_rows(num: int, seed: int, split: str, two_op_share: float = 0.5) -> list[dict]:
    """``num`` distinct problems in DAPO-Math-17k's schema; ``two_op_share`` of them with two operations."""
    rng = np.random.default_rng(seed)
    rows: list[dict] = []
    seen: set[str] = set()
    while len(rows) < num:
        operations = 2 if rng.random() < two_op_share else 1
        problem, answer = make_problem(rng, operations)
        if problem in seen:
            continue
        seen.add(problem)
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": PROMPT.format(problem=problem)}],
                "ability": ABILITY,
                "reward_model": {"style": "rule", "ground_truth": str(answer)},
                "extra_info": {"split": split, "index": len(rows), "operations": operations},
            }
        )
    return rows


def write_splits(
    out_dir: str | Path = DEFAULT_DIR, num_train: int = 4000, num_test: int = 300, seed: int = 0
) -> tuple[Path, Path]:
    """``train.parquet`` and ``test.parquet`` under ``out_dir`` (written once; no held-out problem in train)."""
    out = Path(out_dir)
    train_path, test_path = out / "train.parquet", out / "test.parquet"
    if train_path.is_file() and test_path.is_file():
        return train_path, test_path
    out.mkdir(parents=True, exist_ok=True)
    test = generate_rows(num_test, seed=2 * seed + 1, split="test")
    held_out = {r["prompt"][0]["content"] for r in test}
    train = [
        r
        for r in generate_rows(num_train + num_test, seed=2 * seed, split="train")
        if r["prompt"][0]["content"] not in held_out
    ]
    train = train[:num_train]
    for index, row in enumerate(train):
        row["extra_info"]["index"] = index
    for path, rows in ((train_path, train), (test_path, test)):
        tmp = path.with_suffix(".parquet.tmp")
        pd.DataFrame(rows).to_parquet(tmp, index=False)
        tmp.replace(path)
    return train_path, test_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", nargs="?", default=str(DEFAULT_DIR))
    parser.add_argument("--num-train", type=int, default=4000)
    parser.add_argument("--num-test", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for path in write_splits(args.out_dir, args.num_train, args.num_test, args.seed):
        print(path)


if __name__ == "__main__":
    main()
