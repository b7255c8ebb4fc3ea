"""SAM drafting policy: per-request automata, sibling (group) and cross-epoch sharing, batch-size gate.

Each request drafts from up to four sources and keeps the one with the longest match (with ``scored``, the one whose
draft gains most under the payoff rule's learned chances, :func:`sam.automaton.step_rows`):
- its own automaton over prompt + verified response tokens (SAM-Decoding's dynamic SAM);
- ``siblings``: the finished responses of the other samples of the same prompt in this rollout (Seer's
  grouped drafting: siblings that finish early feed the long tail);
- ``history``: responses to the same prompt from earlier rollouts (RhymeRL / SPEC-RL's cross-epoch reuse);
- ``global`` (``global_sharing``): every prompt's finished responses in this engine (suffix decoding's global
  tree: answers to one task share their phrasing), counted like group material.

Group material lives in one automaton per prompt and source, with a unique negative separator after each
response so no draft runs from one response into the next. It is counted each time it grows, so a draft from it
follows the continuation most responses took and stops where its estimated
chance (counts, ``count_prior`` shrunk as the match grows by ``prior_decay``) falls below ``min_token_prob``; a
request's own text, which grows every step, drafts what followed the latest earlier occurrence (``own_latest``), by
the match-length rule. Each response is stored after its prompt's last
``lead_tokens`` tokens (the group's ``lead``): a new request's context ends with the same tokens, so it matches
its siblings' openings from its first step instead of only after ``min_match`` tokens of its own. When the last
active sample of a prompt finishes, the rollout's sibling responses move into the history (if ``cross_epoch``)
and the sibling automaton is dropped. Memory is bounded by ``max_history_tokens`` per prompt and by
``max_history_bytes`` for all prompts' histories together (the least recently used prompts' histories go first).

Filing is deferred to where it is needed. A finished sibling's response waits until the next step that drafts, which
files every response that finished since into its group's sibling automaton and counts it once; a prompt whose
samples have all finished never builds them into its sibling automaton. A prompt's finished rollout goes into its
history when the next request starts (on a step that prefills a prompt) or at a checkpoint. At the end of a rollout
most requests finish on a few steps, and filing each of them on the spot cost a few milliseconds on the steps with
the fewest requests, where a step is shortest.
vLLM's proposer goes one step further (:class:`sam.vllm.SAMProposer`): a request that leaves the batch is finished
here (:meth:`BatchDrafter.finish`) only on a step where the drafter works and only if a running request drafts from
its response (:meth:`BatchDrafter.drafted_from`); every other one waits for the next request's start or a checkpoint.

All automata of a drafter live in one :class:`~sam.automaton.AutomatonPool`, and :class:`BatchDrafter` runs a
whole decode step (every running request's extend, matchers and draft) in one compiled call.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, fields

import numpy as np

from sam.automaton import BYTES_PER_TOKEN, AutomatonPool, DraftRules, SuffixAutomaton, step_rows
from sam.cells import CORPUS_SOURCE


@dataclass
class SAMOptions:
    """Drafting options; passed to vLLM as ``additional_config={"sam": {...}}``."""

    min_match: int = 2  # no draft below this match length ...
    min_match_counted: int = 1  # ... but this one from counted group material, whose counts say how often even one
    # token of context went on the same way, where drafts are scored (``scored``; suffix decoding drafts from such
    # matches too; 2 lost accepted tokens teacher-forced, results/real/teacher_forced);
    # unscored, min_match
    tokens_per_match: float = 2.0  # own-text drafts: ceil(tokens_per_match * (match - min_match + 1)), at most K
    batch_threshold: int = 256  # no drafting while more than this many requests are active (the article used 8)
    lead_tokens: int = 3  # prompt tokens stored before each group response: a new request, whose context ends with
    # them, drafts its siblings' openings from its first step (0: only after min_match tokens of its own)
    group_sharing: bool = True  # draft from finished sibling responses of the same prompt
    cross_epoch: bool = True  # draft from earlier rollouts' responses to the same prompt
    scored: bool = True  # with the payoff rule: count acceptance also by each draft token's evidence level and pick
    # each request's source (and a counted corpus's match length) by what its draft gains under those chances
    # (sam/cells.py; with global_sharing above vLLM suffix at every drafting level teacher-forced on SmolLM2:
    # results/real/teacher_forced); False: the longest match
    global_sharing: bool = True  # draft from every prompt's finished responses in this engine (one counted corpus:
    # answers to one task share their phrasing; suffix decoding's global tree; with scored, what puts SAM above
    # suffix at its loosest settings teacher-forced on SmolLM2)
    max_global_tokens: int = 1 << 20  # that corpus's bound; beyond it, it keeps its newest responses (half the bound)
    own_bonus: int = 0  # match-length bonus of the request's own text over group material (negative: group wins)
    own_latest: bool = True  # own-text drafts copy what followed the match's latest earlier occurrence (False: its
    # first, the SAM-Decoding paper's rule)
    max_history_tokens: int = 65536  # per prompt; oldest responses are dropped beyond it
    max_history_bytes: int = 4 << 30  # all prompts' history automata together; least recently used prompts' dropped
    resync_tokens: int = 64  # tokens re-matched when group material grows under a running request
    draft_from_counts: bool = True  # drafts from group material follow the continuation most responses took, for
    # as long as its estimated chance holds (False: the first earlier occurrence, by the match-length rule)
    count_prior: float = 1.0  # drafts from group material: a continuation's chance is its count over the match's
    # count plus this (seen once: 1/2; in 7 of 8 responses: 7/9) ...
    prior_decay: float = 1.0  # ... times (min_match_counted / match length) ** this: a continuation seen once after
    # a long match is mostly right (0: the same prior at every length, which stops such drafts after 4 tokens at 0.05)
    min_token_prob: float = 0.05  # drafts from group material stop where the whole draft's estimated chance falls
    # below this
    payoff: bool = True  # keep a draft token only where its learned chance of acceptance pays for its learned
    # verification cost at the step's batch size (sam/payoff.py); False: every draft the match rules give
    payoff_margin: float = 0.1  # ... and send a step's drafts only if they are expected to raise its tokens/s by this
    # share (break-even drafts lose to estimation error: results/FINDINGS.md, "No payoff margin")
    defer_idle: bool = True  # with the payoff rule, where nothing can pay, leave the drafter's work (taking the
    # step's tokens, shadow drafts) to one step in sam.payoff.CATCH_UP_EVERY: most steps of a big batch then cost the
    # drafter next to nothing; False: it works every step
    payoff_cost: list[float] | None = None  # the step cost [a, b, c, e, f] (and g, h: its context terms) in seconds
    # (sam/payoff.py) instead of learning it from the engine's step times: drafting then depends on the tokens alone,
    # so a seeded run samples the same tokens on every run (None: learned, which follows the machine but not token for
    # token)
    device_prior: bool = True  # the learned step cost starts from the step-cost model's prediction for the engine's
    # model on its accelerator (sam.payoff.device_prior; recipe/cost_model.py), not from the CPU-shaped prior; it is
    # still learned. No effect on a CPU or a device the model has no figures for

    def rules(self) -> DraftRules:
        """The options the compiled step (:func:`sam.automaton.step_rows`) reads, typed as it reads them."""
        return DraftRules(
            min_match=int(self.min_match),
            min_match_counted=int(self.min_match_counted),
            tokens_per_match=float(self.tokens_per_match),
            own_bonus=int(self.own_bonus),
            resync_tokens=int(self.resync_tokens),
            count_prior=float(self.count_prior),
            prior_decay=float(self.prior_decay),
            min_token_prob=float(self.min_token_prob),
            own_latest=bool(self.own_latest),
        )

    @classmethod
    def from_dict(cls, d: dict | None) -> SAMOptions:
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown SAM option(s) {unknown}; known options: {sorted(known)}")
        opts = cls(**d)
        if opts.min_match < 1:
            raise ValueError(f"SAM option min_match must be >= 1, got {opts.min_match}")
        if opts.tokens_per_match <= 0:
            raise ValueError(f"SAM option tokens_per_match must be > 0, got {opts.tokens_per_match}")
        if opts.batch_threshold < 0:
            raise ValueError(f"SAM option batch_threshold must be >= 0, got {opts.batch_threshold}")
        if opts.count_prior < 0:
            raise ValueError(f"SAM option count_prior must be >= 0, got {opts.count_prior}")
        if opts.prior_decay < 0:
            raise ValueError(f"SAM option prior_decay must be >= 0, got {opts.prior_decay}")
        if not 0 <= opts.min_token_prob <= 1:
            raise ValueError(f"SAM option min_token_prob must be in [0, 1], got {opts.min_token_prob}")
        if opts.payoff_cost is not None and (len(opts.payoff_cost) not in (5, 6, 7) or min(opts.payoff_cost) < 0):
            raise ValueError(
                f"SAM option payoff_cost must be 5 to 7 numbers >= 0 [a, b, c, e, f(, g, h)], got {opts.payoff_cost}"
            )
        if opts.payoff_margin < 0:
            raise ValueError(f"SAM option payoff_margin must be >= 0, got {opts.payoff_margin}")
        if opts.min_match_counted < 1:
            raise ValueError(f"SAM option min_match_counted must be >= 1, got {opts.min_match_counted}")
        if opts.max_global_tokens < 1:
            raise ValueError(f"SAM option max_global_tokens must be >= 1, got {opts.max_global_tokens}")
        if opts.lead_tokens < 0:
            raise ValueError(f"SAM option lead_tokens must be >= 0, got {opts.lead_tokens}")
        if opts.cross_epoch and opts.max_history_bytes < BYTES_PER_TOKEN * opts.max_history_tokens:
            raise ValueError(
                f"SAM option max_history_bytes={opts.max_history_bytes} cannot hold one prompt's history of "
                f"max_history_tokens={opts.max_history_tokens} at {BYTES_PER_TOKEN} bytes per token: raise it to at "
                f"least {BYTES_PER_TOKEN * opts.max_history_tokens}, or lower max_history_tokens"
            )
        return opts


def stored_tokens(lead_tokens: int, response_tokens: int) -> int:
    """Tokens a response takes in a group corpus: the prompt's lead before it and a separator after it (what
    ``max_history_tokens`` bounds)."""
    return lead_tokens + response_tokens + 1


def newest_within(responses: list[np.ndarray], lead_tokens: int, budget: int) -> list[np.ndarray]:
    """The newest of ``responses`` (oldest first) whose stored tokens (:func:`stored_tokens`) fit ``budget``, oldest
    first: what a bounded corpus keeps."""
    kept, size = [], 0
    for response in reversed(responses):
        size += stored_tokens(lead_tokens, response.size)
        if size > budget:
            break
        kept.append(response)
    return kept[::-1]


class ResponseCorpus:
    """Responses to one prompt in one pooled automaton, each after the prompt's ``lead`` tokens and followed by a
    unique negative separator, with occurrence counts (drafts follow what most responses did)."""

    def __init__(self, pool: AutomatonPool, lead: np.ndarray, counted: bool, capacity: int = 256) -> None:
        self.pool = pool
        self.lead = lead
        self.counted = counted
        self.automaton = SuffixAutomaton(capacity=capacity, pool=pool)
        self.responses: list[np.ndarray] = []

    @classmethod
    def holding(
        cls, pool: AutomatonPool, lead: np.ndarray, counted: bool, responses: list[np.ndarray]
    ) -> ResponseCorpus:
        """A corpus of ``responses``, sized for exactly them (a history rebuilt after its oldest responses were dropped)."""
        corpus = cls(pool, lead, counted, capacity=sum(stored_tokens(lead.size, r.size) for r in responses))
        corpus.add(responses)
        return corpus

    def add(self, responses: list[np.ndarray]) -> None:
        """Store ``responses`` in one append (three per response cost more than the automaton's own work on a
        rollout's responses); a counted corpus counts its
        occurrences again (linear in all it holds)."""
        parts = []
        for response in responses:
            if response.size == 0:
                continue
            self.responses.append(response)
            parts += (self.lead, response, np.array([-len(self.responses)], dtype=np.int32))
        if parts:
            self.automaton.extend(np.concatenate(parts))
        if self.counted:
            self.automaton.count_occurrences()

    def close(self) -> None:
        self.pool.release(self.automaton.slot)

    @property
    def slot(self) -> int:
        return self.automaton.slot

    @property
    def num_tokens(self) -> int:
        return len(self.automaton)

    @property
    def nbytes(self) -> int:
        return self.automaton.nbytes


class GlobalCorpus:
    """Every prompt's finished responses in one counted automaton (``global_sharing``), stored without a lead.

    Counting is linear in all the corpus holds, so finished responses wait until they would add an eighth to it
    (each token is then counted about eight times over its life); beyond ``max_tokens`` the corpus is rebuilt with
    its newest responses, half the bound. Either way the corpus's slot can change: :meth:`flush` returns the old
    one so the drafter can point running requests at the new."""

    RECOUNT_GROWTH = 8  # pending responses are stored once they are this fraction (1/8) of the corpus

    def __init__(self, pool: AutomatonPool, max_tokens: int) -> None:
        self.pool = pool
        self.max_tokens = max_tokens
        self.corpus = ResponseCorpus(pool, np.zeros(0, dtype=np.int32), counted=True)
        self.pending: list[np.ndarray] = []
        self.pending_tokens = 0

    def add(self, response: np.ndarray) -> None:
        if response.size:
            self.pending.append(response)
            self.pending_tokens += stored_tokens(0, response.size)

    def due(self, stopping_tokens: int = 0) -> bool:
        """Whether the pending responses, with ``stopping_tokens`` more of responses about to finish, are to be
        stored at the next flush."""
        pending = self.pending_tokens + stopping_tokens
        return pending > 0 and pending * self.RECOUNT_GROWTH >= self.corpus.num_tokens

    def flush(self) -> int | None:
        """Store the pending responses if they are due; returns the replaced slot if the corpus moved."""
        if not self.due():
            return None
        if self.corpus.num_tokens + self.pending_tokens <= self.max_tokens:
            self.corpus.add(self.pending)
            self.pending, self.pending_tokens = [], 0
            return None
        responses = self.corpus.responses + self.pending
        kept = newest_within(responses, 0, self.max_tokens // 2) or responses[-1:]  # the newest one at least
        old = self.corpus.slot
        self.corpus.close()
        self.corpus = ResponseCorpus.holding(self.pool, np.zeros(0, dtype=np.int32), True, kept)
        self.pending, self.pending_tokens = [], 0
        return old

    def state(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(stored responses, pending responses), for checkpoints."""
        return [r.copy() for r in self.corpus.responses], [r.copy() for r in self.pending]

    def restore(self, stored: list, pending: list) -> None:
        self.corpus.close()
        responses = [np.asarray(r, dtype=np.int32) for r in stored]
        self.corpus = ResponseCorpus.holding(self.pool, np.zeros(0, dtype=np.int32), True, responses)
        self.pending = [np.asarray(r, dtype=np.int32) for r in pending]
        self.pending_tokens = sum(stored_tokens(0, r.size) for r in self.pending)


class Group:
    """Draft material for one prompt; corpora are only replaced while no request of the prompt runs."""

    def __init__(self, pool: AutomatonPool, lead: np.ndarray, counted: bool):
        self.lead = lead
        self.counted = counted
        self.siblings = ResponseCorpus(pool, lead, counted)
        self.history = ResponseCorpus(pool, lead, counted)
        self.active = 0
        self.unfiled: list[np.ndarray] = []  # finished siblings not yet in ``siblings`` (GroupStore.file_siblings)
        self.last_rollout: list[np.ndarray] = []  # a finished rollout's responses, not yet in ``history``

    def close(self) -> None:
        self.siblings.close()
        self.history.close()


class GroupStore:
    """Prompt key -> :class:`Group`, most recently used last; histories bounded per prompt (tokens) and in all
    (bytes: idle prompts' groups are dropped, least recently used first)."""

    def __init__(self, options: SAMOptions, pool: AutomatonPool):
        self.options = options
        self.pool = pool
        self.groups: OrderedDict[bytes, Group] = OrderedDict()
        self.history_bytes = 0  # of every group's history automaton
        self.unfiled: dict[bytes, Group] = {}  # groups with finished siblings not yet in their sibling automaton
        self.finished: dict[bytes, Group] = {}  # groups whose last rollout is not yet in their history

    def join(self, key: bytes, lead: np.ndarray) -> Group:
        """A request of prompt ``key`` started; ``lead`` is the prompt's tail that precedes every response. Finished
        rollouts go into their histories first: a request starts on a step that prefills its prompt, which takes
        far longer than the filing, and at most one rollout per prompt waits."""
        if self.finished:
            self.file_histories()
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = Group(self.pool, lead, self.options.draft_from_counts)
            self.history_bytes += group.history.nbytes
        self.groups.move_to_end(key)
        group.active += 1
        return group

    def leave(self, key: bytes, group: Group, response: np.ndarray) -> None:
        """A request of ``group`` finished with ``response``: it waits for the next drafting step
        (:meth:`file_siblings`; only with ``group_sharing``, the siblings' automaton being no source otherwise) or,
        if it was the prompt's last sample, for the next request's start (:meth:`join`)."""
        group.active -= 1
        if response.size:
            group.unfiled.append(response)
        if group.active > 0:
            if self.options.group_sharing:
                self.unfiled[key] = group
            return
        self.unfiled.pop(key, None)
        if not self.options.cross_epoch:
            self._drop(key)
            return
        group.last_rollout = group.siblings.responses + group.unfiled
        group.unfiled = []
        group.siblings.close()
        group.siblings = ResponseCorpus(self.pool, group.lead, group.counted)
        self.finished[key] = group

    def file_siblings(self) -> None:
        """Every response that finished since the last call into its group's sibling automaton, counted once per
        group: what the next drafting step needs from them."""
        for group in self.unfiled.values():
            group.siblings.add(group.unfiled)
            group.unfiled = []
        self.unfiled.clear()

    def file_histories(self) -> None:
        """Every finished rollout into its prompt's history, in the order they finished (the next request's start,
        :meth:`join`, or a checkpoint's state)."""
        while self.finished:
            key = next(iter(self.finished))
            self._file_history(key, self.finished.pop(key))

    def _file_history(self, key: bytes, group: Group) -> None:
        """``group``'s last rollout appended to its history within ``max_history_tokens`` (else the history is
        rebuilt from its newest responses), then idle prompts' histories dropped, least recently used first, while
        all of them hold more than ``max_history_bytes``."""
        opts = self.options
        rollout, group.last_rollout = group.last_rollout, []
        kept = group.history.responses + rollout
        self.history_bytes -= group.history.nbytes
        if sum(stored_tokens(group.lead.size, r.size) for r in kept) <= opts.max_history_tokens:
            # within the bound the rollout's responses are appended: the same automaton a rebuild would make, at
            # the cost of the new tokens instead of the whole history (rebuilt at every rollout, it grew with every
            # epoch kept: results/FINDINGS.md, "Rebuilding the history")
            group.history.add(rollout)
        else:
            kept = newest_within(kept, group.lead.size, opts.max_history_tokens)
            group.history.close()
            group.history = ResponseCorpus.holding(self.pool, group.lead, group.counted, kept)
        self.history_bytes += group.history.nbytes
        for k in [k for k, g in self.groups.items() if g.active == 0 and k != key]:  # least recently used first
            if self.history_bytes <= opts.max_history_bytes:
                break
            self._drop(k)

    def restore(self, key: bytes, lead: np.ndarray, responses: list) -> None:
        """An idle group whose history holds ``responses`` (a checkpoint's, :meth:`SAMProposer.state_dict`)."""
        group = self.groups[key] = Group(self.pool, lead, self.options.draft_from_counts)
        group.history.close()
        group.history = ResponseCorpus.holding(
            self.pool, lead, group.counted, [np.asarray(r, dtype=np.int32) for r in responses]
        )
        self.history_bytes += group.history.nbytes

    def _drop(self, key: bytes) -> None:
        group = self.groups.pop(key)
        self.finished.pop(key, None)
        self.history_bytes -= group.history.nbytes
        group.close()


class BatchDrafter:
    """Every running request's draft state, stepped in one compiled call per decode step.

    A request is identified by its slot (the pool slot of its own automaton over prompt + verified tokens).
    Its matchers into its group's sibling and history corpora are rows of the ``src_*`` arrays.
    """

    CORPORA = CORPUS_SOURCE.size  # group corpora a request matches: siblings, history, every prompt's responses (in
    # this order: the first wins a tie)

    def __init__(self, options: SAMOptions, k: int):
        self.options = options
        self._rules = options.rules()
        self.k = k
        self.pool = AutomatonPool()
        self.groups = GroupStore(options, self.pool)
        self.global_corpus = GlobalCorpus(self.pool, options.max_global_tokens) if options.global_sharing else None
        self.requests: dict[int, tuple[SuffixAutomaton, int, bytes, Group | None]] = {}
        self._size = 0
        self._resize(64)
        self._alloc_out(64)

    def _alloc_out(self, rows: int) -> None:
        self._out = np.zeros((rows, self.k), dtype=np.int32)
        self._out_n = np.zeros(rows, dtype=np.int64)
        self._out_group = np.zeros(rows, dtype=np.int64)
        self._out_mlen = np.zeros(rows, dtype=np.int64)
        self._out_level = np.zeros((rows, self.k), dtype=np.int64)
        self._explored = (
            np.zeros((rows, self.k), dtype=np.int32), np.zeros(rows, dtype=np.int64), np.zeros(rows, dtype=np.int64),
            np.zeros(rows, dtype=np.int64), np.zeros((rows, self.k), dtype=np.int64),
        )  # fmt: skip

    def _resize(self, size: int) -> None:
        def grown(a: np.ndarray, fill: int) -> np.ndarray:
            b = np.full((size, self.CORPORA), fill, dtype=np.int64)
            b[: a.shape[0]] = a
            return b

        empty = np.zeros((0, self.CORPORA), dtype=np.int64)
        self.src_slot = grown(getattr(self, "src_slot", empty), -1)
        self.src_state = grown(getattr(self, "src_state", empty), 0)
        self.src_len = grown(getattr(self, "src_len", empty), 0)
        self.src_seen = grown(getattr(self, "src_seen", empty), -1)
        self._size = size

    def start(self, prompt: np.ndarray, key: bytes) -> int:
        """A new request with context ``prompt``; ``key`` names its prompt's group. Returns its slot."""
        own = SuffixAutomaton(capacity=max(256, 2 * prompt.size), pool=self.pool, latest=self.options.own_latest)
        own.extend(prompt)
        slot = own.slot
        if slot >= self._size:
            self._resize(max(2 * self._size, slot + 1))
        opts = self.options
        lead = prompt[prompt.size - min(opts.lead_tokens, prompt.size) :].copy()
        group = self.groups.join(key, lead) if opts.group_sharing or opts.cross_epoch else None
        sources = [-1] * self.CORPORA
        if group is not None and opts.group_sharing:
            sources[0] = group.siblings.slot
        if group is not None and opts.cross_epoch:
            sources[1] = group.history.slot
        if self.global_corpus is not None:
            sources[2] = self.global_corpus.corpus.slot
        self.src_slot[slot] = sources
        self.src_state[slot] = 0
        self.src_len[slot] = 0
        self.src_seen[slot] = -1
        self.requests[slot] = (own, int(prompt.size), key, group)
        return slot

    def finish(self, slot: int, tail: np.ndarray | None = None) -> None:
        """The request left the batch: its response (with ``tail``, tokens it verified that no step appended)
        joins its group, its memory is freed."""
        own, prompt_len, key, group = self.requests.pop(slot)
        if tail is not None and tail.size:
            own.extend(tail)
        response = own.text()[prompt_len:]
        if group is not None:
            self.groups.leave(key, group, response)
        if self.global_corpus is not None:
            self.global_corpus.add(response)
        self.src_slot[slot] = -1
        self.pool.release(slot)

    def drafted_from(self, slots: list[int], store_global: bool = True) -> list[bool]:
        """For requests that stopped but are not finished here yet: whether a running request would draft from each
        one's response (a sample of its prompt still runs, with ``group_sharing``; every request, with
        ``global_sharing`` and ``store_global`` (:meth:`step_arrays`), if their responses make the corpus of every
        prompt's responses due for storing: until then it holds them pending, and no request drafts from them)."""
        if self.global_corpus is not None and store_global:
            stopping = sum(stored_tokens(0, len(self.requests[slot][0]) - self.requests[slot][1]) for slot in slots)
            if self.global_corpus.due(stopping):
                return [True] * len(slots)
        if not self.options.group_sharing:
            return [False] * len(slots)
        groups = [self.requests[slot][3] for slot in slots]
        stopping = Counter(groups)
        return [group.active > stopping[group] for group in groups]

    def text(self, slot: int) -> np.ndarray:
        return self.requests[slot][0].text()

    def step(self, slots: np.ndarray, tokens: np.ndarray, offsets: np.ndarray, ks: np.ndarray) -> list[list[int]]:
        """Append ``tokens[offsets[r]:offsets[r + 1]]`` to request ``slots[r]`` (-1: no request) and draft up
        to ``ks[r]`` tokens for it."""
        drafts, lengths, _, _, _ = self.step_arrays(slots, tokens, offsets, ks)
        return draft_lists(drafts, lengths)

    def step_arrays(
        self,
        slots: np.ndarray,
        tokens: np.ndarray,
        offsets: np.ndarray,
        ks: np.ndarray,
        chance_table: np.ndarray | None = None,
        token_cost: float = 0.0,
        explore_from: np.ndarray | None = None,
        store_global: bool = True,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`step`, each row drafting from the source whose draft gains the most under ``chance_table``
        (:meth:`sam.payoff.AcceptanceModel.conditional`) at ``token_cost`` accepted tokens per draft token sent
        (:func:`sam.automaton.step_rows`; no table: the longest match), returning per
        row the draft buffer [rows, k], its length, its source (:data:`sam.cells.OWN`, ...), its match length and
        each token's evidence level [rows, k] (:mod:`sam.cells`; views, valid until the next step). With a table and
        ``explore_from`` (a candidate index per row), each row also writes the candidate the payoff rule learns from
        (:func:`sam.automaton.step_rows`'s ``explored``), read with :meth:`explored`. Without ``store_global`` the
        corpus of every prompt's responses keeps its pending responses, even if due, for a later step: counting it is
        linear in all it holds, and the proposer stores it only on a step worth that
        (:meth:`sam.vllm.SAMProposer._stores_global`)."""
        rows = slots.shape[0]
        if self._out.shape[0] < rows:
            self._alloc_out(rows)
        if self.groups.unfiled:
            self.groups.file_siblings()
        if store_global:
            self.store_global()
        step_rows(
            self.pool.all_lists,
            (slots, tokens, offsets, ks),
            (self.src_slot, self.src_state, self.src_len, self.src_seen),
            self._rules,
            (self._out, self._out_n, self._out_group, self._out_mlen, self._out_level),
            chance_table,
            token_cost,
            None if explore_from is None else (explore_from, *self._explored),
        )
        return (
            self._out[:rows], self._out_n[:rows], self._out_group[:rows], self._out_mlen[:rows], self._out_level[:rows]
        )  # fmt: skip

    def store_global(self) -> None:
        """Store the pending responses of the corpus of every prompt's responses if they are due
        (:meth:`GlobalCorpus.flush`), pointing running requests at the corpus if it moved."""
        if self.global_corpus is None:
            return
        old = self.global_corpus.flush()
        if old is not None:
            moved = self.src_slot[:, 2] == old
            self.src_slot[moved, 2] = self.global_corpus.corpus.slot
            self.src_seen[moved, 2] = -1  # re-matched against the new corpus

    def explored(self, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The last step's explored candidates of its ``rows`` rows, as :meth:`step_arrays` returns its drafts."""
        return tuple(a[:rows] for a in self._explored)


def draft_lists(drafts: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    """vLLM's per-row draft lists from a draft buffer and lengths."""
    if not lengths.any():  # most steps where nothing pays: no buffer to convert
        return [[] for _ in range(lengths.shape[0])]
    return [d[:n] for d, n in zip(drafts.tolist(), lengths.tolist(), strict=True)]
