"""The drafting payoff rule (sam/payoff.py): the step-cost fit, the acceptance counts, the threshold, and the
proposer that learns both from its own calls (driven with a clock that advances by a known step cost)."""

import numpy as np
from test_sam_proposer import Driver, K, make_proposer

from sam.payoff import AcceptanceModel, StepCost, payoff_lengths


def test_step_cost_recovers_the_cost_of_rows_drafts_and_the_switch_to_verification():
    rng = np.random.default_rng(0)
    cost = StepCost(decay=0.999)
    a, b, c, e = 0.010, 0.002, 0.0005, 0.004
    for _ in range(600):
        rows, drafted = int(rng.integers(1, 64)), int(rng.integers(0, 100)) * int(rng.random() < 0.7)
        cost.observe(rows, drafted, (a + b * rows + c * drafted + e * (drafted > 0)) * rng.uniform(0.99, 1.01))
    assert np.allclose(cost.coef, [a, b, c, e], rtol=0.15), cost.coef


def test_without_drafting_data_a_draft_token_and_the_switch_are_priced_as_a_request():
    cost = StepCost()
    for rows in range(1, 60):
        cost.observe(rows, 0, 0.01 + 0.002 * rows)
    assert cost.known
    b = cost.coef[1]
    assert abs(cost.coef[2] - b) < 1e-6 and abs(cost.coef[3] - b) < 1e-6 and abs(b - 0.002) < 2e-4


def test_acceptance_counts_positions_reached_and_accepted():
    model = AcceptanceModel(k=3, prior_mean=0.5, prior_weight=2.0)
    group, band = np.zeros(100, np.int64), np.zeros(100, np.int64)
    # every draft of 3 had its first token accepted and its second rejected: the third was never verified
    model.observe(group, band, np.full(100, 3), np.full(100, 1))
    p = model.accepted[0, 0] / model.reached[0, 0]
    assert p[0] == (100 + 1) / (100 + 2) and p[1] == 1 / (100 + 2) and p[2] == 0.5
    chances = model.chances(np.array([0]), np.array([0]))[0]
    assert np.allclose(chances, np.cumprod(p))
    assert model.band(np.array([2, 3, 5, 8, 9, 40])).tolist() == [0, 1, 2, 3, 4, 5]


def test_a_draft_token_is_kept_only_where_its_chance_beats_the_cost_per_token_of_the_step():
    chances = np.array([[0.9, 0.5, 0.2], [0.3, 0.1, 0.05]])
    lengths = np.array([3, 3])
    # a compute-bound step: a draft token costs what a request costs, no fixed cost -> nothing pays
    assert payoff_lengths(chances, lengths, rows=2, cost=np.array([0.0, 1.0, 1.0, 0.0])).tolist() == [0, 0]
    # a mostly fixed-cost step: a token pays above c * tokens / seconds ~ 0.1 * 4.05 / 12.6 = 0.032, so all but the
    # last token of the second draft (0.05 passes, just)
    cost = np.array([10.0, 1.0, 0.1, 0.0])
    keep = payoff_lengths(chances, lengths, rows=2, cost=cost)
    tokens = 2 + chances[0, : keep[0]].sum() + chances[1, : keep[1]].sum()
    threshold = 0.1 * tokens / (12 + 0.1 * keep.sum())
    assert all((chances[r, : keep[r]] > threshold).all() for r in range(2))
    assert all(keep[r] == 3 or chances[r, keep[r]] <= threshold for r in range(2))
    assert keep.tolist() == [3, 3]
    # never longer than the draft the match rules gave
    assert payoff_lengths(chances, np.array([1, 0]), rows=2, cost=cost).tolist() == [1, 0]
    # a switch to verification dearer than what the drafts bring: (2 + 2.05) / (12 + 12 + 0.6) < 2 / 12
    assert payoff_lengths(chances, lengths, rows=2, cost=np.array([10.0, 1.0, 0.1, 12.0])).tolist() == [0, 0]
    # ... and one the drafts pay for: (2 + 2.05) / (12 + 11 + 0.6) > 2 / 12
    assert payoff_lengths(chances, lengths, rows=2, cost=np.array([10.0, 1.0, 0.1, 11.0])).tolist() == [3, 3]


class ClockedDriver(Driver):
    """Each propose call comes one engine step after the last: ``fixed + per_row * rows + per_draft * drafted``
    seconds on a fake clock, drafted being what the proposer drafted at the previous call."""

    def __init__(self, proposer, requests, fixed: float, per_row: float, per_draft: float):
        super().__init__(proposer, requests)
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
    # a draft token costs what a request does and no step cost is fixed: even a sure draft cannot pay
    assert drafted_tokens(fixed=0.0, per_row=0.01, per_draft=0.01) == 0
