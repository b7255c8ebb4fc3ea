"""Online suffix automaton over token ids, compiled with numba over flat arrays, under 64 bytes per token (measured:
results/sam).

A suffix automaton over n tokens has n + 1 *prefix states* (prefix state i's longest string is the text's first
i tokens) and fewer than n *clones* (made when a state splits). Most of what a prefix state holds follows from
its id, so only the rest is stored:
- prefix state i: length i, first occurrence ending at i - 1, and the edge on ``text[i]`` to prefix state i + 1
  (made when token i was appended; such an edge is solid, so it is never redirected). Stored: its suffix link
  and the head of its chain of other edges (8 B; 12 B with the end of its latest occurrence, where tracked).
- clone j (id ``CLONE | j``): length, link, end of its first occurrence (inherited from the state it split off,
  which keeps it exact without walking links), one edge inline and the head of its chain (24 B; 28 B tracked).
- every other edge: an open-addressing hash ``(state, token) -> (target, next token of the state's chain)``,
  16 B a slot, one cache line a probe. A state with an empty chain never probes it, and on text about four
  edges in five are implicit or inline, so most transitions touch no hash at all.

States, clones and hashed edges per token, and bytes per token with the growth slack, are measured by
``python -m recipe.bench sam`` (results/sam).

The match state ``(match_state, match_len)`` is the longest suffix of the text that also ends at an earlier
position: the suffix link of the newest prefix state, which the construction finds anyway. So a match is never
the trivial self-match. A draft from the text itself copies what followed the match's latest earlier occurrence
(recent text predicts better than old: results/FINDINGS.md, "First occurrence"), kept current for the first :data:`RECENT_DEPTH` states of each suffix path as tokens arrive. Matchers
walk one automaton with another token stream (group sharing: a request matched against its siblings' finished
responses).

An automaton that stops growing for a while (a prompt's finished responses) can be *counted* (:func:`_count`,
linear, 8.5 more bytes per state): how often each state's strings occur, where they last end, and (in a small memo,
once a draft asks) where its most frequent continuation leads. Drafts from it then follow the continuation most
occurrences took, for as long as its estimated chance holds (:func:`_draft_counted`).

Every automaton lives in a slot of an :class:`AutomatonPool` (numba typed lists of its arrays), which lets
compiled code grow an automaton's arrays in place of the old ones and lets :func:`step_rows` extend, match and
draft every running request of a decode step in one compiled call (per-request Python work would cost more
than the drafting).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba as nb
import numpy as np
from numba.typed import List

from sam.cells import (
    CORPUS_SOURCE,
    OWN,
    OWN_AGREED,
    OWN_ONCE,
    OWN_ONCE_SPLIT,
    OWN_SPLIT,
    counted_level,
    likeliest_gain,
    match_band,
)

CLONE = 1 << 30  # clone ids: CLONE | index into the clone table; prefix state ids: 0..n
NO_TOK = -(2**31)  # no token: an empty chain or no inline edge (token ids must be greater)
_LOW32 = np.int64(0xFFFFFFFF)
_HIGH32 = ~_LOW32
_HASH_MULT = np.uint64(0xFF51AFD7ED558CCD)
_SHIFT = np.uint64(33)

N_CLONES, N_EXTRA, TEXT_LEN, MATCH_STATE, MATCH_LEN, COUNTED_LEN, MATCH_LAST = range(7)  # meta slots (COUNTED_LEN:
# the text length the occurrence counts were taken at, -1 if never; MATCH_LAST: where the match's latest earlier
# occurrence ends, -1 if none)
P_LINK, P_HEAD, P_TOK, P_LAST = range(4)  # prefix-state columns; P_TOK of row i is text[i], so the text is a column
C_LEN, C_LINK, C_END, C_TOK, C_TO, C_HEAD, C_LAST = range(7)  # clone columns (C_END: first occurrence's end)
# P_LAST and C_LAST, where a state's latest occurrence ends, exist only in automata that track it (``latest``)
RECENT_DEPTH = 2  # states along the suffix path whose latest occurrence each appended token updates (2 drafts
# as well as 16 teacher-forced; each deeper state costs a cache miss per token)
S_OCC, S_LAST = range(2)  # occurrence-count columns: occurrences of a state's strings, end of the last one
MEMO_SHARE = 16  # a counted automaton's memo of most frequent continuations (_best_next) has a row per this many states
# (rounded up to a power of two): half a byte per state, drafts pass through few distinct states
MEMO_MIN_SUPPORT = 8  # ... and holds only states that occur more often (a state has at most as many edges as
# occurrences: scanning a rarer one's costs about what the memo's cache miss does)
GROWTH = 1.5  # arrays grow by this factor (the hash doubles)
BYTES_PER_TOKEN = 64  # the memory budget the layout keeps on text (tests/unit/test_sam_automaton.py), for sizing bounds
MAX_LOAD = 0.75  # hash slots in use before it doubles
SCORED_LENGTHS = 4  # match lengths a scored draft from counted material is tried at: the longest and the next shorter
# ones up the suffix links (each a K-token draft whose every token scans its state's edges: every link down to one
# token cost more than it found, results/FINDINGS.md, "Scoring every match length")


# libc's madvise by symbol name (resolved when the code is linked, so the compiled functions stay cacheable;
# a ctypes pointer would make numba recompile them in every process); the address passes as an integer
_madvise = nb.types.ExternalFunction("madvise", nb.types.intc(nb.types.uintp, nb.types.uintp, nb.types.intc))
_MADV_HUGEPAGE = 14
_HUGE = 1 << 21


@nb.njit(cache=True)
def _huge_pages(a) -> None:
    """Ask for transparent huge pages on a big array allocated in compiled code (numpy does it for arrays
    it allocates): the automaton is walked at random, and 4 KiB pages make most of those walks TLB misses."""
    if a.nbytes >= _HUGE:
        start = (a.ctypes.data + _HUGE - 1) & ~(_HUGE - 1)
        end = (a.ctypes.data + a.nbytes) & ~(_HUGE - 1)
        if end > start:
            _madvise(start, end - start, _MADV_HUGEPAGE)


@nb.njit(cache=True, inline="always")
def _key(state, tok) -> np.int64:
    return np.int64((np.int64(state) << 32) | (np.int64(tok) & _LOW32))


@nb.njit(cache=True, inline="always")
def _slot(key: np.int64, mask: int) -> int:
    """Table slot of a (state, token) key: a murmur-style mix, so that every key bit reaches the low bits."""
    h = np.uint64(key)
    h ^= h >> _SHIFT
    h *= _HASH_MULT
    h ^= h >> _SHIFT
    return np.int64(h & np.uint64(mask))


@nb.njit(cache=True)
def _find_slot(table, state, tok) -> int:
    """Hash slot of edge (state, tok), or -1 (``table`` interleaves keys and values)."""
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


@nb.njit(cache=True)
def _hash_put(table, key, value) -> None:
    mask = (table.shape[0] >> 1) - 1
    i = _slot(key, mask)
    while table[2 * i] != -1 and table[2 * i] != key:
        i = (i + 1) & mask
    table[2 * i] = key
    table[2 * i + 1] = value


@nb.njit(cache=True, inline="always")
def _length(cl, s) -> int:
    return s if s < CLONE else cl[s - CLONE, C_LEN]


@nb.njit(cache=True, inline="always")
def _link(pf, cl, s) -> int:
    return pf[s, P_LINK] if s < CLONE else cl[s - CLONE, C_LINK]


@nb.njit(cache=True, inline="always")
def _endpos(cl, s) -> int:
    return s - 1 if s < CLONE else cl[s - CLONE, C_END]


@nb.njit(cache=True, inline="always")
def _last(pf, cl, s) -> int:
    return pf[s, P_LAST] if s < CLONE else cl[s - CLONE, C_LAST]


@nb.njit(cache=True, inline="always")
def _occurred(pf, cl, meta, s, e) -> None:
    """The token ending at ``e`` made ``s`` the match (the new prefix state's link): remember where the match's
    latest earlier occurrence ends, then mark ``e`` on ``s`` and the states above it on the suffix path (they all
    occur again at ``e``). Only the first :data:`RECENT_DEPTH` are marked, which keeps a step's cost bounded on
    periodic text (a path as long as the text); a state deeper than that keeps an older occurrence, still a true
    one."""
    meta[MATCH_LAST] = _last(pf, cl, s) if s != 0 else -1
    depth = 0
    while s > 0 and depth < RECENT_DEPTH:
        if s < CLONE:
            pf[s, P_LAST] = e
        else:
            cl[s - CLONE, C_LAST] = e
        s = _link(pf, cl, s)
        depth += 1


@nb.njit(cache=True, inline="always")
def _head(pf, cl, s) -> int:
    return pf[s, P_HEAD] if s < CLONE else cl[s - CLONE, C_HEAD]


@nb.njit(cache=True)
def _transition(pf, cl, table, n_text, s, c) -> int:
    """Target of edge (s, c) in the automaton of the text's first ``n_text`` tokens, or -1."""
    if s < CLONE:
        if s < n_text and pf[s, P_TOK] == c:
            return s + 1
        if pf[s, P_HEAD] == NO_TOK:
            return -1
    else:
        if cl[s - CLONE, C_TOK] == c:
            return cl[s - CLONE, C_TO]
        if cl[s - CLONE, C_HEAD] == NO_TOK:
            return -1
    i = _find_slot(table, s, c)
    return -1 if i == -1 else table[2 * i + 1] & _LOW32


@nb.njit(cache=True)
def _add_edge(table_l, slot, table, meta, pf, cl, s, c, target):
    """Edge (s, c) -> target: inline for a clone that has none, else at the head of ``s``'s chain in the hash
    ``table`` (doubled first when full: then the new array replaces it in ``table_l``). Returns the hash."""
    if s >= CLONE and cl[s - CLONE, C_TOK] == NO_TOK:
        cl[s - CLONE, C_TOK] = c
        cl[s - CLONE, C_TO] = target
        return table
    if meta[N_EXTRA] + 1 > MAX_LOAD * (table.shape[0] >> 1):
        bigger = np.empty(2 * table.shape[0], dtype=np.int64)
        _huge_pages(bigger)
        bigger[:] = -1
        for i in range(0, table.shape[0], 2):
            if table[i] != -1:
                _hash_put(bigger, table[i], table[i + 1])
        table_l[slot] = bigger
        table = bigger
    _hash_put(table, _key(s, c), (np.int64(_head(pf, cl, s)) << 32) | target)
    if s < CLONE:
        pf[s, P_HEAD] = c
    else:
        cl[s - CLONE, C_HEAD] = c
    meta[N_EXTRA] += 1
    return table


@nb.njit(cache=True)
def _advance(pf, cl, table, n_text, state, mlen, tok):
    """Longest-suffix-match step: the match (state, mlen) extended by ``tok`` (falls back along links)."""
    # re-canonicalise: a later split may have moved strings of length mlen into an ancestor (clone)
    while state != 0 and _length(cl, _link(pf, cl, state)) >= mlen:
        state = _link(pf, cl, state)
    while True:
        t = _transition(pf, cl, table, n_text, state, tok)
        if t != -1:
            return t, mlen + 1
        if state == 0:
            return 0, 0
        state = _link(pf, cl, state)
        mlen = _length(cl, state)


@nb.njit(cache=True)
def _grown_rows(a, rows: int):
    b = np.empty((rows, a.shape[1]), dtype=np.int32)
    _huge_pages(b)
    b[: a.shape[0]] = a
    return b


@nb.njit(cache=True)
def _extend(pf_l, cl_l, table_l, meta_l, slot, tokens) -> None:
    """Append ``tokens`` to automaton ``slot`` (the standard online construction, with prefix states' solid
    edges implicit). The new prefix state's suffix link is the longest suffix of the text that also ends
    earlier: that is the match, with no walk of its own."""
    meta = meta_l[slot]
    pf, cl, table = pf_l[slot], cl_l[slot], table_l[slot]
    latest = pf.shape[1] > P_LAST
    need = meta[TEXT_LEN] + tokens.shape[0] + 1
    if need > pf.shape[0]:
        pf_l[slot] = pf = _grown_rows(pf, max(need, int(GROWTH * pf.shape[0])))
    for j in range(tokens.shape[0]):
        c = tokens[j]
        pos = meta[TEXT_LEN]
        pf[pos, P_TOK] = c  # the last prefix state's implicit edge: c -> pos + 1
        meta[TEXT_LEN] = pos + 1
        cur = pos + 1
        pf[cur, P_HEAD] = NO_TOK
        if latest:
            pf[cur, P_LAST] = pos
        p = pf[pos, P_LINK]
        q = -1
        while p != -1:
            q = _transition(pf, cl, table, pos + 1, p, c)
            if q != -1:
                break
            table = _add_edge(table_l, slot, table, meta, pf, cl, p, c, cur)
            p = _link(pf, cl, p)
        if p == -1:
            pf[cur, P_LINK] = 0
            meta[MATCH_STATE], meta[MATCH_LEN], meta[MATCH_LAST] = 0, 0, -1
            continue
        meta[MATCH_LEN] = _length(cl, p) + 1
        if _length(cl, q) == _length(cl, p) + 1:
            pf[cur, P_LINK] = q
            meta[MATCH_STATE] = q
            if latest:
                _occurred(pf, cl, meta, q, pos)
            continue
        k = meta[N_CLONES]
        if k >= cl.shape[0]:
            cl_l[slot] = cl = _grown_rows(cl, int(GROWTH * cl.shape[0]) + 1)
        meta[N_CLONES] = k + 1
        clone = CLONE + k
        cl[k, C_LEN] = _length(cl, p) + 1
        cl[k, C_LINK] = _link(pf, cl, q)
        cl[k, C_END] = _endpos(cl, q)
        if latest:
            cl[k, C_LAST] = _last(pf, cl, q)
        cl[k, C_HEAD] = NO_TOK
        if q < CLONE:
            cl[k, C_TOK] = pf[q, P_TOK]
            cl[k, C_TO] = q + 1
        else:
            cl[k, C_TOK] = cl[q - CLONE, C_TOK]
            cl[k, C_TO] = cl[q - CLONE, C_TO]
        t = _head(pf, cl, q)
        while t != NO_TOK:
            v = table[2 * _find_slot(table, q, t) + 1]
            table = _add_edge(table_l, slot, table, meta, pf, cl, clone, t, v & _LOW32)
            t = v >> 32
        while p != -1 and _transition(pf, cl, table, pos + 1, p, c) == q:
            if p >= CLONE and cl[p - CLONE, C_TOK] == c:
                cl[p - CLONE, C_TO] = clone
            else:  # in the hash: a prefix state's implicit edge is solid and never points at a split state
                i = _find_slot(table, p, c)
                table[2 * i + 1] = (table[2 * i + 1] & _HIGH32) | clone
            p = _link(pf, cl, p)
        if q < CLONE:
            pf[q, P_LINK] = clone
        else:
            cl[q - CLONE, C_LINK] = clone
        pf[cur, P_LINK] = clone
        meta[MATCH_STATE] = clone
        if latest:
            _occurred(pf, cl, meta, clone, pos)


@nb.njit(cache=True)
def _draft(pf, cl, text_len, state, mlen, k, min_match, out) -> int:
    """Write up to ``k`` tokens that followed the first earlier occurrence of the match into ``out``.

    If that occurrence leaves fewer than ``k`` tokens before the end of the text, back off along suffix
    links (shorter matches, earlier first occurrences) while the match stays >= ``min_match``. Stops at a
    negative token (a sequence separator). Returns the number of tokens written.
    """
    if mlen < min_match or state == 0:
        return 0
    while state != 0 and _length(cl, _link(pf, cl, state)) >= mlen:
        state = _link(pf, cl, state)
    e = _endpos(cl, state)
    while text_len - e - 1 < k:
        up = _link(pf, cl, state)
        if up <= 0 or _length(cl, up) < min_match:
            break
        state = up
        e = _endpos(cl, state)
    n = 0
    i = e + 1
    while n < k and i < text_len:
        t = pf[i, P_TOK]
        if t < 0:
            break
        out[n] = t
        n += 1
        i += 1
    return n


@nb.njit(cache=True, inline="always")
def _branches(pf, cl, s) -> bool:
    """Whether state ``s`` has more than one out-edge (its occurrences went on in several ways): edges in the hash
    beside its solid (prefix state) or inline (clone) edge."""
    return _head(pf, cl, s) != NO_TOK


@nb.njit(cache=True)
def _own_evidence(pf, cl, table, n_text, state, mlen, copied_end, draft, n, level) -> None:
    """Each of the ``n`` tokens of a draft copied from the request's own text after the match's latest earlier
    occurrence (which ends at ``copied_end``): its evidence level (:mod:`sam.cells`), by whether the text up to it
    (the match and the draft before it) occurred before that copy too, and whether those occurrences all went on
    the same way (the automaton state's out-edges)."""
    while state != 0 and _length(cl, _link(pf, cl, state)) >= mlen:
        state = _link(pf, cl, state)
    end = copied_end
    for j in range(n):
        if state <= 0:
            level[j] = OWN_ONCE
        elif _endpos(cl, state) >= end:
            shorter = _link(pf, cl, state)  # the text up to the token seen once: did a shorter context go on in
            # several ways?
            level[j] = OWN_ONCE_SPLIT if shorter > 0 and _branches(pf, cl, shorter) else OWN_ONCE
        else:
            level[j] = OWN_SPLIT if _branches(pf, cl, state) else OWN_AGREED
        if state > 0:
            state = _transition(pf, cl, table, n_text, state, draft[j])
        end += 1


@nb.njit(cache=True)
def _draft_recent(pf, n_text, end, k, out) -> int:
    """Write up to ``k`` tokens that followed text position ``end`` (where the match's latest earlier occurrence
    ends) into ``out``. A copy that reaches the end of the text goes on with what it copied, so periodic text
    continues its period. Stops at a separator (negative token). Returns the number of tokens written."""
    if end < 0:
        return 0
    n = 0
    while n < k:
        i = end + 1 + n
        t = pf[i, P_TOK] if i < n_text else out[i - n_text]
        if t < 0:
            break
        out[n] = t
        n += 1
    return n


@nb.njit(cache=True)
def _count(pf_l, cl_l, meta_l, stats_l, slot) -> None:
    """Occurrence counts of every state of automaton ``slot``: how many times its strings occur in the text and
    where the last occurrence ends (a state's end positions are its prefix states' in its suffix-link subtree,
    so counts flow from longer states to their links). Row of prefix state i: i; of clone j: text length + 1 + j;
    the memo's rows (:func:`_best_next`) after those, cleared.
    """
    meta = meta_l[slot]
    pf, cl = pf_l[slot], cl_l[slot]
    n = meta[TEXT_LEN]
    n_clones = meta[N_CLONES]
    rows = n + 1 + n_clones
    st = np.empty((rows + _memo_rows(rows), 2), dtype=np.int32)  # the memo's rows (_best_next) after the states'
    _huge_pages(st)
    st[:, S_OCC] = 0
    st[:, S_LAST] = -1
    by_length = np.zeros(n + 2, dtype=np.int64)  # counting sort of the states, longest first
    by_length[: n + 1] = 1
    for j in range(n_clones):
        by_length[cl[j, C_LEN]] += 1
    at = 0
    for length in range(n, -1, -1):
        count = by_length[length]
        by_length[length] = at
        at += count
    order = np.empty(rows, dtype=np.int64)
    for i in range(n + 1):
        order[by_length[i]] = i
        by_length[i] += 1
    for j in range(n_clones):
        length = cl[j, C_LEN]
        order[by_length[length]] = n + 1 + j
        by_length[length] += 1
    for i in range(1, n + 1):
        st[i, S_OCC] = 1
        st[i, S_LAST] = i - 1
    for r in order:
        if r == 0:
            continue
        link = pf[r, P_LINK] if r <= n else cl[r - n - 1, C_LINK]
        up = link if link < CLONE else n + 1 + (link - CLONE)
        st[up, S_OCC] += st[r, S_OCC]
        st[up, S_LAST] = max(st[up, S_LAST], st[r, S_LAST])
    stats_l[slot] = st
    meta[COUNTED_LEN] = n


@nb.njit(cache=True, inline="always")
def _stat_row(n_text, s) -> int:
    return s if s < CLONE else n_text + 1 + (s - CLONE)


@nb.njit(cache=True)
def _draft_counted(
    pf, cl, table, st, n_text, n_clones, state, mlen, k, min_match, prior, decay, min_prob, out, level, chance_table,
    token_cost, source, bounds, floor, floor_free, cand_out, cand_level,
):  # fmt: skip
    """Write up to ``k`` tokens into ``out``, each the continuation that most occurrences of the match take
    (the latest occurrence breaks ties), while the estimated chance that the whole draft is accepted stays at
    least ``min_prob``, and each token's evidence level (:func:`sam.cells.counted_level`) into ``level``.
    A token's chance is its count over the match's count plus ``prior * (min_match / match length) ** decay`` (a
    continuation seen once after a short match is a guess, after a long one it is mostly right; one seen in 7 of 8
    responses is likely). The match is the longest suffix of the context the text holds or a shorter one (a suffix
    link up, at least ``min_match`` long), whichever draft gains the most under ``chance_table`` at ``token_cost``
    for ``source`` as :func:`_draft_gain` scores it: a long match seen once is often beaten by a short one that most
    responses continued the same way (suffix decoding, too, scores every match length). At most
    :data:`SCORED_LENGTHS` lengths are tried, the longest first; a length is not drafted where its band's
    ``bounds`` (:func:`_gain_bounds`) say no draft there or shorter can beat the best so far, starting from ``floor``
    and ``floor_free`` (a draft the caller already has; ``-inf``: none). Without a table (``scored`` off), the longest
    match. ``cand_out`` and ``cand_level`` are scratch of ``k``. Needs counts taken at ``n_text`` (:func:`_count`).
    Stops at a separator (negative token). Returns (tokens written, the match length they were drafted from, the
    draft's gain and its gain at no cost; 0 and ``floor`` if no length beat it).
    """
    if mlen < min_match or state == 0:
        return 0, 0, floor, floor_free
    while state != 0 and _length(cl, _link(pf, cl, state)) >= mlen:
        state = _link(pf, cl, state)
    scored = chance_table.size > 0
    best_n, best_length, best, best_free = 0, 0, floor, floor_free
    length = mlen
    tried = 0
    while state > 0 and length >= min_match and tried < SCORED_LENGTHS:
        tried += 1
        if scored:
            band = match_band(length)
            if _cannot_beat(bounds[0, source, band], bounds[1, source, band], best, best_free):
                break  # the bounds only fall with the match length, and the best only rises
        n = _draft_counted_at(
            pf, cl, table, st, n_text, n_clones, state, length, k, min_match, prior, decay, min_prob, cand_out,
            cand_level,
        )  # fmt: skip
        if not scored:  # unscored: the longest match's draft
            out[:n] = cand_out[:n]
            level[:n] = cand_level[:n]
            return n, (length if n > 0 else 0), 0.0, 0.0
        gain, free = _draft_gain(chance_table, token_cost, source, length, cand_level, n)
        if n > 0 and (gain > best or (gain == best and free > best_free)):
            best_n, best_length, best, best_free = n, length, gain, free
            out[:n] = cand_out[:n]
            level[:n] = cand_level[:n]
        state = _link(pf, cl, state)
        length = _length(cl, state)
    return best_n, best_length, best, best_free


@nb.njit(cache=True, inline="always")
def _cannot_beat(bound, bound_free, best, best_free) -> bool:
    """Whether a draft whose gain is at most ``bound`` (at no cost ``bound_free``) cannot win over the best so far
    (a higher gain wins, a tie goes to the higher gain at no cost)."""
    return bound < best or (bound == best and bound_free <= best_free)


@nb.njit(cache=True)
def _gain_bounds(chance_table, token_cost, out) -> None:
    """``out[0, source, band]``: the most :func:`_draft_gain` can give a draft from ``source`` at a match band up to
    ``band`` at ``token_cost`` (:func:`sam.cells.likeliest_gain`, best over the bands up to that one); ``out[1]`` the
    same at no cost. A candidate whose bound is below the best draft so far is not drafted: a scored step tries each
    counted corpus at up to :data:`SCORED_LENGTHS` match lengths, each a draft whose tokens scan their states'
    edges."""
    for source in range(chance_table.shape[0]):
        most = most_free = -np.inf
        for band in range(chance_table.shape[1]):
            gain, free = likeliest_gain(chance_table, source, band, token_cost)
            most, most_free = max(most, gain), max(most_free, free)
            out[0, source, band], out[1, source, band] = most, most_free


@nb.njit(cache=True)
def _memo_rows(states: int) -> int:
    """Rows of a counted automaton's memo (:func:`_best_next`) for ``states`` states: a power of two."""
    rows = 16
    while rows * MEMO_SHARE < states:
        rows *= 2
    return rows


@nb.njit(cache=True)
def _best_next(pf, cl, table, st, n_text, n_clones, state, support):
    """(token, state it leads to) of ``state``'s most frequent continuation (the latest occurrence breaks ties; never a
    separator), (NO_TOK, -1) if none; ``support`` is ``state``'s occurrences, which bound its edges. A short match in a
    big corpus has an edge for most tokens, each a hash probe, and drafts pass through the same few such states step
    after step, so a state with more than :data:`MEMO_MIN_SUPPORT` occurrences keeps its answer in a direct-mapped
    memo: ``st``'s rows after the states' (:func:`_count`), each (state, answer), which the next count clears."""
    if support <= MEMO_MIN_SUPPORT:
        return _scan_next(pf, cl, table, st, n_text, state)
    states = n_text + 1 + n_clones
    memo = states + (state & (st.shape[0] - states - 1))
    if st[memo, 0] == state:
        to = st[memo, 1]
        return (pf[_endpos(cl, to), P_TOK] if to >= 0 else NO_TOK), to
    tok, to = _scan_next(pf, cl, table, st, n_text, state)
    st[memo, 0], st[memo, 1] = state, to
    return tok, to


@nb.njit(cache=True, inline="always")
def _scan_next(pf, cl, table, st, n_text, state):
    """:func:`_best_next` by scanning ``state``'s edges."""
    best_tok, best_to, best_occ, best_last = NO_TOK, -1, 0, -1
    if state < CLONE:
        if state < n_text:
            t, to = pf[state, P_TOK], state + 1
            o, last = st[to, S_OCC], st[to, S_LAST]
            if t >= 0 and (o > best_occ or (o == best_occ and last > best_last)):
                best_tok, best_to, best_occ, best_last = t, to, o, last
        h = pf[state, P_HEAD]
    else:
        t, to = cl[state - CLONE, C_TOK], cl[state - CLONE, C_TO]
        if t != NO_TOK:
            r = _stat_row(n_text, to)
            o, last = st[r, S_OCC], st[r, S_LAST]
            if t >= 0 and (o > best_occ or (o == best_occ and last > best_last)):
                best_tok, best_to, best_occ, best_last = t, to, o, last
        h = cl[state - CLONE, C_HEAD]
    while h != NO_TOK:
        v = table[2 * _find_slot(table, state, h) + 1]
        to = v & _LOW32
        r = _stat_row(n_text, to)
        o, last = st[r, S_OCC], st[r, S_LAST]
        if h >= 0 and (o > best_occ or (o == best_occ and last > best_last)):
            best_tok, best_to, best_occ, best_last = h, to, o, last
        h = v >> 32
    return best_tok, best_to


@nb.njit(cache=True)
def _draft_counted_at(
    pf, cl, table, st, n_text, n_clones, state, mlen, k, min_match, prior, decay, min_prob, out, level
):  # fmt: skip
    """:func:`_draft_counted`'s draft from one canonical match ``(state, mlen)``; returns the tokens written."""
    chance = 1.0
    n = 0
    while n < k:
        support = st[_stat_row(n_text, state), S_OCC]
        best_tok, best_to = _best_next(pf, cl, table, st, n_text, n_clones, state, support)
        if best_to < 0:
            break
        best_occ = st[_stat_row(n_text, best_to), S_OCC]
        shrunk = prior * (max(1, min_match) / (mlen + n)) ** decay  # the match grows by each drafted token
        chance *= best_occ / (support + shrunk)
        if chance < min_prob:
            break
        out[n] = best_tok
        level[n] = counted_level(best_occ, support)
        n += 1
        state = best_to
    return n


@nb.njit(cache=True)
def _match_stream(pf, cl, table, n_text, state, mlen, tokens):
    for j in range(tokens.shape[0]):
        state, mlen = _advance(pf, cl, table, n_text, state, mlen, tokens[j])
    return state, mlen


@nb.njit(cache=True)
def _match_slot(pf_l, cl_l, table_l, meta_l, slot, state, mlen, tokens):
    return _match_stream(pf_l[slot], cl_l[slot], table_l[slot], meta_l[slot][TEXT_LEN], state, mlen, tokens)


@nb.njit(cache=True)
def _draft_slot(pf_l, cl_l, meta_l, slot, state, mlen, k, min_match, out) -> int:
    return _draft(pf_l[slot], cl_l[slot], meta_l[slot][TEXT_LEN], state, mlen, k, min_match, out)


class DraftRules(NamedTuple):
    """The drafting options :func:`step_rows` reads, by name (a swapped pair of floats cannot pass unnoticed as it
    could positionally); :meth:`sam.policy.SAMOptions.rules` builds it. Meanings: ``SAMOptions``."""

    min_match: int
    min_match_counted: int
    tokens_per_match: float
    own_bonus: int
    resync_tokens: int
    count_prior: float
    prior_decay: float
    min_token_prob: float
    own_latest: bool


def step_rows(
    pool: tuple,
    rows: tuple,
    matchers: tuple,
    rules: DraftRules,
    outs: tuple,
    chance_table: np.ndarray | None = None,
    token_cost: float = 0.0,
    explored: tuple | None = None,
) -> None:
    """One decode step for every row: append row ``r``'s verified tokens to automaton ``own[r]``, advance its
    matchers into the group corpora ``src_slot[own[r]]`` (re-matching its last ``rules.resync_tokens`` tokens when a
    corpus grew), and draft up to ``ks[r]`` tokens for it into ``out[r]`` from the best of its sources: the one whose
    draft gains the most under ``chance_table`` (the payoff rule's learned chances,
    :meth:`sam.payoff.AcceptanceModel.conditional`) if each draft token costs ``token_cost`` accepted tokens (the
    payoff rule's threshold: a long draft of middling tokens wins where drafting is cheap, a short sure one where it
    is dear), or without a table the one with the longest match (the request's own text wins ties and gets
    ``rules.own_bonus`` extra match length).

    Arguments come in groups: ``pool`` is :attr:`AutomatonPool.all_lists`,
    ``rows`` ``(own, tok_flat, tok_off, ks)`` (row ``r``'s automaton slot, its new tokens
    ``tok_flat[tok_off[r]:tok_off[r + 1]]``, its draft budget), ``matchers`` the per-slot state of the group matchers
    ``(src_slot, src_state, src_len, src_seen)``, ``rules`` a :class:`DraftRules`, ``outs`` the output buffers
    ``(out, out_n, out_group, out_mlen, out_level)``. The groups are unpacked here, in Python, and the compiled kernel
    (:func:`_step_rows`) takes them flat: numba unboxes a tuple of typed lists and a named tuple on every call,
    which doubled the step's cost at 64 rows (135 against 66 us).

    From a counted corpus (:func:`_count`) the draft follows the most frequent continuation while its estimated
    chance (``count_prior`` shrunk by the match length with ``prior_decay``) stays at least ``min_token_prob``
    (:func:`_draft_counted`), from a match of at least ``min_match_counted`` (``min_match`` without a table). From
    the request's own text (never
    counted: it grows every step) it is what followed the latest earlier occurrence (``own_latest``; else the first),
    ``min(ks[r], ceil(tokens_per_match * (match - min_match + 1)))`` tokens; nothing below ``min_match``.
    ``out_group[r]`` is the draft's source (:data:`sam.cells.OWN`, ...), ``out_mlen[r]`` its match length and
    ``out_level[r, j]`` token ``j``'s evidence level (:func:`_own_evidence`, :func:`sam.cells.counted_level`): the
    cells of the payoff rule's model, :mod:`sam.cells`. Without a table every level is 0: unscored drafts are
    counted by source and match band only, and the own-text levels' walk is skipped.

    ``explored`` ``(pick, out, out_n, out_group, out_mlen, out_level)`` (with a table): row ``r`` also writes one
    candidate whatever its gain, the first with a draft from candidate ``pick[r]`` on (0 the request's own text, then
    the group corpora in ``src_slot``'s order, cyclically). It is what the payoff rule learns from: learning only from
    the chosen drafts, a source that was chosen first is the only one ever learned and keeps winning (every prompt's
    responses held out each prompt's own history on the embedded task, results/real/README.md).
    """
    table = np.zeros((0, 0, 0, 0)) if chance_table is None else np.ascontiguousarray(chance_table, dtype=np.float64)
    if explored is None:
        explored = (np.zeros(0, dtype=np.int64), *outs)
    _step_rows(
        *pool, *rows, *matchers,
        rules.min_match, rules.min_match_counted, rules.tokens_per_match, rules.own_bonus, rules.resync_tokens,
        rules.count_prior, rules.prior_decay, rules.min_token_prob, rules.own_latest, table, token_cost, *outs,
        *explored,
    )  # fmt: skip


@nb.njit(cache=True)
def _draft_gain(chance_table, token_cost, source, mlen, level, n) -> tuple:
    """(expected accepted tokens less ``token_cost`` per token sent, the same at no cost) of an ``n``-token draft
    from ``source`` at match length ``mlen`` whose tokens' evidence levels are ``level``, under the learned
    conditional chances ``chance_table`` (:mod:`sam.cells`), sending the tokens whose chance exceeds the cost (the
    payoff rule's cut)."""
    band = match_band(mlen)
    chance = 1.0
    total = free = 0.0
    for j in range(n):
        chance *= chance_table[source, band, level[j], j]
        if chance <= 0.0:
            break
        free += chance
        if chance > token_cost:
            total += chance - token_cost
    return total, free


@nb.njit(cache=True, inline="always")
def _offer(best_rank, rank, r, cand, n, source, mlen, cand_level, out, out_n, out_group, out_mlen, out_level) -> int:
    """Row ``r``'s explored candidate becomes this one if it has a draft and comes earlier in the rotation."""
    if n <= 0 or rank >= best_rank:
        return best_rank
    out[r, :n] = cand[:n]
    out_n[r], out_group[r], out_mlen[r] = n, source, mlen
    out_level[r, :] = cand_level
    return rank


@nb.njit(cache=True)
def _step_rows(
    pf_l, cl_l, table_l, meta_l, stats_l, own, tok_flat, tok_off, ks, src_slot, src_state, src_len, src_seen,
    min_match, min_match_counted, tokens_per_match, own_bonus, resync, count_prior, prior_decay, min_token_prob,
    own_latest, chance_table, token_cost, out, out_n, out_group, out_mlen, out_level, pick, ex, ex_n, ex_group,
    ex_mlen, ex_level,
) -> None:  # fmt: skip
    """:func:`step_rows`'s compiled body, arguments flat in that order (``chance_table`` empty: no table)."""
    scored = chance_table.size > 0
    if not scored:  # without learned chances to cut them, drafts from one token of context are mostly wrong
        min_match_counted = max(min_match_counted, min_match)
    cand = np.empty(out.shape[1], dtype=out.dtype)
    cand_level = np.empty(out.shape[1], dtype=out_level.dtype)
    scratch = np.empty(out.shape[1], dtype=out.dtype)
    scratch_level = np.empty(out.shape[1], dtype=out_level.dtype)
    bounds = np.zeros((2, 0, 0))
    if scored:
        bounds = np.empty((2, chance_table.shape[0], chance_table.shape[1]))
        _gain_bounds(chance_table, token_cost, bounds)
    exploring = scored and pick.size > 0
    candidates = 1 + src_slot.shape[1]
    for r in range(own.shape[0]):
        ex_rank = candidates
        if exploring:
            ex_n[r] = 0
        out_n[r] = 0
        out_group[r] = OWN
        out_mlen[r] = 0
        out_level[r, :] = OWN_ONCE
        s = own[r]
        if s < 0:
            continue
        toks = tok_flat[tok_off[r] : tok_off[r + 1]]
        _extend(pf_l, cl_l, table_l, meta_l, s, toks)
        meta = meta_l[s]
        pf = pf_l[s]
        n_text = meta[TEXT_LEN]
        k = ks[r]
        best, best_free = -np.inf, -np.inf  # the chosen draft's gain at the token cost, and at no cost (a tie-break:
        # the draft with the most to offer is the request's shadow even where no token of any draft pays)
        mlen = meta[MATCH_LEN]
        if k > 0 and mlen >= min_match:
            kk = min(k, math.ceil(tokens_per_match * (mlen - min_match + 1)))
            cand_level[:] = OWN_ONCE
            if own_latest:
                n = _draft_recent(pf, n_text, meta[MATCH_LAST], kk, cand)
                if scored:
                    _own_evidence(
                        pf, cl_l[s], table_l[s], n_text, meta[MATCH_STATE], mlen, meta[MATCH_LAST], cand, n, cand_level
                    )
            else:
                n = _draft_slot(pf_l, cl_l, meta_l, s, meta[MATCH_STATE], mlen, kk, min_match, cand)
            gain, free = float(mlen + own_bonus), 0.0
            if scored:
                gain, free = _draft_gain(chance_table, token_cost, OWN, mlen, cand_level, n)
            if exploring:
                rank = (candidates - pick[r] % candidates) % candidates
                ex_rank = _offer(
                    ex_rank, rank, r, cand, n, OWN, mlen, cand_level, ex, ex_n, ex_group, ex_mlen, ex_level
                )
            if n > 0:
                best, best_free = gain, free
                out_n[r], out_mlen[r] = n, mlen
                out[r, :n] = cand[:n]
                out_level[r, :] = cand_level
        for j in range(src_slot.shape[1]):
            c = src_slot[s, j]
            if c < 0:
                continue
            c_meta = meta_l[c]
            c_len = c_meta[TEXT_LEN]
            if c_len != src_seen[s, j]:
                src_seen[s, j] = c_len
                feed = pf[max(0, n_text - resync) : n_text, P_TOK]
                state, mlen = _match_stream(pf_l[c], cl_l[c], table_l[c], c_len, 0, 0, feed)
            else:
                state, mlen = src_state[s, j], src_len[s, j]
                state, mlen = _match_stream(pf_l[c], cl_l[c], table_l[c], c_len, state, mlen, toks)
            src_state[s, j] = state
            src_len[s, j] = mlen
            counted = c_meta[COUNTED_LEN] == c_len
            if k <= 0 or mlen < (min_match_counted if counted else min_match):
                continue
            if not scored and mlen <= best:  # the longest match wins: no need to draft a shorter one
                continue
            cand_level[:] = OWN_ONCE
            rank = (1 + j - pick[r] % candidates) % candidates if exploring else candidates
            gain, free = float(mlen), 0.0
            if counted:
                # a corpus that may be the row's explored candidate drafts its best whatever the row has; another
                # only what can beat the row's best draft so far
                floor, floor_free = (-np.inf, -np.inf) if rank < ex_rank else (best, best_free)
                n, mlen, gain, free = _draft_counted(
                    pf_l[c], cl_l[c], table_l[c], stats_l[c], c_len, c_meta[N_CLONES], state, mlen, k,
                    min_match_counted, count_prior, prior_decay, min_token_prob, cand, cand_level, chance_table,
                    token_cost, CORPUS_SOURCE[j], bounds, floor, floor_free, scratch, scratch_level,
                )  # fmt: skip
                if not scored:
                    gain = float(mlen)
            else:
                kk = min(k, math.ceil(tokens_per_match * (mlen - min_match + 1)))
                n = _draft_slot(pf_l, cl_l, meta_l, c, state, mlen, kk, min_match, cand)
                if scored:
                    gain, free = _draft_gain(chance_table, token_cost, CORPUS_SOURCE[j], mlen, cand_level, n)
            if exploring:
                ex_rank = _offer(
                    ex_rank, rank, r, cand, n, CORPUS_SOURCE[j], mlen, cand_level, ex, ex_n, ex_group, ex_mlen, ex_level
                )
            if n > 0 and (gain > best or (gain == best and free > best_free)):
                best, best_free = gain, free
                out_n[r], out_mlen[r], out_group[r] = n, mlen, CORPUS_SOURCE[j]
                out[r, :n] = cand[:n]
                if scored:
                    out_level[r, :] = cand_level
                else:
                    out_level[r, :] = OWN_ONCE


def _hash_slots(edges: int) -> int:
    return 1 << max(4, math.ceil(math.log2(edges / MAX_LOAD + 1)))


@nb.njit(cache=True)
def _release(prefix, clones, table, meta, stats, slot: int) -> None:
    """:meth:`AutomatonPool.release`'s arrays, in one compiled call: from Python each typed-list item costs several
    microseconds, and most of a rollout's requests are released on its last few steps."""
    prefix[slot] = np.empty((0, 3), dtype=np.int32)
    clones[slot] = np.empty((0, 6), dtype=np.int32)
    table[slot] = np.full(2, -1, dtype=np.int64)
    fresh = np.zeros(7, dtype=np.int64)
    fresh[5:] = -1
    meta[slot] = fresh
    stats[slot] = np.empty((0, 2), dtype=np.int32)


class AutomatonPool:
    """Slots of automata reachable from one compiled call (see :func:`step_rows`); freed slots are reused."""

    def __init__(self) -> None:
        self.prefix = List.empty_list(nb.types.int32[:, ::1])
        self.clones = List.empty_list(nb.types.int32[:, ::1])
        self.table = List.empty_list(nb.types.int64[::1])
        self.meta = List.empty_list(nb.types.int64[::1])
        self.stats = List.empty_list(nb.types.int32[:, ::1])  # occurrence counts of counted automata (_count)
        self._free: list[int] = []
        self._size = 0

    @property
    def lists(self) -> tuple:
        """The arrays that building and matching read; :attr:`stats` only counted drafting does."""
        return self.prefix, self.clones, self.table, self.meta

    def live(self) -> int:
        return self._size - len(self._free)

    def acquire(self, capacity: int, latest: bool = False) -> int:
        """A slot holding an empty automaton with room for ``capacity`` tokens before its arrays grow; with
        ``latest`` it tracks where each state last occurred (4 more bytes a state, and a slower append)."""
        prefix = np.empty((capacity + 1, 4 if latest else 3), dtype=np.int32)
        prefix[0, :2] = (-1, NO_TOK)  # the root: no link, no chain
        arrays = (
            prefix,
            np.empty((max(4, capacity // 2), 7 if latest else 6), dtype=np.int32),  # about 0.6 clones per token
            np.full(2 * _hash_slots(capacity // 2), -1, dtype=np.int64),  # and about 0.4 hashed edges
            np.array([0, 0, 0, 0, 0, -1, -1], dtype=np.int64),
            np.empty((0, 2), dtype=np.int32),
        )
        if self._free:
            slot = self._free.pop()
            for lst, a in zip(self.all_lists, arrays, strict=True):
                lst[slot] = a
        else:
            slot = self._size
            self._size += 1
            for lst, a in zip(self.all_lists, arrays, strict=True):
                lst.append(a)
        return slot

    @property
    def all_lists(self) -> tuple:
        """Every array of every slot, in :func:`step_rows`'s order: prefix, clones, hash table, meta, stats."""
        return (*self.lists, self.stats)

    def release(self, slot: int) -> None:
        """Drop the slot's arrays (memory is freed) and recycle the slot."""
        _release(*self.all_lists, slot)
        self._free.append(slot)

    def nbytes(self, slot: int) -> int:
        return sum(lst[slot].nbytes for lst in self.all_lists)


class SuffixAutomaton:
    """Online suffix automaton over a token stream with longest-earlier-match drafting.

    >>> sa = SuffixAutomaton()
    >>> sa.extend([1, 2, 3, 1, 2])
    >>> sa.match_length, sa.draft(2)
    (2, [3, 1])
    """

    def __init__(self, capacity: int = 1024, pool: AutomatonPool | None = None, latest: bool = False):
        self._pool = pool if pool is not None else AutomatonPool()
        self.slot = self._pool.acquire(max(16, capacity), latest)
        self._meta = self._pool.meta[self.slot]  # never replaced while the slot is held
        self._out = np.empty(64, dtype=np.int32)

    def extend(self, tokens) -> None:
        """Append ``tokens`` (ints; negative ids are reserved for separators) to the text."""
        arr = np.ascontiguousarray(tokens, dtype=np.int32)
        if arr.ndim != 1:
            raise ValueError(f"extend expects a 1-D sequence of token ids, got shape {arr.shape}")
        if arr.size == 0:
            return
        if int(arr.min()) <= NO_TOK:
            raise ValueError(f"token ids must be greater than {NO_TOK}, got {int(arr.min())}")
        _extend(*self._pool.lists, self.slot, arr)

    def __len__(self) -> int:
        return int(self._meta[TEXT_LEN])

    @property
    def match_length(self) -> int:
        """Length of the longest suffix of the text that also ends at an earlier position."""
        return int(self._meta[MATCH_LEN])

    @property
    def latest(self) -> bool:
        """Whether it tracks each state's latest occurrence (made with ``latest=True``), for :meth:`draft_latest`."""
        return self._pool.prefix[self.slot].shape[1] > P_LAST

    def _buffer(self, k: int) -> np.ndarray:
        if k > self._out.shape[0]:
            self._out = np.empty(k, dtype=np.int32)
        return self._out

    def _draft_from(self, state: int, mlen: int, k: int, min_match: int) -> list[int]:
        pool, out = self._pool, self._buffer(k)
        n = _draft_slot(pool.prefix, pool.clones, pool.meta, self.slot, state, mlen, k, min_match, out)
        return out[:n].tolist()

    def draft(self, k: int, min_match: int = 1) -> list[int]:
        """Up to ``k`` tokens that followed an earlier occurrence of the longest matching suffix."""
        return self._draft_from(int(self._meta[MATCH_STATE]), self.match_length, k, min_match)

    def draft_latest(self, k: int, min_match: int = 1) -> list[int]:
        """Up to ``k`` tokens that followed the latest earlier occurrence of the longest matching suffix (the copy
        goes on with what it copied when it reaches the end of the text); what own-text drafts propose."""
        if not self.latest:
            raise ValueError("draft_latest needs an automaton made with latest=True")
        if self.match_length < min_match or k <= 0:
            return []
        out = self._buffer(k)
        n = _draft_recent(self._pool.prefix[self.slot], len(self), int(self._meta[MATCH_LAST]), k, out)
        return out[:n].tolist()

    def count_occurrences(self) -> None:
        """Count how often each state's strings occur (until the text grows again), for :meth:`Matcher.draft_frequent`
        and the drafts of :func:`step_rows` from this automaton. Linear in the text; 8.5 bytes per state."""
        pool = self._pool
        _count(pool.prefix, pool.clones, pool.meta, pool.stats, self.slot)

    @property
    def counted(self) -> bool:
        return self._meta[COUNTED_LEN] == self._meta[TEXT_LEN]

    def text(self) -> np.ndarray:
        return self._pool.prefix[self.slot][: len(self), P_TOK].copy()

    @property
    def num_states(self) -> int:
        return len(self) + 1 + int(self._meta[N_CLONES])

    @property
    def nbytes(self) -> int:
        """Bytes of every array the automaton holds (allocated, not only used)."""
        return self._pool.nbytes(self.slot)

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
        state, mlen = _match_slot(*a._pool.lists, a.slot, self._state, self._len, arr)
        self._state, self._len = int(state), int(mlen)

    @property
    def match_length(self) -> int:
        return self._len

    def draft(self, k: int, min_match: int = 1) -> list[int]:
        return self.automaton._draft_from(self._state, self._len, k, min_match)

    def draft_frequent(
        self, k: int, min_match: int = 1, prior: float = 1.0, min_prob: float = 0.0, decay: float = 0.0
    ) -> list[int]:
        """Up to ``k`` tokens, each the most frequent continuation, while the estimated chance of the whole draft
        stays at least ``min_prob`` (see :func:`_draft_counted`; ``decay`` shrinks ``prior`` with the match
        length); the automaton must be counted."""
        a = self.automaton
        if not a.counted:
            raise ValueError("draft_frequent needs occurrence counts of the current text: call count_occurrences()")
        pool = a._pool
        out = np.empty(max(1, k), dtype=np.int32)
        levels = np.empty(out.size, dtype=np.int64)
        n, _, _, _ = _draft_counted(
            pool.prefix[a.slot], pool.clones[a.slot], pool.table[a.slot], pool.stats[a.slot], len(a),
            pool.meta[a.slot][N_CLONES], self._state, self._len, k, min_match, prior, decay, min_prob, out, levels,
            np.zeros((0, 0, 0, 0)), 0.0, 1, np.zeros((2, 0, 0)), -np.inf, -np.inf, np.empty_like(out),
            np.empty_like(levels),
        )  # fmt: skip
        return out[:n].tolist()
