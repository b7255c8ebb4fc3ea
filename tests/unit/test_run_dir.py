"""The run directory across launches: veRL's file logger writes one tracking file per launch, the history is their
merge, and a relaunch resumes from a checkpoint whose step's metrics were logged."""

from __future__ import annotations

from pathlib import Path

import pytest
from verl.utils.tracking import FileLogger

from recipe.dapo.run_dir import (
    LATEST_FILE,
    checkpoint_dir,
    merge_tracking,
    prune_checkpoints,
    rewind_to_logged_checkpoint,
    tracking_path,
)


def launch(run: Path, start: int, steps: range, saved: range, monkeypatch: pytest.MonkeyPatch) -> None:
    """One launch resumed at ``start`` as veRL's trainer leaves it: ``steps`` logged by its file logger, ``saved``
    checkpointed (a checkpoint is saved before its step is logged, so a saved step may lack its row)."""
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tracking_path(run, start)))
    logger = FileLogger("project", "experiment")
    for step in steps:
        logger.log({"launch/start": start, "critic/score/mean": step / 10}, step)
    logger.finish()
    for step in saved:
        checkpoint_dir(run, step).mkdir(parents=True, exist_ok=True)
        (run / LATEST_FILE).write_text(str(step))


def test_a_checkpoint_saved_but_never_logged_is_run_again_so_no_row_is_missing(tmp_path, monkeypatch):
    launch(tmp_path, 0, steps=range(0, 2), saved=range(1, 3), monkeypatch=monkeypatch)  # killed after saving step 2
    assert rewind_to_logged_checkpoint(tmp_path) == 1
    assert (tmp_path / LATEST_FILE).read_text() == "1"
    launch(tmp_path, 1, steps=range(2, 4), saved=range(2, 4), monkeypatch=monkeypatch)
    history = merge_tracking(tmp_path)
    assert [row["step"] for row in history] == [0, 1, 2, 3]
    assert [row["launch/start"] for row in history] == [0, 0, 1, 1]
    assert rewind_to_logged_checkpoint(tmp_path) == 3  # logged: nothing to rewind


def test_a_relaunch_replaces_the_rows_an_earlier_launch_logged_after_its_start(tmp_path, monkeypatch):
    launch(tmp_path, 0, steps=range(0, 6), saved=(2, 4), monkeypatch=monkeypatch)
    launch(tmp_path, 2, steps=range(3, 5), saved=(4,), monkeypatch=monkeypatch)  # resumed at 2 and ran to 4
    history = merge_tracking(tmp_path)
    assert [(row["step"], row["launch/start"]) for row in history] == [(0, 0), (1, 0), (2, 0), (3, 2), (4, 2)]


def test_without_an_earlier_logged_checkpoint_the_latest_is_kept_with_a_warning(tmp_path, monkeypatch):
    launch(tmp_path, 0, steps=range(0, 4), saved=(4,), monkeypatch=monkeypatch)  # older checkpoints not kept
    with pytest.warns(UserWarning, match="step 4 was saved but its metrics were never logged"):
        assert rewind_to_logged_checkpoint(tmp_path) == 4
    assert (tmp_path / LATEST_FILE).read_text() == "4"


def test_only_the_newest_checkpoints_are_kept_and_never_the_one_resumed_from(tmp_path):
    for step in (4, 8, 12, 16):
        checkpoint_dir(tmp_path, step).mkdir()
    (tmp_path / LATEST_FILE).write_text("8")  # rewound to a logged step: the pointer names an older checkpoint
    prune_checkpoints(tmp_path, None)
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == [f"global_step_{s}" for s in (12, 16, 4, 8)]
    prune_checkpoints(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == [
        "global_step_12",
        "global_step_16",
        "global_step_8",
    ]
