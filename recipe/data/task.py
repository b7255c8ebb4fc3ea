"""The embedded verifiable reasoning task: adding a list of numbers with a state-carrying scratchpad.

A problem is a list of single-digit numbers. The solution first restates the list, then writes one line
per step: the sum of the first two numbers followed by the rest of the list, and ends with
``Answer: <sum>`` (the form veRL's ``math_dapo`` scorer reads)::

    = 3 8 7 1
    = 11 7 1
    = 18 1
    = 19
    Answer: 19

Each line depends only on the line before it (learnable by a model of a million parameters in minutes)
and mostly repeats it: the repeated structure of real RL traces (restating, re-deriving) that suffix
drafting exploits. The number of terms is Pareto-distributed and the trace grows with its square, so
most traces are short and a few are many times longer: the long tail speculative rollouts speed up.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

DATA_SOURCE = "tiny_sum"
ABILITY = "math"
PROMPT_TEMPLATE = "Add the numbers: {terms}"


@dataclass(frozen=True)
class TaskConfig:
    """Shape of the generated problem set."""

    min_terms: int = 2
    max_terms: int = 20
    pareto_alpha: float = 1.1  # tail index of the number of terms; smaller = heavier tail
    pareto_scale: float = 1.5
    max_digit: int = 9


def sample_num_terms(rng: np.random.Generator, cfg: TaskConfig) -> int:
    """Heavy-tailed number of terms: min_terms + floor(scale * (Pareto(alpha))) clipped to max_terms."""
    extra = cfg.pareto_scale * (rng.pareto(cfg.pareto_alpha))
    return int(min(cfg.max_terms, cfg.min_terms + int(extra)))


def solution_text(terms: list[int]) -> str:
    """The reference scratchpad for ``terms``."""
    state = list(terms)
    lines = ["= " + " ".join(map(str, state))]
    while len(state) > 1:
        state = [state[0] + state[1], *state[2:]]
        lines.append("= " + " ".join(map(str, state)))
    return "\n".join(lines) + f"\nAnswer: {state[0]}"


def prompt_text(terms: list[int]) -> str:
    return PROMPT_TEMPLATE.format(terms=" ".join(str(t) for t in terms))


def make_row(terms: list[int], split: str, index: int) -> dict:
    """One row in the DAPO-Math-17k schema."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": prompt_text(terms)}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": str(sum(terms))},
        "extra_info": {"split": split, "index": index, "solution": solution_text(terms)},
    }


def generate_rows(num: int, seed: int, split: str, cfg: TaskConfig = TaskConfig()) -> list[dict]:
    """``num`` problems, deterministic for ``seed``."""
    rng = np.random.default_rng(seed)
    rows = []
    for index in range(num):
        n = sample_num_terms(rng, cfg)
        terms = [int(x) for x in rng.integers(1, cfg.max_digit + 1, size=n)]
        rows.append(make_row(terms, split, index))
    return rows


def write_splits(
    out_dir: str | Path, num_train: int, num_test: int, seed: int, cfg: TaskConfig = TaskConfig()
) -> dict[str, Path]:
    """Write ``train.parquet`` and ``test.parquet``; the test split uses a different seed stream.

    Test problems that also occur in train (same term list) are dropped from test so that pass@1 on the
    test split measures generalisation, not recall.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    train = generate_rows(num_train, seed=seed * 2 + 0, split="train", cfg=cfg)
    seen = {r["prompt"][0]["content"] for r in train}
    test: list[dict] = []
    candidates = num_test
    while len(test) < num_test:
        candidates *= 2
        rows = generate_rows(candidates, seed=seed * 2 + 1, split="test", cfg=cfg)
        test = [r for r in rows if r["prompt"][0]["content"] not in seen][:num_test]
    for i, r in enumerate(test):
        r["extra_info"]["index"] = i
    paths = {}
    for name, rows in (("train", train), ("test", test)):
        path = out_dir / f"{name}.parquet"
        tmp = path.with_suffix(".parquet.tmp")
        pd.DataFrame(rows).to_parquet(tmp, index=False)
        tmp.replace(path)
        paths[name] = path
    return paths


def length_stats(lengths: list[int] | np.ndarray) -> dict[str, float]:
    """p50/p90/p99/max/mean of a length distribution."""
    a = np.asarray(lengths)
    return {
        "count": int(a.size),
        "mean": float(a.mean()),
        "p50": float(np.percentile(a, 50)),
        "p90": float(np.percentile(a, 90)),
        "p99": float(np.percentile(a, 99)),
        "max": int(a.max()),
    }


def main() -> None:
    """Print the length distribution of a generated set (characters), for a quick look."""
    rows = generate_rows(10000, seed=0, split="train")
    print(json.dumps(length_stats([len(r["extra_info"]["solution"]) for r in rows]), indent=1))


if __name__ == "__main__":
    main()
