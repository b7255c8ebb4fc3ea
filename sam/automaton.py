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
(16 B per slot: key and edge side by side, one cache line per probe), plus the text (4 B/token): see :meth:`SuffixAutomaton.bytes_per_token`.

Batched decode steps: an :class:`AutomatonPool` holds many automata in numba typed lists (one entry per
slot: a ``(states, 4)`` state table, an ``(edges, 3)`` edge table (a state's fields share a cache line), the hash, the text and the meta counters)
so that :func:`step_rows` extends, matches and drafts every running request of a decode step in one
compiled call (the per-request Python work would otherwise cost more than the drafting).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np
from numba.typed import List

_EMPTY = np.int64(-1)
_HASH_MULT = np.uint64(0xFF51AFD7ED558CCD)
_SHIFT = np.uint64(33)

# meta slots
N_STATES, N_EDGES, LAST, TEXT_LEN, MATCH_STATE, MATCH_LEN = range(6)


@nb.njit(cache=True, inline="always")
def _key(state: int, tok: int) -> np.int64:
    return np.int64((np.int64(state) << 32) | (np.int64(tok) & 0xFFFFFFFF))


@nb.njit(cache=True, inline="always")
def _slot(key: np.int64, mask: int) -> int:
    """Table slot of a (state, token) key: a murmur-style mix, so that every key bit reaches the low bits
    (a plain multiply keeps states that differ only in high bits on the same slot)."""
    h = np.uint64(key)
    h ^= h >> _SHIFT
    h *= _HASH_MULT
    h ^= h >> _SHIFT
    return np.int64(h & np.uint64(mask))


_LOW32 = np.int64(0xFFFFFFFF)


@nb.njit(cache=True)
def _find_slot(table, state, tok) -> int:
    """Hash slot of transition (state, tok), or -1. ``table`` interleaves keys and values, and a value packs
    ``edge << 32 | target`` so a transition costs one cache line."""
    mask = (table.shape[0] >> 1) - 1
    key = _key(state, tok)
    i = _slot(key, mask)
    while True:
        k = table[2 * i]
        if k == key:
            return i
        if k == -1:
            return -1
        i = (i + 1) & mask


@nb.njit(cache=True, inline="always")
def _target(table, i) -> int:
    return table[2 * i + 1] & _LOW32


@nb.njit(cache=True)
def _hash_put(table, key, value) -> None:
    mask = (table.shape[0] >> 1) - 1
    i = _slot(key, mask)
    while table[2 * i] != -1 and table[2 * i] != key:
        i = (i + 1) & mask
    table[2 * i] = key
    table[2 * i + 1] = value


@nb.njit(cache=True)
def _rehash(old, new) -> None:
    for i in range(0, old.shape[0], 2):
        if old[i] != -1:
            _hash_put(new, old[i], old[i + 1])


@nb.njit(cache=True)
def _add_edge(meta, edge_head, edge_tok, edge_to, edge_next, table, state, tok, to) -> None:
    e = meta[N_EDGES]
    meta[N_EDGES] = e + 1
    edge_tok[e] = tok
    edge_to[e] = to
    edge_next[e] = edge_head[state]
    edge_head[state] = e
    _hash_put(table, _key(state, tok), (np.int64(e) << 32) | to)


@nb.njit(cache=True)
def _advance(length, link, table, state, mlen, tok):
    """Longest-suffix-match step: the match (state, mlen) extended by ``tok`` (falls back along links)."""
    # re-canonicalise: a later split may have moved strings of length mlen into an ancestor (clone)
    while state != 0 and length[link[state]] >= mlen:
        state = link[state]
    while True:
        i = _find_slot(table, state, tok)
        if i != -1:
            return _target(table, i), mlen + 1
        if state == 0:
            return 0, 0
        state = link[state]
        mlen = length[state]


@nb.njit(cache=True)
def _extend(meta, length, link, endpos, edge_head, edge_tok, edge_to, edge_next, table, text, tokens) -> None:
    """Append ``tokens``: for each, advance the match over earlier text, then insert (standard SAM extend)."""
    for j in range(tokens.shape[0]):
        c = tokens[j]
        pos = meta[TEXT_LEN]
        s, ml = _advance(length, link, table, meta[MATCH_STATE], meta[MATCH_LEN], c)
        meta[MATCH_STATE] = s
        meta[MATCH_LEN] = ml

        cur = meta[N_STATES]
        meta[N_STATES] = cur + 1
        last = meta[LAST]
        length[cur] = length[last] + 1
        endpos[cur] = pos
        edge_head[cur] = -1
        p = last
        i = -1
        while p != -1:
            i = _find_slot(table, p, c)
            if i != -1:
                break
            _add_edge(meta, edge_head, edge_tok, edge_to, edge_next, table, p, c, cur)
            p = link[p]
        if p == -1:
            link[cur] = 0
        else:
            q = _target(table, i)
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
                    _add_edge(meta, edge_head, edge_tok, edge_to, edge_next, table, clone, edge_tok[e], edge_to[e])
                    e = edge_next[e]
                while p != -1:
                    i = _find_slot(table, p, c)
                    if i == -1 or _target(table, i) != q:
                        break
                    e = table[2 * i + 1] >> 32
                    edge_to[e] = clone
                    table[2 * i + 1] = (e << 32) | clone
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
def _match_stream(length, link, table, state, mlen, tokens):
    for j in range(tokens.shape[0]):
        state, mlen = _advance(length, link, table, state, mlen, tokens[j])
    return state, mlen


@nb.njit(cache=True)
def _bind(states_l, edges_l, table_l, text_l, meta_l, slot, states, edges, table, text, meta) -> None:
    """Point pool slot ``slot`` at one automaton's arrays (appending when the slot is new)."""
    if slot == len(meta_l):
        states_l.append(states)
        edges_l.append(edges)
        table_l.append(table)
        text_l.append(text)
        meta_l.append(meta)
    else:
        states_l[slot] = states
        edges_l[slot] = edges
        table_l[slot] = table
        text_l[slot] = text
        meta_l[slot] = meta


@nb.njit(cache=True)
def rows_short_of_room(text_l, meta_l, slots, tok_off, short) -> int:
    """Flag rows whose automaton has no room for this step's tokens; returns how many."""
    count = 0
    for r in range(slots.shape[0]):
        s = slots[r]
        if s >= 0 and meta_l[s][TEXT_LEN] + tok_off[r + 1] - tok_off[r] > text_l[s].shape[0]:
            short[r] = True
            count += 1
    return count


@nb.njit(cache=True)
def step_rows(
    states_l, edges_l, table_l, text_l, meta_l,
    own, tok_flat, tok_off, ks, src_slot, src_state, src_len, src_seen,
    min_match, tokens_per_match, own_bonus, resync, out, out_n,
) -> None:  # fmt: skip
    """One decode step for every row: append row ``r``'s verified tokens to automaton ``own[r]``, advance its
    matchers into the group corpora ``src_slot[own[r]]`` (re-matching its last ``resync`` tokens when a corpus
    grew), and draft up to ``ks[r]`` tokens from the source with the longest match into ``out[r]``.

    Draft length: ``min(ks[r], ceil(tokens_per_match * (match - min_match + 1)))``, nothing below
    ``min_match``; the request's own text wins ties and gets ``own_bonus`` extra match length.
    """
    for r in range(own.shape[0]):
        out_n[r] = 0
        s = own[r]
        if s < 0:
            continue
        meta = meta_l[s]
        st = states_l[s]
        ed = edges_l[s]
        text = text_l[s]
        toks = tok_flat[tok_off[r] : tok_off[r + 1]]
        _extend(meta, st[:, 0], st[:, 1], st[:, 2], st[:, 3], ed[:, 0], ed[:, 1], ed[:, 2], table_l[s], text, toks)
        best_slot = s
        best_state = meta[MATCH_STATE]
        best_mlen = meta[MATCH_LEN]
        best_score = best_mlen + own_bonus
        n_text = meta[TEXT_LEN]
        for j in range(src_slot.shape[1]):
            c = src_slot[s, j]
            if c < 0:
                continue
            cst = states_l[c]
            c_len = meta_l[c][TEXT_LEN]
            if c_len != src_seen[s, j]:
                src_seen[s, j] = c_len
                state, mlen = 0, 0
                feed = text[max(0, n_text - resync) : n_text]
            else:
                state, mlen = src_state[s, j], src_len[s, j]
                feed = toks
            state, mlen = _match_stream(cst[:, 0], cst[:, 1], table_l[c], state, mlen, feed)
            src_state[s, j] = state
            src_len[s, j] = mlen
            if mlen > best_score:
                best_slot, best_state, best_mlen, best_score = c, state, mlen, mlen
        k = ks[r]
        if k <= 0 or best_mlen < min_match:
            continue
        k = min(k, math.ceil(tokens_per_match * (best_mlen - min_match + 1)))
        b = states_l[best_slot]
        n_best = meta_l[best_slot][TEXT_LEN]
        out_n[r] = _draft(
            b[:, 0], b[:, 1], b[:, 2], text_l[best_slot], n_best, best_state, best_mlen, k, min_match, out[r]
        )


class AutomatonPool:
    """Slots of automata reachable from one compiled call (see :func:`step_rows`); freed slots are reused."""

    def __init__(self) -> None:
        self.states = List.empty_list(nb.types.int32[:, ::1])
        self.edges = List.empty_list(nb.types.int32[:, ::1])
        self.table = List.empty_list(nb.types.int64[::1])
        self.text = List.empty_list(nb.types.int32[::1])
        self.meta = List.empty_list(nb.types.int64[::1])
        self.automata: list[SuffixAutomaton | None] = []
        self._free: list[int] = []
        self._placeholder = SuffixAutomaton(capacity=1)

    @property
    def lists(self) -> tuple:
        return self.states, self.edges, self.table, self.text, self.meta

    def __len__(self) -> int:
        return len(self.automata)

    def acquire(self, automaton: SuffixAutomaton) -> int:
        slot = self._free.pop() if self._free else len(self.automata)
        if slot == len(self.automata):
            self.automata.append(automaton)
        else:
            self.automata[slot] = automaton
        self.bind(slot, automaton)
        return slot

    def bind(self, slot: int, automaton: SuffixAutomaton) -> None:
        a = automaton
        _bind(*self.lists, slot, a._states, a._edges, a._table, a._text, a._meta)

    def release(self, slot: int) -> None:
        """Drop the slot's arrays (memory is freed) and recycle the slot."""
        self.automata[slot] = None
        self.bind(slot, self._placeholder)
        self._free.append(slot)

    def live(self) -> int:
        return len(self.automata) - len(self._free)


class SuffixAutomaton:
    """Online suffix automaton over a token stream with longest-earlier-match drafting.

    >>> sa = SuffixAutomaton()
    >>> sa.extend([1, 2, 3, 1, 2])
    >>> sa.match_length, sa.draft(2)
    (2, [3, 1])
    """

    def __init__(self, capacity: int = 1024, pool: AutomatonPool | None = None):
        self._meta = np.zeros(6, dtype=np.int64)
        self._pool = pool
        self._alloc(max(16, capacity))
        self._meta[N_STATES] = 1
        self._meta[LAST] = 0
        self._length[0] = 0
        self._link[0] = -1
        self._endpos[0] = -1
        self._edge_head[0] = -1
        self._out = np.empty(64, dtype=np.int32)
        self.slot = pool.acquire(self) if pool is not None else -1

    def _alloc(self, tokens: int) -> None:
        self._cap = tokens
        ns, ne = 2 * tokens + 2, 3 * tokens + 4
        self._states = np.zeros((ns, 4), dtype=np.int32)
        self._edges = np.zeros((ne, 3), dtype=np.int32)
        self._length, self._link, self._endpos, self._edge_head = self._states.T
        self._edge_head[:] = -1
        self._edge_tok, self._edge_to, self._edge_next = self._edges.T
        hsize = 1 << int(np.ceil(np.log2(2 * ne)))
        self._table = np.full(2 * hsize, _EMPTY, dtype=np.int64)
        self._text = np.zeros(tokens, dtype=np.int32)

    def _grow(self, need: int) -> None:
        if need <= self._cap:
            return
        old_states, old_edges = self._states, self._edges
        old_table, old_text = self._table, self._text
        self._alloc(max(need, 2 * self._cap))
        self._states[: old_states.shape[0]] = old_states
        self._edges[: old_edges.shape[0]] = old_edges
        self._text[: old_text.shape[0]] = old_text
        _rehash(old_table, self._table)
        if self._pool is not None:
            self._pool.bind(self.slot, self)

    def reserve(self, tokens: int) -> None:
        """Make room for ``tokens`` more tokens (batched steps cannot grow arrays inside compiled code)."""
        self._grow(len(self) + tokens)

    @property
    def capacity(self) -> int:
        return self._cap

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
            self._edge_to, self._edge_next, self._table, self._text, arr,
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
        arrays = (self._states, self._edges, self._table, self._text)
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
        self._state, self._len = _match_stream(a._length, a._link, a._table, self._state, self._len, arr)
        self._state, self._len = int(self._state), int(self._len)

    @property
    def match_length(self) -> int:
        return self._len

    def draft(self, k: int, min_match: int = 1) -> list[int]:
        return self.automaton._draft_from(self._state, self._len, k, min_match)
