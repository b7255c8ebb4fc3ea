"""SAM and the model's MTP head in one vLLM engine (``spec=hybrid``): per request and per step, the head's draft,
SAM's draft or none, whichever the payoff rule (:mod:`sam.payoff`) expects to gain most at the step's batch size,
verified in one pass.

vLLM runs one speculative method per engine. The engine here runs vLLM's own MTP drafter (``method: mtp``, with
``disable_padded_drafter_batch`` so that it drafts after the step's bookkeeping, when vLLM's token history holds the
step's tokens, as a ``custom_class`` proposer sees them), and :func:`become_hybrid` (called by
:mod:`sam.runner_hook` once the model runner exists, where ``additional_config`` has a ``hybrid`` entry) turns that
drafter into a :class:`HybridProposer`: the same object, its class a subclass of vLLM's, so that every path of the
runner that expects an MTP drafter still finds one. Each step:

1. SAM (:class:`HybridSAM`, SAM's proposer) takes the step's tokens and finds its drafts as ``spec=sam`` does; its
   payoff cut also weighs, for every row, a chain of up to D head tokens (the head's layer run on its own output) at
   that request's learned per-depth acceptance (:class:`HeadAcceptance`) and what the head's run adds to the step
   at each depth (its layer over the step's tokens and its sampling, :class:`HeadCost`, timed in this engine), and
   keeps whichever cut yields more tokens per second: SAM's drafts alone, or per row the better source with the
   head's chains at most 1, 2, ... D deep.
2. The head runs on steps where a row takes its draft, as deep as the deepest chain sent, and its layer alone on
   steps that prefill prompts; on the other decode steps nothing of it runs, so a head that does not pay costs
   nothing but its prompts' layer. Its KV cache then has holes at the positions of the decode steps it skipped,
   which its later drafts attend over: they cost its drafts little, where holes over the prompt (the positions
   attention leans on most) would cost them much (results/FINDINGS.md, "Holes in the head's KV cache").
3. Each row sends one source's draft. A sampled head draft keeps its probabilities; SAM's are point masses
   (:class:`RowDraftProbs`): vLLM's rejection sampler verifies both in one batch, losslessly.

The head's time is kept out of the step time SAM's step cost learns from (the payoff rule prices it separately).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import torch
from vllm.v1.spec_decode.eagle import EagleProposer

from sam.counts import CountsLog
from sam.payoff import nonnegative_solve, payoff_cut
from sam.vllm import SAMProposer

logger = logging.getLogger(__name__)

ACCEPTANCE_FILE = "acceptance.json"  # written next to a head by recipe/mtp_head.py: its held-out acceptance
HEAD_PRIOR_WEIGHT = 8.0  # the engine-wide head acceptance's prior, in drafts; a request's own, shrunk towards it
REQUEST_PRIOR_WEIGHT = 4.0
HEAD_MEMORY = 0.998  # each draft's weight in the engine-wide acceptance decays by this per later draft (~500 drafts)
SOURCES = ("mtp", "sam")  # where a row's draft came from: the head, SAM (the names of the per-source metrics)
HEAD, SAM = 0, 1
FORGET_EVERY = 1024  # engine steps between droppings of finished requests' head counts
DEFAULT_HEAD_ACCEPTANCE = 0.25  # prior for a head with no recorded acceptance: pessimistic, so that it must earn its
# drafts in the tail first


def recorded_acceptance(model_dir: str | Path, draft_sample_method: str) -> list[float] | None:
    """The held-out acceptance ``recipe.mtp_head`` recorded next to the head (``acceptance.json``) for the way it
    drafts (probabilistic or greedy): per depth, the chance a depth-d draft token is accepted given the ones before it
    were (one depth where the head was measured drafting one token), or None."""
    path = Path(model_dir) / ACCEPTANCE_FILE
    if not path.is_file():
        return None
    recorded = json.loads(path.read_text())
    method = "probabilistic" if draft_sample_method == "probabilistic" else "greedy"
    by_depth = (recorded.get("accept_rate_pos") or {}).get(method)
    if by_depth:
        return [float(v) for v in by_depth]
    value = recorded.get(method)
    return None if value is None else [float(value)]


class HeadAcceptance:
    """The chance that each depth of the head's draft chain is accepted, given the depths before it were: engine-wide
    per depth (prior: the recorded held-out acceptance) and, at depth 1, per request (shrunk towards the engine-wide
    one), counted from the chains it sent. :meth:`chances` gives each row's cumulative chances, what the payoff rule
    reads a draft by.

    Example: depth rates 0.6 and 0.5 give a chain's tokens the chances 0.6 and 0.3."""

    def __init__(self, prior: list[float]) -> None:
        self.prior = np.asarray(prior, dtype=float)
        self.reached = np.zeros(len(prior))  # chains that reached each depth (decayed counts) ...
        self.accepted = np.zeros(len(prior))  # ... and were accepted there
        self.by_request: dict[str, list[int]] = {}  # request id -> [chains, first tokens accepted]

    @property
    def depth(self) -> int:
        return len(self.prior)

    @property
    def by_depth(self) -> np.ndarray:
        """Engine-wide, the chance a depth-d token is accepted given depths 1..d-1 were."""
        return (self.accepted + HEAD_PRIOR_WEIGHT * self.prior) / (self.reached + HEAD_PRIOR_WEIGHT)

    def chances(self, req_ids: list[str]) -> np.ndarray:
        """[rows, depth]: each row's chance that its chain's tokens 1..d are all accepted."""
        rates = self.by_depth
        first = np.full(len(req_ids), rates[0])
        for r, rid in enumerate(req_ids):
            counts = self.by_request.get(rid)
            if counts is not None:
                first[r] = (counts[1] + REQUEST_PRIOR_WEIGHT * rates[0]) / (counts[0] + REQUEST_PRIOR_WEIGHT)
        return first[:, None] * np.cumprod(np.r_[1.0, rates[1:]])[None, :]

    def observe(self, rid: str, sent: int, accepted: int) -> None:
        """A chain of ``sent`` head tokens whose first ``accepted`` were accepted."""
        counts = self.by_request.setdefault(rid, [0, 0])
        counts[0] += 1
        counts[1] += int(accepted > 0)
        # engine-wide, recent chains weigh most: a weight sync or the policy's drift moves the head's acceptance
        self.reached *= HEAD_MEMORY
        self.accepted *= HEAD_MEMORY
        reached = min(sent, accepted + 1, self.depth)
        self.reached[:reached] += 1
        self.accepted[: min(accepted, self.depth)] += 1

    def state_dict(self) -> dict:
        """The engine-wide counts, for a checkpoint (a resumed run's request ids are new: per-request counts go)."""
        return {"drafts": self.reached.tolist(), "accepted": self.accepted.tolist()}

    def load_state_dict(self, state: dict) -> None:
        """Counts from :meth:`state_dict`; a checkpoint of a shallower head (or one number, from a one-token head)
        fills the depths it has."""
        for name in ("drafts", "accepted"):
            saved = np.atleast_1d(np.asarray(state[name], dtype=float))[: self.depth]
            counts = np.zeros(self.depth)
            counts[: saved.size] = saved
            setattr(self, "reached" if name == "drafts" else name, counts)

    def forget(self, live: set[str]) -> None:
        """Drop the counts of requests that left (called now and then: a rollout's ids are not reused)."""
        self.by_request = {rid: c for rid, c in self.by_request.items() if rid in live}


class HeadCost:
    """Seconds the head's run adds to a step of ``rows`` rows whose chains go ``depth`` deep (its layer over the step's
    tokens, then its sampling, once per depth): ``a + b * rows + depth * (c * rows + e)``, by non-negative least
    squares with exponential forgetting over the engine's head runs, as :class:`sam.payoff.StepCost` fits a step, so
    that :meth:`step_seconds` prices each depth at the step's own rows (runs come mostly from small batches, where
    the payoff rule sends the head's drafts).

    Example: a layer of 0.02 + 0.001 * rows s and 0.003 * rows + 0.004 s more per depth price chains 2 deep at 16 rows
    at 0.036 + 2 * 0.052 = 0.14 s."""

    TERMS = 4
    RIDGE = 1e-9  # towards 0, each term in its own units: a term the runs cannot tell apart stays small

    def __init__(self, decay: float = 0.99) -> None:
        self.decay = decay
        self.xtx = np.zeros((self.TERMS, self.TERMS))
        self.xty = np.zeros(self.TERMS)
        self.coef = np.zeros(self.TERMS)  # 0 until the head ran: it is priced free until timed (it must run to be)

    def observe(self, rows: int, depth: int, seconds: float) -> None:
        x = np.array([1.0, rows, depth * rows, depth], dtype=float)
        self.xtx = self.decay * self.xtx + np.outer(x, x)
        self.xty = self.decay * self.xty + x * seconds
        coef = nonnegative_solve(self.xtx + self.RIDGE * np.diag(np.diag(self.xtx) + 1.0), self.xty)
        if coef is not None:
            self.coef = coef

    def step_seconds(self, rows: int, depth: int) -> np.ndarray:
        """[depth + 1]: what the head's run adds to a step of ``rows`` rows at chain depths 0..``depth`` (0 at depth 0:
        the head does not run)."""
        a, b, c, e = self.coef.tolist()
        depths = np.arange(depth + 1, dtype=float)
        return np.where(depths > 0, a + b * rows + depths * (c * rows + e), 0.0)

    def state_dict(self) -> dict:
        return {
            "xtx": self.xtx.tolist(),
            "xty": self.xty.tolist(),
            "coef": self.coef.tolist(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.xtx, self.xty = np.asarray(state["xtx"], dtype=float), np.asarray(state["xty"], dtype=float)
        self.coef = np.asarray(state["coef"], dtype=float)


def timed_on_device(run) -> tuple[list, float]:
    """``run()`` (the head's layer and sampling) read back as token ids, and its seconds, the device's queued work
    included: a GPU returns from the launch before computing, so the clock stops where the ids are read back (which
    waits for them). Timing the launch alone charged the head's work to whatever next waited for the device, the next
    step that SAM's step cost learns from.

    Example: a layer whose kernels take 3 ms after a 0.1 ms launch is timed at 3.1 ms, not 0.1 ms."""
    start = time.perf_counter()
    ids = run().tolist()
    return ids, time.perf_counter() - start


def prompts_in_step(prefilled: int, sampled: list[list[int]]) -> bool:
    """Whether a step's tokens hold prompt tokens, on which the head's layer must run (its KV cache over the prompt):
    a request started in it (``prefilled`` rows sampled their first token) or a row sampled nothing (a prompt
    prefilled in chunks, or a preempted request's recomputation, not done yet).

    Example: ``prompts_in_step(0, [[5], [7, 8]])`` is False (decode rows only); ``prompts_in_step(0, [[5], []])`` is
    True."""
    return prefilled > 0 or any(not tokens for tokens in sampled)


class HybridSAM(SAMProposer):
    """SAM's proposer whose payoff cut also weighs a chain of head tokens for every row (:meth:`_cut`).

    The hybrid sets :attr:`head_chance` ([rows, depth]: per row, the chance its chain's tokens 1..d are all accepted)
    and :attr:`head_seconds` before each :meth:`propose`, and reads :attr:`head_rows` (the rows that take the head's
    chain) and :attr:`head_lengths` (how deep each goes) after it."""

    def __init__(self, vllm_config, *args, **kwargs) -> None:
        super().__init__(vllm_config, *args, **kwargs)
        self.head_chance: np.ndarray | None = None
        self.head_seconds = np.zeros(self.k + 1)  # [depth + 1]: what the head's run adds to the step at chain depth d
        # (free until the hybrid prices it)
        self.head_rows = np.zeros(0, dtype=bool)
        self.head_lengths = np.zeros(0, dtype=np.int64)

    def _head_usable(self, rows: int) -> bool:
        return self.head_chance is not None and self.head_chance.shape[0] == rows and rows > 0

    def _nothing_can_pay(self, rows: int) -> bool:
        """SAM's bound (:meth:`SAMProposer._nothing_can_pay`), and no head draft can pay either: its first token at the
        best row's chance, less its price, against the switch to verification and the head's run at depth 1 (a
        chain's later tokens are likelier to fail than its first)."""
        if not super()._nothing_can_pay(rows):
            return False
        if not self._head_usable(rows) or not self.step_cost.known:
            return True
        a, b, c, e, f = self._cost.tolist()
        margin = self.options.payoff_margin
        plain = max(a + b * rows, 1e-12)
        token_cost = (1.0 + margin) * rows * c / plain
        switch = (1.0 + margin) * (1.0 + (e + f * rows + float(self.head_seconds[1])) / plain) - 1.0
        return float(self.head_chance[:, 0].max()) - token_cost <= switch

    def _pay(self, rows: int, slots, drafts, lengths, group, mlen, level, idle: bool) -> np.ndarray:
        self.head_rows = np.zeros(rows, dtype=bool)
        self.head_lengths = np.zeros(rows, dtype=np.int64)
        lengths = super()._pay(rows, slots, drafts, lengths, group, mlen, level, idle)
        self._last_drafted += int(self.head_lengths.sum())  # verified like SAM's: the step cost learns both
        self._quiet &= not self.head_rows.any()  # a step that sent head drafts is no sign that later ones defer
        return lengths

    def _cut(self, rows: int, chances: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """SAM's payoff cut, against cuts where each row drafts from the source whose draft gains more at the last
        cut's token cost (the head: its chain, at most ``depth`` tokens deep), for each depth the head's chains may
        reach, the head's run priced at each depth; the cut with the most expected tokens per second wins.
        Sets :attr:`head_rows` and :attr:`head_lengths`."""
        sam_lengths = super()._cut(rows, chances, lengths)
        sam_token_cost = self._token_cost
        self.head_rows = np.zeros(rows, dtype=bool)
        self.head_lengths = np.zeros(rows, dtype=np.int64)
        if not self._head_usable(rows):
            return sam_lengths
        width = chances.shape[1]
        head_chance = self.head_chance[:, :width]
        positions = np.arange(width)[None, :] < lengths[:, None]
        sam_gain = np.where(positions, np.maximum(chances - sam_token_cost, 0.0), 0.0).sum(axis=1)
        best = (self._rate(rows, chances, sam_lengths, 0), sam_lengths, sam_token_cost, None)
        for depth in range(1, head_chance.shape[1] + 1):
            head = np.maximum(head_chance[:, :depth] - sam_token_cost, 0.0).sum(axis=1) > sam_gain
            if not head.any():
                continue
            mixed_chances = np.where(head[:, None], 0.0, chances)
            mixed_chances[head, :depth] = head_chance[head, :depth]
            mixed_lengths = np.where(head, depth, lengths)
            cost = self._cost.copy()
            cost[3] += self.head_seconds[depth]
            mixed, token_cost = payoff_cut(mixed_chances, mixed_lengths, rows, cost, self.options.payoff_margin)
            head_lengths = np.where(head, mixed, 0)
            rate = self._rate(rows, mixed_chances, mixed, int(head_lengths.max()))
            if rate > best[0]:
                best = (rate, np.where(head, 0, mixed), token_cost, head_lengths)
        _, kept, self._token_cost, head_lengths = best
        if head_lengths is not None:
            self.head_lengths = head_lengths
            self.head_rows = head_lengths > 0
        return kept

    def _rate(self, rows: int, chances: np.ndarray, lengths: np.ndarray, head_depth: int) -> float:
        """Expected tokens per second of a step that sends ``lengths`` of drafts with these chances, the head's chains
        ``head_depth`` deep (0: the head does not run)."""
        kept = np.arange(chances.shape[1])[None, :] < lengths[:, None]
        drafted = int(lengths.sum())
        seconds = self.step_cost.seconds(rows, drafted, self._context) + self.head_seconds[head_depth]
        return (rows + float(chances[kept].sum())) / max(seconds, 1e-12)


class RowDraftProbs:
    """Draft probabilities as vLLM's runner reads them (``probs[row, :n]`` for each row that drafted): a head row's
    are the head's sampling distribution, a SAM row's point masses on its tokens (built when read)."""

    def __init__(self, head_probs: torch.Tensor, sam_drafts: dict[int, list[int]]) -> None:
        self.head_probs = head_probs  # [rows, depth, vocab]
        self.sam_drafts = sam_drafts

    def __getitem__(self, key) -> torch.Tensor:
        row, positions = key
        tokens = self.sam_drafts.get(row)
        if tokens is None:
            return self.head_probs[row, positions]
        tokens = tokens[positions]
        out = self.head_probs.new_zeros((len(tokens), self.head_probs.shape[-1]))
        out[torch.arange(len(tokens)), torch.as_tensor(tokens, dtype=torch.long)] = 1.0
        return out


class HybridProposer(EagleProposer):
    """vLLM's MTP drafter that also drafts with SAM (module docstring). Made by :func:`become_hybrid`."""

    sam: HybridSAM

    def _init_hybrid(self, runner) -> None:
        config = self.vllm_config
        options = dict((getattr(config, "additional_config", None) or {}).get("hybrid") or {})
        method = config.speculative_config.draft_sample_method
        recorded = recorded_acceptance(config.model_config.model, method) or [DEFAULT_HEAD_ACCEPTANCE]
        k = int(config.speculative_config.num_speculative_tokens)
        depth = options.get("head_depth") or min(len(recorded), k)  # a recorded chain longer than K: cut to K
        if depth > k:
            raise ValueError(
                f"spec.hybrid.head_depth={depth}: the head's chains must fit spec.num_speculative_tokens={k}"
            )
        prior = options.get("head_acceptance")
        rates = recorded if prior is None else [float(prior)]
        # depths past the recorded ones: the deepest recorded rate
        self.head = HeadAcceptance([rates[min(d, len(rates) - 1)] for d in range(depth)])
        pinned = options.get("head_cost")
        self.head_cost = None if pinned is None else float(pinned)  # seconds per row and depth of its run, given
        self.sam = HybridSAM(config)
        self.sam.attach_runner(runner)
        self.runner = runner
        self._sampled: list[list[int]] = []
        self._pending: dict[str, tuple[int, int, int]] = {}  # request id -> (its token count, source, tokens) of the
        # draft it was sent last step
        self.head_cost_fit = HeadCost()  # the head's run time by the step's rows and its chains' depth
        self.drafted = np.zeros(len(SOURCES), dtype=np.int64)  # draft tokens sent, by source
        self.accepted = np.zeros(len(SOURCES), dtype=np.int64)  # ... and accepted
        self.head_chains = np.zeros(self.head.depth + 1, dtype=np.int64)  # head chains sent, by length
        self.head_runs = np.zeros(2, dtype=np.int64)  # steps where the head ran: its layer alone (a prompt's), sampling
        self.steps = 0
        self.counts_log = CountsLog()  # beside a veRL server's timeline, where the trainer reads the counts
        self.sent_by_rows = np.zeros((len(SOURCES), int(config.scheduler_config.max_num_seqs) + 1), dtype=np.int64)
        # draft tokens sent by source and the step's scheduled rows: which source drafted at which batch size

    # what the rest of the recipe reads from a drafter: SAM's cross-rollout memory and time spent
    @property
    def busy(self) -> np.ndarray:
        return self.sam.busy

    def state_dict(self) -> dict:
        """SAM's cross-rollout memory and what the hybrid learned of its head (its acceptance, its seconds per row),
        so that a resumed run weighs the head as an uninterrupted one does."""
        head = {"acceptance": self.head.state_dict(), "cost": self.head_cost_fit.state_dict()}
        return {**self.sam.state_dict(), "head": head}

    def finish_tracked(self) -> None:
        """SAM's :meth:`~sam.vllm.SAMProposer.finish_tracked` (the head keeps nothing per tracked request)."""
        self.sam.finish_tracked()

    def file_finished(self) -> None:
        """SAM's :meth:`~sam.vllm.SAMProposer.file_finished`."""
        self.sam.file_finished()

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        head = state.pop("head", None)  # older checkpoints have none: the head is learned again
        self.sam.load_state_dict(state)
        if head is not None:
            self.head.load_state_dict(head["acceptance"])
            if "cost" in head:  # older checkpoints kept per-row means: the fit is learned again
                self.head_cost_fit.load_state_dict(head["cost"])

    def load_model(self, *args, **kwargs) -> None:
        super().load_model(*args, **kwargs)
        self.sam.load_model()

    def prepare_next_token_ids_cpu(self, sampled_token_ids, *args, **kwargs):
        self._sampled = sampled_token_ids  # the step's verified tokens per row, which SAM takes
        return super().prepare_next_token_ids_cpu(sampled_token_ids, *args, **kwargs)

    def _settle(self, req_ids: list[str], num_tokens: np.ndarray) -> None:
        """How the drafts sent last step fared: a row's tokens grew by its accepted draft tokens and one more. A
        request not scheduled this step (preempted) drops its draft unverified."""
        pending, self._pending = self._pending, {}
        if not pending:
            return
        for r, rid in enumerate(req_ids):
            sent = pending.get(rid)
            if sent is not None:
                before, source, tokens = sent
                accepted = min(tokens, max(0, int(num_tokens[r]) - before - 1))
                self.drafted[source] += tokens
                self.accepted[source] += accepted
                if source == HEAD:
                    self.head.observe(rid, tokens, accepted)

    def counts(self) -> dict[str, list[int]]:
        """Draft tokens sent and accepted so far, by source."""
        return {s: [int(self.drafted[i]), int(self.accepted[i])] for i, s in enumerate(SOURCES)}

    def propose(self, num_speculative_tokens, *args, **kwargs) -> list[list[int]]:
        batch = self.runner.input_batch
        rows = len(self._sampled)
        req_ids = batch.req_ids[:rows]
        num_tokens = batch.num_tokens_no_spec
        self._settle(req_ids, num_tokens)
        self.counts_log.step(self.counts)
        self.steps += 1
        if self.steps % FORGET_EVERY == 0:  # the per-request counts of requests that finished
            self.head.forget(set(self.runner.requests))
        sam = self.sam
        sam.head_chance = self.head.chances(req_ids) if num_speculative_tokens > 0 else None
        if self.head_cost is not None:
            sam.head_seconds = self.head_cost * rows * np.arange(self.head.depth + 1, dtype=float)
        else:
            sam.head_seconds = self.head_cost_fit.step_seconds(rows, self.head.depth)
        sam.head_rows = np.zeros(rows, dtype=bool)
        sam.head_lengths = np.zeros(rows, dtype=np.int64)
        drafts = sam.propose(self._sampled, num_tokens, batch.token_ids_cpu)
        head_rows = sam.head_rows if sam.head_rows.size == rows else np.zeros(rows, dtype=bool)
        depth = int(sam.head_lengths[head_rows].max()) if head_rows.any() else 0
        self._last_draft_probs = None
        if depth or prompts_in_step(sam.prefilled, self._sampled):  # else the head does not run (module docstring)
            head_ids, elapsed = timed_on_device(lambda: super(HybridProposer, self).propose(depth, *args, **kwargs))
            if sam._last_call is not None:
                sam._last_call += elapsed  # the head's time is priced apart from the step SAM's step cost learns
            self.head_runs[int(depth > 0)] += 1
        if depth:
            self.head_cost_fit.observe(rows, depth, elapsed)  # a prompt's layer-only run is no price of a draft
            for r in np.flatnonzero(head_rows).tolist():
                drafts[r] = head_ids[r][: int(sam.head_lengths[r])]
                self.head_chains[len(drafts[r])] += 1
            probs = self._last_draft_probs
            if probs is not None:
                self._last_draft_probs = RowDraftProbs(
                    probs, {r: d for r, d in enumerate(drafts) if d and not head_rows[r]}
                )
        for r, draft in enumerate(drafts):
            if draft:
                source = HEAD if head_rows[r] else SAM
                self._pending[req_ids[r]] = (int(num_tokens[r]), source, len(draft))
                self.sent_by_rows[source, min(rows, self.sent_by_rows.shape[1] - 1)] += len(draft)
        return drafts

    def take_last_draft_probs(self):
        return self._last_draft_probs


def become_hybrid(drafter: EagleProposer, runner) -> HybridProposer:
    """Turn vLLM's MTP drafter into a :class:`HybridProposer` in place (the runner keeps the same object)."""
    if not isinstance(drafter, EagleProposer):
        raise TypeError(f"spec=hybrid needs vLLM's MTP drafter (speculative method mtp), not {type(drafter).__name__}")
    if not drafter.speculative_config.disable_padded_drafter_batch:
        raise ValueError(
            "spec=hybrid needs speculative_config.disable_padded_drafter_batch=true: SAM reads the step's tokens "
            "after vLLM's bookkeeping"
        )
    drafter.__class__ = HybridProposer
    drafter._init_hybrid(runner)
    logger.info(
        "hybrid drafter: MTP head (chains up to %d deep, acceptance prior %s) and SAM, K=%d",
        drafter.head.depth, np.round(drafter.head.prior, 3).tolist(), drafter.sam.k,
    )  # fmt: skip
    return drafter
