"""What an A/B's runs logged, reduced to the rows of its tables: means over steps, ratios to spec off, and the
tests that say whether a mode changed what is learned (the report computes no metric a run already logs)."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from recipe.dapo.report import held_out_keys

ALPHA = 0.01  # significance level of the final greedy accuracy's test (Fisher's exact)
EQUIVALENCE_ALPHA = 0.05  # each one-sided test of TOST: the difference's 90% interval is read against the margin
# how far a mode's per-step metric may sit from spec off's and still count as the same learning: metric -> (margin,
# relative to spec off's mean). Reward is +1/-1 per response: 0.1 is 5 points of accuracy.
EQUIVALENCE_MARGINS = {
    "train/gen_score_mean": (0.1, False),
    "response_length/mean": (0.1, True),
}


def series(h: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    points = [(r["step"], r[key]) for r in h if key in r]
    if not points:
        return np.zeros(0), np.zeros(0)
    steps, values = zip(*points, strict=True)
    return np.asarray(steps), np.asarray(values, dtype=float)


def mean_of(h: list[dict], key: str, second_half: bool = False) -> float:
    steps, values = series(h, key)
    if second_half and len(values):
        values = values[steps > steps.max() / 2]
    return float(values.mean()) if len(values) else float("nan")


def newey_west_se(d: np.ndarray) -> float:
    """Standard error of the mean of a series whose neighbours correlate (Newey-West, Bartlett weights, lag
    ``floor(4 (n/100)^(2/9))``): a training run's per-step differences carry its trend and its recent updates, so the
    i.i.d. error understates the uncertainty.

    Example: a series whose steps repeat in pairs (lag-1 correlation 0.5) has about 1.4x the i.i.d. error."""
    n = d.size
    centred = d - d.mean()
    lag = min(int(4 * (n / 100) ** (2 / 9)), n - 1)
    variance = float(centred @ centred) / n
    for k in range(1, lag + 1):
        variance += 2 * (1 - k / (lag + 1)) * float(centred[k:] @ centred[:-k]) / n
    return math.sqrt(max(variance, 0.0) / n)


def paired_equivalence(h: list[dict], off: list[dict], key: str) -> dict[str, float | str]:
    """Whether a mode learned what spec off learned, by two one-sided tests (TOST) on per-step differences: the
    runs share seed and data order, so step t of both saw the same prompts and the difference removes what the step's
    prompts and the run's trend share. The difference (absolute, or relative to spec off's mean: see
    :data:`EQUIVALENCE_MARGINS`) has a ``1 - 2 * EQUIVALENCE_ALPHA`` interval (Student's t, Newey-West error); the mode
    is ``equivalent`` where that interval lies inside the margin, ``differs`` where it lies wholly outside it, and
    ``not shown`` otherwise (too few or too noisy steps to tell).

    Example: reward differences of +0.01 a step with an interval [-0.03, 0.05] inside the margin 0.1: equivalent."""
    margin, relative = EQUIVALENCE_MARGINS[key]
    mine, theirs = dict(zip(*series(h, key), strict=True)), dict(zip(*series(off, key), strict=True))
    steps = sorted(set(mine) & set(theirs))
    d = np.array([mine[t] - theirs[t] for t in steps], dtype=float)
    if relative and d.size:
        d = d / abs(np.mean([theirs[t] for t in steps]))
    if d.size < 3:
        return {"difference": math.nan, "low": math.nan, "high": math.nan, "p_tost": math.nan, "verdict": "not shown"}
    centre, se = float(d.mean()), newey_west_se(d)
    df = d.size - 1
    half = float(stats.t.ppf(1 - EQUIVALENCE_ALPHA, df)) * se
    low, high = centre - half, centre + half
    p_tost = float(max(stats.t.sf((centre + margin) / se, df), stats.t.cdf((centre - margin) / se, df))) if se else 0.0
    if -margin < low and high < margin:
        verdict = "equivalent"
    elif low > margin or high < -margin:
        verdict = "differs"
    else:
        verdict = "not shown"
    return {"difference": centre, "low": low, "high": high, "p_tost": p_tost, "verdict": verdict}


def ratio_interval(ratios, level: float = 0.95) -> tuple[float, float, float]:
    """Geometric mean of paired speed ratios and its ``level`` confidence interval (Student's t on their logs: a ratio
    and its inverse are equally far from 1). On this shared machine a single pair moves by several percent with no
    change in the work, so a ratio is read against its interval, not its point. NaN bounds below two ratios."""
    logs = np.log(np.asarray(ratios, dtype=np.float64))
    if logs.size == 0:
        return math.nan, math.nan, math.nan
    centre = float(logs.mean())
    if logs.size < 2:
        return math.exp(centre), math.nan, math.nan
    half = float(stats.t.ppf(0.5 + level / 2, logs.size - 1)) * float(logs.std(ddof=1)) / math.sqrt(logs.size)
    return math.exp(centre), math.exp(centre - half), math.exp(centre + half)


def ratio_interval_text(ratios) -> str:
    """``geometric mean [95% interval]`` of paired speed ratios, as the reports print it (the mean alone below two)."""
    centre, lo, hi = ratio_interval(ratios)
    return f"{centre:.3f}x [{lo:.3f}, {hi:.3f}]" if lo == lo else f"{centre:.3f}x"


def solved_p(acc: float, acc_off: float, n: int) -> float:
    """Fisher's exact test that two greedy accuracies on the same ``n`` problems come from the same rate."""
    if acc != acc or acc_off != acc_off:
        return math.nan
    solved, solved_off = round(acc * n), round(acc_off * n)
    return float(stats.fisher_exact([[solved, n - solved], [solved_off, n - solved_off]]).pvalue)


def final(h: list[dict], key: str) -> float:
    values = series(h, key)[1]
    return float(values[-1]) if len(values) else math.nan


SLIME_METRICS = {  # table (a)'s columns read straight from the logged metric of each step
    "rollout_tok_s": "rollout/throughput_tok_s",
    "tail_tok_s": "rollout/tail_throughput_tok_s",
    "tail_request_tok_s": "rollout/tail_request_tok_s",
    "longest_sample_tok_s": "rollout/longest_sample_tok_s",
    "accept_len": "rollout/tokens_per_request_step",
    "tail_accept_len": "rollout/tail_tokens_per_request_step",
}


def tables(runs: dict[str, list[dict]], val_n: int) -> dict[str, list[dict]]:
    """Rows of every table, from each mode's logged metrics (means over steps)."""
    off = runs.get("off")
    slime, ascend, lossless = [], [], []
    for mode, h in runs.items():
        slime.append(
            {
                "mode": mode,
                **{column: mean_of(h, key) for column, key in SLIME_METRICS.items()},
                "train_s_per_step": mean_of(h, "timing_s/update_actor") + mean_of(h, "timing_s/old_log_prob"),
                "rollout_tok_s_2nd_half": mean_of(h, "rollout/throughput_tok_s", second_half=True),
            }
        )
        row = {
            "mode": mode,
            "inference_s_per_round": mean_of(h, "timing_s/gen_round_mean"),
            "rollout_s_per_step": mean_of(h, "timing_s/gen"),
            "total_s_per_step": mean_of(h, "timing_s/step"),
        }
        if off:
            row["rollout_gain_pct"] = 100 * (mean_of(off, "timing_s/gen") / row["rollout_s_per_step"] - 1)
            row["step_gain_pct"] = 100 * (mean_of(off, "timing_s/step") / row["total_s_per_step"] - 1)
        ascend.append(row)
        if off and mode != "off":
            row = {"mode": mode}
            for name, key in (("score", "train/gen_score_mean"), ("length", "response_length/mean")):
                row |= {f"{name}_mean": mean_of(h, key), f"{name}_off": mean_of(off, key)}
                row |= {f"{name}_{k}": v for k, v in paired_equivalence(h, off, key).items()}
            for key in greedy_keys(off):  # veRL's val-core/<data_source>/acc/greedy, one per data source
                source = key.split("/")[1]
                row[f"{source}_greedy_acc"], row[f"{source}_greedy_acc_off"] = final(h, key), final(off, key)
                row[f"{source}_greedy_p"] = solved_p(final(h, key), final(off, key), val_n)
            lossless.append(row)
    return {"slime": slime, "ascend": ascend, "lossless": lossless, "quarters": by_quarter(runs)}


def greedy_keys(h: list[dict]) -> list[str]:
    return [k for k in held_out_keys(h) if k.endswith("/acc/greedy")]


# per-quarter means in the report: (metric, label, decimals); a mode without the metric has no row
QUARTER_METRICS = (
    ("rollout/throughput_tok_s", "rollout tok/s", 0),
    ("rollout/spec_accept_length", "acceptance length", 2),
    ("mtp/head_acc", "MTP head top-1", 3),
    ("mtp/head_loss", "MTP head loss", 3),
    ("train/gen_score_mean", "reward (all generated)", 3),
    ("drift/kl_from_start", "KL from the starting policy (drift probe)", 4),
    ("drift/mtp_accept_start_head", "starting (frozen) head's expected acceptance, argmax draft (drift probe)", 3),
    ("drift/mtp_accept_head", "the run's head's expected acceptance, argmax draft (drift probe)", 3),
    ("drift/mtp_accept_sampled_start_head", "starting (frozen) head's, sampled draft (drift probe)", 3),
    ("drift/mtp_accept_sampled_head", "the run's head's, sampled draft (drift probe)", 3),
    ("rollout/spec_draft_acceptance_rate", "vLLM draft acceptance rate", 3),
    ("rollout/drafter_time_share", "SAM drafter's share of the rollout time", 3),
)


# the run's own head against its starting head: equal where the run trains no head, and then left out
OWN_HEAD_OF_START = {
    "drift/mtp_accept_head": "drift/mtp_accept_start_head",
    "drift/mtp_accept_sampled_head": "drift/mtp_accept_sampled_start_head",
}


def by_quarter(runs: dict[str, list[dict]]) -> list[dict]:
    """Each mode's metrics averaged over quarters of the training steps (steps (i-1)*S/4 < step <= i*S/4): how
    throughput, acceptance and the MTP head move over the run, and which quarter a slow spell fell in. A run whose
    own head's figures equal its starting head's (it trains none) shows the starting head's only."""
    rows = []
    for mode, h in runs.items():
        quarters: dict[str, np.ndarray] = {}
        for key, _, _ in QUARTER_METRICS:
            steps, values = series([r for r in h if r["step"] > 0], key)
            if not len(values):
                continue
            edges = np.linspace(0, steps.max(), 5)
            quarter = [values[(steps > lo) & (steps <= hi)] for lo, hi in zip(edges[:-1], edges[1:], strict=True)]
            quarters[key] = np.array([q.mean() if len(q) else math.nan for q in quarter])
        for own, start in OWN_HEAD_OF_START.items():
            if own in quarters and start in quarters and np.array_equal(quarters[own], quarters[start], equal_nan=True):
                del quarters[own]
        rows += [{"mode": mode, "metric": key, **{f"q{i + 1}": float(v) for i, v in enumerate(q)}}
                 for key, q in quarters.items()]  # fmt: skip
    return rows


def wall_clock(h: list[dict], step: int) -> float:
    """Seconds of training steps (``timing_s/step``) a run took to reach ``step``."""
    steps, seconds = series(h, "timing_s/step")
    return float(seconds[(steps > 0) & (steps <= step)].sum()) if len(seconds) else math.nan


def across_seeds(
    runs: dict[int, dict[str, list[dict]]], decode_vs_off: dict[int, dict[str, float]] | None = None
) -> tuple[list[dict], list[dict]]:
    """A multi-seed A/B (seed -> mode -> history): a row per mode and seed (means over steps, the wall-clock to the
    last step every run reached), and a row per mode against spec off. The modes sample one distribution, so a mode's
    mean reward over its seeds must lie within the seed spread of spec off's: the larger of the two modes' ranges of
    per-seed means (one seed alone has none: no verdict). ``decode_vs_off`` (seed -> mode -> ratio): each run's
    decode speed at equal work over its seed's spec off (the report's, from the timelines)."""
    decode_vs_off = decode_vs_off or {}
    common = min(
        int(series(h, "timing_s/step")[0].max(initial=0)) for by_mode in runs.values() for h in by_mode.values()
    )
    per_seed = [
        {
            "mode": mode,
            "seed": seed,
            "rollout_tok_s": mean_of(h, "rollout/throughput_tok_s"),
            "tail_tok_s": mean_of(h, "rollout/tail_throughput_tok_s"),
            "accept_len": mean_of(h, "rollout/tokens_per_request_step"),
            "reward": mean_of(h, "train/gen_score_mean"),
            "wall_clock_s": wall_clock(h, common),
            "to_step": common,
            "decode_vs_off": decode_vs_off.get(seed, {}).get(mode, math.nan),
        }
        for seed, by_mode in sorted(runs.items())
        for mode, h in by_mode.items()
    ]
    by_mode: dict[str, list[dict]] = {}
    for row in per_seed:
        by_mode.setdefault(row["mode"], []).append(row)
    off = by_mode.get("off", [])
    off_at = {r["seed"]: r for r in off}
    summary = []
    for mode, rows in by_mode.items():
        if mode == "off" or not off:
            continue
        paired = [(r, off_at[r["seed"]]) for r in rows if r["seed"] in off_at]  # the same seed's spec off
        rewards, off_rewards = [r["reward"] for r in rows], [r["reward"] for r in off]
        spread = max(np.ptp(rewards), np.ptp(off_rewards))
        difference = float(np.mean(rewards) - np.mean(off_rewards))
        summary.append(
            {
                "mode": mode,
                "seeds": len(rows),
                **{
                    f"{key}_vs_off": ratio_interval([r[key] / o[key] for r, o in paired])[0]
                    for key in ("rollout_tok_s", "tail_tok_s")
                },
                "decode_vs_off": ratio_interval([r["decode_vs_off"] for r, _ in paired])[0],
                "speedup_to_step": ratio_interval([o["wall_clock_s"] / r["wall_clock_s"] for r, o in paired])[0],
                "reward_minus_off": difference,
                "reward_seed_spread": float(spread),
                "agrees": "-" if spread == 0 else ("yes" if abs(difference) <= spread else "NO"),
            }
        )
    return per_seed, summary
