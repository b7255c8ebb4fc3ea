"""Seeded A/B runs of the DAPO recipe across speculative modes, and the tables and plots that compare them.

    python -m recipe.ab --name cpu24 trainer.total_training_steps=24   # all modes, then the report
    python -m recipe.ab --name cpu24 --modes off,sam                   # a subset
    python -m recipe.ab --name cpu24 --report-only                     # tables and plots again
    python -m recipe.ab --name cpu24 --seeds 0,1 --modes off,hybrid    # an A/B per seed (data.seed)

Every mode runs the same config, data and seed (``python -m recipe.dapo`` in its own process, so a crash of
one mode loses nothing of the others, and a rerun resumes a killed mode from its checkpoint and skips
finished ones). Modes take turns in chunks of ``--chunk-steps`` training steps, each chunk resuming the mode's
run from its checkpoint (a resumed run logs what an uninterrupted one would), so that slow and fast spells of a
shared machine fall on every mode alike instead of on whichever mode ran during them. Runs go to
``runs/ab/<name>/<mode>/``; tables (markdown + CSV) and PNG plots to ``--out`` (``results/ab/<name>/``):
- (a) slime's layout: rollout tokens/s, long-tail tokens/s, longest-sample tokens/s, training time per step;
- (b) the Ascend SAM article's layout: average inference time per generation round, total rollout time per
  step, total time per step, and the gain over spec off;
- (c) speed at equal batch size: decode steps pooled by active requests, tokens/s per active request against
  spec off's in the same band, and over all bands at spec off's mix (equal work: the modes' samples differ, and the
  long-tail figure compares tails of different sizes);
- lossless in training: each mode's per-step reward and response length against spec off's at the same step (the
  same seed and data order), equivalence by two one-sided tests against stated margins
  (:data:`recipe.ab.stats.EQUIVALENCE_MARGINS`), and the final greedy held-out accuracy of every data source (Fisher's
  exact test on the problems solved);
- means by quarter of the run: rollout tokens/s, acceptance length, the MTP head's top-1 and loss, reward;
- plots: acceptance length, rollout throughput, reward and response length per step, and one rollout's
  timeline (active requests and tokens/s over time) for spec off against SAM.

Modes (:data:`recipe.ab.runner.MODES`): ``off``, ``ngram``, ``suffix``, ``sam`` (the recipe's default drafter:
own text, siblings, earlier epochs and every prompt's responses, each request's source picked by the learned
chances), ``sam_own`` (own text only), ``sam_every`` (the default without the payoff rule: every draft the match
rules give), ``sam_eager`` (the default with ``spec.sam.defer_idle=false``: its drafter works on every step where
nothing can pay), ``sam_longest`` (``spec.sam.scored=false spec.sam.global_sharing=false``: the longest match, the
default before scored drafting), ``mtp_frozen``, ``mtp_online``, ``hybrid`` (SAM and the online head in one engine);
``<mode>-2`` runs a mode a second time, an A/A control: how far two runs of one mode differ on this machine.

With ``--seeds`` each seed runs an A/B of its own under ``runs/ab/<name>/seed<s>/`` (more seeds for some modes:
run again with those modes and seeds; the report reads every seed's runs): the tables above are the first seed's,
and an across-seeds section puts every run side by side (slime's per-step curves in ``seeds.png``), each mode's
speed against spec off's of the same seed and its reward against spec off's seed spread.

The report reads what each run logged (its ``metrics.jsonl`` and rollout timelines); it computes no metric the
run already has.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from recipe.ab.render import report
from recipe.ab.runner import MODES, REPO_ROOT, base_mode, earlier_default, run_modes
from recipe.paths import RESULTS_DIR


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default="default", help="A/B name: its runs go to runs/ab/<name>/")
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"comma-separated subset of {list(MODES)}; <mode>-2 runs a mode again, an A/A control of the noise",
    )
    parser.add_argument("--runs-root", default=str(REPO_ROOT / "runs" / "ab"))
    parser.add_argument("--out", help="where the tables and plots go (default: results/ab/<name>/)")
    parser.add_argument(
        "--seeds",
        help="comma-separated seeds (data.seed), an A/B each under runs/ab/<name>/seed<s>/ (default: one A/B "
        "at the config's seed, its runs under runs/ab/<name>/)",
    )
    parser.add_argument("--report-only", action="store_true", help="only rebuild tables and plots")
    parser.add_argument("--val-n", type=int, help="held-out problems (default: the runs' data.val_max_samples)")
    parser.add_argument(
        "--chunk-steps",
        type=int,
        default=40,
        help="modes take turns every this many training steps (0: each mode runs through at once); a multiple of "
        "trainer.test_freq and trainer.save_freq keeps evaluations and checkpoints where an uninterrupted run has them",
    )
    parser.add_argument(
        "--earlier-default",
        action="store_true",
        help="run the configuration of the committed A/Bs (configs/ab/earlier_default.yaml; the overrides given still apply)",
    )
    args, overrides = parser.parse_known_args(argv)
    modes = args.modes.split(",")
    unknown = [m for m in modes if base_mode(m) is None]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; known: {list(MODES)}, or <mode>-2 for a second run of one")
    bad = [o for o in overrides if "=" not in o or o.startswith("-")]
    if bad:
        parser.error(f"not a Hydra override (key=value): {bad}")
    try:
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
    except ValueError:
        parser.error(f"--seeds {args.seeds}: not a comma-separated list of integers")
    runs_root = Path(args.runs_root)
    out = Path(args.out) if args.out else RESULTS_DIR / "ab" / args.name
    if args.earlier_default:
        overrides = [*earlier_default(), *overrides]
    if not args.report_only:
        run_modes(args.name, modes, overrides, runs_root, args.chunk_steps, seeds)
    given = argv if argv is not None else sys.argv[1:]
    command = "python -m recipe.ab " + " ".join(a for a in given if a != "--report-only")
    report(args.name, runs_root, out, command, args.val_n)


if __name__ == "__main__":
    main()
