"""Load DAPO-Math-17k-schema parquet files (the embedded task's, or the real DAPO-Math-17k / AIME ones).

Rows are read with HuggingFace ``datasets`` (what veRL's RLHFDataset uses). A row that is missing a
field or has a malformed prompt or ground truth is skipped, and the skips are counted in one warning
per file with the reasons, never dropped silently.
"""

from __future__ import annotations

import logging
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import datasets

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Problem:
    """One verifiable problem: chat messages, the rule-based ground truth, and where it came from."""

    index: int
    data_source: str
    messages: list[dict]
    ground_truth: str
    solution: str | None = None  # reference trace, when the data set ships one (the embedded task does)


class DatasetFormatWarning(UserWarning):
    """Rows of a data file were skipped as malformed."""


def _parse_row(i: int, row: dict) -> tuple[Problem | None, str | None]:
    prompt = row.get("prompt")
    if prompt is None or len(prompt) == 0:
        return None, "missing prompt"
    messages = []
    for m in prompt:
        if not isinstance(m, dict) or not isinstance(m.get("content"), str) or not isinstance(m.get("role"), str):
            return None, "prompt is not a list of {role, content} messages"
        messages.append({"role": m["role"], "content": m["content"]})
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, dict) or reward_model.get("ground_truth") in (None, ""):
        return None, "missing reward_model.ground_truth"
    extra = row.get("extra_info") or {}
    return (
        Problem(
            index=i,
            data_source=str(row.get("data_source") or "unknown"),
            messages=messages,
            ground_truth=str(reward_model["ground_truth"]),
            solution=extra.get("solution") if isinstance(extra, dict) else None,
        ),
        None,
    )


def load_problems(path: str | Path, max_rows: int | None = None) -> list[Problem]:
    """Problems from one parquet file; malformed rows are skipped and counted in a warning."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} does not exist")
    ds = datasets.load_dataset("parquet", data_files=str(path), split="train")
    problems: list[Problem] = []
    skipped: Counter[str] = Counter()
    for i, row in enumerate(ds):
        if max_rows is not None and len(problems) >= max_rows:
            break
        problem, reason = _parse_row(i, row)
        if problem is None:
            skipped[reason] += 1
        else:
            problems.append(problem)
    if skipped:
        detail = ", ".join(f"{n} {why}" for why, n in skipped.most_common())
        warnings.warn(
            f"{path}: skipped {sum(skipped.values())} of {len(ds)} rows ({detail})", DatasetFormatWarning, stacklevel=2
        )
    if not problems:
        raise ValueError(f"data file {path} has no usable rows")
    return problems
