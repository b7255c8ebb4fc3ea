"""Draft a token only where it pays: the expected accepted tokens per second of an engine step with the draft
must beat the step without it.

A speculative step costs ``a + b * rows + c * drafted + (e + f * rows) * (drafted > 0)`` seconds (rows: requests in
the step; drafted: draft tokens it verifies; ``e + f * rows``: vLLM verifies a step with any draft through its
rejection sampler instead of its plain sampler, every row of it: on a CPU with a large vocabulary that switch costs a
big batch a large share of its step, results/real/verify_cost; ``a`` and ``c`` grow with the context the step's
requests hold, :class:`StepCost`) and yields ``rows + sum of accepted`` tokens. Adding one draft token whose chance of
being accepted (together with every draft token before it) is ``p`` raises tokens per second exactly when
``p > c * tokens / seconds``, so each request drafts the prefix of its draft whose chances clear that threshold
(Dinkelbach's iteration for a ratio, a few rounds), and the step drafts at all only if that beats the step without
drafts, the switch included. Where verification is dear relative to the step (a big batch on a compute-bound CPU,
where a drafted token costs about what a request does) nothing clears it and the step runs as spec off would; where
the step is mostly fixed cost (the long tail, a memory-bound GPU) cheap drafts pass.

Both sides are learned online in the proposer, from what vLLM reports anyway:
- :class:`StepCost`: ``a, b, c, e, f`` (and the context terms ``g, h``) by exponentially weighted non-negative least
  squares on the time between consecutive ``propose`` calls (one engine step), its rows and the draft tokens sent for
  it; ``c`` and ``f`` are pulled towards ``b`` (a drafted token, and switching a row to verification, cost what a
  request's token costs: a compute-bound step's price, about what this CPU measures) until drafting data say
  otherwise, so an engine that has not drafted yet does not assume drafts are free. That prior never learns where it
  is wrong (a step whose per-row cost is the engine's Python work, not arithmetic: a drafted token is then nearly
  free), so until ``EXPLORE_UNTIL`` observed steps have carried drafts, one step in ``EXPLORE_EVERY`` sends the draft
  tokens whose chance is at least ``EXPLORE_CHANCE`` whatever the cost says: a one-off price per engine. (Restricted
  to the long tail it rarely ran and the prior's price stuck: results/FINDINGS.md, "Exploration only in the tail".)
- :class:`AcceptanceModel`: the chance that draft position ``j`` is accepted given the positions before it were,
  counted per source (the request's own text, its prompt's responses, every prompt's), match-length band and, with
  ``scored``, the token's evidence level (:mod:`sam.cells`). It learns from
  *shadow drafts* (:class:`ShadowDrafts`): every request's full draft, sent or not, checked against the tokens the
  request then verifies, so chances are known at batch sizes where nothing has been drafted yet (a rule that learned
  only from sent drafts would never learn where its prior says no). Verified tokens are what spec off would sample
  (lossless verification), so the check is the teacher-forced acceptance of the draft.
"""

from __future__ import annotations

import importlib.metadata
import logging

import numba as nb
import numpy as np
import scipy.linalg
import scipy.optimize

from sam.cells import LEVELS, MATCH_BANDS, SOURCES, bands, likeliest_gain

EXPLORE_UNTIL = 32  # steps with drafts an engine observes before it stops exploring what drafting costs
EXPLORE_EVERY = 16  # ... on one step in this many
EXPLORE_CHANCE = 0.5  # ... with the draft tokens at least this likely to be accepted
PRICED_AFTER = 8  # timed steps before a step's cost is priced
PRIOR_MIN_ROW_SHARE = 0.01  # the prior (a draft token costs a request) prices drafts only where requests carry at
# least this share of the mean step's cost; below it the prior calls drafts free, so drafting waits for a timed step
# that carried drafts (an exploring one): a prior price of 0 for a model whose per-row cost fits 0 would otherwise
# send no draft, explore nothing, and never learn what a draft costs
CATCH_UP_EVERY = 4  # where no draft token can pay, the drafter works (takes the tokens verified since, settles
# and starts shadow drafts) on one step in this many (sam.vllm.SAMProposer.propose)


class AcceptanceModel:
    """Conditional acceptance per (source, match band, evidence level, draft position), from verified drafts: the
    evidence level (:mod:`sam.cells`) separates, within a band, a continuation most responses took from one seen
    once, which the band alone mixed (results/real/teacher_forced). Unscored
    drafts all count at level 0."""

    def __init__(self, k: int, prior_mean: float = 0.05, prior_weight: float = 4.0, levels: bool = False) -> None:
        # a pessimistic prior: a cell never seen is not worth drafting (an optimistic one sent drafts from rarely seen
        # bands that were seldom accepted: results/FINDINGS.md, "An optimistic acceptance prior"); shadow drafts
        # bring the evidence without sending anything
        shape = (SOURCES, MATCH_BANDS.size, LEVELS, k)
        self.reached = np.full(shape, prior_weight)  # draft tokens verified with every earlier position accepted
        self.accepted = np.full(shape, prior_mean * prior_weight)
        self.observed = 0  # drafts settled so far
        self.prior = (prior_mean, prior_weight)
        self.levels = levels  # drafts are counted by evidence level (``scored``): a level's chance is shrunk towards
        # its source and band's over every level (:meth:`conditional`)
        self._table = np.empty(shape)  # that table, computed once per change of the counts (three reads a step)
        self._table_at = -1  # ``observed`` when it was computed
        self._ones = np.ones(shape)  # the table's denominators, for the kernels that read counts

    def state_dict(self) -> dict:
        return {"reached": self.reached.copy(), "accepted": self.accepted.copy(), "observed": self.observed}

    def load_state_dict(self, state: dict) -> None:
        if state["reached"].shape != self.reached.shape:
            raise ValueError(
                f"SAM acceptance counts of shape {state['reached'].shape} cannot be loaded into a model of shape "
                f"{self.reached.shape}: the checkpoint comes from another num_speculative_tokens or an older SAM"
            )
        self.reached, self.accepted = state["reached"].copy(), state["accepted"].copy()
        self.observed = int(state["observed"])
        self._table_at = -1

    def band(self, match_len: np.ndarray) -> np.ndarray:
        return bands(np.ascontiguousarray(match_len, dtype=np.int64))

    def conditional(self) -> np.ndarray:
        """[source, band, level, position]: the chance that a draft token in that cell is accepted if every token
        before it was (what the drafting kernel scores candidate drafts by).

        With ``levels``, a level's counts are shrunk towards its source and band's chance over every level (with the
        pessimistic prior), at the prior's weight: a level seen rarely starts where its band is, not at the prior.
        Every level starting at the prior cut most drafts until each was learned (results/FINDINGS.md, "Evidence
        levels at the prior")."""
        if self._table_at != self.observed:  # every count change settles a draft, which ``observed`` counts
            if self.levels:
                _shrunk_chances(self.accepted, self.reached, *self.prior, self._table)
            else:
                np.divide(self.accepted, self.reached, out=self._table)
            self._table_at = self.observed
        return self._table

    def best_row_gain(self, token_cost: float) -> float:
        """What one request's draft can gain at most, in accepted tokens less ``token_cost`` per token sent: the best
        over sources, match bands and lengths, taking at every position the likeliest evidence level (an upper bound
        of any real draft's, whose levels are what its tokens have; :func:`nothing_can_pay`)."""
        return _best_row_gain(self.conditional(), token_cost)

    def chances(self, group: np.ndarray, band: np.ndarray, level: np.ndarray) -> np.ndarray:
        """[rows, k]: the chance that the first j + 1 draft tokens of each row are all accepted (``level``: [rows, k]
        evidence levels)."""
        out = np.empty(level.shape, dtype=np.float64)
        if self.levels:
            _chances(self.conditional(), self._ones, group, band, level, out)
        else:
            _chances(self.accepted, self.reached, group, band, level, out)
        return out

    def observe(
        self, group: np.ndarray, band: np.ndarray, level: np.ndarray, drafted: np.ndarray, accepted: np.ndarray
    ) -> None:
        """Rows that drafted ``drafted`` tokens of which the first ``accepted`` were accepted."""
        _count_drafts(self.reached, self.accepted, group, band, level, drafted, accepted)
        self.observed += int(drafted.size)


@nb.njit(cache=True)
def _shrunk_chances(accepted, reached, mean, weight, out) -> None:
    """:meth:`AcceptanceModel.conditional` with levels: each cell's observed counts (its prior taken out) shrunk
    towards its source, band and position's chance over every level (with the prior), at the prior's weight."""
    for source in range(accepted.shape[0]):
        for band in range(accepted.shape[1]):
            for j in range(accepted.shape[3]):
                hits = seen = 0.0
                for level in range(accepted.shape[2]):
                    hits += accepted[source, band, level, j] - mean * weight
                    seen += reached[source, band, level, j] - weight
                pooled = (hits + mean * weight) / (seen + weight)
                for level in range(accepted.shape[2]):  # the stored counts hold the prior's weight: observed + weight
                    cell = source, band, level, j
                    out[cell] = (accepted[cell] - mean * weight + weight * pooled) / reached[cell]


@nb.njit(cache=True)
def _best_row_gain(chance_table, token_cost) -> float:
    best = 0.0
    for source in range(chance_table.shape[0]):
        for band in range(chance_table.shape[1]):
            best = max(best, likeliest_gain(chance_table, source, band, token_cost)[0])
    return best


@nb.njit(cache=True)
def _chances(accepted, reached, group, band, level, out) -> None:
    for r in range(level.shape[0]):
        chance = 1.0
        for j in range(level.shape[1]):
            cell = group[r], band[r], level[r, j], j
            chance *= accepted[cell] / reached[cell]
            out[r, j] = chance


@nb.njit(cache=True)
def _count_drafts(reached, accepted, group, band, level, drafted, hits) -> None:
    for r in range(drafted.shape[0]):
        _count_draft(reached, accepted, group[r], band[r], level[r], drafted[r], hits[r])


@nb.njit(cache=True, inline="always")
def _count_draft(reached, accepted, group, band, level, drafted, hits) -> None:
    """One settled draft of ``drafted`` tokens whose first ``hits`` were accepted, into the acceptance counts: each
    position verified with every token before it accepted is reached, each of the first ``hits`` accepted."""
    for j in range(min(hits, drafted - 1) + 1):
        reached[group, band, level[j], j] += 1.0
        if j < hits:
            accepted[group, band, level[j], j] += 1.0


TERMS = 7  # StepCost's terms: a, b, c, e, f, g, h
PRIOR_STEPS = 16  # observed steps a device prior weighs as (StepCost)
PRIOR_ENTRY_POINTS = "spec_rollout.step_cost_prior"  # where device_prior finds step-cost predictions (the recipe's)
SOLVE_EVERY = (4, 16)  # the cost fit is solved every this many observed steps: the first while the fit is young
SOLVE_YOUNG = 64  # (fewer observed steps than this), then the second: a solve right after the forward has evicted
# the caches costs as much as much of the proposer's other work in a big batch


@nb.njit(cache=True)
def _forget_and_add(xtx, xty, decay, rows, drafted, context, seconds, weight) -> None:
    """``xtx = decay * xtx + w x x'`` and ``xty = decay * xty + w x * seconds``, in place, for a step's features ``x``
    (:class:`StepCost`'s terms: 1, rows, drafted, switched, switched * rows, context, drafted * context / rows): one
    compiled call instead of a dozen array operations, each of them cache misses after the engine's forward."""
    switched = 1.0 if drafted > 0 else 0.0
    attended = drafted * context / rows if rows > 0 else 0.0
    x = (1.0, float(rows), float(drafted), switched, switched * rows, float(context), attended)
    for i in range(TERMS):
        xty[i] = decay * xty[i] + weight * x[i] * seconds
        for j in range(TERMS):
            xtx[i, j] = decay * xtx[i, j] + weight * x[i] * x[j]


class StepCost:
    """Seconds of an engine step as ``a + b * rows + c * drafted + (e + f * rows) * (drafted > 0) + g * context
    + h * drafted * context / rows``, by non-negative least squares with exponential forgetting. ``context``: the
    tokens the step's requests hold (prompt and response so far), the KV cache a step reads once however many tokens
    each row verifies, so that long contexts make the plain step dearer and a draft relatively cheaper (a memory-bound
    accelerator's case); each drafted token also attends over its request's context (``h``, at the mean context).

    ``prior``: ``[rows, drafted, context, seconds]`` steps the fit starts from, weighed as :data:`PRIOR_STEPS`
    observed steps and forgotten as they are (the recipe's step-cost model's prediction for the engine's model and
    device, :func:`device_prior`); the cost is then priced and known before the engine's first timed step. Without
    one, the prior is the CPU-shaped tie of :meth:`_solve` (a draft token costs about a request's)."""

    def __init__(self, decay: float = 0.99, prior_steps: float = 0.05, prior: list[list[float]] | None = None) -> None:
        self.decay = decay
        self.prior_steps = prior_steps
        self.xtx = np.zeros((TERMS, TERMS))
        self.xty = np.zeros(TERMS)
        self.steps = 0.0  # weight of the observations held
        self.coef = np.zeros(TERMS)  # a, b, c, e, f, g, h
        self._observed = 0
        self.drafted_steps = 0  # observed steps that carried drafts (what c, e and f are learned from)
        self.from_prior = bool(prior)  # the cost was given a prior for this engine's model and device
        self.prior_coef = np.zeros(TERMS)  # that prior's cost, which the fit is pulled towards ...
        self.prior_scale = np.zeros(TERMS)  # ... per term in its own units (the prior steps' mean squared feature)
        self.prior_weight = 0.0  # ... with the weight of this many steps, forgotten as observed steps are
        if prior:
            xtx, xty = np.zeros((TERMS, TERMS)), np.zeros(TERMS)
            for rows, drafted, context, seconds in prior:
                _forget_and_add(xtx, xty, 1.0, int(rows), int(drafted), float(context), float(seconds), 1.0)
            self.prior_scale = np.diag(xtx) / len(prior)
            self.prior_coef = nonnegative_solve(xtx + 1e-9 * np.diag(np.diag(xtx) + 1.0), xty)
            self.prior_weight = float(PRIOR_STEPS)
            self.coef = self.prior_coef.copy()

    def seconds(self, rows: int, drafted: int, context: float = 0.0) -> float:
        a, b, c, e, f, g, h = self.coef.tolist()
        attended = drafted * context / rows if rows > 0 else 0.0
        return a + b * rows + c * drafted + (e + f * rows) * (drafted > 0) + g * context + h * attended

    def at(self, rows: int, context: float) -> np.ndarray:
        """``[a + g * context, b, c + h * context / rows, e, f]``: the cost of a step of ``rows`` requests holding
        ``context`` tokens, in the form :func:`payoff_cut` and :func:`nothing_can_pay` price a step by."""
        cost = self.coef[:5].copy()
        cost[0] += self.coef[5] * context
        cost[2] += self.coef[6] * context / max(rows, 1)
        return cost

    def observe(self, rows: int, drafted: int, seconds: float, context: float = 0.0) -> None:
        # a stall (another process, a pause) must not teach that drafts are dear or free: a step is clipped at 4x
        # what the fit predicts or the mean observed step, whichever is more (a fit still between a device prior that
        # is some times off and the engine's own steps would clip the real steps by its prediction alone, and keep them)
        if self._observed >= PRICED_AFTER:
            typical = max(self.seconds(rows, drafted, context), self.xty[0] / max(self.steps, 1e-9))
            seconds = min(seconds, 4.0 * typical + 1e-4)
        _forget_and_add(self.xtx, self.xty, self.decay, rows, drafted, context, seconds, 1.0)
        self.steps = self.decay * self.steps + 1.0
        self.prior_weight *= self.decay
        self.drafted_steps += int(drafted > 0)
        self._observed += 1
        every = SOLVE_EVERY[self._observed >= SOLVE_YOUNG]
        if self._observed % every == 0 or self.steps < 16:
            self._solve()

    def _solve(self) -> None:
        steps = max(self.steps, 1e-9)
        scale = self.xtx[1, 1] / steps
        if self.from_prior:  # pulled towards the device prior's cost at the prior's weight in steps like the ones
            # observed (each term in the units of the observed steps' features once there are some)
            units = np.diag(self.xtx) / steps if self.steps >= 1.0 else self.prior_scale
            pull = self.prior_weight * np.diag(units)
            reg, rhs = pull, self.xty + pull @ self.prior_coef
        else:
            # ridge pulling c and f towards b with the weight of prior_steps steps in each column's units (drafted
            # counts and switched rows like rows), e towards 0 as one step, g and h towards 0 in their own units (a
            # context term the steps cannot tell from rows and drafts stays out)
            draft_tie = np.array([0.0, -1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
            switch_tie = np.array([0.0, -1.0, 0.0, 0.0, 1.0, 0.0, 0.0])
            fixed_switch = np.array([0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
            context = np.diag([0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]) * np.diag(self.xtx) / steps
            reg = self.prior_steps * (
                scale * (np.outer(draft_tie, draft_tie) + np.outer(switch_tie, switch_tie))
                + np.outer(fixed_switch, fixed_switch)
                + context
            )
            rhs = self.xty
        # and a little towards 0 overall, each term in its own units
        coef = nonnegative_solve(self.xtx + reg + 1e-9 * np.diag(np.diag(self.xtx) / steps + 1.0), rhs)
        if coef is not None:
            self.coef = coef

    def state_dict(self) -> dict:
        """What the fit has learned from timed steps, for trainer checkpoints: a resumed run prices drafts as the
        uninterrupted one does instead of exploring their cost again (the prior's terms come from the constructor)."""
        return {
            "xtx": self.xtx.copy(),
            "xty": self.xty.copy(),
            "steps": self.steps,
            "coef": self.coef.copy(),
            "observed": self._observed,
            "drafted_steps": self.drafted_steps,
            "prior_weight": self.prior_weight,
        }

    def load_state_dict(self, state: dict) -> None:
        self.xtx, self.xty = np.array(state["xtx"], dtype=float), np.array(state["xty"], dtype=float)
        self.steps, self.coef = float(state["steps"]), np.array(state["coef"], dtype=float)
        self._observed, self.drafted_steps = int(state["observed"]), int(state["drafted_steps"])
        self.prior_weight = float(state["prior_weight"])

    @property
    def priced(self) -> bool:
        """Whether enough steps were timed (or given by a device prior) to price a step without drafts (exploring
        steps may then draft)."""
        return self.steps + self.prior_weight >= PRICED_AFTER

    @property
    def known(self) -> bool:
        """Whether a draft token has a price: from a device prior, from a timed step that carried drafts, or from the
        CPU-shaped prior where a request's cost is a real share of a step's (:data:`PRIOR_MIN_ROW_SHARE`)."""
        if not self.priced:
            return False
        if self.from_prior or self.drafted_steps > 0:
            return True
        return self.coef[1] * self.xtx[0, 1] >= PRIOR_MIN_ROW_SHARE * self.xty[0]

    @property
    def exploring(self) -> bool:
        """Whether too few steps with drafts were seen to price drafting (:data:`EXPLORE_UNTIL`); a device prior's
        price is checked the same way, by the engine's own drafted steps."""
        return self.drafted_steps < EXPLORE_UNTIL


class PinnedStepCost(StepCost):
    """A step cost given, not learned (``SAMOptions.payoff_cost``): drafting depends on the tokens alone."""

    def __init__(self, coef: list[float]) -> None:
        super().__init__()
        self.coef = np.zeros(TERMS)
        self.coef[: len(coef)] = coef  # [a, b, c, e, f], with g or g and h

    def observe(self, rows: int, drafted: int, seconds: float, context: float = 0.0) -> None:
        pass

    def load_state_dict(self, state: dict) -> None:
        pass  # the given cost stays, whatever a checkpoint learned

    @property
    def priced(self) -> bool:
        return True

    @property
    def known(self) -> bool:
        return True

    @property
    def exploring(self) -> bool:
        return False  # nothing to learn: drafting depends on the tokens alone


def nonnegative_solve(gram: np.ndarray, rhs: np.ndarray) -> np.ndarray | None:
    """The non-negative ``x`` minimising ``x' G x - 2 x' r`` (least squares from its normal equations), or None where
    ``G`` is not positive definite. Costs are non-negative: the best non-negative fit, not the free fit clipped (a
    per-row cost that noise made negative, clipped to 0, left the fixed cost it had inflated: every step was then
    priced too dear)."""
    try:
        chol = np.linalg.cholesky(gram)
    except np.linalg.LinAlgError:
        return None
    return scipy.optimize.nnls(chol.T, scipy.linalg.solve_triangular(chol, rhs, lower=True))[0]


def device_prior(vllm_config) -> list[list[float]] | None:
    """The steps (``[rows, drafted, context, seconds]``) a step-cost model predicts for this engine's model on its
    device, from the first entry point of :data:`PRIOR_ENTRY_POINTS` that answers (the recipe registers
    ``recipe.cost_model:payoff_prior``: a plugin point, so that sam does not import the recipe); None where none
    does (a CPU, a device the model has no figures for)."""
    for entry in importlib.metadata.entry_points(group=PRIOR_ENTRY_POINTS):
        try:
            prior = entry.load()(vllm_config)
        except Exception:  # a prior is an optimisation: the learned cost still works without one
            logging.getLogger(__name__).exception(
                "step-cost prior %s failed; learning the step cost from scratch", entry.name
            )
            continue
        if prior:
            return prior
    return None


def nothing_can_pay(model: AcceptanceModel, rows: int, cost: np.ndarray, margin: float = 0.0) -> bool:
    """Whether :func:`payoff_cut` must send nothing for a step of ``rows`` requests whatever their drafts: it sends
    drafts only if ``(rows + T) * P > (1 + margin) * rows * (P + E + c * N)`` (``T`` the sent tokens' chances, ``N``
    their count, ``P = a + b * rows`` the plain step, ``E = e + f * rows`` the switch to verification), that is if
    ``T - lam * N > rows * ((1 + margin) * (1 + E / P) - 1)`` with ``lam = (1 + margin) * rows * c / P``; each row
    adds at most :meth:`AcceptanceModel.best_row_gain` at ``lam`` to the left side, so where that is no more than the
    right side's share per row, no draft can pass. The switch term makes this bound hold on most steps of a big batch
    (where a draft token costs about a request's, ``lam`` nears 1) without drafting a token to learn it."""
    a, b, c, e, f = np.asarray(cost, dtype=np.float64).tolist()
    plain = max(a + b * rows, 1e-12)
    token_cost = (1.0 + margin) * rows * c / plain
    return model.best_row_gain(token_cost) <= (1.0 + margin) * (1.0 + (e + f * rows) / plain) - 1.0


def payoff_lengths(
    chances: np.ndarray, lengths: np.ndarray, rows: int, cost: np.ndarray, margin: float = 0.0, rounds: int = 3
) -> np.ndarray:
    """Draft lengths (at most ``lengths``) that maximise expected tokens per second of a step of ``rows`` requests
    whose cost is ``a, b, c, e, f`` (:class:`StepCost`): each row keeps the draft tokens whose ``chances`` exceed
    ``c * tokens / seconds``; none at all unless the step with them is expected to yield ``margin`` more tokens per
    second than without (the chances and costs are estimates: a draft that only breaks even on them loses to their
    errors)."""
    return payoff_cut(chances, lengths, rows, cost, margin, rounds)[0]


def payoff_cut(
    chances: np.ndarray, lengths: np.ndarray, rows: int, cost: np.ndarray, margin: float = 0.0, rounds: int = 3
) -> tuple[np.ndarray, float]:
    """:func:`payoff_lengths`, and the chance a draft token had to exceed (``c * tokens / seconds``: what a draft
    token sent costs in accepted tokens, which the drafter's next step picks each request's source by)."""
    a, b, c, e, f = np.asarray(cost, dtype=np.float64).tolist()
    keep = np.zeros(lengths.shape[0], dtype=np.int64)
    threshold = _payoff_cut(
        np.ascontiguousarray(chances, dtype=np.float64), lengths, rows, a, b, c, e, f, margin, rounds, keep
    )
    return keep, threshold


@nb.njit(cache=True)
def _take(chances, lengths, threshold, keep) -> tuple:
    """Per row the draft tokens whose chance exceeds ``threshold`` (chances fall with the position: a prefix of each
    draft) into ``keep``; returns (their chances' sum, their count)."""
    total, count = 0.0, 0
    for r in range(chances.shape[0]):
        keep[r] = 0
        for j in range(min(lengths[r], chances.shape[1])):
            if chances[r, j] > threshold:
                keep[r] += 1
                total += chances[r, j]
        count += keep[r]
    return total, count


@nb.njit(cache=True)
def _payoff_cut(chances, lengths, rows, a, b, c, e, f, margin, rounds, keep) -> float:
    """:func:`payoff_cut`'s body: writes the kept lengths into ``keep``, returns the threshold."""
    plain_seconds = a + b * rows
    e = e + f * rows  # switching this step's rows to verification
    threshold, total, count = 0.0, 0.0, 0
    if c <= 0.0:
        total, count = _take(chances, lengths, -1.0, keep)
    else:
        tokens, seconds = float(rows), plain_seconds + e
        for _ in range(rounds):
            threshold = c * tokens / max(seconds, 1e-12)
            total, count = _take(chances, lengths, threshold, keep)
            tokens = rows + total
            seconds = plain_seconds + e + c * count
    if count == 0 or (rows + total) * plain_seconds <= (1.0 + margin) * rows * (plain_seconds + e + c * count):
        keep[:] = 0
    return threshold


@nb.njit(cache=True)
def _advance_shadows(slots, tok_flat, tok_off, buf, n, pos, group, band, level, reached, accepted) -> int:
    """Check each row's newly verified tokens against its slot's pending shadow draft; a draft is settled at its
    first mismatch or when every token matched, and counted into the acceptance model's ``reached`` and ``accepted``
    (:meth:`AcceptanceModel.observe`'s counts, in place). Returns how many drafts settled."""
    done = 0
    for r in range(slots.shape[0]):
        s = slots[r]
        if s < 0 or n[s] == 0:
            continue
        for i in range(tok_off[r], tok_off[r + 1]):
            if tok_flat[i] == buf[s, pos[s]]:
                pos[s] += 1
                if pos[s] < n[s]:
                    continue
            _count_draft(reached, accepted, group[s], band[s], level[s], n[s], pos[s])
            done += 1
            n[s] = 0
            pos[s] = 0
            break
    return done


@nb.njit(cache=True)
def _start_shadows(slots, drafts, lengths, group, band, level, buf, n, pos, s_group, s_band, s_level) -> None:
    for r in range(slots.shape[0]):
        s = slots[r]
        if s < 0 or lengths[r] <= 0 or n[s] > 0:
            continue
        buf[s, :] = drafts[r]
        n[s] = lengths[r]
        pos[s] = 0
        s_group[s] = group[r]
        s_band[s] = band[r]
        s_level[s, :] = level[r]


@nb.njit(cache=True)
def _shadow_turns(slots, ks, n) -> None:
    for r in range(slots.shape[0]):
        s = slots[r]
        if s >= 0 and n[s] > 0:
            ks[r] = 0


class ShadowDrafts:
    """One pending full-length draft per request slot, checked against the tokens it verifies next."""

    def __init__(self, k: int, size: int = 64) -> None:
        self.k = k
        self.buf = np.zeros((size, k), dtype=np.int32)
        self.n = np.zeros(size, dtype=np.int64)
        self.pos = np.zeros(size, dtype=np.int64)
        self.group = np.zeros(size, dtype=np.int64)
        self.band = np.zeros(size, dtype=np.int64)
        self.level = np.zeros((size, k), dtype=np.int64)

    def _fit(self, slots: np.ndarray) -> None:
        size = int(slots.max()) + 1 if slots.size else 0
        if size <= self.n.size:
            return
        grow = max(size, 2 * self.n.size) - self.n.size
        self.buf = np.concatenate([self.buf, np.zeros((grow, self.k), dtype=np.int32)])
        self.level = np.concatenate([self.level, np.zeros((grow, self.k), dtype=np.int64)])
        self.n, self.pos, self.group, self.band = (
            np.concatenate([a, np.zeros(grow, dtype=np.int64)]) for a in (self.n, self.pos, self.group, self.band)
        )

    def resolve(self, slots: np.ndarray, tokens: np.ndarray, offsets: np.ndarray, model: AcceptanceModel) -> None:
        """Feed each row's newly verified tokens; drafts they settle are counted in ``model``."""
        self._fit(slots)
        model.observed += _advance_shadows(
            slots, tokens, offsets, self.buf, self.n, self.pos, self.group, self.band, self.level, model.reached,
            model.accepted,
        )  # fmt: skip

    def start(
        self,
        slots: np.ndarray,
        drafts: np.ndarray,
        lengths: np.ndarray,
        group: np.ndarray,
        band: np.ndarray,
        level: np.ndarray,
    ) -> None:
        """Rows whose slot has no pending draft take this step's full draft as their shadow."""
        self._fit(slots)
        _start_shadows(
            slots, drafts, lengths, group, band, level, self.buf, self.n, self.pos, self.group, self.band, self.level
        )

    def turns(self, slots: np.ndarray, ks: np.ndarray, step: int) -> None:
        """Cuts the draft budgets ``ks`` in place for a step where nothing can pay: on one such step in
        :data:`CATCH_UP_EVERY` the requests with no draft pending draft, for their shadow, on the others none does;
        the model still learns, at a fraction of the drafting work."""
        if step % CATCH_UP_EVERY:
            ks[:] = 0
            return
        self._fit(slots)
        _shadow_turns(slots, ks, self.n)

    def forget(self, slot: int) -> None:
        """A slot that is freed (its request finished) drops its pending draft."""
        if slot < self.n.size:
            self.n[slot] = 0
            self.pos[slot] = 0
