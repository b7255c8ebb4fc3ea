"""Supervising a veRL job from the launcher: run it, find its processes, and leave nothing behind.

A Ray job spreads over processes that start sessions of their own (Ray's daemons, workers, vLLM servers), so the
launcher marks them all with one environment variable (:data:`JOB_ENV`) and, on every exit (an exception, Ctrl-C,
SIGTERM from Slurm's ``scancel`` or time limit), kills what carries it and removes the /dev/shm files the job made.
A launcher killed outright leaves a job file behind, and the next launch in the run directory ends that job first.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from recipe.paths import REPO_ROOT

JOB_ENV = "SPEC_ROLLOUT_JOB"  # marks every process of one job (Ray's daemons and workers inherit it)


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def job_processes(job_id: str) -> list:
    """Live processes of the job ``job_id``, found by the environment they inherited (this process left out: a
    launcher started with the variable set, as tests and benchmarks do to follow a job, ends its job, not itself)."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.pid != os.getpid() and proc.environ().get(JOB_ENV) == job_id:
                found.append(proc)
    return found


def _exit_on_sigterm(signum: int, frame) -> None:
    raise SystemExit(128 + signum)


def run_job(command: list[str], env: dict[str, str], job_file: Path) -> int:
    """Run the Ray job and leave nothing behind: on any exit (also an exception, Ctrl-C, or SIGTERM, which is how
    Slurm cancels a job or ends it at its time limit) every process of the job is killed, Ray's daemons included
    (they start sessions of their own), and the /dev/shm files it created are removed. The job's id and the
    /dev/shm entries before it are kept in ``job_file`` while it runs, for :func:`end_stale_job`."""
    job_id = env.get(JOB_ENV) or f"{os.getpid()}-{time.time_ns()}"
    env = {**env, JOB_ENV: job_id}
    shm_before = shm_entries()
    job_file.write_text(json.dumps({"id": job_id, "shm_before": sorted(shm_before)}))
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main_thread else None
    proc = subprocess.Popen(command, env=env, cwd=REPO_ROOT)
    try:
        return proc.wait()
    finally:
        cleanup_job(job_id, shm_before)
        job_file.unlink(missing_ok=True)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def end_stale_job(job_file: Path) -> None:
    """A launcher killed outright (kill -9: no ``finally``) leaves its job running, still training and writing
    checkpoints; a relaunch in the same run directory ends it (and removes its /dev/shm files) before it reads
    the checkpoint to resume from."""
    if job_file.is_file():
        stale = json.loads(job_file.read_text())
        cleanup_job(stale["id"], set(stale["shm_before"]))
        job_file.unlink()


def cleanup_job(job_id: str, shm_before: set[str]) -> None:
    """Kill every process of the job and remove the /dev/shm entries that appeared since ``shm_before``."""
    import psutil

    procs = job_processes(job_id)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=30)
    for name in shm_entries() - shm_before:
        path = Path("/dev/shm", name)
        with contextlib.suppress(OSError):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
