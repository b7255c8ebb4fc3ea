"""A hybrid engine's draft counts by source, written beside a vLLM server's timeline.

veRL's servers run the drafter in vLLM's engine process, where the trainer cannot ask it anything; the server's
timeline (``recipe.dapo.server_timeline``, a stat logger) sees only vLLM's totals. With the timeline's directory set
(``SPEC_ROLLOUT_TIMELINE_DIR``, which the recipe's veRL launcher sets for every server), the hybrid drafter appends its
cumulative counts there every engine step: ``drafter-<host>-<pid>.jsonl``, one row
``{"t": unix time, "<source>": [draft tokens sent, accepted], ...}``. Rows are cumulative, so a training step's counts
are the difference of the last rows before its start and its end.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

TIMELINE_DIR_ENV = "SPEC_ROLLOUT_TIMELINE_DIR"


class CountsLog:
    """Appends a drafter's cumulative counts by source to the timeline directory (a no-op without it), a row per
    engine step (a training step's counts are read at its start and end: sparser rows moved a short step's drafts
    into the next one)."""

    def __init__(self) -> None:
        directory = os.environ.get(TIMELINE_DIR_ENV)
        self.path = Path(directory, f"drafter-{socket.gethostname()}-{os.getpid()}.jsonl") if directory else None
        self._file = None

    def step(self, counts: Callable[[], dict[str, list[int]]]) -> None:
        """One engine step: a row of ``counts()``."""
        if self.path is None:
            return
        if self._file is None:
            self._file = self.path.open("a", buffering=1)  # line-buffered: each row reaches the file as written
        self._file.write(json.dumps({"t": time.time(), **counts()}) + "\n")
