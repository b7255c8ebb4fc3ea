"""recipe/bench/rollout.py's mode names: a ``#tag`` runs a second engine of the same mode (the A/A control)."""

import json
import math

import numpy as np
import pytest
from scipy import stats

from recipe.bench import rollout as bench_rollout


def test_a_tagged_mode_parses_as_the_mode_it_tags() -> None:
    defaults = bench_rollout.mode_defaults()
    assert bench_rollout.parse_mode("off#2", 8, defaults) == ("off", 0, None, None)
    tagged = bench_rollout.parse_mode("sam+group@32/k3/t2#b", 8, defaults)
    assert tagged == bench_rollout.parse_mode("sam+group@32/k3/t2", 8, defaults)
    method, k, sam, _ = tagged
    assert (method, k) == ("sam", 3)
    assert {key: sam[key] for key in ("batch_threshold", "tokens_per_match", "group_sharing")} == {
        "batch_threshold": 32,
        "tokens_per_match": 2.0,
        "group_sharing": True,
    }
    assert bench_rollout.parse_mode("sam#b/k3", 8, defaults) is None  # the tag ends the name
    assert bench_rollout.parse_mode("offf#2", 8, defaults) is None


def test_modes_named_for_the_spec_option_run_it_as_configs_spec_sets_it() -> None:
    """``sam``, ``mtp``, ``hybrid``: what spec=<mode> runs (the default SAM drafts from siblings and earlier epochs too);
    a hybrid takes SAM's letters."""
    from omegaconf import OmegaConf

    from recipe.dapo.config import spec_group

    defaults = bench_rollout.mode_defaults()
    sam = OmegaConf.to_container(spec_group("sam").sam)
    assert bench_rollout.parse_mode("sam", 256, defaults) == ("sam", 6, {**sam, "batch_threshold": 256}, None)
    assert bench_rollout.parse_mode("sam", 256, defaults) == bench_rollout.parse_mode("sam+group+epoch", 256, defaults)
    assert bench_rollout.parse_mode("sam-own", 256, defaults)[2]["group_sharing"] is False
    assert bench_rollout.parse_mode("mtp", 256, defaults) == ("mtp", 1, None, None)
    method, k, opts, _ = bench_rollout.parse_mode("hybrid/k4/y1", 256, defaults)
    assert (method, k, opts["payoff"], opts["cross_epoch"]) == ("hybrid", 4, True, True)


def test_same_token_pairs_compare_only_repeats_that_sampled_alike_and_rebuild_from_a_log(tmp_path) -> None:
    """A mode is paired with each spec-off engine only where both sampled as many tokens in a repeat; a run's printed
    lines rebuild the same table."""
    runs = {
        "off": [{"tokens": 100, "rollout_time_s": 2.0}, {"tokens": 90, "rollout_time_s": 3.0}],
        "sam": [{"tokens": 100, "rollout_time_s": 1.0}, {"tokens": 95, "rollout_time_s": 1.0}],
        "off#2": [{"tokens": 100, "rollout_time_s": 4.0}, {"tokens": 95, "rollout_time_s": 2.0}],
    }
    rows = {line.split(" | ")[0][2:]: line for line in bench_rollout.same_token_pairs(runs) if line.startswith("| ")}
    # vs off#2: 4.0 / 1.0 and 2.0 / 1.0; all three pairs: (2 * 4 * 2) ** (1 / 3)
    # per repeat: repeat 0 pairs with both engines (geometric mean of 2 and 4), repeat 1 with off#2 only (2)
    per_repeat = f"2, {math.sqrt(math.sqrt(8) * 2):.3f}x [{_bounds([math.sqrt(8), 2.0])}]"
    assert rows["sam"].endswith(f"| 1, 2.000x, 2.000-2.000 | 2, 2.828x, 2.000-4.000 | 3, **2.520x** | {per_repeat} |")
    assert rows["off#2"].endswith("| 1, 0.500x, 0.500-0.500 | - | 1, **0.500x** | 1, 0.500x |")
    log = tmp_path / "bench.log"
    log.write_text(
        "INFO engine started\n"
        + "".join(f"{rep} {name} " + json.dumps(s) + "\n" for name, ss in runs.items() for rep, s in enumerate(ss))
    )
    assert bench_rollout.read_rollouts([log]) == runs


def _bounds(ratios: list[float]) -> str:
    centre = np.mean(np.log(ratios))
    half = stats.t.ppf(0.975, len(ratios) - 1) * np.std(np.log(ratios), ddof=1) / math.sqrt(len(ratios))
    return f"{math.exp(centre - half):.3f}, {math.exp(centre + half):.3f}"


def test_runs_pooled_from_several_logs_pair_only_within_a_repeat_of_one_run(tmp_path) -> None:
    """Two runs with other mode sets pool one after the other: a mode one run lacks pairs with nothing there, and the
    second run's repeats never pair with the first's."""
    first = tmp_path / "a.jsonl"
    first.write_text(
        "".join(
            json.dumps({"repeat": rep, "mode": mode, "tokens": 10, "rollout_time_s": t}) + "\n"
            for rep, mode, t in ((0, "off", 2.0), (0, "sam", 1.0), (0, "sam#2", 4.0), (1, "off", 3.0), (1, "sam", 3.0))
        )
    )
    second = tmp_path / "b.jsonl"
    second.write_text(
        "".join(
            json.dumps({"repeat": rep, "mode": mode, "tokens": 10, "rollout_time_s": t}) + "\n"
            for rep, mode, t in ((0, "off", 1.0), (0, "noop", 2.0), (0, "sam", 0.5), (0, "sam#2", 1.0))
        )
    )
    runs = bench_rollout.read_rollouts([first, second])
    assert [s and s["rollout_time_s"] for s in runs["noop"]] == [None, None, 2.0]
    assert [s and s["rollout_time_s"] for s in runs["sam#2"]] == [4.0, None, 1.0]
    rows = {line.split(" | ")[0][2:]: line for line in bench_rollout.same_token_pairs(runs) if line.startswith("| ")}
    assert rows["sam"].startswith(f"| sam | 3, 1.587x, 1.000-2.000 | 3, **1.587x** | 3, 1.587x [{_bounds([2, 1, 2])}]")
    assert rows["noop"].startswith("| noop | 1, 0.500x, 0.500-0.500 |")
    assert rows["sam#2"].startswith("| sam#2 | 2, 0.707x, 0.500-1.000 |")


def test_the_ratio_interval_covers_the_true_ratio_at_its_level_even_from_three_repeats() -> None:
    """Student's t, not the normal quantile: from three log-normal ratios the 95% interval covers the true geometric
    mean in about 95% of draws (a normal quantile would cover about 80%); it is symmetric in log, so the inverse
    ratios give the inverse interval."""
    from recipe.ab.stats import ratio_interval

    rng = np.random.default_rng(0)
    draws = np.exp(0.02 + 0.05 * rng.standard_normal((2000, 3)))
    covered = [lo <= math.exp(0.02) <= hi for _, lo, hi in map(ratio_interval, draws)]
    assert 0.93 <= np.mean(covered) <= 0.97
    centre, lo, hi = ratio_interval(draws[0])
    inverse = ratio_interval(1 / draws[0])
    assert np.allclose(inverse, (1 / centre, 1 / hi, 1 / lo))
    assert math.isnan(ratio_interval([1.1])[1])


def test_same_token_pairs_by_band_pool_every_spec_off_engine_and_skip_bands_without_steps() -> None:
    """The band table pairs the same repeats as the whole-rollout table, band by band, and leaves out a pair where
    either rollout had no step in the band (NaN) rather than counting it as a zero."""
    nan = float("nan")
    keys = [bench_rollout.band_key(lo, hi) for lo, hi in ((1, 1), (2, 4), (5, 8), (9, 16), (17, 48), (49, 1 << 30))]

    def rollout(tokens: int, band_speeds: list[float]) -> dict:
        return {"tokens": tokens, "rollout_time_s": 1.0, **dict(zip(keys, band_speeds, strict=True))}

    runs = {
        "off": [rollout(100, [40, 30, 20, nan, nan, nan]), rollout(90, [40, 30, 20, nan, nan, nan])],
        "sam": [rollout(100, [80, 30, 10, nan, nan, nan]), rollout(95, [10, 10, 10, nan, nan, nan])],
        "off#2": [rollout(100, [nan, 60, 20, nan, nan, nan]), rollout(95, [40, 15, 40, nan, nan, nan])],
    }
    lines = bench_rollout.same_token_pairs(runs)
    first, second = (i for i, line in enumerate(lines) if line == BAND_HEADER)
    band_rows = {line.split(" | ")[0][2:]: line for line in lines[first:second] if line.startswith("| ")}
    by_repeat = {line.split(" | ")[0][2:]: line for line in lines[second:] if line.startswith("| ")}
    # pairs: (off, sam) in repeat 0, (off#2, sam) in repeats 0 and 1 (off sampled 90 tokens in repeat 1)
    # band 1: 80/40 and 10/40 (off#2 had no step there in repeat 0); 2-4: 30/30, 30/60, 10/15; 5-8: 10/20, 10/20, 10/40
    assert (
        band_rows["sam"]
        == "| sam | 0.707x (2, 0.25-2.00) | 0.693x (3, 0.50-1.00) | 0.397x (3, 0.25-0.50) | - | - | - |"
    )
    assert band_rows["off#2"] == "| off#2 | - | 2.000x (1, 2.00-2.00) | 1.000x (1, 1.00-1.00) | - | - | - |"
    # by repeat, band 5-8: repeat 0 pairs with both engines (10/20, 10/20), repeat 1 with off#2 (10/40)
    assert by_repeat["sam"].split(" | ")[3] == f"0.354x [{_bounds([0.5, 0.25])}] (2)"
    without_bands = {name: [{"tokens": 1, "rollout_time_s": 1.0}] for name in runs}
    assert BAND_HEADER not in bench_rollout.same_token_pairs(without_bands)  # logged without bands: whole rollouts


BAND_HEADER = "| mode | 1 | 2-4 | 5-8 | 9-16 | 17-48 | 49+ |"


def test_drafter_ms_splits_the_proposers_time_by_band_of_scheduled_rows() -> None:
    import math

    import numpy as np

    before = np.zeros((2, 65))
    before[:, 3] = [0.5, 100]  # earlier rollouts: not this one's
    after = before.copy()
    after[:, 3] += [0.002, 2]  # 2 steps of 3 rows, 1 ms each
    after[:, 6] += [0.004, 1]  # 1 step of 6 rows, 4 ms
    after[:, 64] += [0.020, 40]  # 40 steps of 64 rows, 0.5 ms each
    ms = bench_rollout.drafter_ms(before, after)
    expected = {"drafter_ms_2_4": 1.0, "drafter_ms_5_8": 4.0, "drafter_ms_49_inf": 0.5, "drafter_ms_per_step": 26 / 43}
    assert {key: ms[key] for key in expected} == pytest.approx(expected)
    assert math.isnan(ms["drafter_ms_1_1"]) and math.isnan(ms["drafter_ms_9_16"])  # no step there
    assert all(math.isnan(v) for v in bench_rollout.drafter_ms(None, None).values())  # not SAM
    runs = {"off": [bench_rollout.drafter_ms(None, None)], "sam": [ms, {**ms, "drafter_ms_5_8": 2.0}]}
    rows = [line for line in bench_rollout.drafter_ms_table(runs) if line.startswith("| sam")]
    assert rows == ["| sam | - | 1.000 | 3.000 | - | - | 0.500 |"]  # off has no row; the 5-8 band's median


def test_rival_pairs_compare_drafting_modes_repeat_by_repeat_at_spec_offs_batch_sizes() -> None:
    """Each drafting mode against each one after it (spec-off engines take no part but as the weights), one ratio per
    repeat; equal work weighs the bands by that repeat's spec-off time in them, over the bands both modes had steps
    in, and leaves out a repeat with under half its weight left or logged without time shares."""
    nan = float("nan")
    bands = ((1, 1), (2, 4), (5, 8), (9, 16), (17, 48), (49, 1 << 30))

    def rollout(tok_s: float, tail: float, speeds: list[float], shares: list[float] | None = None) -> dict:
        out = {"throughput_tok_s": tok_s, "tail_throughput_tok_s": tail}
        out.update({bench_rollout.band_key(*lohi): v for lohi, v in zip(bands, speeds, strict=True)})
        if shares is not None:
            out.update({bench_rollout.share_key(*lohi): v for lohi, v in zip(bands, shares, strict=True)})
        return out

    off = [0.25, 0.75, 0, 0, 0, 0]
    runs = {
        "off": [
            rollout(1.0, 1.0, [nan] * 6, off),
            rollout(1.0, 1.0, [nan] * 6, [0.6, 0.4, 0, 0, 0, 0]),
            rollout(1.0, 1.0, [nan] * 6),  # logged before rollouts kept their shares
            rollout(1.0, 1.0, [nan] * 6, off),
        ],
        "sam": [
            rollout(12.0, 6.0, [20, 10, nan, nan, nan, nan]),
            rollout(11.0, nan, [nan, 10, nan, nan, nan, nan]),
            rollout(10.0, 5.0, [20, 10, nan, nan, nan, nan]),
            None,  # a repeat this mode did not run
        ],
        "suffix": [rollout(10.0, 5.0, [10, 10, 30, nan, nan, nan], [0.9, 0.1, 0, 0, 0, 0])] * 4,
    }
    rows = [line for line in bench_rollout.rival_pairs(runs) if line.startswith("| ") and "---" not in line]
    assert rows[0].startswith("| mode | rival | tokens/s |")
    # repeat 0 at off's mix (not suffix's): 1 / (0.25 * 10/20 + 0.75 * 10/10) = 1 / 0.875; repeat 1: sam had no
    # step alone, 0.4 of the weight is left (no value); repeat 2: no shares; tails 6/5 and 5/5 (repeat 1 has none)
    whole = f"{(1.2 * 1.1 * 1.0) ** (1 / 3):.3f}x [{_bounds([1.2, 1.1, 1.0])}] (3)"
    tail = f"{math.sqrt(1.2):.3f}x [{_bounds([1.2, 1.0])}] (2)"
    assert rows[1:] == [f"| sam | suffix | {whole} | {tail} | {1 / 0.875:.3f}x (1) |"]
    runs["off"][1] = rollout(1.0, 1.0, [nan] * 6, [0.4, 0.6, 0, 0, 0, 0])  # 0.6 of the weight left: 10/10 there
    assert bench_rollout.rival_pairs(runs)[-1].endswith(f" | {_interval_text([1 / 0.875, 1.0])} (2) |")
    without_off = {name: runs[name] for name in ("sam", "suffix")}  # then the rival's own mix: 1 / (0.9/2 + 0.1)
    assert bench_rollout.rival_pairs(without_off)[-1].split(" | ")[-1].startswith(f"{1 / 0.55:.3f}x")
    assert bench_rollout.rival_pairs({"off": runs["off"], "sam": runs["sam"]}) == []  # no rival
    runs["off"][0] = None  # no spec-off rollout in repeat 0: its tokens/s still count, its equal work cannot
    assert bench_rollout.rival_pairs(runs)[-1].endswith(f" | {whole} | {tail} | 1.000x (1) |")
    old_log = {name: [{"tokens": 10, "rollout_time_s": 1.0}] for name in ("off", "sam", "suffix")}
    assert bench_rollout.rival_pairs(old_log)[-1] == "| sam | suffix | - | - | - |"  # logged without the keys


def _interval_text(ratios: list[float]) -> str:
    return f"{math.exp(np.mean(np.log(ratios))):.3f}x [{_bounds(ratios)}]"


def test_pooled_runs_say_which_source_the_hybrid_drafted_from_in_each_band(tmp_path) -> None:
    """``--pairs-from`` writes the hybrid's head share per band: the median over the rollouts that drafted there, '-'
    where none did; modes without the key get no row."""
    counts = {"tokens": 10, "rollout_time_s": 1.0, "accepted_tokens": 0, "draft_tokens": 0}
    rollouts = [
        {"repeat": 0, "mode": "off", **counts},
        {"repeat": 0, "mode": "hybrid", **counts, "head_share_1_1": 1.0, "head_share_2_4": 0.2},
        {"repeat": 1, "mode": "off", **counts},
        {"repeat": 1, "mode": "hybrid", **counts, "head_share_1_1": math.nan, "head_share_2_4": 0.6},
    ]
    log = tmp_path / "rollouts.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rollouts))
    bench_rollout.write_pooled(tmp_path / "out", [log], None)
    text = (tmp_path / "out" / "same_token_pairs.md").read_text()
    assert "| hybrid | 1.00 | 0.40 | - | - | - | - |" in text
    assert "| off | " not in text.split("MTP head's share")[1]


def test_the_pooled_table_has_each_depths_acceptance_and_the_one_prompt_runs_tokens_per_request_step(tmp_path) -> None:
    """Per-depth acceptance pools the rollouts' counts (accepted at depth k over those that reached it); a mode that
    drafted shallower leaves the deeper columns empty; the one-prompt runs give ``tail_run_tokens_per_request_step``."""
    import csv

    base = {"rollout_time_s": 1.0, "tokens_per_request_step": 1.0, "draft_tokens": 0, "accepted_tokens": 0}
    head = {**base, "tokens": 20, "drafts": 10, "draft_tokens": 30, "accepted_tokens": 11}
    rollouts = [
        {"repeat": 0, "mode": "off", "tokens": 10, "drafts": 0, **base},
        {"repeat": 0, "mode": "mtp/k3", **head, "accepted_pos_1": 6, "accepted_pos_2": 3, "accepted_pos_3": 2},
        {"repeat": 0, "mode": "sam", "tokens": 12, **base, "drafts": 4, "accepted_pos_1": 1},
        {"repeat": 1, "mode": "off", "tokens": 10, "drafts": 0, **base},
        {"repeat": 1, "mode": "mtp/k3", **head, "accepted_pos_1": 4, "accepted_pos_2": 3, "accepted_pos_3": 0},
        {"repeat": 1, "mode": "sam", "tokens": 12, **base, "drafts": 4, "accepted_pos_1": 3},
    ]
    tail = [{**r, "tokens_per_request_step": 2.5 if r["mode"] == "mtp/k3" else 1.0} for r in rollouts]
    for name, rows in (("main.jsonl", rollouts), ("tail.jsonl", tail)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    bench_rollout.write_pooled(tmp_path / "out", [tmp_path / "main.jsonl"], [tmp_path / "tail.jsonl"])
    with open(tmp_path / "out" / "rollout_e2e.csv") as fh:
        table = {row["mode"]: row for row in csv.DictReader(fh)}
    mtp, sam = table["mtp/k3"], table["sam"]
    assert [float(mtp[f"accept_rate_pos_{k}"]) for k in (1, 2, 3)] == pytest.approx([10 / 20, 6 / 10, 2 / 6], rel=1e-3)
    assert float(sam["accept_rate_pos_1"]) == pytest.approx(4 / 8) and sam["accept_rate_pos_2"] == ""
    assert float(mtp["tail_run_tokens_per_request_step"]) == 2.5


def test_rollouts_pair_by_the_digest_of_their_token_ids_not_by_how_many_there_are() -> None:
    """Two rollouts of as many tokens whose ids differ are not the same work; a log written before rollouts kept a
    digest pairs by the count."""
    from types import SimpleNamespace

    def digest(*responses: list[int]) -> str:
        return bench_rollout.tokens_hash([SimpleNamespace(token_ids=r) for r in responses])

    assert digest([1, 2], [3]) == digest([1, 2], [3])
    assert digest([1, 2], [3]) != digest([1, 3], [2])  # the same count, other tokens
    assert digest([1, 2], [3]) != digest([1], [2, 3])  # the same stream, split otherwise
    runs = {
        "off": [
            {"tokens": 3, "rollout_time_s": 2.0, "tokens_hash": digest([1, 2], [3])},
            {"tokens": 3, "rollout_time_s": 2.0},
        ],
        "sam": [
            {"tokens": 3, "rollout_time_s": 1.0, "tokens_hash": digest([1, 3], [2])},
            {"tokens": 3, "rollout_time_s": 1.0},
        ],
    }
    assert list(bench_rollout._paired(runs, "sam", "off")) == [1]
    runs["sam"][0]["tokens_hash"] = digest([1, 2], [3])
    assert list(bench_rollout._paired(runs, "sam", "off")) == [0, 1]
