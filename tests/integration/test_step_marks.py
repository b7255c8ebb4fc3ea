"""A veRL job's own processes mark the steps its file logger writes (the server timeline's step boundaries)."""

from __future__ import annotations


def test_a_veRL_job_marks_every_step_its_file_logger_writes_even_without_its_launcher(tmp_path):
    """The marks come from the job's own process: veRL's Tracking (file backend), in a fresh interpreter where only
    ``import verl`` loads the plugin, writes one mark per logged row, after the row, with the launch's fields.
    (The launcher is not involved, so a job orphaned by kill -9 still marks its steps.)"""
    import json
    import os
    import subprocess
    import sys
    import time

    from recipe.dapo.step_marks import marks_env, read_marks, step_windows

    tracking = tmp_path / "tracking.jsonl"
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(tracking), **marks_env(tmp_path, resumed_from=3)}
    job = (
        "import time\n"
        "from verl.utils.tracking import Tracking\n"
        "t = Tracking('p', 'e', default_backend=['file'])\n"
        "for step in (4, 5, 6):\n"
        "    t.log({'x': float(step)}, step=step)\n"
        "    time.sleep(0.05)\n"
    )
    before = time.time()
    subprocess.run([sys.executable, "-c", job], env=env, check=True, timeout=300, capture_output=True)
    marks = read_marks(tmp_path)
    assert [m["step"] for m in marks] == [4, 5, 6]
    assert all(m["resumed_from"] == 3 and m["launch"] <= before for m in marks)
    assert marks[0]["t"] > before and marks[1]["t"] - marks[0]["t"] >= 0.05
    assert [json.loads(x)["step"] for x in tracking.read_text().splitlines()] == [4, 5, 6]
    windows = step_windows(marks)
    assert windows[4] == (marks[0]["launch"], marks[0]["t"]) and windows[6] == (marks[1]["t"], marks[2]["t"])
