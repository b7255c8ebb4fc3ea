"""SAM's proposer time per engine step, as vLLM drives it, with the caches warm and as the engine's forward leaves them.

Inside vLLM the proposer takes several times longer per step than the same calls back to back, because the engine's
forward evicts its caches. This drives :class:`sam.vllm.SAMProposer` over the real model's cached rollouts (``--prompts`` x ``--n``
requests at once, one sampled token per request per step, as steps without drafts feed it; ``--epochs`` passes over
the same prompts, each with other responses of the cache, so from the second on a prompt's history holds what the
model sampled for it before, not the text it is about to sample) in two ways, side by side:
- ``back to back``: nothing runs between two ``propose`` calls;
- ``after a forward``: between two calls, a stack of float32 matrix products over ``--evict-mb`` MiB of weights with
  one row per request, on torch's threads, as an engine's decode step reads its weights (SmolLM2-135M in float32 is
  540 MB) and evicts what the proposer touched.
- ``after a forward, working every step``: the same with ``defer_idle`` off, so that the drafter takes every step's
  tokens and makes its shadow drafts where nothing can pay instead of leaving that to one step in four.
The engine's step time is simulated in all (the proposer's clock advances by ``STEP_COST``, this CPU's cost of a
SmolLM2 step), so the payoff rule takes the same decisions in all and only the caches differ. Milliseconds per call
over the steps with at least ``--min-rows`` requests from the second epoch on, median and mean, the share of those
steps where nothing could pay (nothing was sent), and the share where the drafter left its work to a later step.

    python -m recipe.bench proposer   # 64 requests -> results/sam/proposer_cost.{md,json}
    python -m recipe.bench proposer --prompts 2 --n 4 --min-rows 1 --out /tmp/proposer_8
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from recipe.paths import REPO_ROOT

STEP_COST = (0.022, 0.0007, 0.0007, 0.01, 0.0004)  # a, b, c, e, f (sam/payoff.py) seconds: a SmolLM2 step on this CPU
# in float32, fitted to results/real/verify_cost: a draft token costs a request's token


class SimulatedClock:
    """The proposer's clock: advanced by the simulated engine step between two calls."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, rows: int, drafted: int) -> None:
        a, b, c, e, f = STEP_COST
        self.now += a + b * rows + c * drafted + (e + f * rows) * (drafted > 0)


def proposer(k: int, max_len: int, rows: int, defer_idle: bool, options: dict):
    from omegaconf import OmegaConf

    from recipe.dapo.config import spec_group
    from sam.vllm import SAMProposer, standalone_config

    sam = {**OmegaConf.to_container(spec_group("sam").sam), **options, "defer_idle": defer_idle}
    return SAMProposer(standalone_config(k, sam, max_model_len=max_len, max_num_seqs=max(rows, 256)))


PARTS = {  # the proposer's parts timed by --parts: label -> (attribute path on the proposer, method)
    "request slots": ("", "_slots"),
    "step cost": ("", "_time_step"),
    "shadow settling": ("", "_settle"),
    "nothing-can-pay check": ("", "_nothing_can_pay"),
    "shadow turns": ("shadows", "turns"),
    "drafting kernel": ("drafter", "step_arrays"),
    "payoff rule and shadow starts": ("", "_pay"),
}


def time_parts(sam, spent: dict[str, float]) -> None:
    """Wrap the proposer's parts (PARTS) on this instance so each call adds its seconds to ``spent``."""
    for label, (owner_name, method) in PARTS.items():
        owner = getattr(sam, owner_name) if owner_name else sam
        inner = getattr(owner, method)

        def timed(*args, inner=inner, label=label, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - start

        setattr(owner, method, timed)


def drive(
    groups,
    n: int,
    epochs: int,
    evict_mb: int,
    min_rows: int,
    defer_idle: bool,
    options: dict,
    parts: bool = False,
    load_model: bool = False,
) -> dict:
    """``n`` responses of every prompt decoded together, other ones in each of ``epochs`` passes; ms per
    ``propose`` call (and, with ``parts``, per part of it: PARTS, the rest being vLLM's lists turned into arrays, the
    row budgets and the drafts turned back into lists), and the seconds of every call of the first epoch; with
    ``load_model``, after the proposer's ``load_model`` (as vLLM calls it at engine start: it warms the compiled
    code) and its seconds."""
    import torch

    from recipe.dapo.config import spec_group

    k = int(spec_group("sam").num_speculative_tokens)
    max_len = max(p.size + r.size for p, rs in groups for r in rs) + 8
    rows = len(groups) * n
    sam = proposer(k, max_len, rows, defer_idle, options)
    start = time.perf_counter()
    if load_model:
        sam.load_model(None)
    load_model_s = time.perf_counter() - start
    first_epoch_s = 0.0
    clock = SimulatedClock()
    sam.clock = clock
    spent: dict[str, float] = {}
    part_times: dict[str, list[float]] = {label: [] for label in PARTS}
    if parts:
        time_parts(sam, spent)
    side = 2048
    weights = [torch.randn(side, side) for _ in range(max(1, evict_mb * 2**20 // (4 * side * side)))]
    times, idle, deferred = [], [], []
    for epoch in range(epochs):
        requests = [(p, r) for p, rs in groups for r in rs[epoch * n : (epoch + 1) * n]]
        ids = [f"{epoch}-{i}" for i in range(len(requests))]
        runner = SimpleNamespace(input_batch=SimpleNamespace(req_ids=[]), requests={})
        states = {rid: SimpleNamespace(output_token_ids=[]) for rid in ids}  # vLLM's CachedRequestState's tokens
        sam.attach_runner(runner)
        token_ids = np.zeros((len(requests), max_len), dtype=np.int32)
        num_tokens = np.array([p.size for p, _ in requests], dtype=np.int64)
        for i, (p, _) in enumerate(requests):
            token_ids[i, : p.size] = p
        done = np.zeros(len(requests), dtype=np.int64)
        while True:
            live = np.flatnonzero(done < np.array([r.size for _, r in requests]))
            if live.size == 0:
                break
            sampled = []
            for i in live:
                token = int(requests[i][1][done[i]])
                token_ids[i, num_tokens[i]] = token
                num_tokens[i] += 1
                done[i] += 1
                sampled.append([token])
                states[ids[i]].output_token_ids.append(token)
            runner.input_batch.req_ids = [ids[i] for i in live]
            runner.requests = {rid: states[rid] for rid in runner.input_batch.req_ids}
            clock.advance(live.size, sam._last_drafted)
            if evict_mb:
                x = torch.ones(live.size, side)
                for w in weights:
                    x = torch.tanh(x @ w)
            spent.clear()
            before = sam.deferred_steps
            rows_tokens, rows_lengths = token_ids[live], num_tokens[live]  # vLLM's arrays, built outside the timing
            start = time.perf_counter()
            sam.propose(sampled, rows_lengths, rows_tokens)
            seconds = time.perf_counter() - start
            first_epoch_s += seconds if epoch == 0 else 0.0
            if epoch > 0 and live.size >= min_rows:
                times.append(seconds)
                idle.append(sam._last_drafted == 0)
                deferred.append(sam.deferred_steps > before)
                for label, part in part_times.items():
                    part.append(spent.get(label, 0.0))
    result = {"first_epoch_s": first_epoch_s, "load_model_s": load_model_s}
    if not times:  # one epoch (--fresh): no step of a later epoch to time
        return result
    result |= {
        "median_ms": 1000 * float(np.median(times)),
        "mean_ms": 1000 * float(np.mean(times)),
        "steps": len(times),
        "steps_without_drafts": float(np.mean(idle)),
        "deferred_steps": float(np.mean(deferred)),
        "working_step_mean_ms": 1000 * float(np.mean([t for t, d in zip(times, deferred, strict=True) if not d])),
        "deferred_step_mean_ms": 1000 * float(np.mean([t for t, d in zip(times, deferred, strict=True) if d] or [0])),
    }
    if parts:
        result["parts_median_ms"] = {label: 1000 * float(np.median(part)) for label, part in part_times.items()}
    return result


def main() -> None:
    import torch

    from recipe.bench.sam_real import rollouts, sam_option_values

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2, help="epochs x n: at most the cache's 8 responses a prompt")
    parser.add_argument("--evict-mb", type=int, default=512)
    parser.add_argument("--min-rows", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the simulated forward")
    parser.add_argument("--parts", action="store_true", help="also time each part of propose (PARTS)")
    parser.add_argument(
        "--sam-option", action="append", default=[], metavar="KEY=VALUE",
        help="a SAM option over configs/spec/sam.yaml's (defer_idle is each mode's own)",
    )  # fmt: skip
    parser.add_argument(
        "--fresh", type=int, default=0, metavar="PAIRS",
        help="instead: PAIRS fresh processes each with and without load_model's warm-up, back to back; the proposer's"
        " seconds over the first epoch (first_epoch.md)",
    )  # fmt: skip
    parser.add_argument("--child", choices=("cold", "warm"), help=argparse.SUPPRESS)  # one process of --fresh
    parser.add_argument("--out", default=str(REPO_ROOT / "results" / "sam"))
    args = parser.parse_args()
    options = sam_option_values(args.sam_option)
    torch.set_num_threads(args.threads)
    if args.epochs * args.n > 8:
        parser.error(f"--epochs {args.epochs} x --n {args.n} needs more than the cache's 8 responses per prompt")
    if args.fresh:
        return fresh_processes(args, options)
    groups = rollouts(args.model, 64, 8, 384)[: args.prompts]  # recipe.bench sam-real's cached rollouts
    if args.child:
        print(
            json.dumps(drive(groups, args.n, args.epochs, 0, args.min_rows, True, options, False, args.child == "warm"))
        )
        return
    modes = {  # name -> (MiB evicted between calls, defer_idle)
        "back to back": (0, True),
        "after a forward": (args.evict_mb, True),
        "after a forward, working every step": (args.evict_mb, False),
    }
    results = {
        name: drive(groups, args.n, args.epochs, mb, args.min_rows, defer, options, args.parts)
        for name, (mb, defer) in modes.items()
    }
    for name, r in results.items():
        print(name, json.dumps(r), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = (
        f"python -m recipe.bench proposer --prompts {args.prompts} --n {args.n} --epochs {args.epochs} "
        f"--evict-mb {args.evict_mb} --min-rows {args.min_rows} --threads {args.threads}"
        + " --parts" * args.parts
        + "".join(f" --sam-option {k}={v}" for k, v in options.items())
    )
    (out / "proposer_cost.json").write_text(json.dumps({"command": command, "results": results}, indent=2))
    lines = [
        "# SAM's proposer per engine step: warm caches and after a forward",
        "",
        f"Produced by `{command}` ({options or 'the default SAM options'}; {args.prompts} x {args.n} requests of"
        f" {args.model}'s cached rollouts; steps with at least {args.min_rows} requests from the second epoch on).",
        "",
        "| between two calls | median ms | mean ms | steps | steps without drafts | steps deferred | mean ms of a working"
        " step | of a deferred step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['median_ms']:.3f} | {r['mean_ms']:.3f} | {r['steps']} | {r['steps_without_drafts']:.0%} "
            f"| {r['deferred_steps']:.0%} | {r['working_step_mean_ms']:.3f} | {r['deferred_step_mean_ms']:.3f} |"
        )
    if args.parts:
        lines += [
            "",
            "Median ms per call of each part (the proposer's methods timed on the instance; the rest of a call is vLLM's"
            " lists turned into arrays, the row budgets and the drafts turned back into lists):",
            "",
            "| part | " + " | ".join(results) + " |",
            "|---|" + "---|" * len(results),
        ]
        for label in PARTS:
            lines.append(
                f"| {label} | " + " | ".join(f"{r['parts_median_ms'][label]:.4f}" for r in results.values()) + " |"
            )
    (out / "proposer_cost.md").write_text("\n".join(lines) + "\n")


def fresh_processes(args: argparse.Namespace, options: dict) -> None:
    """``--fresh``: pairs of fresh processes (one without load_model, one with, in turn), each driving the proposer
    back to back over one epoch of the cached rollouts; its proposer seconds and load_model's."""
    import subprocess

    runs: dict[str, list[dict]] = {"cold": [], "warm": []}
    for _ in range(args.fresh):
        for mode in runs:
            command = [sys.executable, __file__, "--child", mode, "--model", args.model, "--prompts", str(args.prompts)]
            command += ["--n", str(args.n), "--epochs", "1"]  # only the first epoch is read
            command += [f"--sam-option={k}={v}" for k, v in options.items()]
            out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
            runs[mode].append(json.loads(out.strip().splitlines()[-1]))
            print(mode, runs[mode][-1]["first_epoch_s"], runs[mode][-1]["load_model_s"], flush=True)
    command = (
        f"python -m recipe.bench proposer --fresh {args.fresh} --model {args.model} "
        f"--prompts {args.prompts} --n {args.n}" + "".join(f" --sam-option {k}={v}" for k, v in options.items())
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "first_epoch.json").write_text(json.dumps({"command": command, "runs": runs}, indent=2))

    def median(mode: str, key: str) -> float:
        return float(np.median([r[key] for r in runs[mode]]))

    lines = [
        "# SAM's proposer in a fresh process: its first epoch with and without load_model's warm-up",
        "",
        f"Produced by `{command}` ({options or 'the default SAM options'}; {args.prompts} x {args.n} requests of"
        f" {args.model}'s cached rollouts, calls back to back; {args.fresh} fresh processes each, in turn).",
        "",
        "| process | proposer seconds over the first epoch, median | range | load_model seconds, median |",
        "|---|---|---|---|",
    ]
    for mode, label in (("cold", "without load_model"), ("warm", "after load_model (vLLM calls it at engine start)")):
        spent = [r["first_epoch_s"] for r in runs[mode]]
        lines.append(
            f"| {label} | {median(mode, 'first_epoch_s'):.3f} | {min(spent):.3f}-{max(spent):.3f} "
            f"| {median(mode, 'load_model_s'):.3f} |"
        )
    (out / "first_epoch.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
