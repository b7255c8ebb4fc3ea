"""The drafting payoff rule (sam/payoff.py): the step-cost fit, the acceptance counts, the threshold, and the
proposer that learns both from its own calls (driven with a clock that advances by a known step cost)."""

import numpy as np
import pytest
from test_sam_proposer import Driver, K, filed_responses, make_proposer

from sam.cells import OWN
from sam.payoff import (
    EXPLORE_EVERY,
    AcceptanceModel,
    ShadowDrafts,
    StepCost,
    nothing_can_pay,
    payoff_cut,
    payoff_lengths,
)


def test_step_cost_recovers_the_cost_of_rows_drafts_and_the_switch_to_verification():
    rng = np.random.default_rng(0)
    cost = StepCost(decay=0.999)
    a, b, c, e, f = 0.010, 0.002, 0.0005, 0.004, 0.001
    for _ in range(800):
        rows, drafted = int(rng.integers(1, 64)), int(rng.integers(1, 100)) * int(rng.random() < 0.7)
        seconds = a + b * rows + c * drafted + (e + f * rows) * (drafted > 0)
        cost.observe(rows, drafted, seconds * rng.uniform(0.99, 1.01))
    assert np.allclose(cost.coef[:5], [a, b, c, e, f], rtol=0.15), cost.coef
    assert not cost.coef[5:].any()  # no context was seen: no context terms


def test_step_cost_separates_the_context_a_step_reads_from_its_rows():
    """A memory-bound step pays for the KV cache its rows hold (context) apart from their count: the fit tells the
    two apart where contexts vary at a batch size, and prices a step by its context (``at``)."""
    rng = np.random.default_rng(1)
    cost = StepCost(decay=0.999)
    a, b, c, e, f, g, h = 0.004, 0.0002, 0.0001, 0.001, 0.00005, 2e-7, 5e-9
    for _ in range(1500):
        rows, drafted = int(rng.integers(1, 64)), int(rng.integers(1, 100)) * int(rng.random() < 0.5)
        context = rows * float(rng.uniform(100, 16000))
        seconds = (
            a + b * rows + c * drafted + (e + f * rows) * (drafted > 0) + g * context + h * drafted * context / rows
        )
        cost.observe(rows, drafted, seconds * rng.uniform(0.99, 1.01), context)
    assert np.allclose(cost.coef, [a, b, c, e, f, g, h], rtol=0.15), cost.coef
    assert np.allclose(cost.at(32, 32 * 8000.0), [a + g * 32 * 8000.0, b, c + h * 8000.0, e, f], rtol=0.15)


def test_a_device_prior_prices_drafts_before_the_first_step_and_is_then_learned_away():
    """The steps a step-cost model predicts (sam.payoff.device_prior) price a step from the engine's first one; the
    engine's own steps then replace them (the prior weighs PRIOR_STEPS steps and is forgotten as they are)."""
    true = np.array([0.003, 0.0001, 0.00005, 0.0005, 0.00002, 1e-7, 3e-9])

    def seconds(coef, rows, drafted, context):
        a, b, c, e, f, g, h = coef
        return a + b * rows + c * drafted + (e + f * rows) * (drafted > 0) + g * context + h * drafted * context / rows

    prior = [
        [rows, rows * k, rows * ctx, seconds(true, rows, rows * k, rows * ctx)]
        for rows in (1, 4, 16, 64, 256)
        for k in (0, 1, 4)
        for ctx in (512, 4096, 32768)
    ]
    cost = StepCost(prior=prior)
    assert cost.priced and cost.known and cost.exploring  # priced now; the price is still checked by drafting
    for rows, drafted, context, s in prior:
        assert abs(cost.seconds(rows, drafted, context) - s) < 0.02 * s + 1e-5, (rows, drafted, context)
    measured = true * 3  # the engine is three times slower than predicted: its own steps win
    rng = np.random.default_rng(2)
    for _ in range(600):
        rows, drafted = int(rng.integers(1, 64)), int(rng.integers(1, 100)) * int(rng.random() < 0.5)
        context = rows * float(rng.uniform(100, 16000))
        cost.observe(rows, drafted, seconds(measured, rows, drafted, context), context)
    assert np.allclose(cost.coef, measured, rtol=0.1), cost.coef


def test_without_drafting_data_a_draft_token_and_the_switch_are_priced_as_a_request():
    cost = StepCost()
    for rows in range(1, 60):
        cost.observe(rows, 0, 0.01 + 0.002 * rows)
    assert cost.known
    a, b, c, e, f, _, _ = cost.coef
    assert abs(c - b) < 1e-6 and abs(f - b) < 1e-6 and e < 1e-6 and abs(b - 0.002) < 2e-4


def fixed_cost_steps(cost: StepCost) -> None:
    """Plain steps of a tiny model: all fixed cost, a per-request slope within the noise (here slightly negative)."""
    for step in range(400):
        rows = 1 + step % 32
        cost.observe(rows, 0, 0.006 - 0.00002 * rows)


def test_a_cost_that_noise_makes_negative_is_fitted_as_zero_without_mispricing_the_average_step():
    """A tiny model's per-row cost is within the noise of its steps; the fit must stay non-negative and still price
    the average step it saw (the free fit clipped at zero kept the fixed cost that a negative slope had inflated)."""
    cost = StepCost(decay=0.999)
    fixed_cost_steps(cost)
    mean_seconds, mean_features = cost.xty[0] / cost.steps, cost.xtx[0] / cost.steps
    assert (cost.coef >= 0).all() and cost.coef[1] < 1e-6, cost.coef
    assert abs(cost.coef @ mean_features - mean_seconds) < 0.01 * mean_seconds, (cost.coef, mean_seconds)


def test_acceptance_counts_positions_reached_and_accepted():
    model = AcceptanceModel(k=3, prior_mean=0.5, prior_weight=2.0)
    group, band = np.zeros(100, np.int64), np.zeros(100, np.int64)
    level = np.tile([2, 5, 5], (100, 1))  # each token counts in its own evidence level
    # every draft of 3 had its first token accepted and its second rejected: the third was never verified
    model.observe(group, band, level, np.full(100, 3), np.full(100, 1))
    p = np.array([model.accepted[0, 0, 2, 0], model.accepted[0, 0, 5, 1], model.accepted[0, 0, 5, 2]])
    p /= np.array([model.reached[0, 0, 2, 0], model.reached[0, 0, 5, 1], model.reached[0, 0, 5, 2]])
    assert p[0] == (100 + 1) / (100 + 2) and p[1] == 1 / (100 + 2) and p[2] == 0.5
    assert (model.reached[0, 0, 5, 0], model.reached[0, 0, 2, 1]) == (2.0, 2.0)  # other levels untouched
    chances = model.chances(np.array([0]), np.array([0]), level[:1])[0]
    assert np.allclose(chances, np.cumprod(p))
    assert model.band(np.array([1, 2, 3, 5, 8, 9, 40])).tolist() == [0, 1, 2, 3, 4, 5, 6]


def test_shadow_drafts_are_settled_by_the_tokens_their_request_verifies_next():
    model = AcceptanceModel(k=3, prior_mean=0.5, prior_weight=2.0)
    shadows = ShadowDrafts(k=3, size=2)
    slots = np.array([0, 5])  # slot 5: beyond the initial size, grown on demand
    drafts = np.array([[7, 8, 9], [4, 4, 4]], dtype=np.int32)
    level = np.array([[1, 1, 1], [0, 0, 0]])  # slot 0's tokens count at evidence level 1
    shadows.start(slots, drafts, np.array([3, 2]), np.array([0, 1]), np.array([2, 0]), level)
    # one token per step, as a request that was sent no draft verifies: slot 0 matches 7 then misses (8 != 1)
    shadows.resolve(slots, np.array([7, 4], np.int32), np.array([0, 1, 2]), model)
    assert (model.reached == 2.0).all()  # nothing settled yet
    # a new full draft does not replace a pending one
    shadows.start(
        slots, np.array([[1, 1, 1], [1, 1, 1]], np.int32), np.array([3, 3]), np.array([1, 1]), np.array([0, 0]), level
    )
    shadows.resolve(slots, np.array([1, 4, 3], np.int32), np.array([0, 1, 3]), model)
    # slot 0: [7, 8, 9] vs 7, 1 -> 1 accepted of 3 (positions 0 and 1 verified); slot 5: [4, 4] vs 4, 4 -> 2 of 2
    assert (model.reached[0, 2, 1] - 2.0).tolist() == [1, 1, 0] and (model.accepted[0, 2, 1] - 1.0).tolist() == [
        1,
        0,
        0,
    ]
    assert (model.reached[1, 0, 0] - 2.0).tolist() == [1, 1, 0] and (model.accepted[1, 0, 0] - 1.0).tolist() == [
        1,
        1,
        0,
    ]
    assert (model.reached[0, 2, 0] == 2.0).all()  # slot 0's level was kept with its draft
    # settled slots take the next draft; a forgotten slot (its request finished) settles nothing
    shadows.start(slots, drafts, np.array([3, 2]), np.array([0, 1]), np.array([2, 0]), level)
    shadows.forget(0)
    before = model.reached.copy()
    shadows.resolve(slots[:1], np.array([7], np.int32), np.array([0, 1]), model)
    assert (model.reached == before).all()


def test_a_draft_token_is_kept_only_where_its_chance_beats_the_cost_per_token_of_the_step():
    chances = np.array([[0.9, 0.5, 0.2], [0.3, 0.1, 0.05]])
    lengths = np.array([3, 3])
    # a compute-bound step: a draft token costs what a request costs, no fixed cost -> nothing pays
    assert payoff_lengths(chances, lengths, rows=2, cost=np.array([0.0, 1.0, 1.0, 0.0, 0.0])).tolist() == [0, 0]
    # a mostly fixed-cost step: a token pays above c * tokens / seconds ~ 0.1 * 4.05 / 12.6 = 0.032, so all but the
    # last token of the second draft (0.05 passes, just)
    cost = np.array([10.0, 1.0, 0.1, 0.0, 0.0])
    keep = payoff_lengths(chances, lengths, rows=2, cost=cost)
    tokens = 2 + chances[0, : keep[0]].sum() + chances[1, : keep[1]].sum()
    threshold = 0.1 * tokens / (12 + 0.1 * keep.sum())
    assert all((chances[r, : keep[r]] > threshold).all() for r in range(2))
    assert all(keep[r] == 3 or chances[r, keep[r]] <= threshold for r in range(2))
    assert keep.tolist() == [3, 3]
    # never longer than the draft the match rules gave
    assert payoff_lengths(chances, np.array([1, 0]), rows=2, cost=cost).tolist() == [1, 0]
    # a switch to verification dearer than what the drafts bring: (2 + 2.05) / (12 + 10 + 2 + 0.6) < 2 / 12
    assert payoff_lengths(chances, lengths, rows=2, cost=np.array([10.0, 1.0, 0.1, 10.0, 1.0])).tolist() == [0, 0]
    # ... and one the drafts pay for: (2 + 2.05) / (12 + 9 + 2 + 0.6) > 2 / 12
    assert payoff_lengths(chances, lengths, rows=2, cost=np.array([10.0, 1.0, 0.1, 9.0, 1.0])).tolist() == [3, 3]


class ClockedDriver(Driver):
    """Each propose call comes one engine step after the last: ``fixed + per_row * rows + per_draft * drafted``
    seconds on a fake clock, drafted being what the proposer drafted at the previous call."""

    def __init__(self, proposer, requests, fixed: float, per_row: float, per_draft: float):
        super().__init__(proposer, requests, shuffle=False)
        self.now = 0.0
        self.cost = (fixed, per_row, per_draft)
        self.drafted = 0
        proposer.clock = lambda: self.now

    def step(self) -> dict[str, list[int]]:
        fixed, per_row, per_draft = self.cost
        rows = len([r for r in self.unfinished if self.emitted[r] < len(self.requests[r][1])])
        self.now += fixed + per_row * rows + per_draft * self.drafted
        out = super().step()
        self.drafted = sum(len(d) for d in out.values())
        return out


def periodic_requests(n: int) -> dict[str, tuple[list[int], list[int]]]:
    """Requests whose responses repeat a period (the match rules draft every step), of different lengths (the batch
    shrinks as they finish, which tells the fixed cost of a step from its cost per request)."""
    return {f"r{i}": ([1, 2, 3 + i], [10 + i, 11, 12, 13, 14] * (4 + 4 * i)) for i in range(n)}


def drafted_tokens(fixed: float, per_row: float, per_draft: float, requests: int = 12) -> int:
    proposer = make_proposer(payoff=True, batch_threshold=256)
    driver = ClockedDriver(proposer, periodic_requests(requests), fixed, per_row, per_draft)
    total = 0
    for _ in range(60):
        total += sum(len(d) for d in driver.step().values())
    return total


def test_the_proposer_drafts_where_steps_are_fixed_cost_and_not_where_a_draft_costs_a_request():
    # the step is mostly fixed cost (a memory-bound GPU, the long tail): drafts pay, about K per request-step
    assert drafted_tokens(fixed=0.05, per_row=0.001, per_draft=0.0002) > 0.5 * 12 * 5 * 26 * (K / (K + 1))
    # a draft token costs what a request does and no step cost is fixed: even a sure draft cannot pay; only the
    # exploring steps (one in 16, until 32 steps carried drafts) send any
    explored = drafted_tokens(fixed=0.0, per_row=0.01, per_draft=0.01)
    assert explored <= (60 // 16 + 1) * 12 * K


def test_drafts_that_only_break_even_on_the_estimates_are_not_sent_under_a_margin():
    chances = np.array([[0.5, 0.1]])
    cost = np.array([10.0, 1.0, 1.0, 0.0, 0.0])
    # one row: plain 1 token / 11 s; with the first draft token 1.5 tokens / 12 s: +37.5%
    assert payoff_lengths(chances, np.array([2]), rows=1, cost=cost, margin=0.3).tolist() == [1]
    assert payoff_lengths(chances, np.array([2]), rows=1, cost=cost, margin=0.4).tolist() == [0]


def test_a_pinned_step_cost_drafts_the_same_whatever_the_clock_and_a_checkpoint_keeps_the_acceptance_counts():
    pinned = {"payoff": True, "batch_threshold": 256, "payoff_cost": [0.05, 0.001, 0.0002, 0.0, 0.0002]}
    runs = []
    for per_row in (0.001, 0.05):  # two machines, one twice as slow per request as the other is in total
        proposer = make_proposer(**pinned)
        driver = ClockedDriver(proposer, periodic_requests(6), fixed=0.01, per_row=per_row, per_draft=0.0)
        runs.append([driver.step() for _ in range(30)])
    assert runs[0] == runs[1] and sum(len(d) for step in runs[0] for d in step.values()) > 50
    restored = make_proposer(**pinned)
    restored.load_state_dict(proposer.state_dict())
    assert restored.acceptance.observed == proposer.acceptance.observed > 0
    assert (restored.acceptance.accepted == proposer.acceptance.accepted).all()


def test_a_checkpoint_keeps_the_learned_step_cost_and_a_resumed_run_does_not_explore_it_again():
    proposer = make_proposer(payoff=True, batch_threshold=256)
    driver = ClockedDriver(proposer, periodic_requests(12), fixed=0.05, per_row=0.001, per_draft=0.0002)
    for _ in range(120):
        driver.step()
    learned = proposer.step_cost
    assert learned.known and not learned.exploring, learned.drafted_steps
    restored = make_proposer(payoff=True, batch_threshold=256)
    assert restored.step_cost.exploring  # a fresh engine would explore the cost again
    restored.load_state_dict(proposer.state_dict())
    assert np.array_equal(restored.step_cost.coef, learned.coef) and restored.step_cost.known
    assert not restored.step_cost.exploring
    assert restored.step_cost.seconds(32, 64) == learned.seconds(32, 64)
    pinned = make_proposer(payoff=True, batch_threshold=256, payoff_cost=[0.05, 0.001, 0.0002, 0.0, 0.0002])
    pinned.load_state_dict(proposer.state_dict())  # a given cost stays given
    assert pinned.step_cost.coef[:5].tolist() == [0.05, 0.001, 0.0002, 0.0, 0.0002]


def test_where_the_engine_is_per_row_overhead_the_cost_of_a_draft_is_explored_and_then_paid():
    # a step whose cost is all per request (Python work per row) and a drafted token nearly free: the prior (a draft
    # costs a request) alone would never draft; exploring steps learn c and the rule then drafts
    assert drafted_tokens(fixed=0.0, per_row=0.004, per_draft=0.0001) > 0.5 * 12 * 5 * 26 * (K / (K + 1))


def test_where_requests_cost_nothing_the_prior_does_not_call_drafts_free_and_drafting_is_explored():
    """A tiny model's steps are all fixed cost: the per-request cost fits 0 (or rounding's 1e-19), and the prior (a
    draft token costs a request) would price a draft at 0. A draft's price then comes only from a timed step that
    carried drafts, which an exploring step provides (on CI the price hinged on 0 vs 1e-19, and at 0 the engine never
    drafted, so it never explored)."""
    for decay in (0.99, 0.999):  # the fitted per-request cost: exactly 0, and 1e-19
        cost = StepCost(decay=decay)
        fixed_cost_steps(cost)
        assert cost.priced and not cost.known, cost.coef
        cost.observe(8, 20, 0.0065)
        assert cost.known, cost.coef
    proposer = make_proposer(payoff=True, batch_threshold=256)
    fixed_cost_steps(proposer.step_cost)
    driver = ClockedDriver(proposer, periodic_requests(12), fixed=0.006, per_row=-0.00002, per_draft=0.0001)
    drafted_at = []
    for _ in range(60):
        if any(driver.step().values()):
            drafted_at.append(proposer.steps)
    # the first draft is an exploring step's; what it taught then lets the cheap drafts pay on most steps after
    assert drafted_at and drafted_at[0] % EXPLORE_EVERY == 0 and len(drafted_at) > 30, drafted_at


def test_the_cut_reports_what_a_sent_draft_token_costs_at_its_fixed_point():
    """A token is worth sending when its chance beats c * tokens / seconds of the step with the drafts kept; the
    drafter picks the next step's sources at that cost."""
    chances = np.array([[0.9, 0.5, 0.15]])
    # c = 0.1 s per draft token, 1 s per step: all three pass at 0.1 (2.55 tokens in 1.3 s), two at 0.196, and two
    # at 0.2 (2.4 tokens in 1.2 s): the fixed point
    keep, threshold = payoff_cut(chances, np.array([3]), rows=1, cost=np.array([1.0, 0.0, 0.1, 0.0, 0.0]))
    assert keep.tolist() == [2] and threshold == pytest.approx(0.2)
    keep, threshold = payoff_cut(chances, np.array([3]), rows=1, cost=np.array([1.0, 0.0, 1.0, 0.0, 0.0]))
    assert keep.tolist() == [0] and threshold == pytest.approx(1.0)  # a token costing a whole step never pays


def test_where_the_bound_says_nothing_can_pay_the_cut_sends_nothing_and_it_is_not_vacuous():
    """nothing_can_pay is what lets the proposer skip its work, so it must never be true where the payoff cut would
    send a draft: random acceptance tables, step costs and batches, every row drafting K tokens from random cells.
    It must also hold where the older first-token test did not (the switch to verification is priced in), so that
    a big batch's steps are skipped."""
    rng = np.random.default_rng(3)
    skipped = sent = skipped_by_switch = 0
    for _ in range(400):
        model = AcceptanceModel(K)
        model.reached += rng.integers(0, 60, model.reached.shape)
        model.accepted = np.minimum(model.reached, model.accepted + rng.random(model.reached.shape) * model.reached)
        rows = int(rng.integers(1, 65))
        cost = rng.random(5) * np.array([0.03, 0.001, 0.001, 0.012, 0.0005])
        margin = float(rng.choice([0.0, 0.1]))
        skip = nothing_can_pay(model, rows, cost, margin)
        shape = model.reached.shape
        conditional = model.conditional()
        for trial in range(6):
            group, band = rng.integers(0, shape[0], rows), rng.integers(0, shape[1], rows)
            level = rng.integers(0, shape[2], (rows, K))
            if trial == 0:  # the worst case: every row drafts from one cell at each position's likeliest level
                level = conditional[group, band].argmax(axis=1)
            keep, _ = payoff_cut(model.chances(group, band, level), np.full(rows, K), rows, cost, margin)
            sent += int(keep.sum() > 0)
            assert not (skip and keep.sum() > 0)
        skipped += skip
        a, b, c, _e, _f = cost
        skipped_by_switch += skip and (model.conditional()[..., 0].max() > c * rows / (a + b * rows))
    assert sent > 100 and skipped > 50 and skipped_by_switch > 20


def test_where_nothing_can_pay_the_drafter_works_one_step_in_four_and_loses_no_token():
    """A step where no cell's first token beats the cut's lowest threshold sends nothing, so the drafter's work serves
    only its automata and the acceptance model. With the rows of the step before (nothing started or finished) it
    does none: one step in CATCH_UP_EVERY takes the tokens verified since from vLLM's token history, settles the
    shadow drafts and starts new ones for the requests with none pending. The automata then hold every verified
    token again, finished requests file their whole responses (their last tokens read from their request state),
    and the model still learns."""
    never_pays = {"payoff": True, "batch_threshold": 256, "payoff_cost": [0.0, 0.01, 0.01, 0.0, 0.0]}
    rollout = periodic_requests(8)
    proposers = [make_proposer(**never_pays), make_proposer(**never_pays)]
    proposers[1]._nothing_can_pay = lambda rows: False  # the same rule, drafting for every request on every step
    proposers[1]._defers = lambda idle: False  # ... even after a payoff cut that sent nothing
    calls = []
    for proposer in proposers:
        step_arrays = proposer.drafter.step_arrays
        ks_seen = []

        def counted(slots, tokens, offsets, ks, *args, _seen=ks_seen, _step=step_arrays):
            _seen.append(int((ks > 0).sum()))
            return _step(slots, tokens, offsets, ks, *args)

        proposer.drafter.step_arrays = counted
        driver = Driver(proposer, rollout, shuffle=False)
        while driver.unfinished:
            deferred = proposer.deferred_steps
            tracked = list(driver.unfinished)
            assert all(d == [] for d in driver.step().values())  # a token costs a request: never sent
            if proposer.deferred_steps == deferred:  # a step that worked: every verified token is in
                assert all(proposer.request_text(rid).tolist() == driver.text(rid) for rid in tracked)
        driver.step()
        assert filed_responses(proposer) == sorted(response for _prompt, response in rollout.values())
        calls.append(ks_seen)
    lazy, eager = proposers
    assert lazy.deferred_steps > 0.6 * lazy.steps and eager.deferred_steps == 0
    assert sum(calls[0]) < 0.4 * sum(calls[1])  # a quarter of the requests drafted for, or fewer ...
    assert 0.2 * eager.acceptance.observed <= lazy.acceptance.observed < eager.acceptance.observed  # ... still learning


def test_scored_drafting_counts_acceptance_by_evidence_level_and_the_default_by_source_and_band_only():
    pinned = {"payoff": True, "batch_threshold": 256, "payoff_cost": [0.05, 0.001, 0.0002, 0.0, 0.0002]}
    levels_used = {}
    for scored in (False, True):
        proposer = make_proposer(**pinned, scored=scored)
        Driver(proposer, periodic_requests(6)).run()
        counts = proposer.acceptance.reached - proposer.acceptance.reached.min()  # what was observed, per cell
        levels_used[scored] = {int(v) for v in np.nonzero(counts.sum(axis=(0, 1, 3)))[0]}
    assert levels_used[False] == {0} and len(levels_used[True]) > 1, levels_used


def test_scored_drafting_learns_every_source_not_only_the_one_it_picks():
    """A prompt's second rollout repeats its first response: its history drafts every next token right and is what
    the proposer sends, while its own text drafts a coin flip's token where the response flips one. The own text's
    chances are still learned in that rollout: each request's shadow drafts come from its sources in turn. Learning
    only from the drafts it picks, a source that is picked first is the only one ever learned and keeps winning
    (every prompt's responses held off each prompt's own history on the embedded task)."""
    rng = np.random.default_rng(0)
    response = [t for coin in rng.integers(0, 2, 150) for t in (20, 21, 30 + int(coin))]
    cheap = {"payoff": True, "batch_threshold": 256, "payoff_cost": [0.05, 0.001, 0.0002, 0.0, 0.0002]}
    proposer = make_proposer(**cheap, scored=True, group_sharing=False, cross_epoch=True)
    right, own_learned = [], []
    for rollout in range(2):
        driver = Driver(proposer, {f"r{rollout}": ([1, 2, 3], response)})
        own_before = proposer.acceptance.reached[OWN].sum()
        right.append([])
        while driver.unfinished:
            for rid, draft in driver.step().items():
                if draft and driver.emitted[rid] < len(response):
                    right[-1].append(draft[0] == response[driver.emitted[rid]])
        own_learned.append(proposer.acceptance.reached[OWN].sum() - own_before)
    own, history = (np.mean(r[len(r) // 2 :]) for r in right)
    assert own < 0.9 and history > 0.97, (own, history)
    assert own_learned[1] > own_learned[0] / 4, own_learned  # own drafts settled though history's were sent


def test_with_levels_a_level_never_seen_starts_at_its_bands_chance_and_one_seen_often_at_its_own():
    """Scored drafting counts twenty evidence levels per source and band: a level not seen yet takes its band's chance
    over every level, not the pessimistic prior that a band never seen keeps; the default's one level is unchanged."""
    n = 400
    group, band = np.zeros(n, np.int64), np.full(n, 2)
    level = np.full((n, K), 5)
    level[: n // 2] = 7
    hits = (np.arange(n) < n // 2).astype(np.int64)  # level 7 always accepted, level 5 never
    tables = {}
    for levels in (True, False):
        model = AcceptanceModel(K, levels=levels)
        model.observe(group, band, level, np.ones(n, np.int64), hits)
        tables[levels] = table = model.conditional()
        rows = np.array([7, 5, 9])[:, None].repeat(K, axis=1)
        chances = model.chances(np.zeros(3, np.int64), np.full(3, 2), rows)
        assert np.allclose(chances[:, 0], table[0, 2, [7, 5, 9], 0])
        likeliest = table.max(axis=2)  # the bound's draft: every position at its likeliest level
        for cost in (0.0, 0.3):
            best = max(0.0, np.cumsum(np.cumprod(likeliest, axis=2) - cost, axis=2).max())
            assert model.best_row_gain(cost) == pytest.approx(best)
    shrunk, plain = tables[True], tables[False]
    assert shrunk[0, 2, 7, 0] > 0.97 and shrunk[0, 2, 5, 0] < 0.03  # a level's own counts dominate
    assert shrunk[0, 2, 9, 0] == pytest.approx(0.5, abs=0.01)  # never seen: its band's chance
    assert shrunk[0, 3, 9, 0] == pytest.approx(0.05) == plain[0, 2, 9, 0]  # a band never seen, or no levels: the prior
    assert plain[0, 2, 7, 0] == pytest.approx((n / 2 + 0.2) / (n / 2 + 4))
