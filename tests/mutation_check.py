"""Mutation check: plant each of a handful of plausible bugs in a clean clone and count the tests that catch it.

Each mutation is one textual edit of one source file; its tests are the test files whose code can reach the
edited line (matched by file name anywhere under tests/, so the count works before and after tests were moved
into tests/unit and tests/integration). A mutation whose text is not found is an error, not a zero.

    .venv/bin/python tests/mutation_check.py --rev HEAD --out /tmp/mutation_HEAD.json

The clone imports its own sources (PYTHONPATH), uses this checkout's .venv and a copy of its test cache, and is
deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]  # test file names whose code reaches the edited line


MUTATIONS = (
    Mutation(
        "mask shift: the MTP loss mask is not rolled with its targets",
        "mtp/loss.py",
        "mask = roll_packed(response_mask, cu_seqlens, -1)",
        "mask = roll_packed(response_mask, cu_seqlens, 0)",
        ("test_mtp.py", "test_mtp_checkpoints.py", "test_mtp_verl_fsdp.py", "test_sft.py", "test_dapo.py",
         "test_drift.py", "test_model_checkpoint.py"),
    ),
    Mutation(
        "clip ratio: clip-higher's upper bound takes the lower ratio",
        "recipe/dapo/policy.py",
        "clip_ratio_high=actor.clip_ratio_high",
        "clip_ratio_high=actor.clip_ratio_low",
        ("test_dapo.py", "test_drift.py", "test_mtp.py", "test_mtp_verl_fsdp.py", "test_verl_trainer.py",
         "test_policy.py"),
    ),
    Mutation(
        "sibling key collision: SAM groups requests by the first 4 prompt tokens",
        "sam/keys.py",
        "np.asarray(prompt_ids, dtype=np.int32).tobytes()",
        "np.asarray(prompt_ids, dtype=np.int32)[:4].tobytes()",
        ("test_sam_automaton.py", "test_sam_proposer.py", "test_sam_preemption.py", "test_lossless.py",
         "test_ab.py", "test_dapo.py", "test_vllm_engine.py", "test_verl_trainer.py", "test_routing.py"),
    ),
    Mutation(
        "wrong metric name: the long-tail throughput is logged under another key",
        "recipe/dapo/timeline.py",
        '"tail_throughput_tok_s": ratio(',
        '"tail_tok_s": ratio(',
        ("test_timeline.py", "test_report.py", "test_ab.py", "test_dapo.py", "test_verl_trainer.py",
         "test_verl_backend.py"),
    ),
)  # fmt: skip


def run_mutation(clone: Path, mutation: Mutation, log_dir: Path, under: str) -> dict:
    """Plant one mutation, run its test files, restore the file; the counts from pytest's summary line."""
    source = clone / mutation.path
    original = source.read_text()
    if original.count(mutation.old) != 1:
        raise SystemExit(f"{mutation.path}: expected exactly one {mutation.old!r} to mutate")
    files = sorted(str(p.relative_to(clone)) for name in mutation.tests for p in (clone / under).rglob(name))
    source.write_text(original.replace(mutation.old, mutation.new))
    try:
        env = os.environ | {"PYTHONPATH": str(clone)}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=0", *files]
        proc = subprocess.run(cmd, cwd=clone, env=env, capture_output=True, text=True)
    finally:
        source.write_text(original)
        subprocess.run([str(Path(sys.executable).parent / "ray"), "stop", "--force"], capture_output=True)
    log = log_dir / (re.sub(r"\W+", "_", mutation.name.split(":")[0]) + ".log")
    log.write_text(proc.stdout + proc.stderr)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (failed|passed|error|errors)", summary)}
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, re.M)))
    return {"mutation": mutation.name, "file": mutation.path, "test_files": files, "summary": summary,
            "failed": counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0),
            "passed": counts.get("passed", 0), "failing_tests": failed, "log": str(log)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rev", default="HEAD", help="commit to clone and mutate")
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the counts")
    parser.add_argument(
        "--logs",
        type=Path,
        default=Path(tempfile.gettempdir()) / "mutation-logs",
        help="folder for each mutation's pytest output",
    )
    parser.add_argument("--under", default="tests", help="only test files under this folder (e.g. tests/unit)")
    parser.add_argument("--only", default="", help="comma-separated indices of MUTATIONS to run (default all)")
    args = parser.parse_args()
    chosen = [MUTATIONS[int(i)] for i in args.only.split(",")] if args.only else list(MUTATIONS)
    rev = subprocess.run(["git", "rev-parse", args.rev], cwd=REPO, capture_output=True, text=True, check=True)
    rev = rev.stdout.strip()
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        clone = Path(tmp) / "repo"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        subprocess.run(["git", "checkout", "-q", rev], cwd=clone, check=True)
        shutil.copytree(REPO / "artifacts" / "test-cache", clone / "artifacts" / "test-cache", dirs_exist_ok=True)
        args.logs.mkdir(parents=True, exist_ok=True)
        rows = []
        for mutation in chosen:
            rows.append(run_mutation(clone, mutation, args.logs, args.under))
            print(f"{mutation.name}: {rows[-1]['summary']}", flush=True)
    args.out.write_text(json.dumps({"rev": rev, "under": args.under, "mutations": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
