"""Acceptance canary: after every weight sync, each draft source's acceptance is compared with its level before.

The failure it watches for is one vLLM and veRL users report: the MTP head's weights not reaching the engine after a
sync (veRL's FSDP actor dropping ``model.mtp_layers.*``; a drafter left with dummy weights). The rollout stays
lossless, so nothing else notices: drafts are merely rejected, and the speed-up is silently gone. A source whose
acceptance over the rollouts after a sync falls below its level before by more than chance explains (a one-sided
binomial test on its draft tokens, at :data:`ALPHA`) and by at least :data:`MIN_FALL` of the level logs a warning
naming the source and the step; ``rollout/canary_<source>_*`` metrics record every check.

The floor is what keeps the alarm honest: draft tokens come in responses (a response that repeats itself accepts
most of its drafts), so a step of few responses varies far more than the token-level test assumes, and the policy's
own update and the head's first AdamW steps move acceptance too. A head the sync broke or left on dummy weights
accepts at chance, far below half its level; a stale head that merely lags
the policy decays slowly, and is what the A/B's frozen-against-online rows measure, not this alarm.
"""

from __future__ import annotations

import logging

from scipy.stats import binom

logger = logging.getLogger(__name__)

ALPHA = 1e-4  # the chance of a false alarm per source and step, were draft tokens independent
MIN_FALL = 0.5  # ... and the fall must be at least this share of the level before (a healthy run's steps of few
# responses move by a good share of it)
MIN_DRAFTS = 50  # draft tokens a source needs, before and after, to be checked
SYNCED_SOURCES = ("mtp",)  # the sources whose drafts come from synced weights: only their fall can be a broken sync.
# A model-free source's acceptance is reported too, but its fall is the text's or, in the hybrid, the rows the head
# left to it (a broken head hands SAM its harder rows, and SAM's acceptance falls on them)
LEVEL_DECAY = 0.5  # the level before: earlier steps' counts, each step's weighed this much less than the next's


def counts_since(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """Per source, the draft tokens sent and accepted between two cumulative readings (``Rollout.draft_counts``)."""
    return {s: (d - before.get(s, (0, 0))[0], a - before.get(s, (0, 0))[1]) for s, (d, a) in after.items()}


class AcceptanceCanary:
    """Per draft source, the acceptance level of the rollouts before each sync, and the check of the ones after."""

    def __init__(self) -> None:
        self.level: dict[str, list[float]] = {}  # source -> [draft tokens, accepted], decayed

    def verdicts(self, counts: dict[str, tuple[int, int]]) -> dict[str, tuple[float, float, float, bool]]:
        """Per source with enough draft tokens now and before: (acceptance now, level before, p, fell), against the
        levels as they stand (nothing updated: a step still running can be judged on its drafts so far)."""
        out = {}
        for source, (drafted, accepted) in sorted(counts.items()):
            level = self.level.get(source)
            if drafted >= MIN_DRAFTS and level is not None and level[0] >= MIN_DRAFTS:
                before = level[1] / level[0]
                after = accepted / drafted
                p_value = float(binom.cdf(accepted, drafted, before))  # so few acceptances at the level before
                fell = p_value < ALPHA and after < (1.0 - MIN_FALL) * before and source in SYNCED_SOURCES
                out[source] = (after, before, p_value, fell)
        return out

    def warn(self, step: int, counts: dict[str, tuple[int, int]], verdicts: dict | None = None) -> list[str]:
        """Log a warning for every source that fell in ``counts`` (step ``step``'s drafts, whole or so far; their
        :meth:`verdicts`, where already computed); returns those sources."""
        fallen = []
        for source, (after, before, p_value, fell) in (verdicts or self.verdicts(counts)).items():
            if fell:
                drafted, accepted = counts[source]
                logger.warning(
                    "acceptance canary: step %d, %s drafts accepted %.3f (%d of %d draft tokens) after the weight "
                    "sync, %.3f before (p = %.1g): check that the sync reached the drafter (an MTP head the sync "
                    "skipped keeps its old or dummy weights)",
                    step, source, after, accepted, drafted, before, p_value,
                )  # fmt: skip
                fallen.append(source)
        return fallen

    def check(self, step: int, counts: dict[str, tuple[int, int]], warn: bool = True) -> dict[str, float]:
        """``counts``: per source, the draft tokens sent and accepted in step ``step``'s rollouts (after the sync that
        ended the step before). Returns the step's canary metrics, warns (unless ``warn`` is off: a live check warned
        already) and updates the levels."""
        metrics: dict[str, float] = {}
        verdicts = self.verdicts(counts)
        for source, (after, before, _, fell) in verdicts.items():
            prefix = f"rollout/canary_{source}"
            metrics.update(
                {f"{prefix}_acceptance": after, f"{prefix}_level_before": before, f"{prefix}_fell": float(fell)}
            )
        if warn:
            self.warn(step, counts, verdicts)
        for source, (drafted, accepted) in counts.items():
            if drafted:
                old = self.level.get(source) or [0.0, 0.0]
                self.level[source] = [LEVEL_DECAY * old[0] + drafted, LEVEL_DECAY * old[1] + accepted]
        return metrics
