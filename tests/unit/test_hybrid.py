"""sam/hybrid.py without an engine: the payoff rule's choice between the MTP head's draft, SAM's and none, the head's
learned acceptance per depth of its draft chain, and the draft probabilities vLLM's rejection sampler reads."""

import json
import time

import numpy as np
import pytest
import torch

from sam.hybrid import (
    HeadAcceptance,
    HybridSAM,
    RowDraftProbs,
    prompts_in_step,
    recorded_acceptance,
    timed_on_device,
)
from sam.vllm import SAMProposer, standalone_config

K = 4
CHEAP = [0.01, 0.0001, 0.0001, 0.0, 0.0]  # seconds: a, b per row, c per draft token, e + f per row when drafting
DEAR = [0.001, 0.01, 0.01, 0.0, 0.005]  # a compute-bound big batch: a draft token costs what a request does


def proposer(cost: list[float], cls=HybridSAM) -> SAMProposer:
    return cls(standalone_config(K, {"payoff": True, "payoff_cost": cost, "global_sharing": False}))


def test_each_row_drafts_from_the_source_that_gains_more_and_nothing_where_no_draft_pays() -> None:
    p = proposer(CHEAP)
    chances = np.array([[0.95, 0.9, 0.85, 0.8], [0.3, 0.1, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    lengths = np.array([4, 2, 0])
    p.head_chance = np.full((3, 1), 0.6)
    sam_lengths = p._cut(3, chances, lengths)
    # row 0: SAM's four likely tokens beat one head token; rows 1-2: the head's 0.6 beats SAM's 0.3 and nothing
    assert p.head_rows.tolist() == [False, True, True]
    assert sam_lengths.tolist() == [4, 0, 0]

    p.head_rows = np.zeros(0, dtype=bool)
    p.head_chance = np.full((3, 1), 0.6)
    p.head_seconds = np.array([0.0, 3.0])  # the head's run dearer than any step: SAM's cut alone
    assert p._cut(3, chances, lengths).tolist() == [4, 2, 0]
    assert not p.head_rows.any()

    dear = proposer(DEAR)
    dear.head_chance = np.full((64, 1), 0.6)
    many = np.tile(chances[1:2], (64, 1))
    assert dear._cut(64, many, np.full(64, 2)).sum() == 0 and not dear.head_rows.any()


def test_without_head_chances_the_cut_is_sams() -> None:
    chances = np.array([[0.9, 0.5, 0.2, 0.0], [0.4, 0.1, 0.0, 0.0]])
    lengths = np.array([4, 2])
    hybrid, sam = proposer(CHEAP), proposer(CHEAP, SAMProposer)
    hybrid.head_chance = None
    assert hybrid._cut(2, chances, lengths).tolist() == sam._cut(2, chances, lengths).tolist()
    assert hybrid._token_cost == sam._token_cost and not hybrid.head_rows.any()


def test_a_step_where_only_the_head_can_pay_is_not_skipped() -> None:
    """SAM's bound says no draft can pay (its chances still at the pessimistic prior); a confident head on a cheap step
    can, so the step works; on a dear step neither can."""
    cheap, dear = proposer(CHEAP), proposer(DEAR)
    for p in (cheap, dear):
        p.head_chance = None
        assert p._nothing_can_pay(8)
        p.head_chance = np.full((8, 1), 0.7)
    assert not cheap._nothing_can_pay(8)
    assert dear._nothing_can_pay(8)


def test_head_acceptance_is_learned_per_request_and_shrunk_towards_the_engines() -> None:
    head = HeadAcceptance([0.5])
    assert head.chances(["a"]).tolist() == [[0.5]]
    for _ in range(20):
        head.observe("a", 1, 0)
    for _ in range(20):
        head.observe("b", 1, 1)
    a, b, new = head.chances(["a", "b", "c"])[:, 0]
    assert a < new < b  # each request's own record, a new one at the engine-wide rate
    assert new == pytest.approx(0.5, abs=0.05)  # half the drafts accepted, the later ones weighing a little more
    head.forget({"b"})
    assert head.chances(["a"])[0, 0] == pytest.approx(new)


def test_a_checkpoint_keeps_the_engine_wide_head_acceptance_not_the_prior() -> None:
    head = HeadAcceptance([0.9])
    for _ in range(50):
        head.observe("a", 1, 0)
    resumed = HeadAcceptance([0.9])
    resumed.load_state_dict(head.state_dict())
    assert resumed.by_depth[0] == head.by_depth[0] < 0.2  # the prior's 0.9 would draft where the head fails
    assert resumed.chances(["new"]).tolist() == head.chances(["new"]).tolist()


def test_draft_probabilities_are_the_heads_for_its_rows_and_point_masses_for_sams() -> None:
    head_probs = torch.softmax(torch.randn(3, 1, 10), dim=-1)
    probs = RowDraftProbs(head_probs, {1: [7, 2, 5]})
    assert torch.equal(probs[0, slice(None, 1)], head_probs[0, :1])
    sam_rows = probs[1, slice(None, 2)]
    assert sam_rows.shape == (2, 10) and sam_rows[0, 7] == 1 and sam_rows[1, 2] == 1 and sam_rows.sum() == 2


def test_the_recorded_acceptance_is_read_for_the_way_the_head_drafts(tmp_path) -> None:
    assert recorded_acceptance(tmp_path, "probabilistic") is None
    (tmp_path / "acceptance.json").write_text(json.dumps({"probabilistic": 0.52, "greedy": 0.27}))
    assert recorded_acceptance(tmp_path, "probabilistic") == [0.52]
    assert recorded_acceptance(tmp_path, "greedy") == [0.27]
    per_depth = {"probabilistic": 0.52, "accept_rate_pos": {"probabilistic": [0.52, 0.4, 0.45], "greedy": [0.3, 0.2]}}
    (tmp_path / "acceptance.json").write_text(json.dumps(per_depth))
    assert recorded_acceptance(tmp_path, "probabilistic") == [0.52, 0.4, 0.45]
    assert recorded_acceptance(tmp_path, "greedy") == [0.3, 0.2]


def test_a_step_that_sent_only_head_drafts_does_not_make_the_next_steps_defer() -> None:
    p = proposer(CHEAP)
    p.head_chance = np.full((2, 1), 0.6)
    rows = 2
    slots = np.array([-1, -1])
    drafts = np.zeros((rows, K), dtype=np.int32)
    group, mlen = np.zeros(rows, dtype=np.int64), np.zeros(rows, dtype=np.int64)
    level = np.zeros((rows, K), dtype=np.int64)
    lengths = p._pay(rows, slots, drafts, np.zeros(rows, dtype=np.int64), group, mlen, level, idle=False)
    assert lengths.tolist() == [0, 0] and p.head_rows.all()
    assert not p._quiet and p._last_drafted == 2  # the head's tokens are verified like SAM's


def chain_cut(cost: list[float], head_rates: list[float], chances: np.ndarray, lengths: np.ndarray, seconds: float):
    """The hybrid's cut of one step: SAM's drafts ``chances``/``lengths``, every row's head chain at ``head_rates``,
    the head's run ``seconds`` per row and depth."""
    p = proposer(cost)
    rows = chances.shape[0]
    p.head_chance = np.tile(np.cumprod(head_rates), (rows, 1))
    p.head_seconds = seconds * rows * np.arange(len(head_rates) + 1)
    kept = p._cut(rows, chances, lengths)
    return kept.tolist(), p.head_lengths.tolist()


@pytest.mark.parametrize(
    ("case", "cost", "head_rates", "seconds", "sam_kept", "head_kept"),
    [
        # a cheap step, a head good at every depth: each row without a likelier SAM draft takes the whole chain
        ("deep where cheap", CHEAP, [0.8, 0.8, 0.8], 0.0, [4, 0, 0], [0, 3, 3]),
        # later depths too unlikely to pay for their verification: the chain is cut to the depths that pay
        ("cut to what pays", [0.01, 0.0001, 0.001, 0.0, 0.0], [0.8, 0.2, 0.2], 0.0, [4, 0, 0], [0, 1, 1]),
        # sampling each depth costs more than a step: no head chain at all, SAM's cut alone
        ("head too dear", CHEAP, [0.8, 0.8, 0.8], 1.0, [4, 2, 0], [0, 0, 0]),
        # a dear step (every draft token costs a request): nothing at all
        ("nothing pays", DEAR, [0.8, 0.8, 0.8], 0.0, [0, 0, 0], [0, 0, 0]),
    ],
)
def test_the_cut_picks_each_rows_source_and_how_deep_the_heads_chain_goes(
    case, cost, head_rates, seconds, sam_kept, head_kept
) -> None:
    chances = np.array([[0.95, 0.9, 0.85, 0.8], [0.3, 0.1, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert chain_cut(cost, head_rates, chances, np.array([4, 2, 0]), seconds) == (sam_kept, head_kept), case


def test_head_acceptance_per_depth_counts_a_depth_only_where_the_chain_reached_it() -> None:
    """A chain reaches depth d only if depths 1..d-1 were accepted: a chain of 3 whose first token failed says nothing
    of depths 2 and 3; the chances are cumulative (depth 1's rate times the later ones')."""
    head = HeadAcceptance([0.5, 0.5, 0.5])
    for _ in range(400):
        head.observe("a", 3, 0)  # first token rejected
        head.observe("a", 3, 3)  # whole chain accepted
        head.observe("a", 3, 1)  # second token rejected
    rates = head.by_depth
    assert rates[0] == pytest.approx(2 / 3, abs=0.02)
    assert rates[1] == pytest.approx(1 / 2, abs=0.02)
    assert rates[2] == pytest.approx(1.0, abs=0.03)
    (row,) = head.chances(["new"])
    np.testing.assert_allclose(row, np.cumprod(rates))


def test_a_one_token_heads_checkpoint_fills_the_first_depth_of_a_deeper_head() -> None:
    deep = HeadAcceptance([0.5, 0.4])
    deep.load_state_dict({"drafts": 40.0, "accepted": 10.0})  # saved by a hybrid that drafted one token
    assert deep.reached.tolist() == [40.0, 0.0] and deep.accepted.tolist() == [10.0, 0.0]
    assert deep.by_depth[1] == pytest.approx(0.4)  # the prior where nothing was counted


def test_the_heads_run_is_priced_whole_at_every_depth_from_the_steps_it_ran_and_free_before() -> None:
    """The head runs only where its drafts are sent (small batches, chains of several depths): the fit of its layer and
    per-depth sampling prices a step of any size at every depth, and a head that never ran is free (it must run to be
    timed); a checkpoint keeps the fit."""
    from sam.hybrid import HeadCost

    def seconds(rows: int, depth: int) -> float:
        return 0.02 + 0.001 * rows + depth * (0.003 * rows + 0.004)

    fit = HeadCost()
    assert fit.step_seconds(8, 3).tolist() == [0.0] * 4
    for rows, depth in [(rows, depth) for rows in (1, 2, 4) for depth in (1, 2, 3)] * 4:
        fit.observe(rows, depth, seconds(rows, depth))
    for rows in (1, 8, 64):
        np.testing.assert_allclose(fit.step_seconds(rows, 3), [0.0] + [seconds(rows, d) for d in (1, 2, 3)], rtol=1e-3)
    resumed = HeadCost()
    resumed.load_state_dict(fit.state_dict())
    assert resumed.step_seconds(8, 2).tolist() == fit.step_seconds(8, 2).tolist()


class NotReadyYet:
    """What a GPU's head returns: the launch is back at once, the token ids only once the device has computed them."""

    def __init__(self, compute_s: float) -> None:
        self.compute_s = compute_s

    def tolist(self) -> list[list[int]]:
        time.sleep(self.compute_s)  # reading waits for the device
        return [[7, 8]]


def test_the_heads_time_includes_the_device_work_behind_its_result():
    """The hybrid prices the head by :func:`sam.hybrid.timed_on_device`: the clock runs until the ids are back, the
    device's work included."""
    ids, seconds = timed_on_device(lambda: NotReadyYet(0.05))
    assert ids == [[7, 8]] and seconds >= 0.05


@pytest.mark.parametrize(
    ("prefilled", "sampled", "prompts"),
    [
        (0, [[5], [7, 8]], False),  # decode rows only: the head may skip the step
        (1, [[5], [7, 8]], True),  # a request started: its prompt was prefilled in the step
        (0, [[5], []], True),  # a prompt prefilled in chunks (or a preempted request recomputed), not done yet
        (0, [], False),
    ],
)
def test_the_head_runs_its_layer_on_steps_that_hold_prompt_tokens(prefilled, sampled, prompts) -> None:
    assert prompts_in_step(prefilled, sampled) is prompts
