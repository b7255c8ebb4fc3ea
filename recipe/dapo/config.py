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


def _check(cfg: DictConfig, table: tuple) -> None:
    """Each row ``(key, ok, message)`` of a group's table: ``ok(value)`` must hold for the key's value, else
    :class:`ConfigError` with ``message`` formatted with ``v`` (the value)."""
    for key, ok, message in table:
        value = OmegaConf.select(cfg, key)
        _require(ok(value), key, message.format(v=value))


def _count(low: int = 0):
    """An integer (not a boolean) of at least ``low``."""
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


def _at_least(low: float):
    return lambda v: v >= low


MTP_TABLE = (
    ("spec.mtp.train", lambda v: v in ("frozen", "online"), "must be frozen or online, got {v!r}"),
    ("spec.mtp.loss_scaling_factor", _at_least(0), "must be >= 0"),
    ("spec.mtp.lr", lambda v: v is None or v > 0, "must be null or > 0, got {v}"),
    ("spec.mtp.lr_warmup_steps", _count(), "must be an integer >= 0, got {v}"),
    ("spec.mtp.objective", lambda v: v in MTP_OBJECTIVES, f"must be one of {MTP_OBJECTIVES}, got {{v!r}}"),
    ("spec.mtp.loss_sequence_fraction", lambda v: 0 < v <= 1, "must be in (0, 1], got {v}"),
    ("spec.mtp.loss_vocab_topk", _count(), "must be an integer >= 0, got {v!r}"),
    ("spec.mtp.dropped_rows_per_step", _count(), "must be an integer >= 0 (0: every left-out row), got {v!r}"),
    (
        "spec.mtp.dropped_tokens_per_kept_token",
        lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v >= 0,
        "must be a number >= 0 (0: no cap on the left-out tokens), got {v!r}",
    ),
)
# the MTP keys that act through mtp/verl_fsdp.py (or the local trainer): the value a Megatron actor, which trains its
# head its own way, needs; what that actor does instead; whether the key matters only to an online head
MEGATRON_MTP = {
    "spec.mtp.objective": ("sampled", "trains its MTP head on the sampled token", False),
    "spec.mtp.loss_sequence_fraction": (1, "computes its MTP loss over every token", False),
    "spec.mtp.loss_vocab_topk": (0, "scores its MTP loss over the whole vocabulary", False),
    "spec.mtp.lr_warmup_steps": (0, "trains the head with its own optimizer", True),
    "spec.mtp.lr": (None, "trains the head with its own optimizer", True),
}
SUFFIX_TABLE = (
    ("spec.suffix_decoding_max_tree_depth", _at_least(1), "must be >= 1"),
    ("spec.suffix_decoding_max_cached_requests", _at_least(0), "must be >= 0"),
    ("spec.suffix_decoding_max_spec_factor", _at_least(0), "must be >= 0"),
    ("spec.suffix_decoding_min_token_prob", lambda v: 0 <= v <= 1, "must be in [0, 1]"),
)
DATA_TABLE = (
    *((f"data.{k}", _at_least(1), "must be >= 1, got {v}")
      for k in ("train_batch_size", "gen_batch_size", "max_prompt_length", "max_response_length")),
    *((f"data.{k}", lambda v: v == -1 or v >= 1, "must be >= 1 or -1 (all), got {v}")
      for k in ("train_max_samples", "val_max_samples")),
    *((f"data.{k}", lambda v: v is None or Path(v).is_file(), "file {v} does not exist")
      for k in ("train_files", "val_files")),
    ("recipe.rl_prompts.num", _at_least(1), "must be >= 1, got {v}"),
    ("recipe.rl_prompts.max_terms", _at_least(2), "must be >= 2, got {v}"),
)  # fmt: skip
ACTOR_TABLE = (
    ("actor_rollout_ref.actor.ppo_mini_batch_size", _at_least(1), "must be >= 1"),
    (
        "actor_rollout_ref.actor.optim.lr_scheduler_type",
        lambda v: v in ("constant", "cosine"),
        "must be constant or cosine (veRL's FSDP schedules), got {v!r}",
    ),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", _at_least(1), "must be >= 1"),
    ("actor_rollout_ref.actor.loss_agg_mode", lambda v: v in LOSS_AGG_MODES, f"must be one of {LOSS_AGG_MODES}"),
    ("actor_rollout_ref.actor.clip_ratio_low", lambda v: 0 <= v < 1, "must be in [0, 1)"),
    ("actor_rollout_ref.actor.clip_ratio_high", _at_least(0), "must be >= 0"),
    ("actor_rollout_ref.actor.clip_ratio_c", lambda v: v > 1, "must be > 1 (dual-clip bound)"),
    (
        "actor_rollout_ref.actor.strategy",
        lambda v: v in ("fsdp", "fsdp2", "megatron"),
        "must be fsdp, fsdp2 or megatron, got {v!r}",
    ),
)
ROLLOUT_TABLE = (
    ("actor_rollout_ref.rollout.name", lambda v: v == "vllm", "only vllm is supported, got {v!r}"),
    ("actor_rollout_ref.rollout.n", _at_least(2), "GRPO needs >= 2 samples per prompt, got {v}"),
    ("actor_rollout_ref.rollout.temperature", _at_least(0), "must be >= 0"),
    (
        "actor_rollout_ref.rollout.dtype",
        lambda v: v in ("float32", "bfloat16", "float16"),
        "must be float32, bfloat16 or float16, got {v!r}",
    ),
    ("actor_rollout_ref.rollout.val_kwargs.n", _at_least(1), "must be >= 1, got {v}"),
)
ALGORITHM_TABLE = (
    ("algorithm.adv_estimator", lambda v: v == "grpo", "this recipe uses grpo, got {v!r}"),
    ("recipe.on_exhausted", lambda v: v in ("train", "error"), "must be train or error"),
    ("reward.reward_manager.name", lambda v: v == "dapo", "this recipe uses veRL's dapo reward manager, got {v!r}"),
)
LOGGERS = ("console", "file", "wandb", "tensorboard", "mlflow", "swanlab")
TRAINER_TABLE = (
    ("trainer.total_training_steps", _at_least(1), "must be >= 1"),
    ("trainer.resume_mode", lambda v: v in ("auto", "disable"), "must be auto or disable, got {v!r}"),
    ("trainer.device", lambda v: v in ("auto", "cpu", "cuda", "npu"), "must be auto, cpu, cuda or npu, got {v!r}"),
    ("trainer.nnodes", _at_least(1), "must be >= 1, got {v}"),
    ("trainer.n_gpus_per_node", _at_least(1), "must be >= 1, got {v}"),
    (
        "trainer.logger",
        lambda v: all(x in LOGGERS for x in v),
        f"unknown backend(s) in {{v}}; known: {sorted(LOGGERS)}",
    ),
    ("trainer.logger", lambda v: "file" in v, "must include file: the run's metrics.jsonl is built from it"),
    ("recipe.long_tail_threshold", _at_least(1), "must be >= 1, got {v}"),
    ("recipe.train_probe.prompts", _at_least(0), "must be >= 0 (0: off)"),
    ("recipe.train_probe.n", _at_least(1), "must be >= 1, got {v}"),
    ("recipe.drift_probe.prompts", _at_least(0), "must be >= 0 (0: off)"),
    ("recipe.drift_probe.n", _at_least(1), "must be >= 1, got {v}"),
)


def validate(cfg: DictConfig) -> None:
    """Raise :class:`ConfigError` naming the key for values that are out of range or inconsistent: each group's
    table of per-key checks, then the checks that relate keys."""
    _require(cfg.backend in ("local", "verl"), "backend", f"must be local or verl, got {cfg.backend!r}")
    _validate_spec(cfg)
    for table in (DATA_TABLE, ACTOR_TABLE, ROLLOUT_TABLE, ALGORITHM_TABLE, TRAINER_TABLE):
        _check(cfg, table)
    _validate_relations(cfg)


def _validate_spec(cfg: DictConfig) -> None:
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
        _validate_mtp(cfg)
    if spec.method == "suffix":
        _check(cfg, SUFFIX_TABLE)
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


def _validate_mtp(cfg: DictConfig) -> None:
    mtp = cfg.spec.mtp
    _check(cfg, MTP_TABLE)
    _require(
        mtp.lr_warmup_steps == 0 or mtp.lr is not None,
        "spec.mtp.lr_warmup_steps",
        "ramps the head's own rate: set spec.mtp.lr too (the actor's optimizer holds the head in its own group then)",
    )
    if cfg.backend == "verl" and cfg.actor_rollout_ref.actor.strategy == "megatron":
        for key, (needed, instead, online_only) in MEGATRON_MTP.items():
            _require(
                OmegaConf.select(cfg, key) == needed or (online_only and mtp.train != "online"),
                key,
                f"is for the local backend and veRL's FSDP actor (mtp/verl_fsdp.py); a Megatron actor {instead}: "
                f"leave it {'null' if needed is None else needed}",
            )
    dropped = bool(mtp.train_on_dropped_groups)
    _require(
        not dropped or mtp.train == "online",
        "spec.mtp.train_on_dropped_groups",
        f"trains the head: it needs spec.mtp.train=online, got {mtp.train!r}",
    )
    for key, what in (("dropped_rows_per_step", "rows"), ("dropped_tokens_per_kept_token", "tokens")):
        _require(
            mtp[key] == 0 or dropped,
            f"spec.mtp.{key}",
            f"caps the {what} of spec.mtp.train_on_dropped_groups: set that true, or leave this 0",
        )
    top_p = cfg.actor_rollout_ref.rollout.top_p
    _require(
        not (dropped and mtp.loss_vocab_topk) or top_p == 1.0,
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


def _validate_relations(cfg: DictConfig) -> None:
    """The checks that relate keys of different groups."""
    spec, data = cfg.spec, cfg.data
    _require(
        cfg.backend == "verl" or not cfg.actor_rollout_ref.model.lora_rank,
        "actor_rollout_ref.model.lora_rank",
        f"is {cfg.actor_rollout_ref.model.lora_rank}, but the local backend's actor trains every parameter: LoRA runs "
        "on backend=verl (veRL's FSDP actor with peft); leave it 0 here",
    )
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
    actor = cfg.actor_rollout_ref.actor
    _require(
        data.train_batch_size % actor.ppo_mini_batch_size == 0,
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        f"must divide data.train_batch_size ({actor.ppo_mini_batch_size} does not divide {data.train_batch_size})",
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
    fg = cfg.algorithm.filter_groups
    if fg.enable:
        _require(fg.metric in FILTER_METRICS, "algorithm.filter_groups.metric", f"must be one of {FILTER_METRICS}")
    ob = cfg.reward.reward_kwargs.overlong_buffer_cfg
    if ob.enable:
        _require(
            0 < ob.len < data.max_response_length,
            "reward.reward_kwargs.overlong_buffer_cfg.len",
            f"must be in (0, data.max_response_length={data.max_response_length})",
        )


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
