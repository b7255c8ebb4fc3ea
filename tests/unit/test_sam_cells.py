"""What the drafting kernel says of each draft token (its evidence level, sam/cells.py), how it picks a request's
source by the payoff rule's learned chances, and the corpus of every prompt's responses (global_sharing), each
against a brute-force reading of the text."""

import numpy as np
import pytest

from sam.automaton import MATCH_LAST
from sam.cells import (
    LEVELS,
    MATCH_BANDS,
    OWN,
    OWN_AGREED,
    OWN_ONCE,
    OWN_ONCE_SPLIT,
    OWN_SPLIT,
    PROMPT_GROUP,
    SOURCES,
    counted_level,
)
from sam.payoff import AcceptanceModel
from sam.policy import BatchDrafter, GlobalCorpus, SAMOptions

K = 6
ALONE = {"group_sharing": False, "cross_epoch": False, "global_sharing": False}
PRIOR_TABLE = AcceptanceModel(K).conditional()  # the kernel reads evidence levels only when it scores drafts


def ends_of(text: list[int], s: list[int]) -> list[int]:
    return [e for e in range(len(s) - 1, len(text)) if text[e - len(s) + 1 : e + 1] == s]


def next_tokens(text: list[int], ends: list[int]) -> set[int]:
    return {text[e + 1] for e in ends if e + 1 < len(text)}


def oracle_own_levels(text: list[int], match: int, copied_end: int, draft: list[int]) -> list[int]:
    """Each draft token's own-text level from the text alone: the string up to it (match + draft before it) seen
    before the copy it came from, and how its occurrences went on (or, seen only there, how the longest shorter
    suffix with other occurrences went on)."""
    levels = []
    for j in range(len(draft)):
        s = text[len(text) - match :] + draft[:j]
        ends = ends_of(text, s)
        if not ends:
            levels.append(OWN_ONCE)
        elif min(ends) < copied_end + j:
            levels.append(OWN_SPLIT if len(next_tokens(text, ends)) > 1 else OWN_AGREED)
        else:
            shorter = next((s[-n:] for n in range(len(s) - 1, 0, -1) if ends_of(text, s[-n:]) != ends), None)
            split = shorter is not None and len(next_tokens(text, ends_of(text, shorter))) > 1
            levels.append(OWN_ONCE_SPLIT if split else OWN_ONCE)
    return levels


def own_text_levels(text: list[int]) -> tuple[list[int], list[int]]:
    drafter = BatchDrafter(SAMOptions(min_match=1, tokens_per_match=K, **ALONE), K)
    slot = drafter.start(np.array(text[:1], np.int32), b"p")
    drafter.step_arrays(np.array([slot]), np.array(text[1:-1], np.int32), np.array([0, len(text) - 2]), np.array([K]))
    out, n, group, mlen, level = drafter.step_arrays(
        np.array([slot]), np.array(text[-1:], np.int32), np.array([0, 1]), np.array([K]), PRIOR_TABLE
    )
    n = int(n[0])
    if n == 0:
        return [], []
    assert group[0] == 0
    copied_end = int(drafter.pool.meta[slot][MATCH_LAST])
    return level[0, :n].tolist(), oracle_own_levels(text, int(mlen[0]), copied_end, out[0, :n].tolist())


def test_own_text_levels_by_hand():
    levels = {
        OWN_ONCE: [5, 6, 7, 8, 5, 6],  # "5 6" seen once before
        OWN_AGREED: [5, 6, 7, 1, 5, 6, 7, 2, 5, 6],  # seen twice before, both times went on with 7
        OWN_SPLIT: [5, 6, 7, 1, 5, 6, 8, 2, 5, 6],  # went on with 7 and with 8
        OWN_ONCE_SPLIT: [1, 5, 6, 7, 2, 5, 6, 8, 1, 5, 6],  # "1 5 6" seen once; "5 6" went on with 7 and 8
    }
    for want, text in levels.items():
        got, oracle = own_text_levels(text)
        assert got[0] == want == oracle[0], (text, got, oracle)


@pytest.mark.parametrize("alphabet", [2, 3, 5])
def test_own_text_levels_match_the_text(alphabet):
    rng = np.random.default_rng(alphabet)
    seen = set()
    for _ in range(150):
        text = list(map(int, rng.integers(0, alphabet, size=int(rng.integers(6, 40)))))
        got, oracle = own_text_levels(text)
        assert got == oracle, (text, got, oracle)
        seen.update(got)
    assert seen == {OWN_ONCE, OWN_ONCE_SPLIT, OWN_AGREED, OWN_SPLIT}  # every level was exercised


def test_counted_levels_are_the_support_and_share_of_the_text_up_to_each_token():
    rng = np.random.default_rng(7)
    prompt = np.array([1, 2, 3], np.int32)
    checked = 0
    for _ in range(40):
        drafter = BatchDrafter(SAMOptions(min_match=2, group_sharing=True, cross_epoch=False, global_sharing=False), K)
        probe = drafter.start(prompt, b"p")  # keeps the prompt's group alive while its siblings finish
        for _ in range(int(rng.integers(2, 6))):  # finished siblings: a counted corpus
            response = rng.integers(10, 14, size=int(rng.integers(4, 20))).astype(np.int32)
            slot = drafter.start(prompt, b"p")
            drafter.step(np.array([slot]), response, np.array([0, response.size]), np.array([K]))
            drafter.finish(slot)
        own = rng.integers(10, 14, size=int(rng.integers(1, 6))).astype(np.int32)
        args = np.array([probe]), own, np.array([0, own.size]), np.array([K])
        out, n, group, mlen, level = drafter.step_arrays(*args, PRIOR_TABLE)
        corpus = drafter.groups.groups[b"p"].siblings.automaton.text().tolist()  # filed by the step
        if n[0] == 0 or group[0] != 1:
            continue
        context = prompt.tolist() + own.tolist()
        draft = out[0, : n[0]].tolist()
        for j in range(len(draft)):
            s = context[len(context) - int(mlen[0]) :] + draft[:j]
            ends = ends_of(corpus, s)
            count = sum(1 for e in ends if e + 1 < len(corpus) and corpus[e + 1] == draft[j])
            assert level[0, j] == counted_level(count, len(ends)), (corpus, s, draft, j)
            checked += 1
    assert checked > 50


def test_unscored_drafts_count_every_token_at_level_zero():
    """Without a table the kernel skips the evidence walk: every draft token is at level 0, the band-only cells the
    default payoff rule counts in; the same drafts scored carry their levels."""
    rng = np.random.default_rng(3)
    prompt = np.array([1, 2, 3], np.int32)
    unscored_drafts = levelled = 0
    for _ in range(30):
        siblings = [rng.integers(10, 13, size=int(rng.integers(4, 20))).astype(np.int32) for _ in range(3)]
        own = rng.integers(10, 13, size=int(rng.integers(2, 12))).astype(np.int32)
        outs = []
        for table in (None, PRIOR_TABLE):
            drafter = BatchDrafter(SAMOptions(min_match=1, cross_epoch=False, global_sharing=False), K)
            probe = drafter.start(prompt, b"p")
            for response in siblings:
                slot = drafter.start(prompt, b"p")
                drafter.step(np.array([slot]), response, np.array([0, response.size]), np.array([K]))
                drafter.finish(slot)
            _, n, _, _, level = drafter.step_arrays(
                np.array([probe]), own, np.array([0, own.size]), np.array([K]), table
            )
            outs.append(level[0, : n[0]].copy())
        unscored, scored = outs
        assert (unscored == 0).all(), unscored
        unscored_drafts += unscored.size > 0
        levelled += bool((scored != 0).any())
    assert unscored_drafts > 10 and levelled > 10, (unscored_drafts, levelled)


def test_counted_levels_band_support_then_share():
    assert counted_level(1, 1) == OWN_SPLIT + 1 + 3  # seen once, always this token: support band 0, share >= 0.9
    assert counted_level(3, 4) == OWN_SPLIT + 1 + 2 * 4 + 2  # 4-7 occurrences, share 0.75
    assert counted_level(1, 9) == OWN_SPLIT + 1 + 3 * 4 + 0  # 8+ occurrences, share < 0.5
    assert counted_level(9, 9) == LEVELS - 1


def table(own: float, group: float) -> np.ndarray:
    """A chance table with one conditional chance for the request's own text and one for group material, everywhere."""
    t = np.full((SOURCES, MATCH_BANDS.size, LEVELS, K), group)
    t[OWN] = own
    return t


def own_text_against_a_sibling() -> tuple[BatchDrafter, int]:
    """A request whose own text "... 20 21" has matched "20 21" once before (2 tokens drafted: 22 9) and whose
    finished sibling matches "5 20 21" (6 tokens: 22 23 ... 27)."""
    prompt = np.array([1, 2, 3], np.int32)
    sibling = np.array([5, 20, 21, 22, 23, 24, 25, 26, 27], np.int32)
    drafter = BatchDrafter(SAMOptions(min_match=2, group_sharing=True, cross_epoch=False, global_sharing=False), K)
    slot = drafter.start(prompt, b"p")
    finished = drafter.start(prompt, b"p")
    drafter.step(np.array([finished]), sibling, np.array([0, sibling.size]), np.array([K]))
    drafter.finish(finished)
    own = np.array([20, 21, 22, 9, 5, 20, 21], np.int32)
    drafter.step(np.array([slot]), own, np.array([0, own.size]), np.array([K]))
    return drafter, slot


def test_the_source_is_the_one_whose_draft_gains_most_at_the_token_cost():
    drafter, slot = own_text_against_a_sibling()
    nothing = np.zeros(0, np.int32)

    def source(chances=None, cost=0.0) -> tuple[int, list[int]]:
        """The current draft under ``chances`` at ``cost`` (no new token: the same text each time)."""
        out, n, group, _, _ = drafter.step_arrays(
            np.array([slot]), nothing, np.array([0, 0]), np.array([K]), chances, cost
        )
        return int(group[0]), out[0, : n[0]].tolist()

    sibling_draft = (1, [22, 23, 24, 25, 26, 27])
    assert source() == sibling_draft  # without a table: the longest match
    assert source(table(own=0.95, group=0.3)) == (0, [22, 9])  # gains 0.95 + 0.90 against 0.3 + 0.09 + ...
    # two middling own tokens against one sure group token: free, the own draft gains more (0.7 + 0.49 against
    # 0.9 + 0.09 + ...); at a cost of 0.5 per token sent the group's (0.9 - 0.5 against 0.7 - 0.5)
    one_sure = table(own=0.7, group=0.9)
    one_sure[PROMPT_GROUP, :, :, 1:] = 0.1
    assert source(one_sure, 0.0) == (0, [22, 9])
    assert source(one_sure, 0.5) == sibling_draft


def test_every_prompts_responses_draft_for_a_new_prompt_and_the_corpus_keeps_its_newest_half():
    answer = np.arange(30, 60, dtype=np.int32)

    def first_draft(**options) -> list[int]:
        drafter = BatchDrafter(SAMOptions(**{"min_match": 2, "global_sharing": True, **options}), K)
        slot = drafter.start(np.array([1, 2, 3], np.int32), b"a")
        drafter.step(np.array([slot]), answer, np.array([0, answer.size]), np.array([K]))
        drafter.finish(slot)
        slot = drafter.start(np.array([4, 5, 6], np.int32), b"b")  # another prompt
        return drafter.step(np.array([slot]), answer[:3], np.array([0, 3]), np.array([K]))[0]

    assert first_draft() == answer[3 : 3 + K].tolist()
    assert first_draft(global_sharing=False) == []

    drafter = BatchDrafter(SAMOptions(min_match=2, global_sharing=True, max_global_tokens=100), K)
    corpus: GlobalCorpus = drafter.global_corpus
    running = drafter.start(np.array([9, 9, 9], np.int32), b"r")  # started before the corpus is rebuilt
    live = drafter.pool.live()
    responses = [np.arange(100 + 20 * i, 120 + 20 * i, dtype=np.int32) for i in range(8)]  # 21 stored tokens each
    for i, response in enumerate(responses):
        slot = drafter.start(np.array([7, 7, i], np.int32), bytes([i]))
        drafter.step(np.array([slot]), response, np.array([0, response.size]), np.array([K]))
        drafter.finish(slot)
        drafter.step(np.array([running]), np.array([0], np.int32), np.array([0, 1]), np.array([K]))
    assert corpus.corpus.num_tokens + corpus.pending_tokens <= 100
    kept = corpus.corpus.responses + corpus.pending
    assert [r[0] for r in kept] == [r[0] for r in responses[-len(kept) :]] and len(kept) >= 2  # the newest
    assert drafter.pool.live() == live + 2 * len(responses)  # each new prompt's two corpora; the replaced global freed
    newest = responses[-1]
    got = drafter.step(np.array([running]), newest[:3], np.array([0, 3]), np.array([K]))[0]
    assert got == newest[3 : 3 + K].tolist()  # the running request drafts from the rebuilt corpus


def test_acceptance_counts_of_another_shape_are_refused():
    model = AcceptanceModel(k=K)
    state = AcceptanceModel(k=K + 1).state_dict()
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        model.load_state_dict(state)


def test_each_row_explores_its_candidates_in_turn_whatever_it_picks():
    """The candidate the payoff rule learns from (``explored``) is the first with a draft from the row's turn on
    (own text, siblings, history, every prompt's responses), while the draft sent stays the one that gains most."""
    drafter, slot = own_text_against_a_sibling()
    nothing = np.zeros(0, np.int32)
    own_draft, sibling_draft = (0, [22, 9]), (1, [22, 23, 24, 25, 26, 27])
    for turn, explored in enumerate([own_draft, sibling_draft, own_draft, own_draft, own_draft, sibling_draft]):
        out, n, group, _, _ = drafter.step_arrays(
            np.array([slot]), nothing, np.array([0, 0]), np.array([K]), table(own=0.95, group=0.3), 0.0,
            np.array([turn]),
        )  # fmt: skip
        assert (int(group[0]), out[0, : n[0]].tolist()) == own_draft  # picked by its gain
        ex, ex_n, ex_group, _, _ = drafter.explored(1)
        assert (int(ex_group[0]), ex[0, : ex_n[0]].tolist()) == explored, turn
