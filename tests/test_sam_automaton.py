"""The compiled suffix automaton against a brute-force oracle, on random and real token streams."""

from pathlib import Path

import numpy as np
import pytest

from sam import SuffixAutomaton
from sam.automaton import Matcher


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
    sa = SuffixAutomaton(capacity=4)  # tiny capacity: exercises growth and rehashing
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
