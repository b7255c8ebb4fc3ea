"""SAM as a vLLM proposer: ``speculative_config={"method": "custom_class", "model": "sam.vllm.SAMProposer",
"num_speculative_tokens": K}`` with options in ``additional_config={"sam": {...}}`` (see SAMOptions).

vLLM calls ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)`` after every step with one row
per running request, but passes no request ids, and rows are reordered and condensed as requests finish.
So each row is matched to its drafter by content: a drafter holding ``m`` tokens belongs to a row whose
context before this step's tokens has length ``m`` and ends in the drafter's last tokens. A row with no
match is a new request (its context before this step is its prompt: the group key). A drafter whose row is
gone finished: its response goes to its group and its memory is freed. Only verified tokens (what vLLM
reports as sampled) ever enter an automaton.

The common case (each row holds the request it held last step) is checked in one compiled call and the
whole step (extend, group matchers, drafts) runs in another (:class:`~sam.policy.BatchDrafter`); Python
touches rows one by one only when rows moved, started or finished.
"""

from __future__ import annotations

import hashlib
import logging
from itertools import chain

import numpy as np

from sam.automaton import verify_rows
from sam.policy import BatchDrafter, SAMOptions

logger = logging.getLogger(__name__)

TAIL_TOKENS = 16  # tokens compared to re-identify a row


class SAMProposer:
    """Model-free drafter for vLLM's ``custom_class`` speculative method."""

    def __init__(self, vllm_config, *args, **kwargs):
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        extra = getattr(vllm_config, "additional_config", None) or {}
        self.options = SAMOptions.from_dict(extra.get("sam"))
        self.drafter = BatchDrafter(self.options, self.k)
        self.row_slots = np.full(0, -1, dtype=np.int64)  # last step's row -> request slot
        self._claimed = np.zeros(0, dtype=np.int64)
        self._stamp = 0
        self.steps = 0
        self.gated_steps = 0
        logger.info("SAMProposer: K=%d options=%s", self.k, self.options)

    def load_model(self, *args, **kwargs) -> None:
        """Model-free: nothing to load."""

    def state_dict(self) -> dict:
        """Cross-rollout memory (each prompt's lead tokens and history responses), for trainer checkpoints.

        Call it between rollouts. vLLM reports a finished request only by its row missing from the next step, so
        the requests of a rollout's last steps are still tracked then; they are finished first, as the next
        rollout's first step would finish them, so that a run resumed from this state drafts what an
        uninterrupted one does."""
        self._finish_requests(set())
        self.row_slots = np.full(0, -1, dtype=np.int64)
        groups = self.drafter.groups.groups
        return {
            key: (g.lead.copy(), [r.copy() for r in g.history.responses])
            for key, g in groups.items()
            if g.history.responses
        }

    def load_state_dict(self, state: dict) -> None:
        self.drafter = BatchDrafter(self.options, self.k)
        self.row_slots = np.full(0, -1, dtype=np.int64)
        for key, (lead, responses) in state.items():
            group = self.drafter.groups.join(key, np.asarray(lead, dtype=np.int32))
            group.active = 0
            for r in responses:
                group.history.add(np.asarray(r, dtype=np.int32))

    def request_text(self, row: int) -> np.ndarray:
        """Prompt + verified tokens of the request on ``row`` as of the last step."""
        return self.drafter.text(int(self.row_slots[row]))

    @property
    def num_requests(self) -> int:
        return len(self.drafter.requests)

    def _finish_requests(self, kept: set[int]) -> None:
        """Finish every tracked request whose slot is not in ``kept`` (in the order they started)."""
        for slot in [s for s in self.drafter.requests if s not in kept]:
            self.drafter.finish(slot)

    def _identify(self, sampled_token_ids, before: np.ndarray, token_ids_cpu) -> np.ndarray:
        """Request slot of each row (-1 for rows with no new tokens); finishes the requests whose rows are gone,
        then starts the new ones (so a new request's group already holds its finished siblings)."""
        rows = len(sampled_token_ids)
        drafter = self.drafter
        if self._claimed.shape[0] < len(drafter.pool):
            self._claimed = np.zeros(2 * len(drafter.pool), dtype=np.int64)
        self._stamp += 1
        guess = np.full(rows, -1, dtype=np.int64)
        prev = self.row_slots[:rows]
        guess[: prev.shape[0]] = prev
        ok = np.zeros(rows, dtype=np.bool_)
        verify_rows(drafter.pool.text, drafter.pool.meta, guess, before, token_ids_cpu, TAIL_TOKENS,
                     self._claimed, self._stamp, ok)  # fmt: skip
        slots = np.where(ok, guess, -1)
        moved = [r for r in np.flatnonzero(~ok).tolist() if len(sampled_token_ids[r])]
        new_rows: list[tuple[int, np.ndarray]] = []
        if moved:
            claimed = set(slots[ok].tolist())
            by_key: dict[tuple[int, bytes], list[int]] = {}
            for slot, (own, *_rest) in drafter.requests.items():
                if slot not in claimed:
                    by_key.setdefault((len(own), own.tail(TAIL_TOKENS).tobytes()), []).append(slot)
            for r in moved:
                b = int(before[r])
                row = np.asarray(token_ids_cpu[r, :b], dtype=np.int32)
                candidates = by_key.get((b, row[max(0, b - TAIL_TOKENS) :].tobytes()))
                if candidates:
                    slots[r] = candidates.pop()
                else:
                    new_rows.append((r, row))
        live = slots[slots >= 0]
        if live.shape[0] != len(drafter.requests):  # some request's row is gone: it finished
            self._finish_requests(set(live.tolist()))
        for r, row in new_rows:
            slots[r] = drafter.start(row, hashlib.blake2b(row.tobytes(), digest_size=16).digest())
        return slots

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, *args, **kwargs) -> list[list[int]]:
        self.steps += 1
        rows = len(sampled_token_ids)
        counts = np.fromiter(map(len, sampled_token_ids), dtype=np.int64, count=rows)
        offsets = np.zeros(rows + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        tokens = np.fromiter(chain.from_iterable(sampled_token_ids), dtype=np.int32, count=int(offsets[-1]))
        num_tokens = np.asarray(num_tokens_no_spec[:rows], dtype=np.int64)
        slots = self._identify(sampled_token_ids, num_tokens - counts, token_ids_cpu)
        self.row_slots = slots
        if len(self.drafter.requests) > self.options.batch_threshold:
            self.gated_steps += 1
            ks = np.zeros(rows, dtype=np.int64)
        else:
            ks = np.clip(self.max_model_len - num_tokens - 1, 0, self.k)
        return self.drafter.step(slots, tokens, offsets, ks)
