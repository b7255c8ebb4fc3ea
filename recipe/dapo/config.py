"""Checks of a DAPO config before any work starts: every error names the offending key."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

SPEC_METHODS = ("off", "ngram", "sam", "mtp")
LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
FILTER_METRICS = ("acc", "score", "seq_reward", "seq_final_reward")


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
    if spec.method == "mtp":
        _require(
            spec.mtp.train in ("frozen", "online"),
            "spec.mtp.train",
            f"must be frozen or online, got {spec.mtp.train!r}",
        )
        _require(spec.mtp.loss_scaling_factor >= 0, "spec.mtp.loss_scaling_factor", "must be >= 0")
    if spec.method == "sam":
        from sam.policy import SAMOptions

        try:
            SAMOptions.from_dict(dict(spec.sam))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"spec.sam: {e}") from e

    data = cfg.data
    for key in ("train_batch_size", "gen_batch_size", "max_prompt_length", "max_response_length"):
        _require(data[key] >= 1, f"data.{key}", f"must be >= 1, got {data[key]}")
    for key in ("train_max_samples", "val_max_samples"):
        _require(data[key] is None or data[key] >= 1, f"data.{key}", f"must be >= 1 or null (all), got {data[key]}")
    for key in ("train_files", "val_files"):
        if data[key] is not None:
            _require(Path(data[key]).is_file(), f"data.{key}", f"file {data[key]} does not exist")

    actor = cfg.actor_rollout_ref.actor
    _require(actor.ppo_mini_batch_size >= 1, "actor_rollout_ref.actor.ppo_mini_batch_size", "must be >= 1")
    _require(
        data.train_batch_size % actor.ppo_mini_batch_size == 0,
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        f"must divide data.train_batch_size ({actor.ppo_mini_batch_size} does not divide {data.train_batch_size})",
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
        _require(
            Path(model_path, "config.json").is_file(),
            "actor_rollout_ref.model.path",
            f"{model_path} is not a HF checkpoint directory (no config.json)",
        )

    algo = cfg.algorithm
    _require(
        algo.adv_estimator == "grpo", "algorithm.adv_estimator", f"this recipe uses grpo, got {algo.adv_estimator!r}"
    )
    fg = algo.filter_groups
    if fg.enable:
        _require(
            (fg.metric or "acc") in FILTER_METRICS, "algorithm.filter_groups.metric", f"must be one of {FILTER_METRICS}"
        )
        _require(
            fg.on_exhausted in ("train", "error"), "algorithm.filter_groups.on_exhausted", "must be train or error"
        )
    ob = cfg.reward_model.overlong_buffer
    if ob.enable:
        _require(
            0 < ob.len < data.max_response_length,
            "reward_model.overlong_buffer.len",
            f"must be in (0, data.max_response_length={data.max_response_length})",
        )

    tr = cfg.trainer
    _require(tr.total_training_steps >= 1, "trainer.total_training_steps", "must be >= 1")
    _require(tr.resume in ("auto", "disable"), "trainer.resume", f"must be auto or disable, got {tr.resume!r}")
    _require(
        tr.device in ("auto", "cpu", "cuda", "npu"),
        "trainer.device",
        f"must be auto, cpu, cuda or npu, got {tr.device!r}",
    )
    _require(tr.long_tail_threshold >= 1, "trainer.long_tail_threshold", f"must be >= 1, got {tr.long_tail_threshold}")
    _require(tr.train_probe.prompts >= 0, "trainer.train_probe.prompts", "must be >= 0 (0: off)")
    _require(tr.train_probe.n >= 1, "trainer.train_probe.n", f"must be >= 1, got {tr.train_probe.n}")
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
