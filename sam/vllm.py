"""SAM as a vLLM proposer: ``speculative_config={"method": "custom_class", "model": "sam.vllm.SAMProposer",
"num_speculative_tokens": K}`` with options in ``additional_config={"sam": {...}}`` (see SAMOptions).

vLLM calls ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)`` after every step with one row
per running request, but passes no request ids, and rows are reordered and condensed as requests finish.
So each row is matched to its drafter by content: a drafter holding ``m`` tokens belongs to a row whose
context before this step's tokens has length ``m`` and ends in the drafter's last tokens. A row with no
match is a new request (its context before this step is its prompt: the group key). A drafter whose row is
gone finished: its response goes to its group and its memory is freed. Only verified tokens (what vLLM
reports as sampled) ever enter an automaton.
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict

import numpy as np

from sam.policy import GroupStore, RequestDrafter, SAMOptions

logger = logging.getLogger(__name__)

TAIL_TOKENS = 16  # tokens compared to re-identify a row


def _tail_key(length: int, tail: np.ndarray) -> tuple[int, bytes]:
    return length, tail.tobytes()


def _drafter_key(drafter: RequestDrafter) -> tuple[int, bytes]:
    return _tail_key(len(drafter), drafter.own.tail(TAIL_TOKENS))


class SAMProposer:
    """Model-free drafter for vLLM's ``custom_class`` speculative method."""

    def __init__(self, vllm_config, *args, **kwargs):
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        extra = getattr(vllm_config, "additional_config", None) or {}
        self.options = SAMOptions.from_dict(extra.get("sam"))
        self.groups = GroupStore(self.options)
        self.rows: dict[int, RequestDrafter] = {}
        self.steps = 0
        self.gated_steps = 0
        logger.info("SAMProposer: K=%d options=%s", self.k, self.options)

    def load_model(self, *args, **kwargs) -> None:
        """Model-free: nothing to load."""

    def state_dict(self) -> dict:
        """Cross-rollout memory (each prompt's history responses), for trainer checkpoints."""
        return {
            key: [r.copy() for r in g.history.responses] for key, g in self.groups.groups.items() if g.history.responses
        }

    def load_state_dict(self, state: dict) -> None:
        self.groups = GroupStore(self.options)
        self.rows = {}
        for key, responses in state.items():
            group = self.groups.join(key)
            group.active = 0
            for r in responses:
                group.history.add(np.asarray(r, dtype=np.int32))

    def _start(self, context: np.ndarray) -> RequestDrafter:
        prompt = context.astype(np.int32, copy=True)
        key = hashlib.blake2b(prompt.tobytes(), digest_size=16).digest()
        share = self.options.group_sharing or self.options.cross_epoch
        group = self.groups.join(key) if share else None
        return RequestDrafter(prompt, key, group, self.options)

    def _finish(self, drafter: RequestDrafter) -> None:
        if drafter.group is not None:
            self.groups.leave(drafter.key, drafter.group, drafter.response())

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, *args, **kwargs) -> list[list[int]]:
        self.steps += 1
        num_rows = len(sampled_token_ids)
        previous = self.rows
        by_key: dict[tuple[int, bytes], list[RequestDrafter]] | None = None  # built on the first moved row
        current: dict[int, RequestDrafter] = {}
        claimed: set[int] = set()
        for i, sampled in enumerate(sampled_token_ids):
            if not sampled:
                continue
            before = int(num_tokens_no_spec[i]) - len(sampled)
            row = token_ids_cpu[i]
            tail = row[max(0, before - TAIL_TOKENS) : before].astype(np.int32, copy=False).tobytes()
            drafter = previous.get(i)
            if (
                drafter is None
                or len(drafter) != before
                or id(drafter) in claimed
                or drafter.own.tail(TAIL_TOKENS).tobytes() != tail
            ):
                if by_key is None:  # rows were reordered or condensed: find drafters by content
                    by_key = defaultdict(list)
                    for d in previous.values():
                        by_key[_drafter_key(d)].append(d)
                drafter = next((d for d in by_key.get((before, tail), ()) if id(d) not in claimed), None)
            if drafter is None:
                drafter = self._start(np.asarray(row[:before]))
            claimed.add(id(drafter))
            drafter.extend(np.asarray(sampled, dtype=np.int32))
            current[i] = drafter

        for d in previous.values():
            if id(d) not in claimed:
                self._finish(d)
        self.rows = current

        drafts: list[list[int]] = [[] for _ in range(num_rows)]
        if len(current) > self.options.batch_threshold:
            self.gated_steps += 1
            return drafts
        for i, drafter in current.items():
            k = min(self.k, self.max_model_len - int(num_tokens_no_spec[i]) - 1)
            if k > 0:
                drafts[i] = drafter.draft(k)
        return drafts
