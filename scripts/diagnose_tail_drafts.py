"""What SAM's default drafts in the long tail of a real-model rollout, and how its payoff rule's chances hold up.

One SAM engine (``bench_rollout.py``'s mode ``sam+group+epoch``) runs the tail shape: one prompt's ``--n`` samples,
after a warm-up on another prompt and a previous epoch of the same one, then ``--repeats`` reseeded rollouts. Its
proposer is wrapped on the instance (through vLLM's ``collective_rpc``) to record, per rollout: the steps that sent
drafts and how many of them were exploring steps (sam.payoff.EXPLORE_EVERY, before the cost is learned), the live
batch sizes they were sent at, the draft tokens sent, the sum of the chances the payoff cut gave them (the expected
accepted tokens) against the tokens accepted, and the step-cost fit at the rollout's end.

    .venv/bin/python scripts/diagnose_tail_drafts.py [--repeats 6] -> results/real/current_1127/tail_drafts/
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "scripts"))


def _record_on_worker(worker) -> None:
    """Runs in the vLLM worker: wrap the SAM proposer's ``propose`` and ``_pay`` to log each step."""
    from sam.payoff import EXPLORE_EVERY

    sam = worker.model_runner.drafter
    sam.diagnostic_log = []
    propose, pay = sam.propose, sam._pay
    sent: dict[str, int] = {}

    def logged_pay(rows, slots, drafts, lengths, group, mlen, level, idle):
        kept = pay(rows, slots, drafts, lengths, group, mlen, level, idle)
        chances = sam.acceptance.chances(group, sam.acceptance.band(mlen), level)
        expected = float(sum(chances[r, : kept[r]].sum() for r in range(kept.size)))
        sam.diagnostic_log[-1]["expected"] = expected
        return kept

    def logged_propose(sampled_token_ids, *args, **kwargs):
        rows = len(sampled_token_ids)
        req_ids = list(sam.runner.input_batch.req_ids[:rows])
        accepted = sum(len(s) - 1 for rid, s in zip(req_ids, sampled_token_ids, strict=True) if rid in sent)
        exploring = bool(sam.step_cost.exploring and (sam.steps + 1) % EXPLORE_EVERY == 0)
        sam.diagnostic_log.append({"rows": rows, "exploring": exploring, "accepted": accepted, "expected": 0.0})
        drafts = propose(sampled_token_ids, *args, **kwargs)
        sent.clear()
        sent.update((rid, len(d)) for rid, d in zip(req_ids, drafts, strict=True) if d)
        sam.diagnostic_log[-1].update(drafted=sum(sent.values()), coef=sam.step_cost.coef.tolist())
        return drafts

    sam.propose, sam._pay = logged_propose, logged_pay


def _take_log_on_worker(worker) -> list[dict]:
    sam = worker.model_runner.drafter
    log, sam.diagnostic_log = sam.diagnostic_log, []
    return log


def summarize(log: list[dict]) -> dict:
    """One rollout's log (a step's ``accepted`` counts the drafts sent at the step before it)."""
    drafted = [e for e in log if e["drafted"]]
    return {
        "steps": len(log),
        "draft_steps": len(drafted),
        "exploring_draft_steps": sum(e["exploring"] for e in drafted),
        "draft_tokens": sum(e["drafted"] for e in drafted),
        "expected_accepted": round(sum(e["expected"] for e in log), 2),
        "accepted": sum(e["accepted"] for e in log),
        "rows_at_drafts": sorted({e["rows"] for e in drafted}),
        "cost_ms_at_end": [round(1000 * v, 3) for v in log[-1]["coef"]],  # a, b, c, e, f (sam/payoff.py)
    }


def main() -> None:
    from bench_rollout import mode_defaults, mode_engine, parse_mode, rollout_inputs

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=384)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--out", default=str(REPO_ROOT / "results" / "real" / "current_1127" / "tail_drafts"))
    args = parser.parse_args()

    ckpt, ids, dtype = rollout_inputs(args.model, 2)
    engine = mode_engine(ckpt, *parse_mode("sam+group+epoch", 256, mode_defaults()), dtype=dtype)
    engine.llm.collective_rpc(_record_on_worker)
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_tokens": args.max_tokens}
    rollouts = {}
    phases = [("warm-up (other prompt)", ids[0], None), ("previous epoch", ids[1], None)]
    phases += [(f"rollout {r}", ids[1], 1000 + r) for r in range(args.repeats)]
    for name, prompt, seed in phases:
        if seed is not None:
            engine.reseed(seed)  # bench_rollout.py's seeds: its repeats' rollouts
        engine.generate([prompt], args.n, sampling)
        rollouts[name] = summarize(engine.llm.collective_rpc(_take_log_on_worker)[0])
        print(name, json.dumps(rollouts[name]), flush=True)
    measured = [r for name, r in rollouts.items() if name.startswith("rollout")]
    totals = {key: sum(r[key] for r in measured) for key in ("expected_accepted", "accepted", "draft_tokens")}
    command = (
        f".venv/bin/python scripts/diagnose_tail_drafts.py --model {args.model} --n {args.n} "
        f"--max-tokens {args.max_tokens} --repeats {args.repeats}"
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tail_drafts.json").write_text(json.dumps({"command": command, "rollouts": rollouts}, indent=2))
    header = (
        "| phase | steps | draft steps (exploring) | live batch at drafts | tokens sent | expected accepted | accepted"
    )
    lines = [
        "# What SAM's default drafts in the tail",
        "",
        f"Produced by `{command}` (one engine; expected accepted: the sum of the chances the payoff cut gave the tokens"
        " it sent; cost: the step-cost fit a, b, c, e, f in ms at the rollout's end, sam/payoff.py).",
        "",
        header + " | cost at end (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rollouts.items():
        lines.append(
            f"| {name} | {r['steps']} | {r['draft_steps']} ({r['exploring_draft_steps']}) | {r['rows_at_drafts']} | "
            f"{r['draft_tokens']} | {r['expected_accepted']:.1f} | {r['accepted']} | {r['cost_ms_at_end']} |"
        )
    lines += [
        "",
        f"Rollouts 0-{args.repeats - 1}: {totals['draft_tokens']} tokens sent, {totals['expected_accepted']:.1f}"
        f" accepted expected, {totals['accepted']} accepted"
        f" ({totals['accepted'] / max(totals['expected_accepted'], 1e-9):.2f} of expected).",
    ]
    (out / "tail_drafts.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
