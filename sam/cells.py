"""The cells that the payoff rule's acceptance model counts drafts by (:class:`sam.payoff.AcceptanceModel`), and that
the drafting kernel (:func:`sam.automaton.step_rows`) scores candidate drafts by: per draft its source and match-length
band, per draft token its evidence level (what the drafter's text says of that token). Compiled, so the kernel and
the model share one definition.

Evidence levels: a token drafted from the request's own text (copied from the match's latest earlier occurrence) is
at :data:`OWN_ONCE`, :data:`OWN_ONCE_SPLIT`, :data:`OWN_AGREED` or :data:`OWN_SPLIT` (the text up to it seen once
before; seen once, but a shorter context went on in several ways; several times, always going on the same way;
several times, going on in several ways). A token drafted from counted group material
is at a level set by how often the text up to it occurred (its support) and the share of those occurrences that went
on with it: a continuation seen once after a long match and one that 30 of 40 responses took differ, and a share
shrunk by a prior cannot tell them apart (teacher-forced on SmolLM2: results/real/teacher_forced)."""

from __future__ import annotations

import numba as nb
import numpy as np

OWN, PROMPT_GROUP, EVERY_PROMPT = range(3)  # sources: the request's own text, its prompt's responses (siblings,
# history), every prompt's responses (their acceptance differs: on the embedded task every prompt's responses drafted
# more and were accepted less, so they are learned apart)
SOURCES = 3
CORPUS_SOURCE = np.array([PROMPT_GROUP, PROMPT_GROUP, EVERY_PROMPT], dtype=np.int64)  # the source of each group corpus
# a request matches, in the drafter's column order (sam.policy.BatchDrafter: siblings, history, every prompt's)
MATCH_BANDS = np.array([0, 2, 3, 4, 6, 9, 16], dtype=np.int64)  # match-length band edges: [1], [2], [3], [4, 5], ...
OWN_ONCE, OWN_ONCE_SPLIT, OWN_AGREED, OWN_SPLIT = range(4)  # own-text evidence levels
OWN_LEVELS = OWN_SPLIT + 1
SUPPORT_BANDS = np.array([2, 4, 8], dtype=np.int64)  # a counted token's support: 1, 2-3, 4-7, 8+ occurrences
SHARE_BANDS = np.array([0.5, 0.75, 0.9])  # ... and its share of them: < 0.5, 0.5-0.75, 0.75-0.9, 0.9+
LEVELS = OWN_LEVELS + (SUPPORT_BANDS.size + 1) * (SHARE_BANDS.size + 1)


@nb.njit(cache=True, inline="always")
def match_band(match_len: int) -> int:
    band = 0
    while band + 1 < MATCH_BANDS.size and MATCH_BANDS[band + 1] <= match_len:
        band += 1
    return band


@nb.njit(cache=True, inline="always")
def counted_level(count: int, support: int) -> int:
    """The evidence level of a token that ``count`` of the ``support`` occurrences of the text up to it went on with."""
    support_band = 0
    while support_band < SUPPORT_BANDS.size and SUPPORT_BANDS[support_band] <= support:
        support_band += 1
    share = count / max(support, 1)
    share_band = 0
    while share_band < SHARE_BANDS.size and SHARE_BANDS[share_band] <= share:
        share_band += 1
    return OWN_LEVELS + support_band * (SHARE_BANDS.size + 1) + share_band


@nb.njit(cache=True)
def bands(match_len: np.ndarray) -> np.ndarray:
    """[rows]: each draft's match-length band."""
    out = np.empty(match_len.shape[0], dtype=np.int64)
    for r in range(match_len.shape[0]):
        out[r] = match_band(match_len[r])
    return out


@nb.njit(cache=True)
def likeliest_gain(chance_table: np.ndarray, source: int, band: int, token_cost: float) -> tuple:
    """(expected accepted tokens less ``token_cost`` per token sent, the same at no cost) of a draft from ``source`` at
    match band ``band`` whose every token is at its likeliest evidence level, sending the tokens whose chance of
    acceptance (``chance_table``: [source, band, level, position] conditional chances) exceeds the cost. Chances only
    fall along a draft, so no real draft in that cell gains more: the bound that lets the drafting kernel skip
    candidates (:func:`sam.automaton._gain_bounds`) and the payoff rule skip whole steps
    (:meth:`sam.payoff.AcceptanceModel.best_row_gain`)."""
    chance, gain, free = 1.0, 0.0, 0.0
    for j in range(chance_table.shape[3]):
        likeliest = 0.0
        for level in range(chance_table.shape[2]):
            likeliest = max(likeliest, chance_table[source, band, level, j])
        chance *= likeliest
        if chance > token_cost:
            gain += chance - token_cost
        if chance > 0.0:
            free += chance
    return gain, free
