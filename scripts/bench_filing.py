"""What SAM's group material costs where a rollout's requests finish, written to ``results/sam/filing.{md,json}``.

At the end of a rollout most requests finish within a few engine steps (at the response budget, or together at
the end of a short answer), and the steps after them hold only the last few requests: the cheapest steps of the
rollout, so any work the drafter does there weighs most. This times, on :class:`sam.policy.BatchDrafter` with the
default options (group sharing, cross-epoch history, counted corpora), each epoch of ``--prompts`` x ``--n``
requests whose responses are drawn from a small vocabulary (word-problem-like repeats):

- ``finish``: all but ``--left`` requests finished in the drafter at once (vLLM reports them to the proposer together;
  :class:`sam.vllm.SAMProposer` finishes them in the drafter on the next step where the drafter works if a running
  request drafts from them, else at the next request's start: their cost lands on such a step, not on the first
  step without them);
- ``next step``: the next drafting step of the requests left (it files what its prompts' siblings wrote);
- ``next rollout's first start``: the first request of the next epoch (it files the finished rollouts into their
  prompts' histories; vLLM runs it on a step that prefills prompts).

    .venv/bin/python scripts/bench_filing.py [--epochs 6 --prompts 8 --n 8 --left 4 --tokens 384]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

PHASES = ("finish", "next step", "next rollout's first start")


def one_run(args: argparse.Namespace) -> dict[str, list[float]]:
    """Seconds of each phase (:data:`PHASES`) per epoch after the first (which compiles)."""
    from sam.keys import prompt_key
    from sam.policy import BatchDrafter, SAMOptions

    rng = np.random.default_rng(args.seed)
    drafter = BatchDrafter(SAMOptions(group_sharing=True, cross_epoch=True), args.k)
    prompts = [rng.integers(0, 49152, 120).astype(np.int32) for _ in range(args.prompts)]
    words = rng.integers(0, 49152, 300)
    requests = [prompt for prompt in prompts for _ in range(args.n)]
    times: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for epoch in range(args.epochs + 1):
        t0 = time.perf_counter()
        slots = [drafter.start(requests[0], prompt_key(requests[0]))]  # files the last epoch's rollouts
        first_start = time.perf_counter() - t0
        slots += [drafter.start(prompt, prompt_key(prompt)) for prompt in requests[1:]]
        for slot in slots:
            drafter.requests[slot][0].extend(rng.choice(words, args.tokens).astype(np.int32))
        finishing, left = slots[: -args.left], slots[-args.left :]  # the last prompt's last samples run on
        t0 = time.perf_counter()
        for slot in finishing:
            drafter.finish(slot)
        t1 = time.perf_counter()
        tokens = rng.choice(words, len(left)).astype(np.int32)
        drafter.step(np.array(left), tokens, np.arange(len(left) + 1), np.full(len(left), args.k))
        t2 = time.perf_counter()
        for slot in left:
            drafter.finish(slot)
        if epoch > 0:
            times["finish"].append(t1 - t0)
            times["next step"].append(t2 - t1)
            times["next rollout's first start"].append(first_start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=6, help="timed epochs (one more compiles first)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--left", type=int, default=4, help="requests still running after the others finish")
    parser.add_argument("--tokens", type=int, default=384, help="tokens per response")
    parser.add_argument("--k", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "results" / "sam")
    args = parser.parse_args()
    if args.left < 1 or args.left >= args.prompts * args.n:
        parser.error(f"--left {args.left}: must leave 1 to {args.prompts * args.n - 1} requests running")
    times = one_run(args)
    commit = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True
    ).stdout.strip()
    ms = {phase: 1000 * float(np.median(v)) for phase, v in times.items()}
    record = {"commit": commit, "args": {k: v for k, v in vars(args).items() if k != "out"}, "median_ms": ms}
    lines = [
        f"# Filing group material at a rollout's end ({commit})",
        "",
        f"Produced by `.venv/bin/python scripts/bench_filing.py --epochs {args.epochs} --prompts {args.prompts} "
        f"--n {args.n} --left {args.left} --tokens {args.tokens}`: {args.prompts * args.n - args.left} of "
        f"{args.prompts * args.n} requests finish on one step, {args.left} run on; median ms over {args.epochs} "
        "epochs after the first.",
        "",
        "| phase | median ms |",
        "|---|---|",
        *(f"| {phase} | {value:.2f} |" for phase, value in ms.items()),
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "filing.json").write_text(json.dumps(record, indent=1) + "\n")
    (args.out / "filing.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
