"""SAM drafting policy: per-request automata, sibling (group) and cross-epoch sharing, batch-size gate.

Each request drafts from up to three sources and keeps the one with the longest match:
- its own automaton over prompt + verified response tokens (SAM-Decoding's dynamic SAM);
- ``siblings``: the finished responses of the other samples of the same prompt in this rollout (Seer's
  grouped drafting: siblings that finish early feed the long tail);
- ``history``: responses to the same prompt from earlier rollouts (RhymeRL / SPEC-RL's cross-epoch reuse).

Group material lives in one automaton per prompt and source, with a unique negative separator after each
response so no draft runs from one response into the next. When the last active sample of a prompt
finishes, the rollout's sibling responses move into the history (if ``cross_epoch``) and the sibling
automaton is dropped, so memory is bounded by ``max_history_tokens`` per prompt and ``max_groups``.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field, fields

import numpy as np

from sam.automaton import Matcher, SuffixAutomaton


@dataclass
class SAMOptions:
    """Drafting options; passed to vLLM as ``additional_config={"sam": {...}}``."""

    min_match: int = 3  # no draft below this match length
    tokens_per_match: float = 1.0  # draft length = ceil(tokens_per_match * (match - min_match + 1)), capped by K
    batch_threshold: int = 8  # no drafting while more than this many requests are active (the article used 8)
    group_sharing: bool = True  # draft from finished sibling responses of the same prompt
    cross_epoch: bool = True  # draft from earlier rollouts' responses to the same prompt
    own_bonus: int = 0  # match-length bonus of the request's own text over group material
    max_history_tokens: int = 65536  # per prompt; oldest responses are dropped beyond it
    max_groups: int = 4096  # prompts whose history is kept (least recently used dropped)
    resync_tokens: int = 64  # tokens re-matched when group material grows under a running request

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
        return opts

    def draft_length(self, match_length: int, k: int) -> int:
        if match_length < self.min_match:
            return 0
        return min(k, math.ceil(self.tokens_per_match * (match_length - self.min_match + 1)))


class ResponseCorpus:
    """Responses to one prompt in one automaton, separated by unique negative tokens."""

    def __init__(self) -> None:
        self.automaton = SuffixAutomaton()
        self.responses: list[np.ndarray] = []
        self.version = 0  # bumped whenever text is added (running matchers re-sync)

    def add(self, response: np.ndarray) -> None:
        if response.size == 0:
            return
        self.responses.append(response)
        self.automaton.extend(response)
        self.automaton.extend([-len(self.responses)])
        self.version += 1

    @property
    def num_tokens(self) -> int:
        return len(self.automaton)


@dataclass
class Group:
    """Draft material for one prompt."""

    siblings: ResponseCorpus = field(default_factory=ResponseCorpus)
    history: ResponseCorpus = field(default_factory=ResponseCorpus)
    active: int = 0


class GroupStore:
    """Prompt key -> :class:`Group`; LRU-bounded, history trimmed per prompt."""

    def __init__(self, options: SAMOptions):
        self.options = options
        self.groups: OrderedDict[bytes, Group] = OrderedDict()

    def join(self, key: bytes) -> Group:
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = Group()
            while len(self.groups) > self.options.max_groups:
                self.groups.popitem(last=False)
        self.groups.move_to_end(key)
        group.active += 1
        return group

    def leave(self, key: bytes, group: Group, response: np.ndarray) -> None:
        """A request of ``group`` finished with ``response``."""
        opts = self.options
        if opts.group_sharing or opts.cross_epoch:
            group.siblings.add(response)
        group.active -= 1
        if group.active > 0:
            return
        if opts.cross_epoch:
            kept = group.history.responses + group.siblings.responses
            while kept and sum(r.size + 1 for r in kept) > opts.max_history_tokens:
                kept.pop(0)
            history = ResponseCorpus()
            for r in kept:
                history.add(r)
            group.history = history
        group.siblings = ResponseCorpus()
        if not opts.cross_epoch:
            self.groups.pop(key, None)

    def num_tokens(self) -> int:
        return sum(g.siblings.num_tokens + g.history.num_tokens for g in self.groups.values())


class GroupMatcher:
    """A request's matcher against one group corpus, re-synced when the corpus grows."""

    def __init__(self, corpus_getter, resync_tokens: int):
        self._get = corpus_getter
        self._resync = resync_tokens
        self._corpus: ResponseCorpus | None = None
        self._version = -1
        self._matcher: Matcher | None = None

    def feed(self, tokens: np.ndarray, own_text: SuffixAutomaton) -> None:
        corpus = self._get()
        if corpus is not self._corpus or corpus.version != self._version:
            self._corpus, self._version = corpus, corpus.version
            self._matcher = corpus.automaton.matcher() if corpus.num_tokens else None
            if self._matcher is not None:
                self._matcher.feed(own_text.tail(self._resync))
            return
        if self._matcher is not None:
            self._matcher.feed(tokens)

    def best(self) -> tuple[int, Matcher | None]:
        if self._matcher is None:
            return 0, None
        return self._matcher.match_length, self._matcher


class RequestDrafter:
    """Draft state of one running request: its own automaton and its matchers into its group."""

    def __init__(self, prompt: np.ndarray, key: bytes, group: Group | None, options: SAMOptions):
        self.options = options
        self.key = key
        self.group = group
        self.prompt_len = int(prompt.size)
        self.own = SuffixAutomaton(capacity=max(256, 2 * prompt.size))
        self.own.extend(prompt)
        self.sources: list[GroupMatcher] = []
        if group is not None:
            if options.group_sharing:
                self.sources.append(GroupMatcher(lambda: group.siblings, options.resync_tokens))
            if options.cross_epoch:
                self.sources.append(GroupMatcher(lambda: group.history, options.resync_tokens))

    def __len__(self) -> int:
        return len(self.own)

    def extend(self, tokens: np.ndarray) -> None:
        self.own.extend(tokens)
        for src in self.sources:
            src.feed(tokens, self.own)

    def draft(self, k: int) -> list[int]:
        """Draft from the source with the longest match (the request's own text wins ties)."""
        best_len = self.own.match_length + self.options.own_bonus
        best: SuffixAutomaton | Matcher = self.own
        for src in self.sources:
            length, matcher = src.best()
            if matcher is not None and length > best_len:
                best_len, best = length, matcher
        n = self.options.draft_length(best.match_length, k)
        return best.draft(n, self.options.min_match) if n else []

    def response(self) -> np.ndarray:
        return self.own.text()[self.prompt_len :]
