"""vLLM's suffix method keeps earlier responses in Arctic's global suffix tree (FIFO, up to
``suffix_decoding_max_cached_requests``) and offers no way to read them back, so a run resumed from a checkpoint
would draft from an empty tree where an uninterrupted one has every earlier rollout (SAM's history is restored).
The local rollout engine swaps in :class:`RecordedSuffixCache` before its first request: the same cache, also
keeping the tokens it puts in the global tree, exactly as vLLM's proposer passed them (tokens accepted past a stop
included), so a checkpoint can hold them and a resumed engine replays them in the same order.

Imported only in a vLLM worker whose drafter is the suffix method (Arctic Inference is an optional dependency).
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Sequence

import numpy as np
from arctic_inference.suffix_decoding import SuffixDecodingCache


class RecordedSuffixCache(SuffixDecodingCache):
    """Arctic's cache that also records the responses of its global tree."""

    def __init__(self, max_tree_depth: int, max_cached_requests: int):
        super().__init__(max_tree_depth=max_tree_depth, max_cached_requests=max_cached_requests)
        self._tokens: dict[Hashable, array] = {}  # cached request -> its response so far (4 bytes a token)

    def add_active_response(self, req_id: Hashable, token_ids: np.ndarray | Sequence[int]) -> None:
        super().add_active_response(req_id, token_ids)
        if req_id in self._req_to_seq_id:  # what the global tree received
            self._tokens.setdefault(req_id, array("i")).extend(np.asarray(token_ids, dtype=np.int32).tolist())

    def evict_cached_response(self, req_id: Hashable) -> None:
        super().evict_cached_response(req_id)
        self._tokens.pop(req_id, None)

    def responses(self) -> list[np.ndarray]:
        """The global tree's responses, oldest first (the order eviction follows)."""
        return [np.frombuffer(self._tokens[r], dtype=np.int32).copy() for r in self._req_to_seq_id if r in self._tokens]

    def replay(self, responses: list[np.ndarray]) -> None:
        """Put saved responses into the global tree, oldest first, as vLLM's proposer did when it generated them
        (each a request with no prompt: the global tree holds responses only)."""
        for i, tokens in enumerate(responses):
            rid = f"restored-{i}"
            self.start_request(rid, np.zeros(0, dtype=np.int32))
            self.add_active_response(rid, np.ascontiguousarray(tokens, dtype=np.int32))
            self.stop_request(rid)
