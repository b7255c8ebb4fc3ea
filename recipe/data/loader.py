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


class DataFileError(ValueError):
    """A data file the recipe cannot read; the message names the file and what it needs."""


REQUIRED_COLUMNS = ("prompt", "reward_model")  # data_source and extra_info are optional
SCHEMA = (
    "DAPO-Math-17k's schema: prompt (a list of {role, content} messages), reward_model ({ground_truth: str}), "
    "optionally data_source (str) and extra_info"
)


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


def check_data_file(path: str | Path, key: str = "data file") -> None:
    """Name a missing file, one that is not parquet, or one without the schema's columns, from its footer alone (before
    any model is built or engine started)."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{key}: {path} does not exist")
    try:
        columns = pq.read_schema(path).names
    except Exception as err:  # pyarrow's own error says what is wrong with the bytes, not which file
        raise DataFileError(f"{key}: {path} is not a readable parquet file ({type(err).__name__}: {err})") from err
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise DataFileError(f"{key}: {path} has no column {', '.join(missing)} (it has {columns}); it needs {SCHEMA}")


def load_problems(path: str | Path, max_rows: int | None = None) -> list[Problem]:
    """Problems from one parquet file; malformed rows are skipped and counted in a warning."""
    path = Path(path)
    check_data_file(path)
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
        raise DataFileError(f"data file {path} has no usable rows ({dict(skipped)}); it needs {SCHEMA}")
    return problems
