"""SAM as a vLLM proposer: ``speculative_config={"method": "custom_class", "model": "sam.vllm.SAMProposer",
"num_speculative_tokens": K}`` with options in ``additional_config={"sam": {...}}`` (see SAMOptions).

vLLM calls ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)`` after every step with one row per
scheduled request and no request ids. The ids are in the model runner that built the proposer: its
``input_batch.req_ids`` names each row and its ``requests`` holds every unfinished request, preempted ones
included. :func:`register` (a ``vllm.general_plugins`` entry point, so it runs in every vLLM worker) hands the
runner to the proposer. A request is then tracked by its id: one whose row is missing but which the runner
still holds was preempted (KV cache full) and keeps its automaton until it is scheduled again; one the runner
no longer holds finished, and its response goes to its prompt's group. A new id starts a drafter keyed by its
prompt (its context before its first sampled token), which is what siblings and later epochs share. Only
verified tokens (what vLLM reports as sampled) ever enter an automaton.

The whole step (extend, group matchers, drafts) runs in one compiled call (:class:`~sam.policy.BatchDrafter`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from itertools import chain

import numpy as np

from sam.payoff import AcceptanceModel, StepCost, payoff_lengths
from sam.policy import BatchDrafter, SAMOptions, draft_lists

logger = logging.getLogger(__name__)


class SAMProposer:
    """Model-free drafter for vLLM's ``custom_class`` speculative method."""

    def __init__(self, vllm_config, *args, **kwargs):
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        extra = getattr(vllm_config, "additional_config", None) or {}
        self.options = SAMOptions.from_dict(extra.get("sam"))
        self.drafter = BatchDrafter(self.options, self.k)
        self.k_by_batch = self._k_by_batch(vllm_config)
        self.runner = None  # vLLM's model runner (attach_runner): request ids per row, unfinished requests
        self.slot_of: dict[str, int] = {}  # request id -> drafter slot, in the order requests started
        self.steps = 0
        self.gated_steps = 0
        self.preempted_steps = 0  # request-steps spent preempted (row missing, request kept)
        # the payoff rule (sam/payoff.py): step cost and acceptance learned from this engine's own steps
        self.step_cost = StepCost()
        self.acceptance = AcceptanceModel(self.k)
        self.clock = time.perf_counter  # what step times are read from
        self._last_call: float | None = None  # when propose was last entered: one engine step ago
        self._last_drafted = 0  # draft tokens proposed at the last call (verified in the step that just ran)
        self._last_len = np.zeros(64, dtype=np.int64)  # per drafter slot: its last draft's length, source, band
        self._last_group = np.zeros(64, dtype=np.int64)
        self._last_band = np.zeros(64, dtype=np.int64)
        logger.info("SAMProposer: K=%d options=%s", self.k, self.options)

    def _k_by_batch(self, vllm_config) -> np.ndarray | None:
        """K per live batch size from vLLM's ``num_speculative_tokens_per_batch_size`` (None: K at every size).

        vLLM's scheduler applies that schedule to its own proposers (ngram, suffix, EAGLE) but does not pass it to
        a custom_class proposer; SAM reads it here, expanded by vLLM's own lookup builder, so one config key sets
        K by batch size for every method."""
        schedule = getattr(vllm_config.speculative_config, "num_speculative_tokens_per_batch_size", None)
        if not schedule:
            return None
        from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

        max_batch = int(vllm_config.scheduler_config.max_num_seqs)
        return np.asarray(build_dynamic_sd_schedule_lookup(schedule, max_batch, self.k), dtype=np.int64)

    def attach_runner(self, runner) -> None:
        """Called by :func:`register` once vLLM's model runner that built this proposer exists."""
        self.runner = runner

    def load_model(self, *args, **kwargs) -> None:
        """Model-free: nothing to load."""

    def state_dict(self) -> dict:
        """Cross-rollout memory (each prompt's lead tokens and history responses), for trainer checkpoints.

        Call it between rollouts. vLLM's runner drops a finished request only at the next step, so the requests
        of a rollout's last steps are still tracked then; they are finished first, as the next
        rollout's first step would finish them, so that a run resumed from this state drafts what an
        uninterrupted one does."""
        self._finish(list(self.slot_of))
        groups = self.drafter.groups.groups
        return {
            key: (g.lead.copy(), [r.copy() for r in g.history.responses])
            for key, g in groups.items()
            if g.history.responses
        }

    def load_state_dict(self, state: dict) -> None:
        self.drafter = BatchDrafter(self.options, self.k)
        self.slot_of = {}
        for key, (lead, responses) in state.items():
            self.drafter.groups.restore(key, np.asarray(lead, dtype=np.int32), responses)

    def request_text(self, request_id: str) -> np.ndarray:
        """Prompt + verified tokens of a tracked request as of the last step."""
        return self.drafter.text(self.slot_of[request_id])

    @property
    def num_requests(self) -> int:
        return len(self.drafter.requests)

    def _finish(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.drafter.finish(self.slot_of.pop(rid))

    def _slots(self, req_ids: list, sampled_token_ids, before: np.ndarray, token_ids_cpu) -> tuple[np.ndarray, int]:
        """Drafter slot of each row (-1 for a new request that has not sampled yet) and how many rows started a
        request in this step (their prompts were prefilled in it). Finishes the requests the runner no longer
        holds, then starts the new ones (so a new request's group already holds its finished siblings)."""
        slot_of = self.slot_of
        slots = np.fromiter((slot_of.get(rid, -1) for rid in req_ids), dtype=np.int64, count=len(req_ids))
        known = int((slots >= 0).sum())
        if known != len(slot_of):  # a tracked request has no row: finished, or preempted if the runner holds it
            scheduled, unfinished = set(req_ids), self.runner.requests
            gone = [rid for rid in slot_of if rid not in scheduled]
            finished = [rid for rid in gone if rid not in unfinished]
            self.preempted_steps += len(gone) - len(finished)
            self._finish(finished)
        new = np.flatnonzero(slots < 0).tolist()
        for r in new:
            if sampled_token_ids[r]:
                prompt = np.asarray(token_ids_cpu[r, : int(before[r])], dtype=np.int32)
                slots[r] = self.drafter.start(prompt, hashlib.blake2b(prompt.tobytes(), digest_size=16).digest())
                slot_of[req_ids[r]] = int(slots[r])
        return slots, len(new)

    def _learn(self, now: float, rows: int, prefilled: int, slots: np.ndarray, counts: np.ndarray) -> None:
        """What the step that just ran says: its time (against its rows and the drafts verified in it) and which
        drafts it accepted. A step that prefilled a prompt is not a decode step's cost and is not timed."""
        if self._last_call is not None and prefilled == 0 and rows > 0:
            self.step_cost.observe(rows, self._last_drafted, now - self._last_call)
        self._last_call = now
        if self._last_len.size < self.drafter._size:
            grow = self.drafter._size - self._last_len.size
            self._last_len, self._last_group, self._last_band = (
                np.concatenate([a, np.zeros(grow, dtype=np.int64)])
                for a in (self._last_len, self._last_group, self._last_band)
            )
        known = slots[slots >= 0]
        counts = counts[slots >= 0]
        drafted = self._last_len[known]
        verified = drafted > 0
        if verified.any():
            accepted = np.clip(counts[verified] - 1, 0, drafted[verified])
            idx = known[verified]
            self.acceptance.observe(self._last_group[idx], self._last_band[idx], drafted[verified], accepted)
        self._last_len[:] = 0

    def _pay(
        self, rows: int, slots: np.ndarray, lengths: np.ndarray, group: np.ndarray, mlen: np.ndarray
    ) -> np.ndarray:
        """The payoff rule's draft lengths (nothing until the step cost is learned) and what it records for
        :meth:`_learn` at the next step."""
        band = self.acceptance.band(mlen)
        if self.step_cost.known:
            lengths = payoff_lengths(self.acceptance.chances(group, band), lengths, rows, self.step_cost.coef)
        else:
            lengths = np.zeros_like(lengths)
        live = slots >= 0
        self._last_len[slots[live]] = lengths[live]
        self._last_group[slots[live]] = group[live]
        self._last_band[slots[live]] = band[live]
        self._last_drafted = int(lengths.sum())
        return lengths

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, *args, **kwargs) -> list[list[int]]:
        if self.runner is None:
            raise RuntimeError(
                "SAMProposer has no model runner to read request ids from: the sam.vllm:register vLLM plugin did "
                "not run in this process (install this package, e.g. pip install -e ., and keep VLLM_PLUGINS unset "
                "or naming it)"
            )
        now = self.clock()
        self.steps += 1
        rows = len(sampled_token_ids)
        counts = np.fromiter(map(len, sampled_token_ids), dtype=np.int64, count=rows)
        offsets = np.zeros(rows + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        tokens = np.fromiter(chain.from_iterable(sampled_token_ids), dtype=np.int32, count=int(offsets[-1]))
        num_tokens = np.asarray(num_tokens_no_spec[:rows], dtype=np.int64)
        req_ids = self.runner.input_batch.req_ids[:rows]
        slots, prefilled = self._slots(req_ids, sampled_token_ids, num_tokens - counts, token_ids_cpu)
        if self.options.payoff:
            self._learn(now, rows, prefilled, slots, counts)
        live = int((slots >= 0).sum())  # the live batch: scheduled, started requests
        if live > self.options.batch_threshold:
            self.gated_steps += 1
            ks = np.zeros(rows, dtype=np.int64)
        else:
            k = self.k if self.k_by_batch is None else int(self.k_by_batch[min(live, len(self.k_by_batch) - 1)])
            ks = np.clip(self.max_model_len - num_tokens - 1, 0, k)
        drafts, lengths, group, mlen = self.drafter.step_arrays(slots, tokens, offsets, ks)
        if self.options.payoff:
            lengths = self._pay(rows, slots, lengths.astype(np.int64), group, mlen)
        return draft_lists(drafts, lengths)


_HOOKED = "_sam_attach_runner"


def register() -> None:
    """vLLM general plugin: give every custom proposer that asks (``attach_runner``) the model runner that built it.

    vLLM builds a ``custom_class`` proposer inside ``GPUModelRunner.__init__`` (the CPU runner subclasses it) with
    only the config; the runner is what knows which request each row is. Idempotent."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    init = GPUModelRunner.__init__
    if getattr(init, _HOOKED, False):
        return

    @functools.wraps(init)
    def init_then_attach(runner, *args, **kwargs):
        init(runner, *args, **kwargs)
        attach = getattr(getattr(runner, "drafter", None), "attach_runner", None)
        if attach is not None:
            attach(runner)

    setattr(init_then_attach, _HOOKED, True)
    GPUModelRunner.__init__ = init_then_attach
