"""``python -m recipe.dapo [overrides]``: DAPO with speculative rollouts (configs/dapo.yaml).

Checks the config before any work (errors name the key), resolves the embedded base model and data when no
model path or data file is given, builds veRL's config of the run (``config.verl_config``) and runs the chosen
backend on it: the local loop or veRL's own trainer.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from recipe.dapo.config import ConfigError, check_overrides, resolve_device, validate, verl_config
from recipe.dapo.report import run_summary
from recipe.engine import HEAD_METHODS, UnsupportedVLLMError, check_vllm_version
from recipe.paths import CONFIG_DIR


def resolve_inputs(cfg: DictConfig) -> tuple[str, str, str]:
    """Model path, train file and val file; the embedded base model (built once, cached) and its unseen RL
    prompts (``recipe.rl_prompts``) fill the gaps. A dry run names where they will be and builds nothing."""
    model = cfg.actor_rollout_ref.model.path
    train, val = cfg.data.train_files, cfg.data.val_files
    if not cfg.recipe.dry_run:
        from recipe.data.loader import check_data_file

        for key, path in (("data.train_files", train), ("data.val_files", val)):
            if path is not None:
                check_data_file(path, key)
    if model is not None:
        # a built-in real model, a .gguf file or a HF directory: one checked HF checkpoint (recipe/models.py), before
        # any engine starts; any model but the embedded one (a real model, or one grafted from it) defaults to the word
        # problems (recipe/data/word_problems.py): the embedded task is written in the embedded tokenizer's alphabet
        from recipe.models import resolve_model
        from recipe.sft.train import is_embedded_checkpoint

        model = str(resolve_model(model))
        if train is not None and val is not None:
            return model, str(train), str(val)
        if not is_embedded_checkpoint(model):
            from recipe.data.word_problems import write_splits

            word_train, word_val = write_splits()
            return model, str(train or word_train), str(val or word_val)
    if model is None or train is None or val is None:
        from recipe.dapo.data import write_unseen_prompts
        from recipe.data.task import TaskConfig
        from recipe.sft.train import base_model_path, ensure_base_model

        base_cfg = OmegaConf.load(CONFIG_DIR / f"{cfg.recipe.base_model}.yaml")
        ckpt = base_model_path(base_cfg) if cfg.recipe.dry_run else ensure_base_model(base_cfg)
        data = ckpt.parent / "data"
        model = model or str(ckpt)
        val = val or str(data / "test.parquet")
        if train is None:
            rl = cfg.recipe.rl_prompts
            train = data / f"rl_prompts_seed{rl.seed}_num{rl.num}_max{rl.max_terms}.parquet"
            if not cfg.recipe.dry_run:
                task = TaskConfig(**OmegaConf.to_container(base_cfg.data.task, resolve=True))
                write_unseen_prompts(train, data, rl.num, rl.seed, rl.max_terms, task)
    return str(model), str(train), str(val)


def require_local_trainable(model: str) -> None:
    """The local actor trains the recipe's MiMo checkpoints (a Qwen2 trunk with MTP layers, mtp/model.py); any other
    architecture is named at start, before any engine, with the backend that trains it."""
    import json

    architectures = json.loads(Path(model, "config.json").read_text()).get("architectures") or []
    if architectures != ["MiMoForCausalLM"]:
        raise ConfigError(
            f"actor_rollout_ref.model.path: backend=local trains MiMo checkpoints (mtp/model.py); {model} is "
            f"{architectures}: train it with backend=verl (veRL's FSDP actor loads any HF causal LM)"
        )


def require_mtp_layer(model: str, method: str, k: int) -> None:
    """``spec=mtp`` drafts with the checkpoint's own MTP layer: a checkpoint without one is named at start, with how
    to graft one (mtp/graft.py), instead of failing inside vLLM's engine start; so is a ``spec=mtp`` depth K above the
    one its layer was trained to draft (:func:`mtp.checkpoint.trained_depth`), with how to train it that deep."""
    from mtp.checkpoint import has_mtp_layer, trained_depth

    if not Path(model, "config.json").is_file():
        return
    if not has_mtp_layer(model):
        raise ConfigError(
            f"spec={method}: {model} has no MTP layer (config.json num_nextn_predict_layers); graft one onto a Llama "
            f"checkpoint with `python -m mtp.graft {model} OUT_DIR` (`python -m recipe.mtp_head` also trains it on the "
            "model's own samples), then set actor_rollout_ref.model.path=OUT_DIR"
        )
    depth = trained_depth(model)
    if method == "mtp" and k > depth:
        raise ConfigError(
            f"spec.num_speculative_tokens={k}: the MTP layer of {model} was trained to draft {depth} token(s) a step; "
            f"set spec.num_speculative_tokens<={depth} or train it deeper (`python -m recipe.mtp_head --depth {k}`)"
        )


def run(cfg: DictConfig) -> list[dict] | DictConfig:
    """Train on the chosen backend: the local history of metrics, or (backend=verl) veRL's config."""
    validate(cfg)
    check_vllm_version(method=str(cfg.spec.method))
    model, train, val = resolve_inputs(cfg)
    if cfg.backend == "local":
        require_local_trainable(model)
    if str(cfg.spec.method) in HEAD_METHODS:
        require_mtp_layer(model, str(cfg.spec.method), int(cfg.spec.num_speculative_tokens))
    verl_cfg = verl_config(cfg, model, train, val, resolve_device(str(cfg.trainer.device)))
    if cfg.backend == "verl":
        from recipe.dapo.verl_backend import run_verl

        return run_verl(cfg, verl_cfg)
    from recipe.dapo.trainer import DAPOTrainer

    trainer = DAPOTrainer(cfg, verl_cfg)
    try:
        return trainer.fit()
    finally:
        trainer.engine.close()


def input_errors() -> tuple[type[Exception], ...]:
    """What a bad input raises before any work starts: the console gets its one line (key or file, and what is
    wanted) and exit code 2; ``HYDRA_FULL_ERROR=1`` shows the traceback as Hydra does."""
    from recipe.dapo.verl_backend import BackendUnavailableError
    from recipe.data.loader import DataFileError
    from recipe.models import ModelError
    from recipe.verl_cpu import UnsupportedVersionError

    return (
        ConfigError,
        DataFileError,
        FileNotFoundError,
        ModelError,
        UnsupportedVLLMError,
        UnsupportedVersionError,
        BackendUnavailableError,
    )


def check_command_line(cfg: DictConfig) -> None:
    """The command line's overrides checked against the defaults they override (config.check_overrides): a value of
    the wrong type stops the run naming it; a ``+key`` nothing reads is named in a warning before any work."""
    from hydra import compose
    from hydra.core.hydra_config import HydraConfig

    hydra_cfg = HydraConfig.get()
    overrides = list(hydra_cfg.overrides.task)
    groups = set(hydra_cfg.runtime.choices)
    chosen = [o for o in overrides if o.lstrip("+~").split("=", 1)[0].split("@", 1)[0] in groups]
    defaults = compose(config_name=hydra_cfg.job.config_name, overrides=chosen)
    for line in check_overrides(cfg, overrides, defaults, groups):
        print(line, file=sys.stderr, flush=True)


@hydra.main(config_path=str(CONFIG_DIR), config_name="dapo", version_base=None)
def main(cfg: DictConfig) -> None:
    # the console carries progress, one line per step, warnings and the run's summary; every metric is in the
    # run's files. vLLM (here, in its engine processes and, on backend=verl, in its servers) logs at WARNING
    # unless VLLM_LOGGING_LEVEL says otherwise; the recipe's own messages at INFO.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for package in ("recipe", "sam", "mtp"):
        logging.getLogger(package).setLevel(logging.INFO)
    # veRL lists every optional training engine it could not import (torchtitan, megatron, ...) at each start
    warnings.filterwarnings("ignore", message=r".* engine is not available", category=UserWarning)
    try:
        check_command_line(cfg)
        history = run(cfg)
    except input_errors() as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    if isinstance(history, list):
        print(run_summary(history, Path(cfg.trainer.default_local_dir).resolve()), flush=True)


if __name__ == "__main__":
    main()
