"""How far a DAPO run's policy can drift before a frozen MTP head stops being accepted: the drift probe of a run
(recipe/dapo/drift.py: KL from the starting policy and the heads' expected acceptance) measured on saved policy
checkpoints, with the starting head (what a frozen head drafts) and each checkpoint's own head (an online run's).

    python -m recipe.bench head-swap --start artifacts/models/smollm2-135m-instruct-mtp \\
        --probe runs/ab/smollm2_drift/mtp_online/drift_probe.json \\
        --policy "rise step 6=runs/spec-rollout-dapo/smollm2-sam-rise/global_step_6/actor" ...

Writes ``<out>/frozen_head_drift.{json,md}``, and with rollouts ``timelines.json.gz`` (every rollout's engine steps)
and ``timelines.png``.
Every checkpoint must share the starting checkpoint's trunk lineage (a run started from it, or from the same trunk with
another head); the probe is the starting policy's responses kept by such a run.

``--rollout-prompts K`` also serves each checkpoint in vLLM with its own head and with the starting head on its trunk
(what a frozen-head run would serve at that policy), ``--rollout-repeats`` times in alternating order on K held-out
prompts x ``--rollout-n`` at T=1, in one warm engine with the heads swapped in place and the sampler reseeded per
rollout (``--fresh-engines``: an engine per rollout). It reports rollout tokens/s (raw, at the
starting head's mix of batch sizes, and so over the engine steps that prefilled nothing), drafts accepted and those
that earned a token, tokens per request-step and per response, with each own / start ratio per repeat and its 95%
interval: the throughput side of online vs frozen at the same policy, which two training runs could only compare
across diverging policies. With ``--start`` set to the policy itself both sides serve one
head (an A/A pair: the noise of the tokens/s ratio).
"""

from __future__ import annotations

import argparse
import gzip
import json
import shlex
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from mtp.checkpoint import labelled_checkpoint, load_checkpoint, with_start_head
from mtp.model import MiMoForCausalLM
from recipe.ab.render import swap_timelines_plot
from recipe.ab.stats import ratio_interval, ratio_interval_text
from recipe.dapo.drift import METRIC_LABELS, DriftProbe
from recipe.dapo.timeline import equal_work_vs_off, speed_by_active_requests_vs_off
from recipe.head_training import WARMUP_PROMPTS, held_out_prompts, mtp_rollout, swapped_head_rollouts
from recipe.paths import REPO_ROOT


def head_states(policy: MiMoForCausalLM, start_head: torch.nn.ModuleList) -> dict[str, dict[str, torch.Tensor]]:
    """The policy's full state with its own MTP head and with the starting head in its place (what a frozen-head
    run serves at that policy): the two sides a one-engine swap pushes in turn."""
    own = {name: t.detach().clone() for name, t in policy.state_dict().items()}
    start = dict(own)
    for name, t in start_head.state_dict().items():
        start[f"model.mtp_layers.{name}"] = t.detach().clone()
    return {"own": own, "start": start}


def rollout_ab(
    policy_dir: Path, policy: MiMoForCausalLM, start_head: torch.nn.ModuleList, prompts: list[list[int]],
    warmup: list[list[int]], args: argparse.Namespace,
) -> dict:  # fmt: skip
    """Own head vs the starting head on the policy's trunk, served in vLLM (method ``mtp``, the experiment's
    probabilistic drafts), repeats in alternating order; medians, and per-repeat ratios with their geometric mean and
    95% interval.

    By default one warm engine serves both heads, swapped in place and reseeded before each rollout
    (``recipe.head_training.swapped_head_rollouts``); ``--fresh-engines`` starts an engine per rollout from a checkpoint
    (noisier: an engine instance alone moves a rollout's speed). Each rollout samples other responses (a draft changes which
    tokens T=1 draws), and at 20-30 tokens a response a rollout's tokens/s is set by its few long ones. So the own head
    is also timed at the starting head's mix of batch sizes (``recipe.dapo.timeline.equal_work_vs_off``, the starting
    head as the reference): the same work, which the raw tokens/s ratio is not."""
    seeds = [args.seed + rep for rep in range(args.rollout_repeats)]
    drafting = {
        "draft_sample_method": "probabilistic", "dtype": args.dtype, "warmup": warmup,
        "num_speculative_tokens": args.num_speculative_tokens,
    }  # fmt: skip
    if args.fresh_engines:
        runs: dict[str, list] = {"own": [], "start": []}
        with tempfile.TemporaryDirectory() as tmp:
            swapped = with_start_head(policy, policy_dir, start_head, Path(tmp) / "start_head")
            for rep, seed in enumerate(seeds):
                order = (
                    (("own", policy_dir), ("start", swapped))
                    if rep % 2 == 0
                    else (("start", swapped), ("own", policy_dir))
                )
                for head, ckpt in order:
                    runs[head].append(
                        mtp_rollout(ckpt, prompts, args.rollout_n, args.max_tokens, seed, progress=False, **drafting)
                    )
    else:
        runs = swapped_head_rollouts(
            policy_dir, head_states(policy, start_head), prompts, args.rollout_n, args.max_tokens, seeds, **drafting
        )
    figures = {head: [f for f, _ in rows] for head, rows in runs.items()}
    timelines = {head: [t for _, t in rows] for head, rows in runs.items()}
    out: dict = {}
    for head, rows in figures.items():
        for key in (
            "rollout_tok_s", "acceptance", "earned", "tokens_per_request_step", "tokens_per_response",
            "prefill_time_share",
        ):  # fmt: skip
            out[f"rollout/{head}_head_{key}"] = float(np.median([r[key] for r in rows]))
    pairs = list(zip(figures["own"], figures["start"], strict=True))
    readings = {  # READINGS, in the report's order
        "tok_s": [o["rollout_tok_s"] / s["rollout_tok_s"] for o, s in pairs],
        "equal_work": [
            equal_work_own_over_start([o], [s]) for o, s in zip(timelines["own"], timelines["start"], strict=True)
        ],
        "equal_work_decode": [
            equal_work_own_over_start([o], [s], decode_only=True)
            for o, s in zip(timelines["own"], timelines["start"], strict=True)
        ],
        "tokens_per_request_step": [o["tokens_per_request_step"] / s["tokens_per_request_step"] for o, s in pairs],
    }
    for name, ratios in readings.items():
        out[f"rollout/own_over_start_{name}_runs"] = ratios
        out[f"rollout/own_over_start_{name}_interval"] = list(ratio_interval(defined(ratios)))
    out["rollout/own_over_start_tok_s"] = float(np.median(readings["tok_s"]))
    out["rollout/own_over_start_equal_work"] = equal_work_own_over_start(timelines["own"], timelines["start"])
    out["timelines"] = {head: [t.to_json() for t in rows] for head, rows in timelines.items()}
    return out


def defined(ratios: list[float]) -> list[float]:
    """The pairs whose ratio is known: an equal-work ratio is NaN where the own head's rollout never ran at a batch size
    the starting head's spent time at (``equal_work_vs_off``), as when its last two responses ended in one step."""
    return [r for r in ratios if r == r]


def interval_text(ratios: list[float]) -> str:
    """``ratio_interval_text`` over the defined pairs, saying how many of all they are when some are not."""
    known = defined(ratios)
    return ratio_interval_text(known) + (f" ({len(known)} of {len(ratios)} pairs)" if len(known) < len(ratios) else "")


READINGS = ("tok_s", "equal_work", "equal_work_decode", "tokens_per_request_step")  # own / start, per repeat


def equal_work_own_over_start(own: list, start: list, decode_only: bool = False) -> float:
    """The own head's rollouts over the starting head's, at the starting head's mix of batch sizes (all rollouts'
    engine steps pooled by active requests). ``decode_only``: over the steps that prefilled no request, the part of a
    rollout a head changes (the same prompts cost both heads the same prefill)."""
    bands = speed_by_active_requests_vs_off({"start": start, "own": own}, reference="start", decode_only=decode_only)
    return equal_work_vs_off(bands, reference="start")["own"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--start", type=Path, required=True, help="the starting checkpoint, with the frozen head")
    parser.add_argument("--probe", type=Path, required=True, help="a run's drift_probe.json (the start's responses)")
    parser.add_argument(
        "--policy", type=labelled_checkpoint, action="append", required=True, help="LABEL=CHECKPOINT_DIR"
    )
    parser.add_argument("--temperature", type=float, default=1.0, help="the rollout temperature")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "results" / "real" / "online_vs_frozen")
    parser.add_argument("--rollout-prompts", type=int, default=0, help="held-out prompts per rollout (0: no rollouts)")
    parser.add_argument("--rollout-n", type=int, default=8, help="samples per prompt (the DAPO group)")
    parser.add_argument("--rollout-repeats", type=int, default=2, help="rollouts per head, in alternating order")
    parser.add_argument(
        "--num-speculative-tokens", type=int, default=1,
        help="draft tokens per step (1: the experiment's; more runs the one MTP layer on its own output)",
    )  # fmt: skip
    parser.add_argument(
        "--fresh-engines", action="store_true",
        help="a fresh engine per rollout instead of one engine with the heads swapped in place",
    )  # fmt: skip
    parser.add_argument("--max-tokens", type=int, default=256, help="response budget (the experiment's)")
    parser.add_argument("--dtype", default="float32", help="the engine's dtype (the experiment's)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not args.probe.is_file():
        parser.error(f"--probe {args.probe}: no such file")
    torch.set_grad_enabled(False)
    sequences = json.loads(args.probe.read_text())
    start = load_checkpoint(args.start)
    probe = DriftProbe(start, sequences, args.temperature)
    rows = [{"policy": "start", "checkpoint": str(args.start), **probe.measure(start)}]
    # the rollouts' prompts, and after them other held-out prompts that warm each fresh engine up, unmeasured
    held_out = held_out_prompts(args.start, args.rollout_prompts + WARMUP_PROMPTS) if args.rollout_prompts else []
    prompts, warmup = held_out[: args.rollout_prompts], held_out[args.rollout_prompts :]
    timelines: dict[str, dict[str, list[dict]]] = {}
    for label, path in args.policy:
        policy = load_checkpoint(path)
        rows.append({"policy": label, "checkpoint": str(path), **probe.measure(policy)})
        if prompts:
            rows[-1].update(rollout_ab(path, policy, start.model.mtp_layers, prompts, warmup, args))
        served = rows[-1].pop("timelines", None)
        if served is not None:  # every rollout's engine steps, to recompute any reading (recipe.dapo.timeline)
            timelines[label] = served
        print(json.dumps(rows[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "frozen_head_drift.json").write_text(json.dumps(rows, indent=1))
    if timelines:
        with gzip.open(args.out / "timelines.json.gz", "wt") as fh:
            json.dump(timelines, fh)
        swap_timelines_plot(timelines, args.out / "timelines.png")
    command = shlex.join(["python", "recipe/bench/head_swap.py", *sys.argv[1:]])
    lines = [
        f"Produced by `{command}` ({len(sequences)} probe responses, temperature {args.temperature}). Expected "
        "acceptance of one draft token on the checkpoint's policy, over the probe's response positions: argmax = "
        "the policy's probability of the head's top token; sampled = sum(min(p, q)), a draft sampled from the head.",
        "",
        "| policy | " + " | ".join(METRIC_LABELS.values()) + " |",
        "|---|" + "---|" * len(METRIC_LABELS),
    ]
    for row in rows:
        lines.append(f"| {row['policy']} | " + " | ".join(f"{row[key]:.3f}" for key in METRIC_LABELS) + " |")
    served = [row for row in rows if "rollout/own_over_start_tok_s" in row]
    if served:
        engines = "a fresh engine per rollout" if args.fresh_engines else "one engine, the heads swapped in place"
        lines += [
            "",
            f"Served in vLLM (method `mtp`, {args.num_speculative_tokens} probabilistic draft token(s) a step, T=1, "
            f"{args.rollout_prompts} held-out prompts x {args.rollout_n}, up to {args.max_tokens} tokens, {args.dtype}, "
            f"{args.rollout_repeats} rollouts per head in alternating order, {engines}): the policy's own head against "
            "the starting head on its trunk. Ratios are own / start, per repeat, as geometric mean [95% interval]. "
            "Equal work: the own head's speed at the starting head's mix of batch sizes, which the raw tokens/s ratio "
            "is not when the two rollouts' response lengths differ; decode: over the engine steps that prefilled no "
            "request, the part of the rollout a head changes (prefill share: of the starting head's rollout time). "
            "Accepted: vLLM's share of draft tokens accepted (in brackets: those that earned a token, less the drafts "
            "of a response's last token, whose step emits it anyway). Tok/s, accepted, tokens per response and "
            "prefill share: medians.",
            "",
            "| policy | own head tok/s | start head tok/s | own / start tok/s | own / start, equal work | own / start, "
            "equal work, decode | own / start tokens/request-step | own head accepted | start head accepted | tokens "
            "per response, own vs start | prefill share |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in served:
            cells = [
                row["policy"],
                f"{row['rollout/own_head_rollout_tok_s']:.1f}",
                f"{row['rollout/start_head_rollout_tok_s']:.1f}",
                *(interval_text(row[f"rollout/own_over_start_{name}_runs"]) for name in READINGS),
                f"{row['rollout/own_head_acceptance']:.3f} ({row['rollout/own_head_earned']:.3f})",
                f"{row['rollout/start_head_acceptance']:.3f} ({row['rollout/start_head_earned']:.3f})",
                f"{row['rollout/own_head_tokens_per_response']:.1f} vs {row['rollout/start_head_tokens_per_response']:.1f}",
                f"{row['rollout/start_head_prefill_time_share']:.2f}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    (args.out / "frozen_head_drift.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
