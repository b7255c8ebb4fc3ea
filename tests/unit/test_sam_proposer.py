"""SAMProposer driven the way vLLM drives a custom_class proposer: one row per scheduled request, rows reordered
and condensed between steps, several verified tokens per step, requests preempted (unscheduled for a while,
still unfinished) and resumed. The request ids come from the model runner, as in vLLM: ``input_batch.req_ids``
in row order and ``requests`` holding every unfinished request's state (its ``output_token_ids`` as vLLM's
``CachedRequestState`` keeps them)."""

import json
import math
import pickle
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from sam.automaton import AutomatonPool, SuffixAutomaton
from sam.cells import EVERY_PROMPT, LEVELS
from sam.keys import prompt_key
from sam.payoff import CATCH_UP_EVERY, EXPLORE_EVERY, PinnedStepCost
from sam.policy import BatchDrafter, GlobalCorpus, GroupStore, ResponseCorpus, SAMOptions, stored_tokens
from sam.vllm import SAMProposer, standalone_config

K = 4


def draft_length(opts: SAMOptions, match_length: int) -> int:
    """The own-text draft length rule, written out independently of the compiled step (the oracle)."""
    if match_length < opts.min_match:
        return 0
    return min(K, math.ceil(opts.tokens_per_match * (match_length - opts.min_match + 1)))


def make_proposer(k_by_batch: list | None = None, **sam_options) -> SAMProposer:
    """A proposer drafting what the match rules give (payoff off unless asked: tests/unit/test_sam_payoff.py; the
    corpus of every prompt's responses too: the tests of group material count its automata and finishing order)."""
    return SAMProposer(
        standalone_config(K, {"payoff": False, "global_sharing": False, **sam_options}, k_by_batch=k_by_batch)
    )


class Driver:
    """Feeds requests to the proposer as vLLM's model runner would: rows shuffled every step, and with
    ``preempt`` > 0 each unfinished request sits out a step with that probability (preempted, not finished)."""

    def __init__(
        self,
        proposer: SAMProposer,
        requests: dict[str, tuple[list[int], list[int]]],
        seed: int = 0,
        preempt: float = 0.0,
        shuffle: bool = True,
    ):
        self.p = proposer
        self.requests = requests  # id -> (prompt, full response)
        self.emitted = {r: 0 for r in requests}
        self.unfinished = list(requests)
        self.rows: list[str] = list(requests)
        self.preempt = preempt
        self.shuffle = shuffle  # rows reordered every step (vLLM keeps their order until requests leave or join)
        self.preemptions = 0
        self.states = {rid: SimpleNamespace(output_token_ids=[]) for rid in requests}
        self.rng = np.random.default_rng(seed)
        self.token_ids = np.zeros((64, 4096), dtype=np.int32)
        self.num_tokens = np.zeros(64, dtype=np.int32)
        self.runner = SimpleNamespace(input_batch=SimpleNamespace(req_ids=[]), requests={})
        proposer.attach_runner(self.runner)

    def text(self, rid: str) -> list[int]:
        prompt, response = self.requests[rid]
        return prompt + response[: self.emitted[rid]]

    def step(self) -> dict[str, list[int]]:
        self.rows = [r for r in self.unfinished if self.rng.random() >= self.preempt or self.emitted[r] == 0]
        self.preemptions += len(self.unfinished) - len(self.rows)
        if self.shuffle:
            self.rng.shuffle(self.rows)
        sampled = []
        for i, rid in enumerate(self.rows):
            prompt, response = self.requests[rid]
            take = 1 if self.emitted[rid] == 0 else int(self.rng.integers(1, K + 2))
            take = min(take, len(response) - self.emitted[rid])
            sampled.append(response[self.emitted[rid] : self.emitted[rid] + take])
            self.emitted[rid] += take
            self.states[rid].output_token_ids.extend(sampled[-1])
            t = self.text(rid)
            self.token_ids[i, : len(t)] = t
            self.token_ids[i, len(t) : len(t) + 8] = 99999  # stale speculative slots beyond the valid length
            self.num_tokens[i] = len(t)
        self.runner.input_batch.req_ids = list(self.rows)
        self.runner.requests = {rid: self.states[rid] for rid in self.unfinished}
        drafts = self.p.propose(sampled, self.num_tokens, self.token_ids)
        assert len(drafts) == len(self.rows)
        out = dict(zip(self.rows, drafts, strict=True))
        # finished requests leave the runner's requests at the next step, as vLLM's scheduler reports them
        self.unfinished = [r for r in self.unfinished if self.emitted[r] < len(self.requests[r][1])]
        return out

    def run(self) -> list[dict[str, list[int]]]:
        """Steps until every request finished, then one empty step (vLLM's next step reports the finishes)."""
        steps = []
        while self.unfinished:
            steps.append(self.step())
        self.step()
        return steps


def filed_responses(proposer: SAMProposer) -> list[list[int]]:
    """Every response in the prompts' histories, sorted, as a checkpoint holds them (it files the last rollout)."""
    proposer.finish_tracked()
    return sorted(r.tolist() for _lead, responses in proposer.state_dict()["groups"].values() for r in responses)


def random_requests(rng, n: int, prompts: int = 3, max_len: int = 80) -> dict[str, tuple[list[int], list[int]]]:
    base = [list(map(int, rng.integers(0, 6, size=rng.integers(3, 9)))) for _ in range(prompts)]
    motif = list(map(int, rng.integers(0, 6, size=7)))
    reqs = {}
    for i in range(n):
        resp = []
        while len(resp) < rng.integers(10, max_len):
            resp += motif if rng.random() < 0.5 else list(map(int, rng.integers(0, 6, size=5)))
        reqs[f"r{i}"] = (base[i % prompts], resp)
    return reqs


@pytest.mark.parametrize(
    ("max_len", "preempt"), [(80, 0.0), (900, 0.0), (80, 0.3)]
)  # 900: automata outgrow their arrays mid-rollout
def test_requests_are_tracked_through_reordering_and_preemption_and_only_verified_tokens_enter(max_len, preempt):
    rng = np.random.default_rng(0)
    opts = {
        "group_sharing": False,
        "cross_epoch": False,
        "global_sharing": False,
        "batch_threshold": 100,
        "min_match": 1,
    }
    proposer = make_proposer(**opts)
    drv = Driver(proposer, random_requests(rng, 12, max_len=max_len), preempt=preempt)
    while drv.unfinished:
        unfinished = list(drv.unfinished)
        drafts = drv.step()
        for rid in drv.rows:
            text = drv.text(rid)
            ref = SuffixAutomaton(latest=True)
            ref.extend(text)
            expected = ref.draft_latest(draft_length(SAMOptions.from_dict(opts), ref.match_length), 1)
            assert drafts[rid] == expected, rid
        assert proposer.num_requests == len(unfinished)  # one drafter per unfinished request, preempted included
        for rid in unfinished:
            assert proposer.request_text(rid).tolist() == drv.text(rid)
    assert (drv.preemptions > 20) == (preempt > 0)
    drv.step()
    assert proposer.num_requests == 0  # the finished requests left ...
    assert proposer.drafter.pool.live() == 12  # ... and wait, no running request drafting from them
    Driver(proposer, {"next": ([1, 2, 3], [4, 5])}).step()  # the next request's start frees them
    assert proposer.drafter.groups.groups == {}
    assert proposer.drafter.pool.live() == 1  # and their automata: only the new request's is left


def test_batch_size_gate_turns_drafting_on_in_the_tail():
    rng = np.random.default_rng(1)
    proposer = make_proposer(batch_threshold=3, group_sharing=False, cross_epoch=False, min_match=1)
    drv = Driver(proposer, random_requests(rng, 10))
    saw_gated = saw_drafts = False
    while drv.unfinished:
        active = len(drv.unfinished)
        drafts = drv.step()
        if active > 3:
            assert all(d == [] for d in drafts.values())
            saw_gated = True
        elif any(drafts.values()):
            saw_drafts = True
    assert saw_gated and saw_drafts and proposer.gated_steps > 0


@pytest.mark.vllm_side  # vLLM's own lookup builder expands the schedule
def test_k_follows_vllms_batch_size_schedule():
    """vLLM's ``num_speculative_tokens_per_batch_size`` caps SAM's drafts by the live batch, as vLLM's scheduler
    caps its own proposers' (it does not pass the schedule to a custom_class proposer)."""
    rng = np.random.default_rng(1)
    proposer = make_proposer([[1, 3, K], [4, 256, 1]], batch_threshold=100, group_sharing=False, cross_epoch=False)
    drv = Driver(proposer, random_requests(rng, 10))
    longest = {True: 0, False: 0}  # more than 3 live -> longest draft
    while drv.unfinished:
        live = len(drv.unfinished)
        drafts = drv.step()
        longest[live > 3] = max(longest[live > 3], *map(len, drafts.values()))
    assert longest == {True: 1, False: K}


def test_a_corpus_stores_a_rollout_in_one_append_as_lead_response_separator_per_response() -> None:
    """ResponseCorpus.add appends a rollout at once: the same automaton (text, states, counts) as appending
    each response's lead, tokens and own separator one call at a time; empty responses take no separator."""
    rng = np.random.default_rng(0)
    lead = np.array([7, 8, 9], dtype=np.int32)
    responses = [rng.integers(0, 12, size=n).astype(np.int32) for n in (40, 0, 25, 31)]
    pool = AutomatonPool()
    corpus = ResponseCorpus(pool, lead, counted=True)
    corpus.add(responses[:2])
    corpus.add(responses[2:])
    by_parts = SuffixAutomaton(pool=pool)
    for i, response in enumerate(r for r in responses if r.size):
        by_parts.extend(lead)
        by_parts.extend(response)
        by_parts.extend([-(i + 1)])
    by_parts.count_occurrences()
    assert [r.size for r in corpus.responses] == [40, 25, 31]
    assert np.array_equal(corpus.automaton.text(), by_parts.text())
    assert corpus.automaton.num_states == by_parts.num_states
    assert np.array_equal(pool.stats[corpus.slot], pool.stats[by_parts.slot])
    assert corpus.automaton.counted


def test_siblings_draft_from_finished_siblings_and_history_across_rollouts():
    prompt = [1, 2, 3]
    answer = list(range(10, 40))
    filler = list(range(50, 90))
    proposer = make_proposer(batch_threshold=100, min_match=2, group_sharing=True, cross_epoch=True)
    # rollout 1: sibling a writes the answer straight away; b writes filler first, then the same answer
    drv = Driver(proposer, {"a": (prompt, answer), "b": (prompt, filler + answer)})
    correct_from_sibling = 0
    while drv.unfinished:
        a_done = "a" not in drv.unfinished
        drafts = drv.step()
        if a_done and "b" in drafts and drafts["b"]:
            upcoming = drv.requests["b"][1][drv.emitted["b"] :]
            assert drafts["b"] == upcoming[: len(drafts["b"])]  # b has no earlier copy of it: from a
            correct_from_sibling += 1
    assert correct_from_sibling >= 3
    drv.step()
    group = next(iter(proposer.drafter.groups.groups.values()))
    # a went into the sibling automaton for b; b, which no running request drafts from, waits in the proposer for the
    # next request's start, and the rollout is in no history yet
    assert len(group.siblings.responses) == 1 and len(proposer.left_unneeded) == 1 and group.history.num_tokens == 0
    # rollout 2 (next epoch): a new sample of the same prompt drafts from history right away
    drv2 = Driver(proposer, {"c": (prompt, answer)}, seed=5)
    drafted = 0
    while drv2.unfinished:
        d = drv2.step().get("c", [])
        upcoming = answer[drv2.emitted["c"] :]
        assert d == upcoming[: len(d)]
        drafted += len(d)
    assert drafted > 10


def test_prompts_that_share_a_template_prefix_are_separate_groups():
    """Chat prompts share a long template and differ near the end: each prompt is its own group, so a request
    never drafts another prompt's answer (a key over part of the prompt would pool them)."""
    template = list(range(60, 80))
    prompt_a, prompt_b = [*template, 1, 2], [*template, 3, 4]
    answer_a, answer_b = list(range(10, 40)), list(range(100, 130))
    proposer = make_proposer(batch_threshold=100, min_match=2, group_sharing=True, cross_epoch=True)
    Driver(proposer, {"a1": (prompt_a, answer_a), "b1": (prompt_b, answer_b)}).run()
    assert len(proposer.drafter.groups.groups) == 2
    drv = Driver(proposer, {"b2": (prompt_b, answer_b)}, seed=3)  # next epoch: prompt b's history is answer b
    drafted = 0
    while drv.unfinished:
        d = drv.step().get("b2", [])
        assert d == answer_b[drv.emitted["b2"] :][: len(d)]  # never answer a's tokens
        drafted += len(d)
    assert drafted > 10


def test_group_drafts_follow_the_continuation_most_siblings_took_while_its_chance_holds():
    prompt = np.array([1, 2, 3], dtype=np.int32)
    earliest, majority = [20, 21, 22, 23], [30, 31, 32, 33]
    responses = [[10, 11, 12, *earliest], [10, 11, 12, *majority], [10, 11, 12, *majority]]

    def draft_after_opening(**options) -> list[int]:
        drafter = BatchDrafter(SAMOptions(batch_threshold=100, min_match=2, **options), K)
        for response in responses:  # siblings one after another, each into the prompt's history
            slot = drafter.start(prompt, b"prompt")
            drafter.step(np.array([slot]), np.array(response, np.int32), np.array([0, len(response)]), np.array([K]))
            drafter.finish(slot)
        slot = drafter.start(prompt, b"prompt")
        return drafter.step(np.array([slot]), np.array([10, 11, 12], np.int32), np.array([0, 3]), np.array([K]))[0]

    # the match (3 lead tokens + opening) occurred 3 times, 2 went on with 30: chance 2/(3+1); then 2/(2+1)
    # per token with one prior at every match length
    assert draft_after_opening(min_token_prob=0.05, prior_decay=0) == majority  # 0.5, 0.33, 0.22, 0.15
    assert draft_after_opening(min_token_prob=0.3, prior_decay=0) == majority[:2]
    assert draft_after_opening(min_token_prob=0.6, prior_decay=0) == []
    assert draft_after_opening(min_token_prob=0.6, count_prior=0) == majority  # 2/3, then 2/2 per token
    # drafted without the payoff rule's chances, group material needs min_match too (not min_match_counted), and the
    # prior shrinks by it over the match length: 2/(3+2/6), then 2/(2+2/7), 2/(2+2/8), ...: 0.6, 0.53, 0.47, 0.42
    assert draft_after_opening(min_token_prob=0.3) == majority
    assert draft_after_opening(min_token_prob=0.5) == majority[:2]
    assert draft_after_opening(draft_from_counts=False) == earliest  # the first earlier occurrence


def test_a_new_request_drafts_its_siblings_opening_from_its_first_step_and_after_a_checkpoint():
    prompt = [7, 1, 2, 3]
    answer = list(range(10, 40))
    opts = {"batch_threshold": 100, "min_match": 3, "group_sharing": True, "cross_epoch": True}
    proposer = make_proposer(**opts)
    Driver(proposer, {"a": (prompt, answer)}).run()  # a finished: its response is the prompt's history
    restored = make_proposer(**opts)
    proposer.finish_tracked()
    restored.load_state_dict(proposer.state_dict())  # what a trainer checkpoint keeps
    store = restored.drafter.groups  # the memory bound counts restored histories as it counts grown ones
    assert store.history_bytes == sum(g.history.nbytes for g in store.groups.values()) > 0
    for p in (proposer, restored):
        first = Driver(p, {"c": (prompt, answer)}, seed=5).step()["c"]  # one token of its own so far
        assert len(first) >= 2 and first == answer[1 : 1 + len(first)]


SCORED_PINNED = {  # the default drafter with a pinned step cost: drafting then depends on the tokens alone
    "payoff": True, "payoff_cost": [0.05, 0.001, 0.0002, 0.0, 0.0002], "scored": True, "global_sharing": True,
}  # fmt: skip


@pytest.mark.parametrize("drafting", [{}, SCORED_PINNED], ids=["longest_match", "scored"])
def test_a_checkpoint_between_rollouts_resumes_the_drafts_of_an_uninterrupted_run(drafting):
    """vLLM reports a finish only through the next step's rows, so a rollout's last requests are still tracked
    when the trainer checkpoints between rollouts; their responses must be in the checkpoint all the same. Scored, the
    resumed requests get other drafter slots than the uninterrupted ones, and their shadow drafts must still rotate
    through their candidates alike (what the payoff rule learns from)."""
    opts = {"batch_threshold": 100, "min_match": 2, "group_sharing": True, "cross_epoch": True, **drafting}
    rollout = random_requests(np.random.default_rng(3), 6, prompts=2)
    next_epoch = {f"again_{rid}": request for rid, request in rollout.items()}  # the same prompts again
    uninterrupted, checkpointed = make_proposer(**opts), make_proposer(**opts)
    for proposer in (uninterrupted, checkpointed):
        drv = Driver(proposer, rollout)
        while drv.unfinished:
            drv.step()
    assert uninterrupted.num_requests > 0  # the last step's requests: not known to have finished yet
    resumed = make_proposer(**opts)
    before = checkpointed.state_dict()
    assert checkpointed.num_requests == uninterrupted.num_requests  # reading the state changes nothing ...
    assert pickle.dumps(checkpointed.state_dict()) == pickle.dumps(before)
    checkpointed.finish_tracked()  # ... finishing the tracked requests files them, and the next step maps rows afresh
    assert checkpointed.num_requests == 0 and checkpointed._rows is None
    resumed.load_state_dict(checkpointed.state_dict())
    drafts = []
    for proposer in (uninterrupted, checkpointed, resumed):
        drafts.append(Driver(proposer, next_epoch, seed=7).run())
    assert drafts[0] == drafts[1] == drafts[2]
    assert sum(len(d) for step in drafts[0] for d in step.values()) > 20


def test_a_checkpoint_while_requests_run_files_the_rollouts_that_finished_and_leaves_the_running_ones():
    """veRL's trainer checkpoints while its servers generate, so the tracked requests stay out: a finished rollout
    waits (finishing is lazy) for the next request's start to enter its history, and :meth:`file_finished` files it
    for the checkpoint, leaving the running requests tracked."""
    opts = {"batch_threshold": 100, "min_match": 2, "group_sharing": True, "cross_epoch": True}
    rollout = random_requests(np.random.default_rng(5), 6, prompts=2)
    late = [1, 2, 3, 4, 5] * 200  # a request of another prompt, still running when the rollout has finished
    proposer = make_proposer(**opts)
    drv = Driver(proposer, {**rollout, "late": ([7, 7, 7], late)})
    while set(drv.unfinished) & set(rollout):
        drv.step()
    drv.step()  # reports the rollout's finishes
    assert drv.unfinished == ["late"]
    assert not proposer.state_dict()["groups"]  # the rollout waits for a request of its prompts
    proposer.file_finished()
    held = sorted(r.tolist() for _lead, responses in proposer.state_dict()["groups"].values() for r in responses)
    assert held == sorted(response for _prompt, response in rollout.values())
    assert proposer.num_requests == 1  # the running request is still tracked
    drv.run()
    assert filed_responses(proposer) == sorted([*held, late])


def test_sharing_switches_are_separate():
    prompt = [1, 2, 3]
    answer = list(range(10, 40))
    for sharing, history in ((False, True), (True, False)):
        proposer = make_proposer(batch_threshold=100, min_match=2, group_sharing=sharing, cross_epoch=history)
        Driver(proposer, {"a": (prompt, answer)}).run()
        if history:
            assert filed_responses(proposer) == [answer]
        else:  # no history kept: once finished (here by the checkpoint), the prompt's group is gone
            assert filed_responses(proposer) == [] and proposer.drafter.groups.groups == {}


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="unknown SAM option.*bogus"):
        make_proposer(bogus=1)
    with pytest.raises(ValueError, match="min_match"):
        make_proposer(min_match=0)
    with pytest.raises(ValueError, match="lead_tokens"):
        make_proposer(lead_tokens=-1)
    with pytest.raises(ValueError, match="min_token_prob"):
        make_proposer(min_token_prob=1.5)
    with pytest.raises(ValueError, match="count_prior"):
        make_proposer(count_prior=-1)


def test_history_is_bounded_by_bytes_and_evicted_memory_is_freed():
    def run(max_history_bytes: int):
        proposer = make_proposer(
            batch_threshold=100, min_match=2, group_sharing=True, cross_epoch=True, max_history_tokens=64,
            max_history_bytes=max_history_bytes,
        )  # fmt: skip
        for p in range(6):  # six prompts, one after the other, each filing the last into its history as it starts
            Driver(proposer, {f"r{p}": ([1, 2, 3 + p], list(range(10 + p, 40 + p)))}, seed=p).run()
        proposer.finish_tracked()  # as before a checkpoint: files the last one
        return proposer.drafter.groups

    unbounded = run(1 << 30)
    one_history = next(iter(unbounded.groups.values())).history.nbytes
    assert len(unbounded.groups) == 6 and unbounded.history_bytes == 6 * one_history
    store = run(max(64 * 64, int(2.5 * one_history)))  # room for two prompts' histories: the oldest four go
    assert [int(g.lead[-1]) for g in store.groups.values()] == [3 + 4, 3 + 5]  # the two most recent prompts
    assert store.history_bytes == sum(g.history.nbytes for g in store.groups.values()) <= 2.5 * one_history
    assert store.pool.live() == 2 * len(store.groups)  # siblings + history automaton per kept group, the rest freed


def test_history_grows_in_place_within_its_bound_and_drops_its_oldest_beyond_it():
    """A prompt's history takes each rollout's responses by appending them (the cost of the new tokens, not of the
    whole history), drafting exactly as a history built whole from the same responses; past max_history_tokens
    it is rebuilt without its oldest responses."""
    rng = np.random.default_rng(7)
    lead = np.array([1, 2, 3], dtype=np.int32)
    per_response = lead.size + 20 + 1
    opts = SAMOptions.from_dict({"cross_epoch": True, "group_sharing": True, "max_history_tokens": 4 * per_response})
    store = GroupStore(opts, AutomatonPool())
    rollouts = [[rng.integers(10, 14, 20).astype(np.int32) for _ in range(2)] for _ in range(3)]  # 4 symbols: repeats
    kept = []  # the history corpus after each rollout
    for responses in rollouts:
        groups = [store.join(b"p", lead) for _ in responses]
        for group, response in zip(groups, responses, strict=True):
            store.leave(b"p", group, response)
        assert store.groups[b"p"].siblings.num_tokens == 0  # the prompt finished: its siblings were never built
        store.file_histories()
        kept.append(store.groups[b"p"].history)
        if len(kept) == 2:  # two rollouts, 4 responses: at the bound, appended to the same corpus
            history = kept[1]
            assert history is kept[0] and len(history.responses) == 4
            whole = ResponseCorpus.holding(store.pool, lead, True, history.responses)
            assert np.array_equal(history.automaton.text(), whole.automaton.text())
            for probe in (r[:cut] for r in rollouts[1] for cut in range(2, 20, 3)):
                grown, built = history.automaton.matcher(), whole.automaton.matcher()
                grown.feed(np.concatenate([lead, probe]))
                built.feed(np.concatenate([lead, probe]))
                assert grown.match_length == built.match_length >= 3
                assert grown.draft_frequent(6, 2, 1.0, 0.05, 1.0) == built.draft_frequent(6, 2, 1.0, 0.05, 1.0)
            whole.close()
    history = kept[2]
    assert history is not kept[1]  # over the bound: rebuilt without the first rollout's responses
    assert [r.tolist() for r in history.responses] == [r.tolist() for r in rollouts[1] + rollouts[2]]
    assert len(history.automaton) == 4 * per_response
    assert store.history_bytes == history.nbytes


def test_a_history_bound_too_small_for_one_prompt_is_refused_at_start():
    with pytest.raises(ValueError, match="max_history_bytes=1000 cannot hold"):
        make_proposer(cross_epoch=True, max_history_tokens=64, max_history_bytes=1000)
    make_proposer(cross_epoch=False, max_history_tokens=64, max_history_bytes=1000)  # no history kept: no bound


@pytest.mark.parametrize("payoff", [False, True])  # True: a cost no draft pays, so the drafter defers its work
def test_a_preempted_request_is_filed_once_with_its_whole_response(payoff):
    """Under preemption (KV cache full) a request leaves the batch for a while: its prompt's group must get
    its response once, whole, when it finishes, and never a partial copy when it leaves."""
    opts = {"batch_threshold": 100, "min_match": 2, "group_sharing": True, "cross_epoch": True}
    if payoff:
        opts.update(payoff=True, payoff_cost=[0.0, 0.01, 0.01, 0.0, 0.0])
    rollout = random_requests(np.random.default_rng(4), 8, prompts=2)
    proposer = make_proposer(**opts)
    drv = Driver(proposer, rollout, preempt=0.3, shuffle=not payoff)
    drv.run()
    assert drv.preemptions > 10 and proposer.preempted_steps == drv.preemptions
    assert (proposer.deferred_steps > 0) == payoff
    assert filed_responses(proposer) == sorted(response for _prompt, response in rollout.values())


def test_the_proposers_defaults_are_the_recipes_spec_sam_yaml():
    """A vLLM user of SAMProposer without additional_config drafts as the recipe's default does (configs/spec/sam.yaml
    sets every option; the dataclass must hold the same values)."""
    from dataclasses import asdict
    from pathlib import Path

    from omegaconf import OmegaConf

    yaml = OmegaConf.to_container(OmegaConf.load(Path(__file__).parents[2] / "configs" / "spec" / "sam.yaml"))["sam"]
    assert yaml == asdict(SAMOptions())


def test_finished_responses_are_filed_where_they_are_needed_and_drafted_from_on_the_next_step():
    """A response that finishes while its prompt has samples running is filed by the next drafting step (every one
    that finished since, counted once), and that step already drafts from it; a prompt whose samples all finished
    never builds its sibling automaton, and its rollout goes into its history when the next request starts."""
    opts = SAMOptions(batch_threshold=100, min_match=2, group_sharing=True, cross_epoch=True)
    drafter = BatchDrafter(opts, K)
    p, q = np.array([1, 2, 3], np.int32), np.array([4, 5, 6], np.int32)
    answer = np.arange(10, 30, dtype=np.int32)
    slots = {name: drafter.start(prompt, key) for name, prompt, key in (("p1", p, b"p"), ("p2", p, b"p"))}
    slots |= {name: drafter.start(prompt, key) for name, prompt, key in (("p3", p, b"p"), ("q1", q, b"q"))}
    for name in ("p1", "p2", "q1"):
        drafter.requests[slots[name]][0].extend(answer)
        drafter.finish(slots[name])
    store = drafter.groups
    group_p, group_q = store.groups[b"p"], store.groups[b"q"]
    assert group_p.siblings.num_tokens == 0 and len(group_p.unfiled) == 2  # nothing built on the finishing step
    assert group_q.siblings.num_tokens == 0 and group_q.history.num_tokens == 0 and len(group_q.last_rollout) == 1
    opening = answer[:3]
    draft = drafter.step(np.array([slots["p3"]]), opening, np.array([0, opening.size]), np.array([K]))[0]
    assert draft == answer[3 : 3 + K].tolist()  # from the siblings the step filed
    assert len(group_p.siblings.responses) == 2 and group_p.siblings.automaton.counted and not group_p.unfiled
    assert group_q.history.num_tokens == 0  # q has not come back: its rollout still waits
    drafter.start(np.array([7, 8, 9], np.int32), b"r")  # any request's start files every finished rollout
    assert group_q.history.responses[0].tolist() == answer.tolist() and not store.finished


def test_without_group_sharing_no_sibling_automaton_is_built_and_the_history_gets_every_response():
    drafter = BatchDrafter(SAMOptions(min_match=2, group_sharing=False, cross_epoch=True), K)
    prompt = np.array([1, 2, 3], np.int32)
    responses = [np.arange(10, 20, dtype=np.int32) + i for i in range(3)]
    slots = [drafter.start(prompt, b"p") for _ in responses]
    for slot, response in zip(slots[:2], responses, strict=False):
        drafter.requests[slot][0].extend(response)
        drafter.finish(slot)
    drafter.step(np.array(slots[2:]), responses[2][:1], np.array([0, 1]), np.array([K]))
    assert drafter.groups.groups[b"p"].siblings.num_tokens == 0  # no request could draft from it
    drafter.requests[slots[2]][0].extend(responses[2][1:])
    drafter.finish(slots[2])
    drafter.start(prompt, b"p")
    assert [r.tolist() for r in drafter.groups.groups[b"p"].history.responses] == [r.tolist() for r in responses]


def run_until_left(drv: Driver, names: tuple[str, ...]) -> None:
    """Steps until ``names`` finished, then one step more: the one whose rows show vLLM dropped them."""
    while any(name in drv.unfinished for name in names):
        drv.step()
    drv.step()


def test_a_request_that_leaves_is_finished_by_the_next_drafting_step_only_if_a_running_sibling_drafts_from_it():
    p, q = [1, 2, 3], [4, 5, 6]
    short, long = list(range(10, 18)), list(range(20, 80))
    proposer = make_proposer(batch_threshold=100, min_match=2, group_sharing=True, cross_epoch=True)
    drv = Driver(proposer, {"p1": (p, short), "p2": (p, long), "q1": (q, short)})
    run_until_left(drv, ("p1", "q1"))
    assert "p2" in drv.unfinished
    groups = proposer.drafter.groups.groups
    group_p, group_q = groups[prompt_key(np.array(p, np.int32))], groups[prompt_key(np.array(q, np.int32))]
    assert [r.tolist() for r in group_p.siblings.responses] == [short]  # p2 drafts from p1: finished
    assert len(proposer.left_unneeded) == 1 and group_q.active == 1  # nothing drafts from q1: it waits
    Driver(proposer, {"q2": (q, short)}).step()  # a request's start finishes everything that left
    assert [r.tolist() for r in group_q.history.responses] == [short] and not proposer.left_unneeded


def test_a_deferred_step_finishes_nothing_and_a_working_one_only_what_a_running_request_drafts_from():
    p, q = [1, 2, 3], [4, 5, 6]
    rollout = {"a": (p, list(range(10, 18))), "c": (p, list(range(30, 90))), "b": (q, list(range(20, 28)))}
    proposer = make_proposer(
        batch_threshold=100, min_match=2, payoff=True, payoff_cost=[0.0, 0.01, 0.01, 0.0, 0.0]
    )  # a cost no draft pays: the drafter works on one step in CATCH_UP_EVERY and defers the others
    drv = Driver(proposer, rollout)
    drv.step()  # starts the requests
    deferred, steps = proposer.deferred_steps, 0
    while steps == 0 or "a" in drv.unfinished or "b" in drv.unfinished:
        steps += 1
        proposer.steps = CATCH_UP_EVERY * 10  # the next step defers
        drv.step()
    proposer.steps = CATCH_UP_EVERY * 10
    drv.step()  # the step whose rows show that a and b left
    assert proposer.deferred_steps == deferred + steps + 1
    assert len(proposer.left) == 2 and len(proposer.drafter.requests) == 3  # left, not finished in the drafter
    proposer.steps = CATCH_UP_EVERY * 11 - 1  # the next step works
    drv.step()
    group_p = proposer.drafter.groups.groups[prompt_key(np.array(p, np.int32))]
    assert [r.tolist() for r in group_p.siblings.responses] == [rollout["a"][1]]  # c drafts from a: finished
    assert len(proposer.left_unneeded) == 1 and len(proposer.drafter.requests) == 2  # b waits
    drv.run()
    Driver(proposer, {"next": ([7, 8], [1])}).step()  # a request's start finishes everything that left
    assert not proposer.left and not proposer.left_unneeded and len(proposer.drafter.requests) == 1
    histories = [proposer.drafter.groups.groups[prompt_key(np.array(x, np.int32))].history for x in (p, q)]
    assert [sorted(r.tolist() for r in h.responses) for h in histories] == [
        sorted([rollout["a"][1], rollout["c"][1]]),
        [rollout["b"][1]],
    ]


def test_with_every_prompts_responses_a_request_that_leaves_is_finished_early_only_if_it_makes_that_corpus_due():
    """The corpus of every prompt's responses stores finished responses only once they would add an eighth to it;
    until then no request drafts from them, so a request that leaves waits for the next request's start as it would
    without the corpus, unless its response makes the corpus due."""
    opts = SAMOptions(min_match=2, group_sharing=True, cross_epoch=True, global_sharing=True)
    drafter = BatchDrafter(opts, K)
    corpus: GlobalCorpus = drafter.global_corpus
    short = np.arange(10, 18, dtype=np.int32)

    def left(prompt: list[int]) -> int:
        slot = drafter.start(np.array(prompt, np.int32), bytes(prompt))
        drafter.requests[slot][0].extend(short)
        return slot

    assert drafter.drafted_from([left([1, 2, 3])]) == [True]  # an empty corpus is due at once
    for i in range(20):  # a corpus of 20 responses
        slot = left([4, 5, i])
        drafter.finish(slot)
        corpus.flush()
    assert corpus.corpus.num_tokens > 8 * stored_tokens(0, short.size) and not corpus.pending
    assert drafter.drafted_from([left([6, 7, 8])]) == [False]  # one response is not an eighth of it
    many = [left([9, 9, i]) for i in range(3)]
    assert drafter.drafted_from(many) == [True] * 3  # three are


class ExploringCost(PinnedStepCost):
    """A pinned step cost that is still being explored: one step in EXPLORE_EVERY sends likely drafts whatever it
    says."""

    @property
    def exploring(self) -> bool:
        return True


@pytest.mark.parametrize("steps", ["drafts pay", "nothing pays", "nothing pays, exploring"])
def test_the_corpus_of_every_prompts_responses_is_stored_only_on_a_step_that_can_send_drafts_or_starts_requests(
    steps,
):
    """Storing that corpus counts all it holds: on a rollout's last steps, where no draft pays (exploring ones
    included), the responses that leave wait for the next request's start (a step that prefills prompts), as they
    would without the corpus."""
    drafts_pay = steps == "drafts pay"
    cost = [0.01, 0.0, 0.0, 0.0, 0.0] if drafts_pay else [0.0, 0.01, 0.01, 0.0, 0.0]  # free drafts, or dear ones
    proposer = make_proposer(
        batch_threshold=100, min_match=2, global_sharing=True, payoff=True, payoff_cost=cost, payoff_margin=0.0
    )
    if steps.endswith("exploring"):
        proposer.step_cost = ExploringCost(cost)
    short, long = list(range(10, 18)), list(range(20, 80))
    drv = Driver(proposer, {"a": ([1, 2, 3], short), "b": ([4, 5, 6], long)})
    corpus: GlobalCorpus = proposer.drafter.global_corpus
    working = CATCH_UP_EVERY * EXPLORE_EVERY * 10  # a step that works and, while exploring, explores
    while "a" in drv.unfinished:
        proposer.steps = working - 1
        drv.step()
    proposer.steps = working - 1
    drv.step()  # the step whose rows show that a left; an empty corpus is due at once
    assert "b" in drv.unfinished
    stored = [r.tolist() for r in corpus.corpus.responses]
    assert stored == ([short] if drafts_pay else [])
    assert len(proposer.left_unneeded) == (0 if drafts_pay else 1)
    Driver(proposer, {"c": ([7, 8], [1])}).step()  # a request's start finishes what left (b too) and stores them
    assert [r.tolist() for r in corpus.corpus.responses][0] == short and not proposer.left_unneeded


@pytest.mark.parametrize("scored", [True, False])
@pytest.mark.parametrize("drafts_pay", [False, True])
def test_a_drafter_whose_payoff_cut_sent_nothing_works_on_one_step_in_four_until_a_request_starts(scored, drafts_pay):
    """The bound of what a draft can gain takes the best cell (with ``scored``, the likeliest evidence level at every
    position): one cell that no draft reaches (here every prompt's responses, off) keeps it from ruling any step out,
    as a few requests do on SmolLM2. A drafter whose payoff cut sent nothing then leaves its work to one step in
    CATCH_UP_EVERY, as where nothing can pay, until a step starts requests; one whose drafts pay works every step."""
    cost = [0.01, 0.0, 0.0 if drafts_pay else 0.001, 0.0, 0.0]  # free drafts, or a fifth of a token each at 2 rows:
    # the prior's 5% chance does not pay, a sure one would
    proposer = make_proposer(batch_threshold=100, min_match=2, payoff=True, payoff_cost=cost, scored=scored)
    sure = (EVERY_PROMPT, slice(None), LEVELS - 1 if scored else 0, slice(None))
    if drafts_pay:
        sure = (slice(None),) * 4  # every draft is accepted
    proposer.acceptance.accepted[sure] = proposer.acceptance.reached[sure]
    text = [7, 8, 9] * 30  # own-text drafts at every step
    drv = Driver(proposer, {"a": ([1, 2], text), "b": ([3, 4], text[1:])})
    drv.step()  # starts the requests
    proposer.steps = CATCH_UP_EVERY * 10 - 1
    drv.step()  # a working step
    assert proposer.deferred_steps == 0 and (proposer._last_drafted > 0) == drafts_pay
    quiet = 0 if drafts_pay else CATCH_UP_EVERY - 1
    for _ in range(CATCH_UP_EVERY - 1):
        drv.step()
    assert proposer.deferred_steps == quiet
    drv.step()  # the next working step
    assert proposer.deferred_steps == quiet
    proposer.steps = CATCH_UP_EVERY * 20
    Driver(proposer, {"c": ([5, 6], text)}).step()  # a request's start: the drafter works
    assert proposer.deferred_steps == quiet


WARM_CHECK = """
import json, sys
import sam.automaton, sam.payoff, sam.policy, sam.vllm
proposer = sam.vllm.SAMProposer(sam.vllm.standalone_config(4, json.loads(sys.argv[1])))
if sys.argv[2] == "load":
    proposer.load_model(None)
entry = [(sam.automaton, "_step_rows"), (sam.automaton, "_extend"), (sam.automaton, "_count"),
         (sam.automaton, "_release"), (sam.vllm, "_catch_up"), (sam.payoff, "_payoff_cut"),
         (sam.payoff, "_start_shadows"), (sam.payoff, "_advance_shadows"), (sam.payoff, "_shadow_turns"),
         (sam.payoff, "_chances"), (sam.payoff, "_best_row_gain")]
if proposer.options.scored:
    entry.append((sam.payoff, "_shrunk_chances"))
print(json.dumps({
    "cold": [name for module, name in entry if not getattr(module, name).signatures],
    "state": [proposer.steps, proposer.num_requests, proposer.acceptance.observed, proposer.drafter.pool.live(),
              len(proposer.drafter.groups.groups), proposer.step_cost.steps],
}))
"""


@pytest.mark.parametrize("options", [{}, {"scored": False, "global_sharing": False}], ids=["default", "longest_match"])
def test_load_model_runs_every_compiled_kernel_of_a_step_on_a_twin_and_leaves_the_proposer_untouched(options):
    """vLLM calls load_model at engine start: a fresh process's first kernel calls (numba's cache loads, typed-list
    access compiled) happen there, not in the first rollout; checked in a fresh interpreter, where nothing is warm."""

    def run(mode: str) -> dict:
        out = subprocess.run(
            [sys.executable, "-c", WARM_CHECK, json.dumps(options), mode], capture_output=True, text=True, check=True
        )
        return json.loads(out.stdout.strip().splitlines()[-1])

    cold, loaded = run("cold"), run("load")
    assert cold["cold"], "a fresh interpreter should start with cold kernels"
    assert loaded["cold"] == []
    assert loaded["state"] == cold["state"]  # steps, requests, acceptance, automata, groups, step cost: as built
