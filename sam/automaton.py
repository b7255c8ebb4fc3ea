"""Online suffix automaton over token ids, compiled with numba over flat arrays.

Layout (no Python object per state):
- per state: ``length`` (longest string), ``link`` (suffix link), ``endpos`` (end index of the state's
  *first* occurrence in the text; a clone inherits it, which keeps it exact without ever walking links),
  ``edge_head`` (first outgoing edge);
- per edge: ``edge_tok``, ``edge_to``, ``edge_next`` (a singly linked list per state, so a clone can copy
  its original's edges);
- an open-addressing hash table ``(state, token) -> edge`` for O(1) transitions (the root of a real
  tokenizer's text can have tens of thousands of children).

The match state ``(match_state, match_len)`` tracks the longest suffix of the text that also ends at an
earlier position: each new token first advances the match over the automaton of the text *before* it,
then is inserted. So a match is never the trivial self-match, and a draft is the text that followed the
first earlier occurrence of that suffix. Matchers walk one automaton with another token stream (group
sharing: a request matched against its siblings' finished responses).

Memory: at most 2n states (16 B each), 3n edges (12 B each) and a hash table of 2-4x the edges
(12 B per slot), plus the text (4 B/token): see :meth:`SuffixAutomaton.bytes_per_token`.
"""

from __future__ import annotations

import numba as nb
import numpy as np

_EMPTY = np.int64(-1)
_HASH_MULT = np.uint64(0x9E3779B97F4A7C15)

# meta slots
N_STATES, N_EDGES, LAST, TEXT_LEN, MATCH_STATE, MATCH_LEN = range(6)


@nb.njit(cache=True, inline="always")
def _key(state: int, tok: int) -> np.int64:
    return np.int64((np.int64(state) << 32) | (np.int64(tok) & 0xFFFFFFFF))


@nb.njit(cache=True, inline="always")
def _slot(key: np.int64, mask: int) -> int:
    return int((np.uint64(key) * _HASH_MULT) >> np.uint64(20)) & mask


@nb.njit(cache=True)
def _find_edge(hkeys, hvals, state, tok) -> int:
    """Edge index of transition (state, tok), or -1."""
    mask = hkeys.shape[0] - 1
    key = _key(state, tok)
    i = _slot(key, mask)
    while True:
        k = hkeys[i]
        if k == key:
            return hvals[i]
        if k == -1:
            return -1
        i = (i + 1) & mask


@nb.njit(cache=True)
def _hash_put(hkeys, hvals, key, edge) -> None:
    mask = hkeys.shape[0] - 1
    i = _slot(key, mask)
    while hkeys[i] != -1 and hkeys[i] != key:
        i = (i + 1) & mask
    hkeys[i] = key
    hvals[i] = edge


@nb.njit(cache=True)
def _rehash(old_keys, old_vals, new_keys, new_vals) -> None:
    for i in range(old_keys.shape[0]):
        if old_keys[i] != -1:
            _hash_put(new_keys, new_vals, old_keys[i], old_vals[i])


@nb.njit(cache=True)
def _add_edge(meta, edge_head, edge_tok, edge_to, edge_next, hkeys, hvals, state, tok, to) -> None:
    e = meta[N_EDGES]
    meta[N_EDGES] = e + 1
    edge_tok[e] = tok
    edge_to[e] = to
    edge_next[e] = edge_head[state]
    edge_head[state] = e
    _hash_put(hkeys, hvals, _key(state, tok), e)


@nb.njit(cache=True)
def _advance(length, link, hkeys, hvals, edge_to, state, mlen, tok):
    """Longest-suffix-match step: the match (state, mlen) extended by ``tok`` (falls back along links)."""
    # re-canonicalise: a later split may have moved strings of length mlen into an ancestor (clone)
    while state != 0 and length[link[state]] >= mlen:
        state = link[state]
    while True:
        e = _find_edge(hkeys, hvals, state, tok)
        if e != -1:
            return edge_to[e], mlen + 1
        if state == 0:
            return 0, 0
        state = link[state]
        mlen = length[state]


@nb.njit(cache=True)
def _extend(meta, length, link, endpos, edge_head, edge_tok, edge_to, edge_next, hkeys, hvals, text, tokens) -> None:
    """Append ``tokens``: for each, advance the match over earlier text, then insert (standard SAM extend)."""
    for j in range(tokens.shape[0]):
        c = tokens[j]
        pos = meta[TEXT_LEN]
        s, ml = _advance(length, link, hkeys, hvals, edge_to, meta[MATCH_STATE], meta[MATCH_LEN], c)
        meta[MATCH_STATE] = s
        meta[MATCH_LEN] = ml

        cur = meta[N_STATES]
        meta[N_STATES] = cur + 1
        last = meta[LAST]
        length[cur] = length[last] + 1
        endpos[cur] = pos
        edge_head[cur] = -1
        p = last
        while p != -1 and _find_edge(hkeys, hvals, p, c) == -1:
            _add_edge(meta, edge_head, edge_tok, edge_to, edge_next, hkeys, hvals, p, c, cur)
            p = link[p]
        if p == -1:
            link[cur] = 0
        else:
            q = edge_to[_find_edge(hkeys, hvals, p, c)]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:
                clone = meta[N_STATES]
                meta[N_STATES] = clone + 1
                length[clone] = length[p] + 1
                endpos[clone] = endpos[q]
                link[clone] = link[q]
                edge_head[clone] = -1
                e = edge_head[q]
                while e != -1:
                    _add_edge(
                        meta, edge_head, edge_tok, edge_to, edge_next, hkeys, hvals, clone, edge_tok[e], edge_to[e]
                    )
                    e = edge_next[e]
                while p != -1:
                    e = _find_edge(hkeys, hvals, p, c)
                    if e == -1 or edge_to[e] != q:
                        break
                    edge_to[e] = clone
                    p = link[p]
                link[q] = clone
                link[cur] = clone
        meta[LAST] = cur
        text[pos] = c
        meta[TEXT_LEN] = pos + 1


@nb.njit(cache=True)
def _draft(length, link, endpos, text, text_len, state, mlen, k, min_match, out) -> int:
    """Write up to ``k`` tokens that followed the first earlier occurrence of the match into ``out``.

    If that occurrence leaves fewer than ``k`` tokens before the end of the text, back off along suffix
    links (shorter matches, earlier first occurrences) while the match stays >= ``min_match``. Stops at a
    negative token (a sequence separator). Returns the number of tokens written.
    """
    if mlen < min_match or state == 0:
        return 0
    while state != 0 and length[link[state]] >= mlen:
        state = link[state]
    e = endpos[state]
    while text_len - e - 1 < k and link[state] > 0 and length[link[state]] >= min_match:
        state = link[state]
        e = endpos[state]
    n = 0
    i = e + 1
    while n < k and i < text_len:
        t = text[i]
        if t < 0:
            break
        out[n] = t
        n += 1
        i += 1
    return n


@nb.njit(cache=True)
def _match_stream(length, link, hkeys, hvals, edge_to, state, mlen, tokens):
    for j in range(tokens.shape[0]):
        state, mlen = _advance(length, link, hkeys, hvals, edge_to, state, mlen, tokens[j])
    return state, mlen


class SuffixAutomaton:
    """Online suffix automaton over a token stream with longest-earlier-match drafting.

    >>> sa = SuffixAutomaton()
    >>> sa.extend([1, 2, 3, 1, 2])
    >>> sa.match_length, sa.draft(2)
    (2, [3, 1])
    """

    def __init__(self, capacity: int = 1024):
        self._meta = np.zeros(6, dtype=np.int64)
        self._alloc(max(16, capacity))
        self._meta[N_STATES] = 1
        self._meta[LAST] = 0
        self._length[0] = 0
        self._link[0] = -1
        self._endpos[0] = -1
        self._edge_head[0] = -1
        self._out = np.empty(64, dtype=np.int32)

    def _alloc(self, tokens: int) -> None:
        self._cap = tokens
        ns, ne = 2 * tokens + 2, 3 * tokens + 4
        self._length = np.zeros(ns, dtype=np.int32)
        self._link = np.zeros(ns, dtype=np.int32)
        self._endpos = np.zeros(ns, dtype=np.int32)
        self._edge_head = np.full(ns, -1, dtype=np.int32)
        self._edge_tok = np.zeros(ne, dtype=np.int32)
        self._edge_to = np.zeros(ne, dtype=np.int32)
        self._edge_next = np.zeros(ne, dtype=np.int32)
        hsize = 1 << int(np.ceil(np.log2(2 * ne)))
        self._hkeys = np.full(hsize, _EMPTY, dtype=np.int64)
        self._hvals = np.zeros(hsize, dtype=np.int32)
        self._text = np.zeros(tokens, dtype=np.int32)

    def _grow(self, need: int) -> None:
        if need <= self._cap:
            return
        old = (self._length, self._link, self._endpos, self._edge_head, self._edge_tok, self._edge_to, self._edge_next)
        old_keys, old_vals, old_text = self._hkeys, self._hvals, self._text
        self._alloc(max(need, 2 * self._cap))
        new = (self._length, self._link, self._endpos, self._edge_head, self._edge_tok, self._edge_to, self._edge_next)
        for o, n in zip(old, new, strict=True):
            n[: o.shape[0]] = o
        self._text[: old_text.shape[0]] = old_text
        _rehash(old_keys, old_vals, self._hkeys, self._hvals)

    def extend(self, tokens) -> None:
        """Append ``tokens`` (ints; negative ids are reserved for separators) to the text."""
        arr = np.ascontiguousarray(tokens, dtype=np.int32)
        if arr.ndim != 1:
            raise ValueError(f"extend expects a 1-D sequence of token ids, got shape {arr.shape}")
        if arr.size == 0:
            return
        self._grow(len(self) + arr.size)
        _extend(
            self._meta, self._length, self._link, self._endpos, self._edge_head, self._edge_tok,
            self._edge_to, self._edge_next, self._hkeys, self._hvals, self._text, arr,
        )  # fmt: skip

    def __len__(self) -> int:
        return int(self._meta[TEXT_LEN])

    @property
    def match_length(self) -> int:
        """Length of the longest suffix of the text that also ends at an earlier position."""
        return int(self._meta[MATCH_LEN])

    def _draft_from(self, state: int, mlen: int, k: int, min_match: int) -> list[int]:
        if k > self._out.shape[0]:
            self._out = np.empty(k, dtype=np.int32)
        n = _draft(self._length, self._link, self._endpos, self._text, len(self), state, mlen, k, min_match, self._out)
        return self._out[:n].tolist()

    def draft(self, k: int, min_match: int = 1) -> list[int]:
        """Up to ``k`` tokens that followed an earlier occurrence of the longest matching suffix."""
        return self._draft_from(int(self._meta[MATCH_STATE]), self.match_length, k, min_match)

    def text(self) -> np.ndarray:
        return self._text[: len(self)].copy()

    def tail(self, m: int) -> np.ndarray:
        """The last ``m`` tokens of the text (a view, valid until the next ``extend``)."""
        n = len(self)
        return self._text[max(0, n - m) : n]

    @property
    def num_states(self) -> int:
        return int(self._meta[N_STATES])

    @property
    def nbytes(self) -> int:
        arrays = (self._length, self._link, self._endpos, self._edge_head, self._edge_tok, self._edge_to,
                  self._edge_next, self._hkeys, self._hvals, self._text)  # fmt: skip
        return sum(a.nbytes for a in arrays)

    def bytes_per_token(self) -> float:
        return self.nbytes / max(1, len(self))

    def matcher(self) -> Matcher:
        return Matcher(self)


class Matcher:
    """A second token stream matched against a :class:`SuffixAutomaton` (which may keep growing).

    ``feed`` advances the longest suffix of the stream that occurs in the automaton's text; ``draft``
    proposes what followed its first occurrence there.
    """

    def __init__(self, automaton: SuffixAutomaton):
        self.automaton = automaton
        self._state = 0
        self._len = 0

    def feed(self, tokens) -> None:
        a = self.automaton
        arr = np.ascontiguousarray(tokens, dtype=np.int32)
        self._state, self._len = _match_stream(
            a._length, a._link, a._hkeys, a._hvals, a._edge_to, self._state, self._len, arr
        )
        self._state, self._len = int(self._state), int(self._len)

    @property
    def match_length(self) -> int:
        return self._len

    def draft(self, k: int, min_match: int = 1) -> list[int]:
        return self.automaton._draft_from(self._state, self._len, k, min_match)
