"""The rollout stage: an in-process vLLM engine over the current policy, stepped by hand so that every
engine step lands in the rollout timeline, plus weight sync and sleep/wake around training.

The local trainer talks to the rollout only through :class:`Rollout` (the verbs of veRL's rollout replicas:
generate, update weights, sleep/wake, plus evaluation and the drafter's cross-rollout memory);
:class:`RolloutEngine` implements it over ``vllm.LLM``. On backend=verl the rollout is veRL's own vLLM servers.
"""

from __future__ import annotations

import logging
import os
import pickle
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from recipe.dapo.timeline import RolloutTimeline
from recipe.data.loader import Problem
from recipe.engine import SAM_PROPOSER_CLASS, EngineOptions, make_llm, on_gpu, spec_counters, spec_from_config
from recipe.evaluate import EvalResult, evaluate

logger = logging.getLogger(__name__)


@dataclass
class Response:
    """One sampled response of one prompt."""

    prompt_index: int  # index into the round's prompt list
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    # the trunk's last hidden states (before its final norm) at positions 0 .. len(prompt)+len(tokens)-2, the ones
    # each next token was sampled from, as the engine's MTP drafter read them (``generate(keep_trunk_states=True)``)
    trunk_states: np.ndarray | None = None
    # with ``generate(teacher_topk=k)``: the ids of the k likeliest tokens ([len(tokens), k], int32) and the sampled
    # token's log-prob ([len(tokens)], float32) at each response token's position, at the rollout temperature (vLLM's
    # processed logprobs): the online MTP head's teacher on rows the update leaves out (recipe/dapo/policy.py)
    teacher_topk: np.ndarray | None = None
    token_logprobs: np.ndarray | None = None


@dataclass
class RolloutResult:
    responses: list[Response]
    timeline: RolloutTimeline  # per engine step, with vLLM's acceptance counters


def to_vllm_names(state: dict[str, torch.Tensor], num_hidden_layers: int) -> dict[str, torch.Tensor]:
    """HF MiMo tensors -> vLLM parameter names (fused ``qkv_proj`` and ``gate_up_proj``; MTP layers under
    ``model.mtp_layers.{num_hidden_layers + i}`` with the decoder block in ``mtp_block``). One dict serves
    both the main model and the drafter: each copies the names it has."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if name.startswith("model.mtp_layers."):
            _, _, i, rest = name.split(".", 3)
            block = rest.split(".")[0] in ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")
            name = f"model.mtp_layers.{int(i) + num_hidden_layers}." + ("mtp_block." if block else "") + rest
        out[name] = t
    for key in list(out):
        for part in ("weight", "bias"):
            if key.endswith(f".q_proj.{part}"):
                base = key[: -len(f"q_proj.{part}")]
                qkv = [out.pop(f"{base}{p}_proj.{part}") for p in "qkv"]
                out[f"{base}qkv_proj.{part}"] = torch.cat(qkv, dim=0)
        if key.endswith(".gate_proj.weight"):
            base = key[: -len("gate_proj.weight")]
            out[f"{base}gate_up_proj.weight"] = torch.cat([out.pop(key), out.pop(f"{base}up_proj.weight")], dim=0)
    return out


def _copy_into(module: torch.nn.Module, prefix: str, weights: dict[str, torch.Tensor], dtype: torch.dtype) -> int:
    """Copy ``weights`` into ``module``'s parameters in place. vLLM's CPU linear layers keep a repacked copy
    of their weight (``cpu_linear``) and may have dropped the parameter itself: those get the new weight
    and are repacked by vLLM's own dispatch, exactly as at load time."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    n = 0
    for mod_name, mod in module.named_modules():
        dropped = False
        for p_name, param in list(mod.named_parameters(recurse=False)):
            name = f"{mod_name}.{p_name}" if mod_name else p_name
            if name not in weights:
                raise KeyError(f"weight sync: no tensor for vLLM parameter {prefix}{name}")
            tensor = weights[name].to(dtype)
            if param.numel() == 0:  # removed after repacking (CPU)
                setattr(mod, p_name, torch.nn.Parameter(tensor.clone(), requires_grad=False))
                dropped = True
            elif param.shape[1:] == tensor.shape[1:] and param.shape[0] >= tensor.shape[0]:
                param.data[: tensor.shape[0]].copy_(tensor)  # vLLM pads the vocab dimension
            else:
                raise ValueError(
                    f"weight sync: {prefix}{name} has shape {tuple(param.shape)}, got {tuple(tensor.shape)}"
                )
            n += 1
        if hasattr(mod, "cpu_linear"):
            dispatch_cpu_unquantized_gemm(mod, remove_weight=dropped)
    return n


def _load_weights_on_worker(worker, payload: bytes) -> tuple[int, int]:
    """Runs inside each vLLM worker: load the weights into the model and the drafter.

    Weights travel as one safetensors blob (vLLM's RPC encoder would turn nested tensors into lists).
    Returns (parameters updated in the model, in the drafter); every parameter of both must be covered."""
    from safetensors.torch import load

    weights = load(payload)
    runner = worker.model_runner
    dtype = runner.model_config.dtype
    n_model = _copy_into(runner.model, "", weights, dtype)
    draft_model = getattr(getattr(runner, "drafter", None), "model", None)
    n_draft = _copy_into(draft_model, "drafter.", weights, dtype) if draft_model is not None else 0
    return n_model, n_draft


def vllm_weights_payload(llm, state_dict: dict[str, torch.Tensor]) -> bytes:
    """HF-named tensors (trunk and MTP layers) as one safetensors blob under the engine's parameter names."""
    from safetensors.torch import save

    layers = llm.llm_engine.vllm_config.model_config.hf_config.num_hidden_layers
    hf = {name: t.detach().to("cpu") for name, t in state_dict.items()}
    out, storages = {}, set()
    for name, t in to_vllm_names(hf, layers).items():
        t = t.contiguous()
        if t.untyped_storage().data_ptr() in storages:  # tied weights (embeddings = LM head): safetensors wants copies
            t = t.clone()
        storages.add(t.untyped_storage().data_ptr())
        out[name] = t
    return save(out)


def sync_weights(llm, state_dict: dict[str, torch.Tensor]) -> None:
    """Push the trained weights into every worker's model and drafter (the MTP head reaches vLLM's MTP
    drafter here); the prefix cache is dropped since cached KV belongs to the old weights."""
    llm.collective_rpc(_load_weights_on_worker, args=(vllm_weights_payload(llm, state_dict),))
    llm.reset_prefix_cache()


class Rollout(Protocol):
    """What the trainer needs from a rollout engine."""

    tokenizer: Any

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        sampling: dict,
        progress: bool = False,
        keep_trunk_states: bool = False,
        teacher_topk: int = 0,
    ) -> RolloutResult: ...

    def evaluate(
        self, problems: list[Problem], n: int, temperature: float, top_p: float, max_tokens: int
    ) -> EvalResult: ...

    def sync_weights(self, state_dict: dict[str, torch.Tensor]) -> None: ...

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...

    def reseed(self, seed: int) -> None: ...

    def drafter_state(self) -> bytes | None: ...

    def load_drafter_state(self, blob: bytes) -> None: ...

    def draft_counts(self) -> dict[str, tuple[int, int]]: ...

    def close(self) -> None: ...


class TrunkStateLog:
    """Wraps an MTP (or EAGLE) drafter's ``propose`` in a vLLM worker and keeps, while armed, the trunk hidden states
    the runner hands it each engine step: one per scheduled token, with its position and request. The online head
    then trains on responses the policy's update leaves out (``spec.mtp.train_on_dropped_groups``) from the states
    the rollout already computed, without running the trunk over them again.

    A rejected draft's state is logged too, at the position of the token sampled in its place; that token is fed
    the next step, whose state then wins (:meth:`take` keeps each position's latest). A request that ends on a
    rejection leaves a stale state at its last position only, which no next token was sampled from."""

    def __init__(self, runner):
        self.runner = runner
        self.propose = runner.drafter.propose
        self.armed = False
        self.steps: list[tuple[list[str], np.ndarray, torch.Tensor, torch.Tensor]] = []

    def __call__(self, *args, **kwargs):
        if self.armed:
            cad = kwargs["common_attn_metadata"]
            num_tokens = int(cad.query_start_loc_cpu[cad.num_reqs])
            self.steps.append(
                (
                    list(self.runner.input_batch.req_ids[: cad.num_reqs]),
                    cad.query_start_loc_cpu[: cad.num_reqs + 1].numpy().copy(),
                    kwargs["target_positions"][:num_tokens].clone(),
                    kwargs["target_hidden_states"][:num_tokens].detach().clone(),
                )
            )
        return self.propose(*args, **kwargs)

    def take(self) -> dict[str, np.ndarray]:
        """Each logged request's states by position ([last position + 1, hidden], float32; NaN rows where none was
        logged), each position's latest write; the log is emptied and disarmed."""
        steps, self.steps, self.armed = self.steps, [], False
        if not steps:
            return {}
        index: dict[str, int] = {}
        request = np.concatenate(
            [np.repeat([index.setdefault(r, len(index)) for r in ids], np.diff(starts)) for ids, starts, _, _ in steps]
        )
        position = torch.cat([pos for _, _, pos, _ in steps]).cpu().numpy().astype(np.int64)
        states = torch.cat([h for _, _, _, h in steps]).float().cpu().numpy()
        key = request.astype(np.int64) * (int(position.max()) + 1) + position
        order = np.lexsort((np.arange(len(key)), key))  # by key, then by when it was written
        latest = order[np.r_[key[order][1:] != key[order][:-1], True]]
        out: dict[str, np.ndarray] = {}
        for name, i in index.items():
            rows = latest[request[latest] == i]
            table = np.full((int(position[rows].max()) + 1, states.shape[1]), np.nan, dtype=np.float32)
            table[position[rows]] = states[rows]
            out[name] = table
        return out


def _arm_trunk_state_log_on_worker(worker) -> None:
    """Runs in a vLLM worker: start logging the drafter's trunk states (:class:`TrunkStateLog`, installed the first
    time)."""
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    runner = worker.model_runner
    drafter = getattr(runner, "drafter", None)
    if not isinstance(drafter, SpecDecodeBaseProposer):
        raise ValueError(
            f"keep_trunk_states needs a drafter that reads the trunk's hidden states (spec=mtp), not {type(drafter)}"
        )
    if not isinstance(drafter.propose, TrunkStateLog):
        drafter.propose = TrunkStateLog(runner)
    drafter.propose.armed = True


def _take_trunk_states_on_worker(worker) -> dict[str, np.ndarray]:
    """Runs in a vLLM worker: the logged states by vLLM's request id (:meth:`TrunkStateLog.take`)."""
    return worker.model_runner.drafter.propose.take()


def _reseed_worker(worker, seed: int) -> None:
    """Runs in each vLLM worker: reseed the sampler's generator so every round is reproducible."""
    torch.manual_seed(seed)


def _record_suffix_tree_on_worker(worker) -> None:
    """Runs in a vLLM worker before its first request: with the suffix method's global tree on, swap in a cache
    that keeps what goes into it (see :mod:`recipe.dapo.suffix_memory`)."""
    from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

    drafter = getattr(worker.model_runner, "drafter", None)
    if isinstance(drafter, SuffixDecodingProposer) and drafter.suffix_cache.max_cached_requests != 0:
        from recipe.dapo.suffix_memory import RecordedSuffixCache

        old = drafter.suffix_cache
        drafter.suffix_cache = RecordedSuffixCache(old.max_tree_depth, old.max_cached_requests)


def _drafter_busy_on_worker(worker) -> np.ndarray | None:
    """Runs in a vLLM worker: SAM's proposer's [seconds inside ``propose``, calls] by the step's scheduled rows
    (None for other drafters)."""
    busy = getattr(getattr(worker.model_runner, "drafter", None), "busy", None)
    return None if busy is None else busy.copy()


def save_drafter_state_on_worker(worker, path: str) -> None:
    """Runs in a vLLM worker of a veRL server (whose ``collective_rpc`` returns nothing): writes the drafter's memory
    (:func:`_drafter_state_on_worker`, the requests in flight left out: veRL's trainer generates while it saves) to
    ``path`` atomically, from the engine's first worker only; nothing for a drafter without memory."""
    if getattr(worker, "rank", 0) != 0:
        return
    blob = _drafter_state_on_worker(worker, finish=False)
    if blob is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(f"{path}.tmp")
        tmp.write_bytes(blob)
        os.replace(tmp, path)


def load_drafter_state_on_worker(worker, path: str) -> None:
    """Runs in a vLLM worker of a veRL server: the drafter's memory from ``path`` (:func:`save_drafter_state_on_worker`),
    where the file exists."""
    if Path(path).is_file():
        _drafter_state_on_worker(worker, Path(path).read_bytes())
        logger.info("drafter memory loaded from %s", path)


def _draft_counts_on_worker(worker) -> dict[str, list[int]] | None:
    """Runs in a vLLM worker: the hybrid drafter's draft tokens sent and accepted by source (None for others)."""
    counts = getattr(getattr(worker.model_runner, "drafter", None), "counts", None)
    return None if counts is None else counts()


def _drafter_state_on_worker(worker, blob: bytes | None = None, finish: bool = True) -> bytes | None:
    """Runs in a vLLM worker: get (``blob=None``) or set the drafter's cross-rollout memory, as one pickled blob
    (vLLM's RPC turns nested bytes into memoryviews it cannot forward to workers): SAM's per-prompt history (and
    what spec=hybrid learned of its head), or the responses in suffix's global tree (recorded by
    :func:`_record_suffix_tree_on_worker`). None for other drafters. The rollouts that finished are filed into their
    prompts' histories first; with ``finish`` the requests SAM still tracks too (between rollouts; off where a
    rollout may be running)."""
    from sam.vllm import SAMProposer

    drafter = getattr(worker.model_runner, "drafter", None)
    if isinstance(getattr(drafter, "sam", drafter), SAMProposer):  # SAM, or spec=hybrid's MTP drafter with its SAM
        if blob is None:
            if finish:
                drafter.finish_tracked()  # a rollout's last requests, still tracked, go into their prompts' histories
            else:
                drafter.file_finished()  # the requests that left the batch (finished lazily) and their rollouts
            return pickle.dumps(drafter.state_dict())
        drafter.load_state_dict(pickle.loads(blob))
        return None
    cache = getattr(drafter, "suffix_cache", None)
    if type(cache).__name__ == "RecordedSuffixCache":  # not imported here: Arctic Inference is optional
        if blob is None:
            return pickle.dumps(cache.responses())
        cache.replay(pickle.loads(blob))
    return None


def teacher_of(completion, k: int) -> tuple[np.ndarray, np.ndarray]:
    """A finished completion's flat logprobs (sampled token first, then the k likeliest, at every position) as
    (the k likeliest ids [tokens, k] int32, the sampled token's log-prob [tokens] float32)."""
    flat = completion.logprobs
    tokens = len(completion.token_ids)
    ids = np.asarray(flat.token_ids, dtype=np.int32)
    if ids.size != tokens * (k + 1):
        raise RuntimeError(f"{ids.size} log-probs for {tokens} tokens at top-{k} (expected {tokens * (k + 1)})")
    ids = ids.reshape(tokens, k + 1)
    if not np.array_equal(ids[:, 0], np.asarray(completion.token_ids, dtype=np.int32)):
        raise RuntimeError("vLLM's first log-prob of a position is not the sampled token's")
    logprobs = np.asarray(flat.logprobs, dtype=np.float32).reshape(tokens, k + 1)
    return ids[:, 1:].copy(), logprobs[:, 0].copy()


def rollout_engine(cfg, model_path: str, teacher_topk: int = 0) -> RolloutEngine:
    """The local trainer's rollout engine for the recipe config ``cfg`` (``actor_rollout_ref.rollout`` and ``spec``),
    able to hand over a ``teacher_topk`` teacher (the online head's on left-out rows)."""
    ro, data = cfg.actor_rollout_ref.rollout, cfg.data
    spec_cfg, extra = spec_from_config(cfg.spec)
    options = EngineOptions(
        max_model_len=data.max_prompt_length + data.max_response_length,
        max_num_seqs=ro.max_num_seqs,
        gpu_memory_utilization=ro.gpu_memory_utilization,
        enforce_eager=ro.enforce_eager,
        seed=int(ro.seed),
        dtype=str(ro.dtype),
        teacher_topk=teacher_topk,
    )
    return RolloutEngine(model_path, spec_cfg, options, extra, free_cache_engine=ro.free_cache_engine)


class RolloutEngine:
    """:class:`Rollout` on an in-process ``vllm.LLM`` with the chosen speculative method."""

    def __init__(
        self,
        model_path: str,
        spec_config: dict | None,
        options: EngineOptions,
        additional_config: dict | None = None,
        free_cache_engine: bool = True,
    ):
        self.spec_config = spec_config
        self.llm = make_llm(model_path, spec_config, options, additional_config=additional_config)
        self.tokenizer = self.llm.get_tokenizer()
        self.can_sleep = free_cache_engine and on_gpu()
        self.max_teacher_topk = options.teacher_topk
        self._request_counter = 0
        self.llm.collective_rpc(_record_suffix_tree_on_worker)
        if free_cache_engine and not self.can_sleep:
            logger.info("rollout.free_cache_engine: vLLM sleep mode needs a GPU; the CPU engine stays resident")

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        sampling: dict,
        progress: bool = False,
        keep_trunk_states: bool = False,
        teacher_topk: int = 0,
    ) -> RolloutResult:
        """``n`` samples for each prompt (token ids); one timeline entry per engine step. With ``keep_trunk_states``
        each response carries the trunk states its tokens were sampled from (:attr:`Response.trunk_states`; MTP
        drafter only), and with ``teacher_topk`` each token's k likeliest tokens and its own log-prob
        (:attr:`Response.teacher_topk`; an engine made with ``EngineOptions(teacher_topk >= k)``)."""
        from tqdm import tqdm
        from vllm import SamplingParams, TokensPrompt

        if teacher_topk > self.max_teacher_topk:
            raise ValueError(
                f"generate(teacher_topk={teacher_topk}) on an engine made with EngineOptions(teacher_topk="
                f"{self.max_teacher_topk}): vLLM reports at most that many log-probs a token"
            )
        engine = self.llm.llm_engine
        # flat: a few lists a request instead of a dict of k + 1 objects a token; not detokenized, for vLLM would
        # decode every one of the k + 1 tokens at every position (the text is decoded once, below)
        logprobs = {"logprobs": teacher_topk, "flat_logprobs": True, "detokenize": False} if teacher_topk else {}
        params = SamplingParams(n=1, **sampling, **logprobs)
        if keep_trunk_states:
            self.llm.collective_rpc(_arm_trunk_state_log_on_worker)
        owner: dict[str, int] = {}
        for p_i, ids in enumerate(prompts):
            for _ in range(n):
                rid = f"r{self._request_counter}"
                self._request_counter += 1
                owner[rid] = p_i
                engine.add_request(rid, TokensPrompt(prompt_token_ids=list(ids)), params)
        timeline = RolloutTimeline(num_requests=len(owner))
        emitted: dict[str, int] = dict.fromkeys(owner, 0)
        finished: dict[str, Any] = {}
        spec_before = spec_counters(self.llm)
        busy_before = self.drafter_busy() if self.spec_config is not None else None
        bar = tqdm(total=len(owner), desc="rollout", disable=not progress, leave=False, dynamic_ncols=True)
        start = time.perf_counter()
        while engine.has_unfinished_requests():
            active = engine.get_num_unfinished_requests()
            t0 = time.perf_counter()
            outputs = engine.step()
            t1 = time.perf_counter()
            new_tokens = 0
            stepped = 0
            started = 0
            for out in outputs:
                total = len(out.outputs[0].token_ids)
                if total > emitted[out.request_id]:
                    stepped += 1
                    started += emitted[out.request_id] == 0
                    new_tokens += total - emitted[out.request_id]
                    emitted[out.request_id] = total
                if out.finished:
                    finished[out.request_id] = out
                    timeline.finish(out.request_id, total, t1 - start)
                    bar.update(1)
            spec_now = spec_counters(self.llm) if self.spec_config is not None else spec_before
            timeline.step(t0 - start, t1 - t0, active, stepped, new_tokens, spec_now - spec_before, started)
        bar.close()
        if busy_before is not None:
            timeline.drafter_s = float((self.drafter_busy() - busy_before)[0].sum())
        states = self._trunk_states(owner, finished, prompts) if keep_trunk_states else {}
        responses = []
        for rid, p_i in owner.items():
            comp = finished[rid].outputs[0]
            text = self.tokenizer.decode(comp.token_ids, skip_special_tokens=True) if teacher_topk else comp.text
            response = Response(
                p_i, list(prompts[p_i]), list(comp.token_ids), text, comp.finish_reason, states.get(rid)
            )
            if teacher_topk:
                response.teacher_topk, response.token_logprobs = teacher_of(comp, teacher_topk)
            responses.append(response)
        return RolloutResult(responses, timeline)

    def _trunk_states(self, owner: dict[str, int], finished: dict[str, Any], prompts: list[list[int]]) -> dict:
        """The logged trunk states of each request (by its id here), cut to the positions its tokens were sampled
        from. vLLM suffixes the ids it is given (``<id>-<8 characters>``)."""
        logged = {
            rid.rsplit("-", 1)[0]: s for rid, s in self.llm.collective_rpc(_take_trunk_states_on_worker)[0].items()
        }
        out = {}
        for rid, p_i in owner.items():
            length = len(prompts[p_i]) + len(finished[rid].outputs[0].token_ids) - 1
            table = logged.get(rid)
            if table is None or len(table) < length or np.isnan(table[:length]).any():
                raise RuntimeError(
                    f"request {rid}: the drafter was not handed the trunk state of every one of its first {length} "
                    "positions (a prefix served from vLLM's prefix cache has none)"
                )
            out[rid] = table[:length]
        return out

    def evaluate(
        self, problems: list[Problem], n: int, temperature: float, top_p: float, max_tokens: int
    ) -> EvalResult:
        """Sampled (or greedy, ``temperature=0``) accuracy on ``problems``; see :func:`recipe.evaluate.evaluate`."""
        return evaluate(self.llm, problems, n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens)

    def sync_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        sync_weights(self.llm, state_dict)

    def reseed(self, seed: int) -> None:
        """Reseed the workers' samplers: the next round samples the same tokens whatever ran before it."""
        self.llm.collective_rpc(_reseed_worker, args=(seed,))

    def drafter_state(self) -> bytes | None:
        """The drafter's cross-rollout memory for a checkpoint (SAM's per-prompt history, the responses in suffix's
        global tree), tagged with its speculative method; None without one."""
        state = self.llm.collective_rpc(_drafter_state_on_worker)[0]
        return None if state is None else pickle.dumps({"method": self.spec_config["method"], "state": state})

    def drafter_busy(self) -> np.ndarray | None:
        """The drafter's [seconds proposing, calls] so far in this engine, by the step's scheduled rows (SAM only;
        None for other methods)."""
        return self.llm.collective_rpc(_drafter_busy_on_worker)[0]

    def draft_counts(self) -> dict[str, tuple[int, int]]:
        """Draft tokens sent and accepted so far in this engine, by draft source (the hybrid's head and SAM; else the
        one method): what the acceptance canary (recipe/dapo/canary.py) compares across weight syncs."""
        by_source = self.llm.collective_rpc(_draft_counts_on_worker)[0]
        if by_source is not None:
            return {source: tuple(counts) for source, counts in by_source.items()}
        if self.spec_config is None:
            return {}
        c = spec_counters(self.llm)
        method = self.spec_config["method"]
        name = "sam" if self.spec_config.get("model") == SAM_PROPOSER_CLASS else method
        return {name: (c.num_draft_tokens, c.num_accepted_tokens)}

    def load_drafter_state(self, blob: bytes) -> None:
        saved = pickle.loads(blob)
        method = (self.spec_config or {}).get("method")
        if saved["method"] != method:
            logger.warning("drafter memory saved by spec method %r not loaded into %r", saved["method"], method)
            return
        self.llm.collective_rpc(_drafter_state_on_worker, args=(saved["state"],))

    def close(self) -> None:
        """Stop the engine's processes now (left to interpreter exit, vLLM's shutdown can hang)."""
        self.llm.llm_engine.engine_core.shutdown()

    def sleep(self) -> None:
        if self.can_sleep:
            self.llm.sleep(level=1)

    def wake_up(self) -> None:
        if self.can_sleep:
            self.llm.wake_up()
