"""Draft a token only where it pays: the expected accepted tokens per second of an engine step with the draft
must beat the step without it.

A speculative step costs ``a + b * rows + c * drafted + e * (drafted > 0)`` seconds (rows: requests in the step;
drafted: draft tokens it verifies; ``e``: vLLM verifies a step with any draft through its rejection sampler instead
of its plain sampler) and yields ``rows + sum of accepted`` tokens. Adding one draft token whose chance of being
accepted (together with every draft token before it) is ``p`` raises tokens per second exactly when
``p > c * tokens / seconds``, so each request drafts the prefix of its draft whose chances clear that threshold
(Dinkelbach's iteration for a ratio, a few rounds), and the step drafts at all only if that beats the step without
drafts, ``e`` included. Where verification is dear relative to the step (a big batch on
a compute-bound CPU, where a drafted token costs about what a request does) nothing clears it and the step runs as
spec off would; where the step is mostly fixed cost (the long tail, a memory-bound GPU) cheap drafts pass.

Both sides are learned online in the proposer, from what vLLM reports anyway:
- :class:`StepCost`: ``a, b, c, e`` by exponentially weighted least squares on the time between consecutive
  ``propose`` calls (one engine step), its rows and the draft tokens proposed for it; ``c`` is pulled towards ``b``
  (a drafted token costs what a request's token costs, a compute-bound step's price) and ``e`` towards ``b`` too until
  drafting data say otherwise, so an engine that has not drafted yet does not assume drafts are free.
- :class:`AcceptanceModel`: the chance that draft position ``j`` is accepted given the positions before it were,
  counted per source (the request's own text or its group's responses) and match-length band from the next step's
  sampled tokens (accepted = sampled - 1).
"""

from __future__ import annotations

import numpy as np

MATCH_BANDS = np.array([0, 3, 4, 6, 9, 16], dtype=np.int64)  # match-length band edges: [2], [3], [4, 5], [6, 8], ...
SOURCES = 2  # 0: the request's own text, 1: group material (siblings, history)


class AcceptanceModel:
    """Conditional acceptance per (source, match band, draft position), from verified drafts."""

    def __init__(self, k: int, prior_mean: float = 0.3, prior_weight: float = 4.0) -> None:
        shape = (SOURCES, MATCH_BANDS.size, k)
        self.reached = np.full(shape, prior_weight)  # draft tokens verified with every earlier position accepted
        self.accepted = np.full(shape, prior_mean * prior_weight)

    def band(self, match_len: np.ndarray) -> np.ndarray:
        return np.searchsorted(MATCH_BANDS, match_len, side="right") - 1

    def chances(self, group: np.ndarray, band: np.ndarray) -> np.ndarray:
        """[rows, k]: the chance that the first j + 1 draft tokens of each row are all accepted."""
        return np.cumprod(self.accepted[group, band] / self.reached[group, band], axis=1)

    def observe(self, group: np.ndarray, band: np.ndarray, drafted: np.ndarray, accepted: np.ndarray) -> None:
        """Rows that drafted ``drafted`` tokens of which the first ``accepted`` were accepted."""
        k = self.reached.shape[2]
        pos = np.arange(k)
        reached = pos[None, :] <= np.minimum(accepted, drafted - 1)[:, None]  # verified with all before accepted
        hit = pos[None, :] < accepted[:, None]
        np.add.at(self.reached, (group, band), reached)
        np.add.at(self.accepted, (group, band), hit)


def features(rows: int, drafted: int) -> np.ndarray:
    return np.array([1.0, rows, drafted, float(drafted > 0)])


class StepCost:
    """Seconds of an engine step as ``a + b * rows + c * drafted + e * (drafted > 0)``, by least squares with
    exponential forgetting."""

    def __init__(self, decay: float = 0.99, prior_steps: float = 1.0) -> None:
        self.decay = decay
        self.prior_steps = prior_steps
        self.xtx = np.zeros((4, 4))
        self.xty = np.zeros(4)
        self.steps = 0.0  # weight of the observations held
        self.coef = np.zeros(4)  # a, b, c, e

    def seconds(self, rows: int, drafted: int) -> float:
        return float(self.coef @ features(rows, drafted))

    def observe(self, rows: int, drafted: int, seconds: float) -> None:
        if self.steps >= 8:  # a stall (another process, a pause) must not teach that drafts are dear or free
            seconds = min(seconds, 4.0 * self.seconds(rows, drafted) + 1e-4)
        x = features(rows, drafted)
        self.xtx = self.decay * self.xtx + np.outer(x, x)
        self.xty = self.decay * self.xty + x * seconds
        self.steps = self.decay * self.steps + 1.0
        self._solve()

    def _solve(self) -> None:
        # ridge pulling c and e towards b with the weight of prior_steps steps (each tie in its own column's units:
        # drafted counts like rows, the switch is 0 or 1), a little towards 0 overall
        scale = self.xtx[1, 1] / max(self.steps, 1e-9)
        draft_tie = np.array([0.0, -1.0, 1.0, 0.0])
        switch_tie = np.array([0.0, -1.0, 0.0, 1.0])
        reg = self.prior_steps * (scale * np.outer(draft_tie, draft_tie) + np.outer(switch_tie, switch_tie))
        reg += 1e-9 * np.eye(4) * (1.0 + scale)
        try:
            coef = np.linalg.solve(self.xtx + reg, self.xty)
        except np.linalg.LinAlgError:
            return
        self.coef = np.maximum(coef, 0.0)

    @property
    def known(self) -> bool:
        return self.steps >= 8 and self.coef[1] + self.coef[2] > 0


def payoff_lengths(
    chances: np.ndarray, lengths: np.ndarray, rows: int, cost: np.ndarray, rounds: int = 3
) -> np.ndarray:
    """Draft lengths (at most ``lengths``) that maximise expected tokens per second of a step of ``rows`` requests
    whose cost is ``a, b, c, e`` (:class:`StepCost`): each row keeps the draft tokens whose ``chances`` exceed
    ``c * tokens / seconds``; none at all if the step with them yields fewer tokens per second than without."""
    a, b, c, e = (float(v) for v in cost)
    plain_seconds = a + b * rows
    k = chances.shape[1]
    valid = np.arange(k)[None, :] < lengths[:, None]
    if c <= 0.0:
        take = valid
    else:
        tokens, seconds = float(rows), plain_seconds + e
        for _ in range(rounds):
            threshold = c * tokens / max(seconds, 1e-12)
            take = valid & (chances > threshold)  # chances fall with the position: a prefix of each draft
            tokens = rows + float(chances[take].sum())
            seconds = plain_seconds + e + c * float(take.sum())
    keep = take.sum(axis=1)
    gain = rows + float(chances[take].sum())
    if not keep.any() or gain * plain_seconds <= rows * (plain_seconds + e + c * float(keep.sum())):
        return np.zeros_like(lengths)
    return keep
