"""A rollout replayed on a step-cost model: how long a rollout of given response lengths takes on a model shape and a
device, spec off or with a drafter whose tokens per request-step are known by band of active requests.

The engine runs continuous batching: at most ``max_num_seqs`` requests decode at once, a waiting request takes the
first free slot. Every engine step each active request emits, on average, its drafter's tokens per request-step at the
step's batch size (1 without drafts); a request finishes when it has emitted its length. The step's time is
:func:`recipe.cost_model.step_seconds` at the step's batch, the requests' contexts (prompt plus tokens so far) and the
drafter's K. A drafter *with the payoff rule* drafts only where the expected tokens per second beat spec off's at that
batch size (what sam/payoff.py learns online); *every draft* drafts at every step. A drafter with an MTP ``head``
pays the head's forward in its steps (the caller's step cost prices it: recipe.cost_model.head_seconds). Acceptance
does not depend on the hardware, so tokens per request-step measured on a CPU carry to a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from recipe.dapo.timeline import ACTIVE_BANDS


@dataclass(frozen=True)
class Drafter:
    """What a drafter yields: ``k`` draft tokens a step, ``tokens_per_step[i]`` tokens per request-step in band i of
    :data:`ACTIVE_BANDS`; ``payoff``: it drafts only where that pays at the step's batch size; ``head``: its drafts
    come from an MTP head."""

    name: str
    k: int
    tokens_per_step: tuple[float, ...]
    payoff: bool = True
    head: bool = False

    def tokens_at(self, batch: int) -> float:
        return self.tokens_per_step[band_index(batch)]


SPEC_OFF = Drafter("off", 0, (1.0,) * len(ACTIVE_BANDS), payoff=False)


def band_index(batch: int) -> int:
    return next(i for i, (lo, hi) in enumerate(ACTIVE_BANDS) if lo <= batch <= hi)


@dataclass
class ReplayResult:
    seconds: float
    tail_seconds: float  # steps with at most ``tail`` active requests
    steps: int
    drafted_steps: int
    tokens: int

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds


StepCost = Callable[[int, np.ndarray, int], float]  # (batch, contexts, k) -> seconds


def replay(
    lengths: Sequence[int],
    prompt_tokens: int,
    drafter: Drafter,
    step_cost: StepCost,
    max_num_seqs: int = 256,
    tail: int = 8,
    prefill: Callable[[int], float] | None = None,
) -> ReplayResult:
    """Replay a rollout of responses of ``lengths`` tokens (requests admitted in order) with ``drafter``;
    ``prefill(n)``: the seconds prefilling ``n`` prompts admitted at once adds to the step that admits them (None: free).

    Between two finishes the batch is fixed and every context grows by the same tokens a step, and a step's cost is
    affine in the contexts' sum (recipe/cost_model.py), so each such stretch of steps is priced at once, at its middle
    step: exact for that cost model, and as many iterations as responses."""
    remaining = list(np.asarray(lengths, dtype=np.float64)[::-1])  # a stack: the next request to admit is last
    total = int(np.sum(lengths))
    done = np.zeros(0)  # tokens emitted by each active request
    todo = np.zeros(0)  # each active request's length
    seconds = tail_seconds = 0.0
    steps = drafted = 0
    while remaining or todo.size:
        free = max_num_seqs - todo.size
        prefill_s = 0.0
        if free > 0 and remaining:
            admitted = [remaining.pop() for _ in range(min(free, len(remaining)))]
            todo = np.concatenate([todo, admitted])
            done = np.concatenate([done, np.zeros(len(admitted))])
            prefill_s = prefill(len(admitted)) if prefill else 0.0
        batch = int(todo.size)
        contexts = prompt_tokens + done
        drafts = drafter.k > 0
        tokens = drafter.tokens_at(batch) if drafts else 1.0
        if drafts and drafter.payoff:  # draft only where the expected tokens per second beat spec off's
            drafts = tokens / step_cost(batch, contexts, drafter.k) > 1.0 / step_cost(batch, contexts, 0)
            tokens = tokens if drafts else 1.0
        n = max(1, int(np.ceil(float(np.min(todo - done)) / tokens - 1e-9)))  # steps until the next request finishes
        step = step_cost(batch, contexts + tokens * (n - 1) / 2, drafter.k if drafts else 0)
        seconds += step * n + prefill_s
        tail_seconds += step * n + prefill_s if batch <= tail else 0.0
        steps += n
        drafted += n if drafts else 0
        done = done + tokens * n
        finished = done >= todo - 1e-9  # the sum of fractional tokens a step, up to rounding
        todo, done = todo[~finished], done[~finished]
    return ReplayResult(seconds, tail_seconds, steps, drafted, total)


def response_lengths(count: int, max_tokens: int, median: float, sigma: float, seed: int = 0) -> np.ndarray:
    """A long-tailed set of response lengths: log-normal around ``median`` with shape ``sigma``, capped at
    ``max_tokens`` (RL responses pile up at the cap: the overlong ones), at least one token."""
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(np.log(median), sigma, count)), 1, max_tokens).astype(np.int64)
