"""The compiled suffix automaton against a brute-force oracle, on random and real token streams."""

from pathlib import Path

import numpy as np
import pytest

from sam.automaton import Matcher, SuffixAutomaton


def oracle_match_length(text: list[int]) -> int:
    """Longest suffix of ``text`` that also ends at an earlier position (brute force)."""
    n = len(text)
    best = 0
    for length in range(1, n):
        suffix = text[n - length :]
        if any(text[end - length + 1 : end + 1] == suffix for end in range(length - 1, n - 1)):
            best = length
        else:
            break
    return best


def is_true_continuation(text: list[int], draft: list[int], min_match: int) -> bool:
    """``draft`` follows an earlier occurrence of some suffix of ``text`` of length >= min_match."""
    n = len(text)
    for length in range(n - 1, min_match - 1, -1):
        suffix = text[n - length :]
        for end in range(length - 1, n - 1):
            if text[end - length + 1 : end + 1] == suffix and text[end + 1 : end + 1 + len(draft)] == draft:
                return True
    return False


def check_against_oracle(chunks: list[list[int]], k: int = 5) -> None:
    sa = SuffixAutomaton(capacity=4, latest=True)  # tiny capacity: exercises growth and rehashing
    text: list[int] = []
    for chunk in chunks:
        sa.extend(chunk)
        text += chunk
        assert len(sa) == len(text)
        expected = oracle_match_length(text)
        assert sa.match_length == expected, (text, sa.match_length, expected)
        draft = sa.draft(k)
        if expected == 0:
            assert draft == []
        else:
            assert 1 <= len(draft) <= k
            # the longest suffix's first earlier occurrence, or (backing off for a longer draft) a shorter one
            assert is_true_continuation(text, draft, 1), (text, draft)
            longest = text[len(text) - expected :]
            nxt = [text[e + 1] for e in range(expected - 1, len(text) - 1) if text[e - expected + 1 : e + 1] == longest]
            assert draft[0] in nxt or len(draft) > 1
        # the copy after an earlier occurrence of the match: the latest one, unless the state was deeper than
        # RECENT_DEPTH on a later occurrence's suffix path (then an older one; the latest: the hand cases below)
        assert sa.draft_latest(k) in oracle_copies(text, expected, k), (text, sa.draft_latest(k))


def oracle_copies(text: list[int], match: int, k: int) -> list[list[int]]:
    """What followed each earlier occurrence of the last ``match`` tokens, copied on into itself past the end of
    the text, up to ``k`` tokens or a separator (brute force; [[]] without a match)."""
    if match == 0:
        return [[]]
    suffix = text[len(text) - match :]
    copies = []
    for end in range(match - 1, len(text) - 1):
        if text[end - match + 1 : end + 1] == suffix:
            copied: list[int] = []
            while len(copied) < k:
                i = end + 1 + len(copied)
                token = text[i] if i < len(text) else copied[i - len(text)]
                if token < 0:
                    break
                copied.append(token)
            copies.append(copied)
    return copies


@pytest.mark.parametrize("alphabet", [1, 2, 3, 8])
def test_random_streams_match_oracle(alphabet):
    rng = np.random.default_rng(alphabet)
    for _ in range(150):
        chunks = [
            list(map(int, rng.integers(0, alphabet, size=rng.integers(1, 10)))) for _ in range(rng.integers(1, 8))
        ]
        check_against_oracle(chunks)


def test_real_text_matches_oracle_and_drafts_are_continuations():
    import textwrap

    source = Path(textwrap.__file__).read_bytes()[:1500]
    tokens = list(source)  # bytes of a real file nobody here wrote
    check_against_oracle([tokens[i : i + 37] for i in range(0, len(tokens), 37)], k=8)


def test_longest_match_draft_is_first_earlier_occurrence_continuation():
    sa = SuffixAutomaton()
    sa.extend([1, 2, 3, 4, 9, 1, 2, 3, 5, 7, 1, 2, 3])
    assert sa.match_length == 3
    assert sa.draft(3) == [4, 9, 1]  # first occurrence of [1, 2, 3] is followed by 4 9 1
    assert sa.draft(0) == []


def test_own_text_drafts_copy_the_latest_occurrence_and_periodic_text_continues_its_period():
    sa = SuffixAutomaton(latest=True)
    sa.extend([1, 2, 3, 4, 9, 1, 2, 3, 5, 7, 1, 2, 3])
    assert sa.draft_latest(3) == [5, 7, 1]  # the latest earlier [1, 2, 3] is followed by 5 7 1 (the first by 4 9 1)
    periodic = SuffixAutomaton(latest=True)
    periodic.extend([8] + [1, 2, 3] * 40)  # suffix paths about as long as the text, far beyond RECENT_DEPTH
    assert periodic.draft_latest(7) == [1, 2, 3, 1, 2, 3, 1]
    with pytest.raises(ValueError, match="latest=True"):
        SuffixAutomaton().draft_latest(3)


def test_never_self_match_and_empty():
    sa = SuffixAutomaton()
    assert len(sa) == 0 and sa.match_length == 0 and sa.draft(4) == []
    sa.extend([5, 6, 7])
    assert sa.match_length == 0 and sa.draft(4) == []
    sa.extend([5])
    assert sa.match_length == 1 and sa.draft(4) == [6, 7, 5]


def test_min_match_and_separators():
    sa = SuffixAutomaton()
    sa.extend([1, 2, -1, 1, 2])
    assert sa.match_length == 2
    assert sa.draft(4) == []  # the continuation is a separator: nothing to draft
    assert sa.draft(4, min_match=3) == []
    sa2 = SuffixAutomaton()
    sa2.extend([1, 2, 3, -1, 1, 2])
    assert sa2.draft(4) == [3]  # stops before the separator


def test_matcher_against_growing_automaton():
    corpus = SuffixAutomaton()
    corpus.extend([10, 11, 12, 13, -1])
    m = Matcher(corpus)
    m.feed([7, 10, 11])
    assert m.match_length == 2 and m.draft(2) == [12, 13]
    corpus.extend([20, 21, 22, -2])  # corpus grows under the matcher
    m.feed([12])
    assert m.match_length == 3 and m.draft(5) == [13]


def test_rejects_bad_input_and_reports_memory():
    sa = SuffixAutomaton()
    with pytest.raises(ValueError, match="1-D"):
        sa.extend([[1, 2]])
    with pytest.raises(ValueError, match="greater than"):
        sa.extend([1, -(2**31)])
    rng = np.random.default_rng(0)
    sa.extend(rng.integers(0, 1000, size=20000))
    assert sa.bytes_per_token() <= 64  # the budget the layout is built for (sam/automaton.py)
    assert sa.num_states <= 2 * len(sa)
    real = SuffixAutomaton(capacity=16)  # grown from tiny: the growth slack counts too
    real.extend(
        np.frombuffer(Path(np.__file__).parent.joinpath("lib", "_function_base_impl.py").read_bytes(), np.uint8)
    )
    assert len(real) > 100_000 and real.bytes_per_token() <= 64
    real.count_occurrences()  # a prompt's history is counted: still within the budget its bound is sized by
    assert real.counted and real.bytes_per_token() <= 64


def oracle_frequent_draft(
    corpus: list[int], match: list[int], k: int, prior: float, min_prob: float, decay: float = 0.0
) -> list[int]:
    """Brute force of drafting by counts: extend ``match`` by the continuation most of its occurrences in
    ``corpus`` take (latest occurrence on ties; separators are never drafted) while the product of count /
    (count of the match so far + prior / (length of the match so far) ** decay) stays >= min_prob (min_match 1)."""
    draft: list[int] = []
    chance = 1.0
    w = list(match)
    while len(draft) < k:
        ends = [e for e in range(len(w) - 1, len(corpus)) if corpus[e - len(w) + 1 : e + 1] == w]
        nxt: dict[int, list[int]] = {}
        for e in ends:
            if e + 1 < len(corpus):
                nxt.setdefault(corpus[e + 1], []).append(e + 1)
        candidates = [(len(es), max(es), t) for t, es in nxt.items() if t >= 0]
        if not candidates:
            break
        count, _, tok = max(candidates)
        chance *= count / (len(ends) + prior / len(w) ** decay)
        if chance < min_prob:
            break
        draft.append(tok)
        w.append(tok)
    return draft


@pytest.mark.parametrize("alphabet", [2, 3, 6])
def test_frequent_draft_matches_oracle(alphabet):
    rng = np.random.default_rng(10 + alphabet)
    for trial in range(60):
        corpus_sa = SuffixAutomaton(capacity=4)
        corpus: list[int] = []
        for sep in range(1, int(rng.integers(2, 6))):  # responses with separators, as a group corpus holds them
            response = list(map(int, rng.integers(0, alphabet, size=rng.integers(3, 25))))
            corpus_sa.extend(response + [-sep])
            corpus += response + [-sep]
        corpus_sa.count_occurrences()
        stream = list(map(int, rng.integers(0, alphabet, size=12)))
        m = corpus_sa.matcher()
        for i, tok in enumerate(stream):
            m.feed([tok])
            match = stream[i + 1 - m.match_length : i + 1] if m.match_length else []
            prior, min_prob, decay = [(0.0, 0.0, 0.0), (1.0, 0.05, 0.0), (0.5, 0.3, 0.0), (1.0, 0.2, 1.0)][trial % 4]
            got = m.draft_frequent(6, 1, prior, min_prob, decay)
            want = oracle_frequent_draft(corpus, match, 6, prior, min_prob, decay) if match else []
            assert got == want, (corpus, match, got, want)


@pytest.mark.parametrize("alphabet", [2, 5])
def test_a_scored_draft_skips_only_match_lengths_that_cannot_beat_the_best(alphabet):
    """The scored kernel leaves out a counted corpus's match lengths whose band's bound (the likeliest evidence level
    at every position) cannot beat the best draft so far: its drafts, gains and the match they come from are the
    ones that trying every length gives, for random chances, token costs and drafts already in hand."""
    from sam.automaton import N_CLONES, _draft_counted, _gain_bounds
    from sam.cells import LEVELS, MATCH_BANDS, PROMPT_GROUP, SOURCES

    rng = np.random.default_rng(20 + alphabet)
    pruned = 0
    for trial in range(40):
        sa = SuffixAutomaton(capacity=4)
        for sep in range(1, int(rng.integers(3, 9))):
            sa.extend(list(map(int, rng.integers(0, alphabet, size=rng.integers(3, 25)))) + [-sep])
        sa.count_occurrences()
        table = rng.uniform(0.0, 1.0, size=(SOURCES, MATCH_BANDS.size, LEVELS, 6)) ** rng.uniform(0.2, 3.0)
        if trial % 2:  # short matches likelier than long ones: a shorter length can win after a longer one lost
            table *= np.linspace(1.0, 0.1, MATCH_BANDS.size)[None, :, None, None]
        cost = float(rng.choice([0.0, 0.1, 0.3, 0.6]))
        bounds = np.empty((2, SOURCES, MATCH_BANDS.size))
        _gain_bounds(table, cost, bounds)
        never = np.full_like(bounds, np.inf)
        m = sa.matcher()
        pool, slot = sa._pool, sa.slot
        for tok in rng.integers(0, alphabet, size=12):
            m.feed([int(tok)])
            floor = float(rng.choice([-np.inf, 0.0, 0.5, 1.5]))
            floor_free = -np.inf if floor == -np.inf else float(rng.uniform(0.0, 3.0))
            results = []
            for b in (bounds, never):
                out, level = np.zeros(6, np.int32), np.zeros(6, np.int64)
                got = _draft_counted(
                    pool.prefix[slot], pool.clones[slot], pool.table[slot], pool.stats[slot], len(sa),
                    pool.meta[slot][N_CLONES], m._state, m._len, 6, 1, 1.0, 1.0, 0.0, out, level, table, cost,
                    PROMPT_GROUP, b, floor, floor_free, np.empty(6, np.int32), np.empty(6, np.int64),
                )  # fmt: skip
                results.append((got, out[: got[0]].tolist(), level[: got[0]].tolist()))
            assert results[0] == results[1], (trial, floor, cost)
            pruned += results[0][0][0] == 0 and floor > -np.inf
    assert pruned  # some drafts in hand were not beaten


def test_counts_go_stale_when_the_text_grows():
    sa = SuffixAutomaton()
    sa.extend([1, 2, 3, -1, 1, 2, 4, -2, 1, 2, 4, -3])
    m = sa.matcher()
    with pytest.raises(ValueError, match="count_occurrences"):
        m.draft_frequent(3)
    sa.count_occurrences()
    m.feed([1, 2])
    assert m.draft_frequent(3) == [4]  # 2 of 3 responses continue with 4 (the earliest occurrence has 3)
    assert m.draft(3) == [3]
    sa.extend([1, 2, 3, -4])
    with pytest.raises(ValueError, match="count_occurrences"):
        m.draft_frequent(3)


def test_a_long_match_seen_once_drafts_on_when_the_prior_shrinks_with_its_length():
    sa = SuffixAutomaton()
    sa.extend(list(range(1, 20)) + [-1])
    sa.count_occurrences()
    m = sa.matcher()
    m.feed([1, 2])
    assert m.draft_frequent(8, 2, 1.0, 0.05) == [3, 4, 5, 6]  # seen once: 1/2 per token, 4 tokens reach 0.0625
    m.feed(list(range(3, 11)))
    assert m.draft_frequent(8, 2, 1.0, 0.05) == [11, 12, 13, 14]  # one prior at every match length: still 4
    # a match of 10 tokens seen once: the prior shrinks to 2/10, 5/6 for the first token, more after it
    assert m.draft_frequent(8, 2, 1.0, 0.05, decay=1.0) == list(range(11, 19))
