"""SAM as a vLLM proposer: ``speculative_config={"method": "custom_class", "model": "sam.vllm.SAMProposer",
"num_speculative_tokens": K}`` with options in ``additional_config={"sam": {...}}`` (see SAMOptions).

vLLM calls ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)`` after every step with one row per
scheduled request and no request ids. The ids are in the model runner that built the proposer: its
``input_batch.req_ids`` names each row and its ``requests`` holds every unfinished request, preempted ones
included. :func:`sam.runner_hook.register` (a ``vllm.general_plugins`` entry point, so it runs in every vLLM
worker) hands the runner to the proposer. A request is then tracked by its id: one whose row is missing but which the runner
still holds was preempted (KV cache full) and keeps its automaton until it is scheduled again; one the runner
no longer holds left, and its response goes to its prompt's group where a running request drafts from it, else at the
next request's start (:meth:`SAMProposer._finish_left`). A new id starts a drafter keyed by its
prompt (its context before its first sampled token), which is what siblings and later epochs share. Only
verified tokens ever enter an automaton: a row's are read from vLLM's ``token_ids_cpu`` up to
``num_tokens_no_spec``, from where its drafter left off (a step may leave its work to a later one), and a finished
request's last ones from its ``CachedRequestState.output_token_ids``.

The whole step (extend, group matchers, drafts) runs in one compiled call (:class:`~sam.policy.BatchDrafter`).
"""

from __future__ import annotations

import logging
import time
from itertools import repeat
from types import SimpleNamespace

import numba as nb
import numpy as np

from sam.keys import prompt_key
from sam.payoff import (
    CATCH_UP_EVERY,
    EXPLORE_CHANCE,
    EXPLORE_EVERY,
    AcceptanceModel,
    PinnedStepCost,
    ShadowDrafts,
    StepCost,
    device_prior,
    nothing_can_pay,
    payoff_cut,
)
from sam.policy import BatchDrafter, SAMOptions, draft_lists

logger = logging.getLogger(__name__)


@nb.njit(cache=True)
def _catch_up(token_ids, num_tokens, slots, ingested, max_len, k, k_by_batch, batch_threshold, offsets, ks):
    """Each started row's tokens verified since its drafter last took tokens (``token_ids[r, ingested[slot]:
    num_tokens[r]]``: vLLM's token history of the row, so a step the drafter skipped costs no copy), flat with
    ``offsets``, and ``ingested`` moved on; each row's draft budget ``ks``: ``k`` (by the live batch size where
    ``k_by_batch`` is given; none above ``batch_threshold`` live requests), less what the model length leaves.
    Returns the tokens and the live batch size (scheduled, started requests)."""
    rows = slots.shape[0]
    live = 0
    offsets[0] = 0
    for r in range(rows):
        s = slots[r]
        n = 0
        if s >= 0:
            live += 1
            n = max(0, num_tokens[r] - ingested[s])
        offsets[r + 1] = offsets[r] + n
    tokens = np.empty(offsets[rows], dtype=np.int32)
    for r in range(rows):
        s = slots[r]
        n = offsets[r + 1] - offsets[r]
        if n > 0:
            tokens[offsets[r] : offsets[r + 1]] = token_ids[r, ingested[s] : ingested[s] + n]
            ingested[s] += n
    if k_by_batch.size:
        k = k_by_batch[min(live, k_by_batch.size - 1)]
    if live > batch_threshold:
        k = 0
    for r in range(rows):
        ks[r] = max(0, min(max_len - num_tokens[r] - 1, k))
    return tokens, live


def standalone_config(
    k: int = 4,
    sam: dict | None = None,
    max_model_len: int = 4096,
    max_num_seqs: int = 256,
    k_by_batch: list | None = None,
) -> SimpleNamespace:
    """The parts of vLLM's ``VllmConfig`` that :class:`SAMProposer` reads (K, ``num_speculative_tokens_per_batch_size``,
    model length, batch capacity, SAM's options), for driving a proposer outside an engine: tests and benchmarks."""
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k, num_speculative_tokens_per_batch_size=k_by_batch),
        model_config=SimpleNamespace(max_model_len=max_model_len),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
        additional_config={"sam": dict(sam or {})},
    )


class SAMProposer:
    """Model-free drafter for vLLM's ``custom_class`` speculative method."""

    def __init__(self, vllm_config, *args, **kwargs):
        self._vllm_config = vllm_config  # what a throwaway twin is built from (warm_up)
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        extra = getattr(vllm_config, "additional_config", None) or {}
        self.options = SAMOptions.from_dict(extra.get("sam"))
        self.drafter = BatchDrafter(self.options, self.k)
        self.k_by_batch = self._k_by_batch(vllm_config)
        self.runner = None  # vLLM's model runner (attach_runner): request ids per row, unfinished requests
        self.slot_of: dict[str, int] = {}  # request id -> drafter slot, in the order requests started
        self.state_of: dict[int, object] = {}  # drafter slot -> vLLM's CachedRequestState of its request: the tokens
        # of a request that finished while its drafter lagged (_finish)
        self.left: list[int] = []  # drafter slots of requests that left the batch, not finished in the drafter yet
        # (_finish_left): most of a rollout's requests leave on its last few steps, the cheapest of the rollout
        self.left_unneeded: list[int] = []  # ... of those, the ones whose responses no running request drafts from:
        # they wait for the next request's start (a step that prefills prompts) or a checkpoint
        self.ingested = np.zeros(64, dtype=np.int64)  # per drafter slot: tokens its automaton holds (prompt included)
        self.started = 0  # requests started so far; each one's ordinal (per slot: ordinal) sets where its shadow
        # drafts start in the rotation of its candidates (scored), so that a resumed run, whose requests get other
        # slots, rotates as an uninterrupted one does
        self.ordinal = np.zeros(64, dtype=np.int64)
        self._rows: list | None = None  # the request id of each row at the last step, if its rows all had drafters
        # (None otherwise): a step with the same rows starts and finishes nothing
        self._row_slots = np.zeros(0, dtype=np.int64)  # ... and their drafter slots
        self.steps = 0
        self.prefilled = 0  # rows whose request started in the last step (their prompts were prefilled in it)
        self.deferred_steps = 0  # steps where nothing could pay and the drafter left its work to a later step
        self.gated_steps = 0
        self.preempted_steps = 0  # request-steps spent preempted (row missing, request kept)
        self.busy = np.zeros((2, int(vllm_config.scheduler_config.max_num_seqs) + 1))  # [seconds inside propose,
        # calls] by the step's scheduled rows: the drafter's own share of the engine's steps, by batch size
        # the payoff rule (sam/payoff.py): step cost and acceptance learned from this engine's own steps
        pinned = self.options.payoff_cost
        prior = device_prior(vllm_config) if pinned is None and self.options.device_prior else None
        self.step_cost = StepCost(prior=prior) if pinned is None else PinnedStepCost(pinned)
        self.acceptance = AcceptanceModel(self.k, levels=self.options.scored)
        self.shadows = ShadowDrafts(self.k)
        self.clock = time.perf_counter  # what step times are read from
        self._last_call: float | None = None  # when propose was last entered: one engine step ago
        self._last_drafted = 0  # draft tokens sent at the last call (verified in the step that just ran)
        self._context = 0.0  # tokens this step's rows hold (prompt and response so far): the step cost's context term
        self._cost = self.step_cost.at(1, 0.0)  # the step cost at this step's context ([a, b, c, e, f], sam/payoff.py)
        self._token_cost = 0.0  # the chance a draft token had to exceed at the last payoff cut: the drafter picks
        # each request's source by what its draft gains at that cost (sam.automaton.step_rows)
        self._quiet = False  # the last payoff cut sent nothing although the bound could not rule drafts out
        # (:meth:`_defers`)

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
        """Model-free: nothing to load, but the drafter's compiled code is warmed here (:meth:`warm_up`)."""
        seconds = self.warm_up()
        logger.info("SAMProposer: K=%d options=%s (compiled code warmed in %.2f s)", self.k, self.options, seconds)

    def warm_up(self, prompts: int = 2, n: int = 2, steps: int = 2 * EXPLORE_EVERY) -> float:
        """Drive a throwaway twin of this proposer (same options) through ``prompts`` x ``n`` requests (random
        prompts, a repeated phrase sampled) for two epochs of ``steps`` steps, on a runner that holds only what
        :meth:`propose` reads, and return the seconds it took. In a fresh process the first calls of the compiled
        kernels load numba's disk cache and compile the typed-list access that Python code makes, which would land
        on the first rollout's steps. vLLM calls :meth:`load_model` at engine start, so that cost leaves the first rollout. The twin's
        first epoch learns its step cost from a simulated clock (where nothing can pay yet: deferred and catch-up
        steps), its second drafts at a fixed cost that makes drafts pay (the payoff cut); this proposer's state is
        untouched."""
        start = time.perf_counter()
        twin = type(self)(self._vllm_config)
        now = [0.0]
        twin.clock = lambda: now[0]
        rng = np.random.default_rng(0)
        prompt_len = 16
        texts = [rng.integers(0, 32, prompt_len, dtype=np.int32) for _ in range(prompts)]
        phrase = rng.integers(0, 32, 8)
        steps = min(steps, self.max_model_len - prompt_len - 1)  # a step's token and room to draft after it
        for epoch in range(2):  # the second drafts from the first one's histories
            if epoch:
                twin.step_cost = PinnedStepCost([0.01, 0.001, 1e-5, 0.0, 0.0])
            ids = [f"warm-up-{epoch}-{i}" for i in range(prompts * n)]
            states = {rid: SimpleNamespace(output_token_ids=[]) for rid in ids}
            runner = SimpleNamespace(input_batch=SimpleNamespace(req_ids=ids), requests=states)
            twin.attach_runner(runner)
            token_ids = np.zeros((len(ids), prompt_len + steps), dtype=np.int32)
            token_ids[:, :prompt_len] = np.repeat(texts, n, axis=0)
            num_tokens = np.full(len(ids), prompt_len, dtype=np.int64)
            for step in range(steps):
                sampled = phrase[(step + np.arange(len(ids))) % phrase.size].tolist()  # a repeated phrase: drafts hit
                token_ids[np.arange(len(ids)), num_tokens] = sampled
                num_tokens += 1
                for rid, token in zip(ids, sampled, strict=True):
                    states[rid].output_token_ids.append(token)
                now[0] += 0.01 + 0.001 * len(ids) + 0.0001 * twin._last_drafted
                twin.propose([[t] for t in sampled], num_tokens, token_ids)
        runner.input_batch.req_ids, runner.requests = [], {}
        twin.finish_tracked()  # finishes the last requests, files their histories
        return time.perf_counter() - start

    def finish_tracked(self) -> None:
        """Finish every tracked request and file the finished rollouts into their prompts' histories: what the next
        rollout's first step and its prompts' return would do. Call it between rollouts, before :meth:`state_dict`:
        vLLM's runner drops a finished request only at the next step, so the requests of a rollout's last steps are
        still tracked then. The next step maps its rows to slots afresh."""
        self.left += self.slot_of.values()
        self.slot_of.clear()
        self.file_finished()
        self._rows = None

    def file_finished(self) -> None:
        """Finish the requests that left the batch and file every finished rollout into its prompt's history: what
        the next step that starts a request does (finishing is lazy: a rollout waits for it), done now so that a
        checkpoint taken while other requests run (veRL's trainer saves while its servers generate) holds them. The
        requests still tracked are untouched."""
        self._finish_left()
        self.drafter.groups.file_histories()

    def state_dict(self) -> dict:
        """Cross-rollout memory (each prompt's lead tokens and history responses, every prompt's responses of the
        global corpus, the payoff rule's acceptance counts, step-cost fit and last token cost, the step count), for
        trainer checkpoints; reading it changes nothing. It holds the rollouts filed so far: after :meth:`file_finished`
        every finished one, after :meth:`finish_tracked` the last rollout's tracked requests too, so that a run resumed
        from it drafts what an uninterrupted one does."""
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
            "step_cost": self.step_cost.state_dict(),  # the timed steps' fit, so a resumed run need not explore again
            "steps": self.steps,  # the phase of the catch-up and exploring steps, which decide where the drafter works
            "started": self.started,  # ... and of each request's rotation of candidates for its shadow drafts
        }

    def load_state_dict(self, state: dict) -> None:
        self.drafter = BatchDrafter(self.options, self.k)
        self.shadows = ShadowDrafts(self.k)  # slots restart with the new drafter
        self.slot_of, self.state_of, self._rows = {}, {}, None
        self.left, self.left_unneeded = [], []
        for key, (lead, responses) in state["groups"].items():
            self.drafter.groups.restore(key, np.asarray(lead, dtype=np.int32), responses)
        if self.drafter.global_corpus is not None and state.get("global") is not None:
            self.drafter.global_corpus.restore(*state["global"])
        self.acceptance.load_state_dict(state["acceptance"])
        self._token_cost = float(state.get("token_cost", 0.0))
        if "step_cost" in state:  # older checkpoints have none: the cost is learned again
            self.step_cost.load_state_dict(state["step_cost"])
        self.steps = int(state.get("steps", 0))
        self.started = int(state.get("started", 0))

    def request_text(self, request_id: str) -> np.ndarray:
        """Prompt + verified tokens of a tracked request as of the last step its drafter worked (every step without
        the payoff rule; with it, steps where nothing can pay leave the work to a later step: :meth:`propose`)."""
        return self.drafter.text(self.slot_of[request_id])

    def _account(self, since: float, rows: int) -> None:
        self.busy[0, rows] += self.clock() - since
        self.busy[1, rows] += 1

    @property
    def num_requests(self) -> int:
        """Requests tracked: started and not seen to leave the batch (preempted ones included)."""
        return len(self.slot_of)

    def _finish_left(self, needed_only: bool = False, store_global: bool = True) -> None:
        """Finish the requests that left the batch in the drafter (:meth:`_finish`): with ``needed_only``, those whose
        responses a running request drafts from (:meth:`sam.policy.BatchDrafter.drafted_from`), on a step where the
        drafter works (its drafts and shadow drafts, which teach the payoff rule what sibling material is worth, need
        them); else all of them (a step that starts a request, so its group holds its finished siblings, or a
        checkpoint). A step that leaves the drafter's work to a later one costs the leaving requests nothing but the
        bookkeeping."""
        if needed_only:
            needed = self.drafter.drafted_from(self.left, store_global)
            self.left_unneeded += (slot for slot, n in zip(self.left, needed, strict=True) if not n)
            slots = [slot for slot, n in zip(self.left, needed, strict=True) if n]
        else:
            slots = self.left_unneeded + self.left
            self.left_unneeded = []
        self.left = []
        self._finish(slots)

    def _finish(self, slots: list[int]) -> None:
        """Each response, with the tokens its drafter had not taken yet (read from vLLM's request state, which
        outlives the runner's reference), goes to its prompt's group and settles its shadow draft."""
        tails = []
        for slot in slots:
            state = self.state_of.pop(slot)
            unseen = int(self.ingested[slot]) - self.drafter.requests[slot][1]
            tails.append(np.asarray(state.output_token_ids[unseen:], dtype=np.int32))
        if not slots:
            return
        # one settling call for every finished request (most of a rollout's requests finish on its last few steps)
        offsets = np.zeros(len(slots) + 1, dtype=np.int64)
        np.cumsum([tail.size for tail in tails], out=offsets[1:])
        if offsets[-1]:
            self.shadows.resolve(np.array(slots), np.concatenate(tails), offsets, self.acceptance)
        for slot, tail in zip(slots, tails, strict=True):
            self.drafter.finish(slot, tail)
            self.shadows.forget(slot)

    def _slots(self, req_ids: list, sampled_token_ids, num_tokens, token_ids_cpu) -> tuple[np.ndarray, int]:
        """Drafter slot of each row (-1 for a new request that has not sampled yet) and how many rows started a
        request in this step (their prompts were prefilled in it). The requests the runner no longer holds left
        (:meth:`_finish_left`); a step with new requests finishes every request that left, then starts the new ones
        (so a new request's group already holds its finished siblings)."""
        slot_of = self.slot_of
        slots = list(map(slot_of.get, req_ids, repeat(-1, len(req_ids))))
        new = [r for r, slot in enumerate(slots) if slot < 0]
        # a tracked request without a row finished, or was preempted if the runner still holds it
        if len(slots) - len(new) != len(slot_of):
            scheduled, unfinished = set(req_ids), self.runner.requests
            gone = [rid for rid in slot_of if rid not in scheduled]
            finished = [rid for rid in gone if rid not in unfinished]
            self.preempted_steps += len(gone) - len(finished)
            self.left += (slot_of.pop(rid) for rid in finished)
        if new and (self.left or self.left_unneeded):
            self._finish_left()
        for r in new:
            if sampled_token_ids[r]:
                before = int(num_tokens[r]) - len(sampled_token_ids[r])
                prompt = np.asarray(token_ids_cpu[r, :before], dtype=np.int32)
                slot = slots[r] = slot_of[req_ids[r]] = self.drafter.start(prompt, prompt_key(prompt))
                self.state_of[slot] = self.runner.requests[req_ids[r]]
                if slot >= self.ingested.size:
                    self.ingested, self.ordinal = (
                        np.concatenate([a, np.zeros(slot + 1, dtype=np.int64)]) for a in (self.ingested, self.ordinal)
                    )
                self.ingested[slot] = before
                self.ordinal[slot] = self.started
                self.started += 1
        return np.array(slots, dtype=np.int64), len(new)

    def _time_step(self, now: float, rows: int, prefilled: int) -> None:
        """The time of the step that just ran, against its rows, the drafts verified in it and its rows' context (a
        step that prefilled a prompt is not a decode step's cost and is not timed)."""
        if self._last_call is not None and prefilled == 0 and rows > 0:
            self.step_cost.observe(rows, self._last_drafted, now - self._last_call, self._context)
        self._last_call = now

    def _settle(self, slots, tokens, offsets) -> None:
        """How the requests' pending shadow drafts fared against the tokens they verified."""
        self.shadows.resolve(slots, tokens, offsets, self.acceptance)

    def _pay(self, rows: int, slots, drafts, lengths, group, mlen, level, idle: bool) -> np.ndarray:
        """The payoff rule's draft lengths (nothing where nothing can pay, ``idle``, :meth:`_nothing_can_pay`, which
        holds until the step cost is learned; the likely tokens on exploring steps while drafting's cost is unknown);
        each full draft also becomes its request's shadow if none is pending."""
        band = self.acceptance.band(mlen)
        if self.options.scored:  # the shadows are the explored candidates, not the chosen drafts (step_rows)
            ex_drafts, ex_lengths, ex_group, ex_mlen, ex_level = self.drafter.explored(rows)
            self.shadows.start(slots, ex_drafts, ex_lengths, ex_group, self.acceptance.band(ex_mlen), ex_level)
        else:
            self.shadows.start(slots, drafts, lengths, group, band, level)
        if idle:
            lengths = np.zeros_like(lengths)
        elif self.step_cost.exploring and self.steps % EXPLORE_EVERY == 0:
            likely = np.arange(self.k)[None, :] < lengths[:, None]
            likely &= self.acceptance.chances(group, band, level) >= EXPLORE_CHANCE
            lengths = likely.sum(axis=1)  # explore: what drafting costs can only be learned by drafting
        else:
            lengths = self._cut(rows, self.acceptance.chances(group, band, level), lengths)
            self._quiet = not lengths.any()
        self._last_drafted = int(lengths.sum())
        return lengths

    def _cut(self, rows: int, chances: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """The payoff cut of this step's drafts (:func:`sam.payoff.payoff_cut`), keeping the token cost it found."""
        lengths, self._token_cost = payoff_cut(chances, lengths, rows, self._cost, self.options.payoff_margin)
        return lengths

    def _nothing_can_pay(self, rows: int) -> bool:
        """Whether no draft can be sent this step: too few steps were timed to price one, or this is no exploring
        step and either a draft token has no price yet (:attr:`sam.payoff.StepCost.known`) or no draft can pass the
        payoff cut at this batch size (:func:`sam.payoff.nothing_can_pay`: a big batch on a compute-bound engine,
        most steps). Then the drafter works only on one step in
        :data:`sam.payoff.CATCH_UP_EVERY` (:meth:`propose`), drafting only shadows, for the requests with none
        pending: its work on such a step is pure cost."""
        if not self.step_cost.priced:
            return True
        if self.step_cost.exploring and self.steps % EXPLORE_EVERY == 0:
            return False
        if not self.step_cost.known:
            return True
        return nothing_can_pay(self.acceptance, rows, self._cost, self.options.payoff_margin)

    def _defers(self, idle: bool) -> bool:
        """Whether this step may leave the drafter's work to a later one (:meth:`propose`): where nothing can pay, or
        while the last payoff cut sent nothing. The bound cannot rule out drafts where a few requests are left (the
        tail), nor, with ``scored``, anywhere (it takes the likeliest evidence level at every position), so a
        step that sent nothing is a better sign than the bound. The step that works (one in :data:`sam.payoff.CATCH_UP_EVERY`) cuts the drafts it
        finds, and the first that sends any ends it."""
        return (idle or self._quiet) and self._rows is not None and self.options.defer_idle

    def _stores_global(self, rows: int, prefilled: int, idle: bool) -> bool:
        """Whether this step may store the corpus of every prompt's responses (``global_sharing``), which counts all it
        holds: on a step that prefilled prompts (which costs far more) or where drafts can pay by the step cost's
        bound, not on an exploring step that only could not rule them out (:meth:`_nothing_can_pay`). A rollout's
        last steps, where nothing pays, stored it at a loss (results/FINDINGS.md, "Storing the global corpus on
        every step")."""
        if self.drafter.global_corpus is None or prefilled or not self.options.payoff:
            return True
        if idle or not self.step_cost.known:
            return False
        return not nothing_can_pay(self.acceptance, rows, self._cost, self.options.payoff_margin)

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, *args, **kwargs) -> list[list[int]]:
        """Drafts for vLLM's rows. With the payoff rule, a step where nothing can pay does no drafter work but
        timing the step and tracking which requests start and finish: its tokens stay in vLLM's ``token_ids_cpu``
        until a later step takes them (one in :data:`sam.payoff.CATCH_UP_EVERY`, or one where something can pay),
        which saves the drafter's cache misses after the forward on most steps of a big batch. A step with a request that has not sampled yet works."""
        if self.runner is None:
            raise RuntimeError(
                "SAMProposer has no model runner to read request ids from: the sam.runner_hook:register vLLM plugin did "
                "not run in this process (install this package, e.g. pip install -e ., and keep VLLM_PLUGINS unset "
                "or naming it)"
            )
        now = self.clock()
        self.steps += 1
        rows = len(sampled_token_ids)
        req_ids = self.runner.input_batch.req_ids[:rows]
        payoff = self.options.payoff
        self._context = float(np.sum(num_tokens_no_spec[:rows]))
        if req_ids == self._rows:
            slots, prefilled = self._row_slots, 0
            self.preempted_steps += len(self.slot_of) - rows  # tracked without a row: preempted
        else:
            slots, prefilled = self._slots(req_ids, sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
            self._rows, self._row_slots = (req_ids if (slots >= 0).all() else None), slots
        if payoff:
            self._time_step(now, rows, prefilled)
            self._cost = self.step_cost.at(rows, self._context)
        self.prefilled = prefilled
        self._quiet &= not prefilled  # new requests bring new drafts (and a checkpoint, between rollouts, keeps none)
        idle = payoff and self._nothing_can_pay(rows)
        if self._defers(idle) and self.steps % CATCH_UP_EVERY:
            if prefilled:  # the requests that left were finished as these started (_slots): store them now
                self.drafter.store_global()
            self.deferred_steps += 1
            self.gated_steps += rows > self.options.batch_threshold
            self._last_drafted = 0
            self._account(now, rows)
            return [[] for _ in range(rows)]
        store_global = self._stores_global(rows, prefilled, idle)
        if self.left:
            self._finish_left(needed_only=True, store_global=store_global)
        offsets = np.empty(rows + 1, dtype=np.int64)
        ks = np.empty(rows, dtype=np.int64)
        tokens, live = _catch_up(
            token_ids_cpu, num_tokens_no_spec, slots, self.ingested, self.max_model_len, self.k, self.k_by_batch,
            self.options.batch_threshold, offsets, ks,
        )  # fmt: skip
        self.gated_steps += live > self.options.batch_threshold
        if payoff:
            self._settle(slots, tokens, offsets)
        # what the drafter picks sources by (None: the longest match)
        scored = self.acceptance.conditional() if payoff and self.options.scored else None
        if idle:
            self.shadows.turns(slots, ks, self.steps)
        # each request's shadow is its candidates in turn (BatchDrafter.explored)
        explore_from = (self.ordinal[slots] + self.steps) % (1 + self.drafter.CORPORA) if scored is not None else None
        drafts, lengths, group, mlen, level = self.drafter.step_arrays(
            slots, tokens, offsets, ks, scored, self._token_cost, explore_from, store_global
        )
        if payoff:
            lengths = self._pay(rows, slots, drafts, lengths, group, mlen, level, idle)
        self._account(now, rows)
        return draft_lists(drafts, lengths)
