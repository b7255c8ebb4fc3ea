"""The recipe's config: veRL's own ``ppo_trainer`` config plus the recipe's groups (configs/dapo.yaml).

:func:`validate` checks it before any work starts (every error names the offending key); :func:`verl_config`
is veRL's config of a run, the one thing both backends read: the local backend's reward comes from it, and
backend=verl hands it to veRL's trainer as it is.
"""

from __future__ import annotations

import copy
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from mtp import (
    MTP_DEPTH_KEY,
    MTP_LOSS_FRACTION_KEY,
    MTP_LR_KEY,
    MTP_LR_WARMUP_KEY,
    MTP_OBJECTIVE_KEY,
    MTP_OBJECTIVES,
    MTP_VOCAB_TOPK_KEY,
)
from recipe.engine import HEAD_METHODS, K_BY_BATCH_KEY, SAM_METHODS, SPEC_METHODS, head_draft_depth
from recipe.paths import REPO_ROOT

RECIPE_GROUPS = ("backend", "spec", "recipe")  # top-level keys that are the recipe's, not veRL's
REPO_RELATIVE_KEYS = (  # the recipe's own files, named relative to the repository
    "reward.custom_reward_function.path",
    "actor_rollout_ref.rollout.router_config_path",
)
LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
FILTER_METRICS = ("acc", "score", "reward")  # veRL V1: "reward" (the summed score) or a reward_extra_info key


class ConfigError(ValueError):
    """A config value that cannot work; the message starts with the key."""


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


def validate(cfg: DictConfig) -> None:
    """Raise :class:`ConfigError` naming the key for values that are out of range or inconsistent."""
    _require(cfg.backend in ("local", "verl"), "backend", f"must be local or verl, got {cfg.backend!r}")
    spec = cfg.spec
    _require(spec.method in SPEC_METHODS, "spec.method", f"must be one of {SPEC_METHODS}, got {spec.method!r}")
    if spec.method != "off":
        _require(
            spec.num_speculative_tokens >= 1, "spec.num_speculative_tokens", f"must be >= 1 for spec={spec.method}"
        )
    if spec.get(K_BY_BATCH_KEY) is not None:
        from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule

        try:
            schedule = spec[K_BY_BATCH_KEY]
            validate_and_normalize_dynamic_sd_schedule(
                OmegaConf.to_container(schedule) if OmegaConf.is_config(schedule) else schedule
            )
        except ValueError as err:
            raise ConfigError(f"spec.{K_BY_BATCH_KEY}: {err}") from err
    if spec.method in HEAD_METHODS:
        _require(
            spec.mtp.train in ("frozen", "online"),
            "spec.mtp.train",
            f"must be frozen or online, got {spec.mtp.train!r}",
        )
        _require(spec.mtp.loss_scaling_factor >= 0, "spec.mtp.loss_scaling_factor", "must be >= 0")
        _require(spec.mtp.lr is None or spec.mtp.lr > 0, "spec.mtp.lr", f"must be null or > 0, got {spec.mtp.lr}")
        warmup = spec.mtp.lr_warmup_steps
        _require(
            isinstance(warmup, int) and warmup >= 0,
            "spec.mtp.lr_warmup_steps",
            f"must be an integer >= 0, got {warmup}",
        )
        _require(
            warmup == 0 or spec.mtp.lr is not None,
            "spec.mtp.lr_warmup_steps",
            "ramps the head's own rate: set spec.mtp.lr too (the actor's optimizer holds the head in its own group then)",
        )
        # the MTP keys below act through mtp/verl_fsdp.py (or the local trainer); a Megatron actor has its own
        megatron = cfg.backend == "verl" and cfg.actor_rollout_ref.actor.strategy == "megatron"
        _require(
            spec.mtp.objective in MTP_OBJECTIVES,
            "spec.mtp.objective",
            f"must be one of {MTP_OBJECTIVES}, got {spec.mtp.objective!r}",
        )
        _require(
            spec.mtp.objective == "sampled" or not megatron,
            "spec.mtp.objective",
            "is for the local backend and veRL's FSDP actor (mtp/verl_fsdp.py); a Megatron actor trains its MTP "
            "head on the sampled token: leave it sampled",
        )
        fraction = spec.mtp.loss_sequence_fraction
        _require(0 < fraction <= 1, "spec.mtp.loss_sequence_fraction", f"must be in (0, 1], got {fraction}")
        _require(
            fraction == 1 or not megatron,
            "spec.mtp.loss_sequence_fraction",
            "is for the local backend and veRL's FSDP actor (mtp/verl_fsdp.py); a Megatron actor computes its MTP "
            "loss over every token: leave it 1",
        )
        topk = spec.mtp.loss_vocab_topk
        _require(
            isinstance(topk, int) and topk >= 0, "spec.mtp.loss_vocab_topk", f"must be an integer >= 0, got {topk!r}"
        )
        _require(
            topk == 0 or not megatron,
            "spec.mtp.loss_vocab_topk",
            "is for the local backend and veRL's FSDP actor (mtp/verl_fsdp.py); a Megatron actor scores its MTP loss "
            "over the whole vocabulary: leave it 0",
        )
        _require(
            warmup == 0 or spec.mtp.train != "online" or not megatron,
            "spec.mtp.lr_warmup_steps",
            "is for the local backend and veRL's FSDP actor (mtp/verl_fsdp.py); a Megatron actor trains the head with "
            "its own optimizer: leave it 0",
        )
        dropped = bool(spec.mtp.train_on_dropped_groups)
        _require(
            not dropped or spec.mtp.train == "online",
            "spec.mtp.train_on_dropped_groups",
            f"trains the head: it needs spec.mtp.train=online, got {spec.mtp.train!r}",
        )
        cap = spec.mtp.dropped_rows_per_step
        _require(
            isinstance(cap, int) and cap >= 0,
            "spec.mtp.dropped_rows_per_step",
            f"must be an integer >= 0 (0: every left-out row), got {cap!r}",
        )
        _require(
            cap == 0 or dropped,
            "spec.mtp.dropped_rows_per_step",
            "caps the rows of spec.mtp.train_on_dropped_groups: set that true, or leave this 0",
        )
        token_cap = spec.mtp.dropped_tokens_per_kept_token
        _require(
            isinstance(token_cap, int | float) and not isinstance(token_cap, bool) and token_cap >= 0,
            "spec.mtp.dropped_tokens_per_kept_token",
            f"must be a number >= 0 (0: no cap on the left-out tokens), got {token_cap!r}",
        )
        _require(
            token_cap == 0 or dropped,
            "spec.mtp.dropped_tokens_per_kept_token",
            "caps the tokens of spec.mtp.train_on_dropped_groups: set that true, or leave this 0",
        )
        top_p = cfg.actor_rollout_ref.rollout.top_p
        _require(
            not (dropped and topk) or top_p == 1.0,
            "actor_rollout_ref.rollout.top_p",
            f"is {top_p}: with spec.mtp.train_on_dropped_groups and loss_vocab_topk the head's teacher on the left-out "
            "rows is the rollout's log-probs, which vLLM reports over the top-p nucleus, not the whole distribution the "
            "update's teacher is: set top_p=1.0 (DAPO's), or loss_vocab_topk=0",
        )
        _require(
            not dropped or cfg.backend == "local",
            "spec.mtp.train_on_dropped_groups",
            "is the local backend's: veRL's trainer drops the filtered groups inside its fit loop, before the actor "
            "sees them; leave it false on backend=verl",
        )
        _require(
            spec.mtp.lr is None or spec.mtp.train != "online" or not megatron,
            "spec.mtp.lr",
            "is for the local backend and veRL's FSDP actor (mtp/verl_fsdp.py); a Megatron actor trains the head with "
            "its own optimizer: leave it null",
        )
    if spec.method == "suffix":
        _require(spec.suffix_decoding_max_tree_depth >= 1, "spec.suffix_decoding_max_tree_depth", "must be >= 1")
        _require(
            spec.suffix_decoding_max_cached_requests >= 0, "spec.suffix_decoding_max_cached_requests", "must be >= 0"
        )
        _require(spec.suffix_decoding_max_spec_factor >= 0, "spec.suffix_decoding_max_spec_factor", "must be >= 0")
        _require(
            0 <= spec.suffix_decoding_min_token_prob <= 1, "spec.suffix_decoding_min_token_prob", "must be in [0, 1]"
        )
        from importlib.util import find_spec

        _require(
            find_spec("arctic_inference") is not None,
            "spec.method",
            "suffix needs Arctic Inference's suffix trees: make install-suffix (builds arctic-inference 0.3.0 from "
            "source; the gpu extra installs it)",
        )
    if spec.method in SAM_METHODS:
        from sam.policy import SAMOptions

        try:
            SAMOptions.from_dict(dict(spec.sam))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"spec.sam: {e}") from e
    if spec.method == "hybrid":
        _require(
            spec.sam.payoff,
            "spec.sam.payoff",
            "must be true for spec=hybrid: the payoff rule picks each draft's source",
        )
        prior = spec.hybrid.head_acceptance
        _require(
            prior is None or 0 <= prior <= 1, "spec.hybrid.head_acceptance", f"must be null or in [0, 1], got {prior}"
        )
        depth = spec.hybrid.head_depth
        _require(
            depth is None or 1 <= depth <= spec.num_speculative_tokens,
            "spec.hybrid.head_depth",
            f"must be null or in [1, spec.num_speculative_tokens={spec.num_speculative_tokens}] (a chain is verified "
            f"within the step's K), got {depth}",
        )

    _require(
        cfg.backend == "verl" or not cfg.actor_rollout_ref.model.lora_rank,
        "actor_rollout_ref.model.lora_rank",
        f"is {cfg.actor_rollout_ref.model.lora_rank}, but the local backend's actor trains every parameter: LoRA runs "
        "on backend=verl (veRL's FSDP actor with peft); leave it 0 here",
    )
    data = cfg.data
    for key in ("train_batch_size", "gen_batch_size", "max_prompt_length", "max_response_length"):
        _require(data[key] >= 1, f"data.{key}", f"must be >= 1, got {data[key]}")
    if spec.method in SAM_METHODS and spec.sam.cross_epoch:
        from sam.policy import stored_tokens

        # a history keeps whole responses: a bound under one full-length response would silently keep nothing
        one_response = stored_tokens(spec.sam.lead_tokens, data.max_response_length)
        _require(
            spec.sam.max_history_tokens >= one_response,
            "spec.sam.max_history_tokens",
            f"must hold one response of data.max_response_length={data.max_response_length} tokens (with "
            f"spec.sam.lead_tokens={spec.sam.lead_tokens} and a separator: {one_response}), got "
            f"{spec.sam.max_history_tokens}; raise it, or set spec.sam.cross_epoch=false to keep no history",
        )
    for key in ("train_max_samples", "val_max_samples"):
        _require(data[key] == -1 or data[key] >= 1, f"data.{key}", f"must be >= 1 or -1 (all), got {data[key]}")
    for key in ("train_files", "val_files"):
        if data[key] is not None:
            _require(Path(data[key]).is_file(), f"data.{key}", f"file {data[key]} does not exist")

    rl_prompts = cfg.recipe.rl_prompts
    _require(rl_prompts.num >= 1, "recipe.rl_prompts.num", f"must be >= 1, got {rl_prompts.num}")
    _require(rl_prompts.max_terms >= 2, "recipe.rl_prompts.max_terms", f"must be >= 2, got {rl_prompts.max_terms}")

    actor = cfg.actor_rollout_ref.actor
    _require(actor.ppo_mini_batch_size >= 1, "actor_rollout_ref.actor.ppo_mini_batch_size", "must be >= 1")
    _require(
        data.train_batch_size % actor.ppo_mini_batch_size == 0,
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        f"must divide data.train_batch_size ({actor.ppo_mini_batch_size} does not divide {data.train_batch_size})",
    )
    _require(
        actor.optim.lr_scheduler_type in ("constant", "cosine"),
        "actor_rollout_ref.actor.optim.lr_scheduler_type",
        f"must be constant or cosine (veRL's FSDP schedules), got {actor.optim.lr_scheduler_type!r}",
    )
    _require(
        actor.ppo_micro_batch_size_per_gpu >= 1, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "must be >= 1"
    )
    _require(
        actor.loss_agg_mode in LOSS_AGG_MODES,
        "actor_rollout_ref.actor.loss_agg_mode",
        f"must be one of {LOSS_AGG_MODES}",
    )
    _require(0 <= actor.clip_ratio_low < 1, "actor_rollout_ref.actor.clip_ratio_low", "must be in [0, 1)")
    _require(actor.clip_ratio_high >= 0, "actor_rollout_ref.actor.clip_ratio_high", "must be >= 0")
    _require(actor.clip_ratio_c > 1, "actor_rollout_ref.actor.clip_ratio_c", "must be > 1 (dual-clip bound)")

    rollout = cfg.actor_rollout_ref.rollout
    _require(rollout.name == "vllm", "actor_rollout_ref.rollout.name", f"only vllm is supported, got {rollout.name!r}")
    _require(rollout.n >= 2, "actor_rollout_ref.rollout.n", f"GRPO needs >= 2 samples per prompt, got {rollout.n}")
    _require(rollout.temperature >= 0, "actor_rollout_ref.rollout.temperature", "must be >= 0")
    _require(
        rollout.dtype in ("float32", "bfloat16", "float16"),
        "actor_rollout_ref.rollout.dtype",
        f"must be float32, bfloat16 or float16, got {rollout.dtype!r}",
    )
    model_path = cfg.actor_rollout_ref.model.path
    if model_path is not None:
        from recipe.models import BUILTIN_HEADS, BUILTIN_MODELS, is_gguf_spec

        _require(
            is_gguf_spec(model_path) or Path(model_path, "config.json").is_file(),
            "actor_rollout_ref.model.path",
            f"{model_path} is neither a built-in model ({', '.join([*BUILTIN_MODELS, *BUILTIN_HEADS])}), a .gguf file "
            "nor a HF checkpoint directory (no config.json)",
        )

    algo = cfg.algorithm
    _require(
        algo.adv_estimator == "grpo", "algorithm.adv_estimator", f"this recipe uses grpo, got {algo.adv_estimator!r}"
    )
    fg = algo.filter_groups
    if fg.enable:
        _require(fg.metric in FILTER_METRICS, "algorithm.filter_groups.metric", f"must be one of {FILTER_METRICS}")
    rc = cfg.recipe
    _require(rc.on_exhausted in ("train", "error"), "recipe.on_exhausted", "must be train or error")
    _require(
        cfg.reward.reward_manager.name == "dapo",
        "reward.reward_manager.name",
        f"this recipe uses veRL's dapo reward manager, got {cfg.reward.reward_manager.name!r}",
    )
    ob = cfg.reward.reward_kwargs.overlong_buffer_cfg
    if ob.enable:
        _require(
            0 < ob.len < data.max_response_length,
            "reward.reward_kwargs.overlong_buffer_cfg.len",
            f"must be in (0, data.max_response_length={data.max_response_length})",
        )

    tr = cfg.trainer
    _require(tr.total_training_steps >= 1, "trainer.total_training_steps", "must be >= 1")
    _require(
        tr.resume_mode in ("auto", "disable"),
        "trainer.resume_mode",
        f"must be auto or disable, got {tr.resume_mode!r}",
    )
    _require(
        tr.device in ("auto", "cpu", "cuda", "npu"),
        "trainer.device",
        f"must be auto, cpu, cuda or npu, got {tr.device!r}",
    )
    _require(rc.long_tail_threshold >= 1, "recipe.long_tail_threshold", f"must be >= 1, got {rc.long_tail_threshold}")
    _require(rc.train_probe.prompts >= 0, "recipe.train_probe.prompts", "must be >= 0 (0: off)")
    _require(rc.train_probe.n >= 1, "recipe.train_probe.n", f"must be >= 1, got {rc.train_probe.n}")
    _require(rc.drift_probe.prompts >= 0, "recipe.drift_probe.prompts", "must be >= 0 (0: off)")
    _require(rc.drift_probe.n >= 1, "recipe.drift_probe.n", f"must be >= 1, got {rc.drift_probe.n}")
    vk = cfg.actor_rollout_ref.rollout.val_kwargs
    _require(vk.n >= 1, "actor_rollout_ref.rollout.val_kwargs.n", f"must be >= 1, got {vk.n}")
    for key in ("nnodes", "n_gpus_per_node"):
        _require(tr[key] >= 1, f"trainer.{key}", f"must be >= 1, got {tr[key]}")
    _require(
        cfg.actor_rollout_ref.actor.strategy in ("fsdp", "fsdp2", "megatron"),
        "actor_rollout_ref.actor.strategy",
        f"must be fsdp, fsdp2 or megatron, got {cfg.actor_rollout_ref.actor.strategy!r}",
    )
    loggers = {"console", "file", "wandb", "tensorboard", "mlflow", "swanlab"}
    bad = [x for x in tr.logger if x not in loggers]
    _require(not bad, "trainer.logger", f"unknown backend(s) {bad}; known: {sorted(loggers)}")
    _require("file" in tr.logger, "trainer.logger", "must include file: the run's metrics.jsonl is built from it")


SCALAR_TYPES = {bool: "a boolean (true or false)", int: "an integer", float: "a number"}


def _fits(value: object, expected: type) -> bool:
    if expected is bool:
        return isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_overrides(cfg: DictConfig, overrides: list[str], defaults: DictConfig, groups: set[str]) -> list[str]:
    """The command line's overrides against ``defaults`` (the config composed from the same group choices, without the
    value overrides). A value whose type differs from its key's default scalar (``trainer.total_training_steps=abc``)
    raises :class:`ConfigError` naming key, value and type; a ``+key`` under no map that anything reads (a typo Hydra
    accepts, since ``+`` adds keys) comes back as a warning line. ``groups`` are the config groups (``spec``,
    ``experiment``): their overrides choose files, not values."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    missing = object()
    warnings = []
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.key_or_group
        if key in groups or key.startswith("hydra") or override.is_delete() or override.package is not None:
            continue
        if override.is_add():
            parent, found = key, missing
            while found is missing and "." in parent:
                parent = parent.rpartition(".")[0]
                found = OmegaConf.select(defaults, parent, default=missing)
            if not (OmegaConf.is_dict(found) and len(found) == 0):  # an empty map is read whole (engine_kwargs.vllm)
                warnings.append(
                    f"warning: +{key}: no such key, and nothing reads it (a typo? without + a misspelled key "
                    "is refused)"
                )
            continue
        if "${" in str(override.value()):  # an interpolation (``${oc.env:X}`` is a string until decoded): unchecked
            continue
        # a default that does not resolve without the command line's values (a run name interpolating a key only
        # some spec groups have) has no type to check against
        default = OmegaConf.select(defaults, key, default=None, throw_on_resolution_failure=False)
        value = OmegaConf.select(cfg, key, default=None)
        expected = type(default)
        if expected in SCALAR_TYPES and value is not None and not _fits(value, expected):
            raise ConfigError(f"{key}: expected {SCALAR_TYPES[expected]}, got {value!r}")
    return warnings


def _load_spec_option(name: str) -> DictConfig:
    """configs/spec/<name>.yaml with the options its defaults list names merged first, as Hydra composes it."""
    own = OmegaConf.load(REPO_ROOT / "configs" / "spec" / f"{name}.yaml")
    defaults = own.pop("defaults", [])
    group = OmegaConf.create()
    for entry in defaults:
        group = OmegaConf.merge(group, own if entry == "_self_" else _load_spec_option(str(entry)))
    return group if "_self_" in defaults else OmegaConf.merge(group, own)


def spec_group(method: str, **overrides: object) -> DictConfig:
    """The ``spec`` group of ``method`` as configs/spec/<method>.yaml sets it (for scripts that build engines
    outside a run), with ``overrides``."""
    _require(method in SPEC_METHODS, "spec.method", f"must be one of {SPEC_METHODS}, got {method!r}")
    group = _load_spec_option(method)
    for key, value in overrides.items():
        OmegaConf.update(group, key, value)
    return group


def spec_overrides(spec: DictConfig) -> dict[str, object]:
    """veRL's keys for the recipe's ``spec`` group (a leading ``+`` marks a key veRL passes through to vLLM)."""
    from recipe.engine import spec_from_config

    method = str(spec.method)
    if method == "off":
        return {}
    if method in ("ngram", "suffix", "sam"):
        vllm = "+actor_rollout_ref.rollout.engine_kwargs.vllm"
        speculative, additional = spec_from_config(spec)  # the same vLLM settings as the local backend
        out: dict[str, object] = {f"{vllm}.speculative_config": speculative}
        if additional:
            out[f"{vllm}.additional_config"] = additional
        return out
    # MTP drafting: veRL builds the speculative config from model.mtp (method, K) and merges engine_kwargs' over it
    speculative, additional = spec_from_config(spec)
    vllm_keys = {k: v for k, v in speculative.items() if k not in ("method", "num_speculative_tokens")}
    engine = {f"+actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config.{k}": v for k, v in vllm_keys.items()}
    if additional:
        engine["+actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config"] = additional
    return {
        **engine,
        "actor_rollout_ref.model.mtp.enable": True,
        "actor_rollout_ref.model.mtp.enable_rollout": True,
        "actor_rollout_ref.model.mtp.enable_train": spec.mtp.train == "online",
        "actor_rollout_ref.model.mtp.detach_encoder": True,  # the MTP loss updates only the MTP layer
        "actor_rollout_ref.model.mtp.mtp_loss_scaling_factor": float(spec.mtp.loss_scaling_factor),
        "actor_rollout_ref.model.mtp.method": "mtp",
        "actor_rollout_ref.model.mtp.num_speculative_tokens": int(spec.num_speculative_tokens),
        # online: the FSDP actor's engine holds, trains and syncs the head (veRL imports the module in its
        # workers; a Megatron actor trains the head itself), so the servers get it with the first weight sync
        **(
            {
                "actor_rollout_ref.model.external_lib": "mtp.verl_fsdp",
                # veRL's optimizer config has no key for a second learning rate: mtp.verl_fsdp takes this one out of
                # the optimizer's extra arguments and gives the MTP layer its own parameter group
                **(
                    {
                        f"+actor_rollout_ref.actor.optim.override_optimizer_config.{MTP_LR_KEY}": float(spec.mtp.lr),
                        f"+actor_rollout_ref.actor.optim.override_optimizer_config.{MTP_LR_WARMUP_KEY}": int(
                            spec.mtp.lr_warmup_steps
                        ),
                    }
                    if spec.mtp.lr is not None
                    else {}
                ),
                # a loss setting of the model's forward: the actor's HF config carries it to mtp.verl_fsdp's model
                f"+actor_rollout_ref.model.override_config.{MTP_LOSS_FRACTION_KEY}": float(
                    spec.mtp.loss_sequence_fraction
                ),
                f"+actor_rollout_ref.model.override_config.{MTP_OBJECTIVE_KEY}": str(spec.mtp.objective),
                f"+actor_rollout_ref.model.override_config.{MTP_VOCAB_TOPK_KEY}": int(spec.mtp.loss_vocab_topk),
            }
            if spec.mtp.train == "online"
            # frozen: the actor holds the trunk only (Qwen2ForCausalLM drops model.mtp_layers.*) and weight sync
            # never sends the head, so the servers load the checkpoint's (veRL's default "dummy" load would leave
            # it random, drafting at chance)
            else {"actor_rollout_ref.rollout.load_format": "auto"}
        ),
    }


def has_key(cfg: DictConfig, key: str) -> bool:
    """Whether the dotted ``key`` exists in ``cfg`` (also with a ``???`` value, which veRL uses for required keys)."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None) if parent else cfg
    return isinstance(node, DictConfig) and leaf in node.keys()


def apply_overrides(cfg: DictConfig, overrides: dict[str, object]) -> None:
    """Set dotted keys as Hydra's command line would: a key veRL's schema lacks raises unless it is marked ``+``."""
    for key, value in overrides.items():
        if key.startswith("+"):
            with open_dict(cfg):
                OmegaConf.update(cfg, key[1:], value, merge=False, force_add=True)
        elif not has_key(cfg, key):
            raise ConfigError(f"{key}: veRL's config has no such key")
        else:
            OmegaConf.update(cfg, key, value, merge=False)


def leaves(raw: dict, prefix: str = "") -> dict[str, object]:
    """Every leaf of a nested dict (a config as a container) by dotted key; empty sections hold none."""
    out: dict[str, object] = {}
    for key, value in raw.items():
        if isinstance(value, dict):
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _resolve_recipe_references(cfg: DictConfig) -> None:
    """Values that interpolate a recipe group (``experiment_name: ${spec.method}``) take their value, so the
    groups can go; veRL's own interpolations stay for veRL to resolve."""
    marks = tuple("${" + group for group in RECIPE_GROUPS)
    raw = OmegaConf.to_container(cfg, resolve=False)
    for key, value in leaves({k: v for k, v in raw.items() if k not in RECIPE_GROUPS}).items():
        if isinstance(value, str) and any(m in value for m in marks):
            OmegaConf.update(cfg, key, OmegaConf.select(cfg, key), merge=False)


def accelerators(device: str) -> int:
    """GPUs (or NPUs for ``device=npu``) visible to this process."""
    if device == "npu":
        try:
            import torch_npu  # noqa: F401
        except ImportError:
            return 0
        import torch

        return int(torch.npu.device_count())
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def resolve_device(requested: str) -> str:
    """``trainer.device=auto``: cuda or npu where visible, else the CPU."""
    if requested != "auto":
        return requested
    for device in ("cuda", "npu"):
        if accelerators(device):
            return device
    return "cpu"


def verl_config(cfg: DictConfig, model: str, train: str, val: str, device: str) -> DictConfig:
    """veRL's config of this run: ``cfg`` without the recipe's groups, with the inputs (``model``, ``train``,
    ``val``: the embedded ones where the config names none) and the device filled in, paths made absolute, and
    the ``spec`` group as veRL's keys. Nothing is translated: every other key is veRL's already."""
    out = copy.deepcopy(cfg)
    _resolve_recipe_references(out)
    with open_dict(out):
        for group in RECIPE_GROUPS:
            out.pop(group)
    tokenizer = Path(model, "tokenizer")
    ro = out.actor_rollout_ref.rollout
    apply_overrides(
        out,
        {
            "actor_rollout_ref.model.path": str(Path(model).resolve()),
            "actor_rollout_ref.model.tokenizer_path": str(tokenizer.resolve()) if tokenizer.is_dir() else None,
            "data.train_files": str(Path(train).resolve()),
            "data.val_files": str(Path(val).resolve()),
            "trainer.default_local_dir": str(Path(out.trainer.default_local_dir).resolve()),
            "trainer.device": device,
            "actor_rollout_ref.rollout.gpu_memory_utilization": float(
                ro.gpu_memory_utilization or (0.04 if device == "cpu" else 0.5)
            ),
            **{
                key: str(REPO_ROOT / OmegaConf.select(out, key))
                for key in REPO_RELATIVE_KEYS
                if OmegaConf.select(out, key)
            },
            **spec_overrides(cfg.spec),
            # the depth of the head's draft chain the online loss trains: the model's, so not spec_overrides'
            **(
                {f"+actor_rollout_ref.model.override_config.{MTP_DEPTH_KEY}": head_draft_depth(cfg.spec, model)}
                if str(cfg.spec.method) in HEAD_METHODS and cfg.spec.mtp.train == "online"
                else {}
            ),
        },
    )
    return out
