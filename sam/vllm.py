"""SAM as a vLLM proposer: ``speculative_config={"method": "custom_class", "model": "sam.vllm.SAMProposer",
"num_speculative_tokens": K}`` with options in ``additional_config={"sam": {...}}`` (see SAMOptions).

vLLM calls ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)`` after every step with one row per
scheduled request and no request ids. The ids are in the model runner that built the proposer: its
``input_batch.req_ids`` names each row and its ``requests`` holds every unfinished request, preempted ones
included. :func:`sam.runner_hook.register` (a ``vllm.general_plugins`` entry point, so it runs in every vLLM
worker) hands the runner to the proposer. A request is then tracked by its id: one whose row is missing but which the runner
still holds was preempted (KV cache full) and keeps its automaton until it is scheduled again; one the runner
no longer holds finished, and its response goes to its prompt's group. A new id starts a drafter keyed by its
prompt (its context before its first sampled token), which is what siblings and later epochs share. Only
verified tokens (what vLLM reports as sampled) ever enter an automaton.

The whole step (extend, group matchers, drafts) runs in one compiled call (:class:`~sam.policy.BatchDrafter`).
"""

from __future__ import annotations

import logging
import time
from itertools import chain, repeat

import numba as nb
import numpy as np

from sam.keys import prompt_key
from sam.payoff import (
    EXPLORE_CHANCE,
    EXPLORE_EVERY,
    AcceptanceModel,
    PinnedStepCost,
    ShadowDrafts,
    StepCost,
    payoff_cut,
)
from sam.policy import BatchDrafter, SAMOptions, draft_lists

logger = logging.getLogger(__name__)


@nb.njit(cache=True)
def _row_budgets(counts, num_tokens, slots, max_len, k, k_by_batch, batch_threshold, offsets, ks) -> int:
    """Each row's token offsets into the step's verified tokens and its draft budget: ``k`` (by the live batch size
    where ``k_by_batch`` is given; none above ``batch_threshold`` live requests), less what the model length leaves.
    Returns the live batch size (scheduled, started requests)."""
    live = 0
    for r in range(slots.shape[0]):
        live += slots[r] >= 0
    if k_by_batch.size:
        k = k_by_batch[min(live, k_by_batch.size - 1)]
    if live > batch_threshold:
        k = 0
    offsets[0] = 0
    for r in range(counts.shape[0]):
        offsets[r + 1] = offsets[r] + counts[r]
        ks[r] = max(0, min(max_len - num_tokens[r] - 1, k))
    return live


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
        self.busy_s = 0.0  # time spent inside propose: the drafter's own share of the engine's steps
        # the payoff rule (sam/payoff.py): step cost and acceptance learned from this engine's own steps
        pinned = self.options.payoff_cost
        self.step_cost = StepCost() if pinned is None else PinnedStepCost(pinned)
        self.acceptance = AcceptanceModel(self.k)
        self.shadows = ShadowDrafts(self.k)
        self.clock = time.perf_counter  # what step times are read from
        self._last_call: float | None = None  # when propose was last entered: one engine step ago
        self._last_drafted = 0  # draft tokens sent at the last call (verified in the step that just ran)
        self._token_cost = 0.0  # the chance a draft token had to exceed at the last payoff cut: the drafter picks
        # each request's source by what its draft gains at that cost (sam.automaton.step_rows)
        logger.info("SAMProposer: K=%d options=%s", self.k, self.options)

    def _k_by_batch(self, vllm_config) -> np.ndarray:
        """K per live batch size from vLLM's ``num_speculative_tokens_per_batch_size`` (empty: K at every size).

        vLLM's scheduler applies that schedule to its own proposers (ngram, suffix, EAGLE) but does not pass it to
        a custom_class proposer; SAM reads it here, expanded by vLLM's own lookup builder, so one config key sets
        K by batch size for every method."""
        schedule = getattr(vllm_config.speculative_config, "num_speculative_tokens_per_batch_size", None)
        if not schedule:
            return np.zeros(0, dtype=np.int64)
        from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

        max_batch = int(vllm_config.scheduler_config.max_num_seqs)
        return np.asarray(build_dynamic_sd_schedule_lookup(schedule, max_batch, self.k), dtype=np.int64)

    def attach_runner(self, runner) -> None:
        """Called by :func:`sam.runner_hook.register` once vLLM's model runner that built this proposer exists."""
        self.runner = runner

    def load_model(self, *args, **kwargs) -> None:
        """Model-free: nothing to load."""

    def state_dict(self) -> dict:
        """Cross-rollout memory (each prompt's lead tokens and history responses, every prompt's responses of the
        global corpus, the payoff rule's acceptance counts and its last token cost), for trainer checkpoints.

        Call it between rollouts. vLLM's runner drops a finished request only at the next step, so the requests
        of a rollout's last steps are still tracked then; they are finished first, as the next
        rollout's first step would finish them, so that a run resumed from this state drafts what an
        uninterrupted one does."""
        self._finish(list(self.slot_of))
        groups = self.drafter.groups.groups
        return {
            "groups": {
                key: (g.lead.copy(), [r.copy() for r in g.history.responses])
                for key, g in groups.items()
                if g.history.responses
            },
            "global": None if self.drafter.global_corpus is None else self.drafter.global_corpus.state(),
            "acceptance": self.acceptance.state_dict(),
            "token_cost": self._token_cost,
        }

    def load_state_dict(self, state: dict) -> None:
        self.drafter = BatchDrafter(self.options, self.k)
        self.shadows = ShadowDrafts(self.k)  # slots restart with the new drafter
        self.slot_of = {}
        for key, (lead, responses) in state["groups"].items():
            self.drafter.groups.restore(key, np.asarray(lead, dtype=np.int32), responses)
        if self.drafter.global_corpus is not None and state.get("global") is not None:
            self.drafter.global_corpus.restore(*state["global"])
        self.acceptance.load_state_dict(state["acceptance"])
        self._token_cost = float(state.get("token_cost", 0.0))

    def request_text(self, request_id: str) -> np.ndarray:
        """Prompt + verified tokens of a tracked request as of the last step."""
        return self.drafter.text(self.slot_of[request_id])

    @property
    def num_requests(self) -> int:
        return len(self.drafter.requests)

    def _finish(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            slot = self.slot_of.pop(rid)
            self.drafter.finish(slot)
            self.shadows.forget(slot)

    def _slots(self, req_ids: list, sampled_token_ids, before: np.ndarray, token_ids_cpu) -> tuple[np.ndarray, int]:
        """Drafter slot of each row (-1 for a new request that has not sampled yet) and how many rows started a
        request in this step (their prompts were prefilled in it). Finishes the requests the runner no longer
        holds, then starts the new ones (so a new request's group already holds its finished siblings)."""
        slot_of = self.slot_of
        slots = list(map(slot_of.get, req_ids, repeat(-1, len(req_ids))))
        new = [r for r, slot in enumerate(slots) if slot < 0]
        # a tracked request without a row finished, or was preempted if the runner still holds it
        if len(slots) - len(new) != len(slot_of):
            scheduled, unfinished = set(req_ids), self.runner.requests
            gone = [rid for rid in slot_of if rid not in scheduled]
            finished = [rid for rid in gone if rid not in unfinished]
            self.preempted_steps += len(gone) - len(finished)
            self._finish(finished)
        for r in new:
            if sampled_token_ids[r]:
                prompt = np.asarray(token_ids_cpu[r, : int(before[r])], dtype=np.int32)
                slots[r] = slot_of[req_ids[r]] = self.drafter.start(prompt, prompt_key(prompt))
        return np.array(slots, dtype=np.int64), len(new)

    def _learn(self, now: float, rows: int, prefilled: int, slots, tokens, offsets) -> None:
        """What the step that just ran says: its time (against its rows and the drafts verified in it; a step that
        prefilled a prompt is not a decode step's cost and is not timed) and, from the tokens it verified, how the
        requests' pending shadow drafts fared."""
        if self._last_call is not None and prefilled == 0 and rows > 0:
            self.step_cost.observe(rows, self._last_drafted, now - self._last_call)
        self._last_call = now
        self.shadows.resolve(slots, tokens, offsets, self.acceptance)

    def _pay(self, rows: int, slots, drafts, lengths, group, mlen, level, idle: bool) -> np.ndarray:
        """The payoff rule's draft lengths (nothing where nothing can pay, ``idle``, :meth:`_nothing_can_pay`, which
        holds until the step cost is learned; the likely tokens on exploring steps while drafting's cost is unknown);
        each full draft also becomes its request's shadow if none is pending."""
        band = self.acceptance.band(mlen)
        self.shadows.start(slots, drafts, lengths, group, band, level)
        if idle:
            lengths = np.zeros_like(lengths)
        elif self.step_cost.exploring and self.steps % EXPLORE_EVERY == 0:
            likely = np.arange(self.k)[None, :] < lengths[:, None]
            likely &= self.acceptance.chances(group, band, level) >= EXPLORE_CHANCE
            lengths = likely.sum(axis=1)  # explore: what drafting costs can only be learned by drafting
        else:
            chances = self.acceptance.chances(group, band, level)
            lengths, self._token_cost = payoff_cut(
                chances, lengths, rows, self.step_cost.coef, self.options.payoff_margin
            )
        self._last_drafted = int(lengths.sum())
        return lengths

    def _nothing_can_pay(self, rows: int) -> bool:
        """Whether no draft token can be sent this step: the step cost is not known yet, or not even the likeliest
        cell's first token beats the lowest threshold the payoff cut can have (``c * rows / seconds`` of the step
        without drafts: taking a token raises it), and this is no exploring step (a big batch on a compute-bound
        engine: most steps). Then only shadow drafts are made, for a quarter of the requests that need one
        (:data:`sam.payoff.SHADOW_EVERY`): the drafter's work on such a step is pure cost."""
        if not self.step_cost.known:
            return True
        if self.step_cost.exploring and self.steps % EXPLORE_EVERY == 0:
            return False
        a, b, c, e, f = self.step_cost.coef.tolist()
        lowest = c * rows / max(a + b * rows + e + f * rows, 1e-12)
        return self.acceptance.likeliest_first() <= lowest

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, *args, **kwargs) -> list[list[int]]:
        if self.runner is None:
            raise RuntimeError(
                "SAMProposer has no model runner to read request ids from: the sam.runner_hook:register vLLM plugin did "
                "not run in this process (install this package, e.g. pip install -e ., and keep VLLM_PLUGINS unset "
                "or naming it)"
            )
        now = self.clock()
        self.steps += 1
        rows = len(sampled_token_ids)
        counts = np.fromiter(map(len, sampled_token_ids), dtype=np.int64, count=rows)
        tokens = np.fromiter(chain.from_iterable(sampled_token_ids), dtype=np.int32)
        num_tokens = np.asarray(num_tokens_no_spec[:rows], dtype=np.int64)
        req_ids = self.runner.input_batch.req_ids[:rows]
        slots, prefilled = self._slots(req_ids, sampled_token_ids, num_tokens - counts, token_ids_cpu)
        offsets = np.empty(rows + 1, dtype=np.int64)
        ks = np.empty(rows, dtype=np.int64)
        live = _row_budgets(
            counts, num_tokens, slots, self.max_model_len, self.k, self.k_by_batch, self.options.batch_threshold,
            offsets, ks,
        )  # fmt: skip
        self.gated_steps += live > self.options.batch_threshold
        if self.options.payoff:
            self._learn(now, rows, prefilled, slots, tokens, offsets)
        idle = self.options.payoff and self._nothing_can_pay(rows)
        # what the drafter picks sources by (None: the longest match)
        scored = self.acceptance.conditional() if self.options.payoff and self.options.scored else None
        if idle:
            self.shadows.turns(slots, ks, self.steps)
        drafts, lengths, group, mlen, level = self.drafter.step_arrays(
            slots, tokens, offsets, ks, scored, self._token_cost
        )
        if self.options.payoff:
            lengths = self._pay(rows, slots, drafts, lengths, group, mlen, level, idle)
        self.busy_s += self.clock() - now
        return draft_lists(drafts, lengths)
