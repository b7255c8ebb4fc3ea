"""``backend=verl``: the same DAPO configuration on veRL 0.9.1's own Ray trainer (``verl.trainer.main_ppo``:
FSDP/Megatron workers, vLLM rollout servers), on clusters and, through recipe/verl_cpu.py, on this CPU.

The recipe's config is veRL's own ``ppo_trainer`` config (configs/dapo.yaml), so the job gets it as it is:
``config.verl_config`` drops the recipe's groups, fills in the inputs and the device, and writes the ``spec``
group as veRL's keys (SAM and ngram as ``actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config``, SAM
as vLLM's ``custom_class`` proposer; MTP as ``actor_rollout_ref.model.mtp.*``, with the servers loading the
checkpoint's MTP layer). On the CPU, :func:`cpu_overrides` adds what veRL needs there. With several replicas,
``rollout.router_config_path`` names the prompt-affinity router (routing.py), so a prompt's samples and epochs
meet in one server's SAM.

``recipe.dry_run=true`` prints the veRL config and the command of the Ray job, and writes both
next to the run, without starting anything. A real start checks what the device needs first (on the CPU:
versions, Ray, TransferQueue, memory), runs the job as a subprocess that it cleans up after on every exit
(job.py), and collects the run's metrics and server timelines into the run directory (server_timeline.py).
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import sys
import time
import warnings
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from recipe.dapo.config import ConfigError, accelerators, apply_overrides
from recipe.dapo.job import JOB_ENV, end_stale_job, run_job
from recipe.dapo.report import plot_run
from recipe.dapo.run_dir import latest_step, merge_tracking, rewind_to_logged_checkpoint, tracking_path, write_history
from recipe.dapo.server_timeline import TIMELINE_DIR_ENV, LiveCanary, canary_rows, rollout_metrics_by_step
from recipe.dapo.step_marks import STEP_MARKS_ENV, marks_env
from recipe.engine import INSECURE_SERIALIZATION_ENV
from recipe.verl_cpu import PLATFORM_ENV, PLATFORM_NAME


class BackendUnavailableError(RuntimeError):
    """veRL's trainer cannot start here; the message names what is missing."""


def check_mapping(cfg: DictConfig) -> None:
    """What the local backend does that veRL does differently or not at all, named by key."""
    actor, ranks = cfg.actor_rollout_ref.actor, world_size(cfg)
    per_rank = int(actor.ppo_mini_batch_size) * int(cfg.actor_rollout_ref.rollout.n) / ranks
    if per_rank != int(per_rank) or int(per_rank) % int(actor.ppo_micro_batch_size_per_gpu):
        raise ConfigError(
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu: a mini-batch of {actor.ppo_mini_batch_size} "
            f"prompts x rollout.n={cfg.actor_rollout_ref.rollout.n} responses over {ranks} ranks is {per_rank:g} per "
            f"rank, which veRL must split into micro-batches of {actor.ppo_micro_batch_size_per_gpu}"
        )
    fg = cfg.algorithm.filter_groups
    if fg.enable and fg.max_num_gen_batches > 0:
        warnings.warn(
            "algorithm.filter_groups.max_num_gen_batches and recipe.on_exhausted apply to backend=local only: veRL 0.9.1's "
            "V1 trainer ignores them and refills until train_batch_size groups are kept, with no cap on rounds",
            stacklevel=2,
        )


def launch_command(config_file: Path) -> list[str]:
    """The Ray job: veRL's own entry point on the run's veRL config (what the sbatch scripts run on the head)."""
    return [
        sys.executable, "-m", "verl.trainer.main_ppo",
        f"--config-path={config_file.parent}", f"--config-name={config_file.stem}",
        f"hydra.run.dir={config_file.parent}", "hydra.output_subdir=null",  # no outputs/ folder in the repository
    ]  # fmt: skip


# What a CPU job needs before it starts, from the peak memory of one and two replicas (FINDINGS.md, the two backends),
# rounded up per extra replica.
CPU_GIB_FIRST_REPLICA = 7.5
CPU_GIB_PER_EXTRA_REPLICA = 3.5


def world_size(cfg: DictConfig) -> int:
    """Ranks of the job's actor: one per GPU (on the CPU, per logical GPU, each also one vLLM server)."""
    return int(cfg.trainer.nnodes) * int(cfg.trainer.n_gpus_per_node)


def weight_bucket_megabytes(model_path: str, floor: int = 64) -> int:
    """The /dev/shm bucket (MiB, a multiple of ``floor``) veRL's weight sync needs on the CPU: it refuses any tensor
    larger than its bucket, and a real vocabulary's float32 embedding table is (SmolLM2: 49,152 x 576, 108 MiB)."""

    config = Path(model_path, "config.json")
    if not config.is_file():  # a dry run names the embedded model before it is built
        return floor
    hf = json.loads(config.read_text())
    largest = int(hf["vocab_size"]) * int(hf["hidden_size"]) * 4
    return floor * -(-largest // (floor << 20))


def joins_ray_cluster() -> bool:
    """Whether the job joins a running Ray cluster (``RAY_ADDRESS``, which the sbatch scripts' ``ray_cluster_up``
    exports) instead of starting one of its own."""
    return bool(os.environ.get("RAY_ADDRESS"))


def cpu_overrides(cfg: DictConfig, model_path: str) -> dict[str, object]:
    """What veRL's trainer needs on a machine without accelerators (each setting checked necessary there)."""
    replicas = world_size(cfg)
    own_ray = {
        # veRL schedules on Ray's "GPU" resource: the CPU node declares one logical GPU per replica
        "+ray_kwargs.ray_init.num_gpus": replicas,
        # each replica's placement-group bundle takes 3 CPUs (veRL's max_colocate_count); 2 for the driver-side actors
        "ray_kwargs.ray_init.num_cpus": 2 + 3 * replicas,
    }
    return {
        "actor_rollout_ref.model.use_remove_padding": False,  # the packed path needs flash-attn
        "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile": False,
        "+actor_rollout_ref.rollout.enable_sleep_mode": False,  # vLLM CPU has no sleep mode
        "actor_rollout_ref.rollout.agent.num_workers": 1,
        # a /dev/shm buffer, as small as the largest tensor allows
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes": weight_bucket_megabytes(
            model_path
        ),
        "reward.num_workers": 1,
        "transfer_queue.backend.SimpleStorage.num_data_storage_units": 1,
        # a running cluster declared its resources at `ray start` (Ray refuses them from a client)
        **({} if joins_ray_cluster() else own_ray),
    }


def job_config(cfg: DictConfig, verl_cfg: DictConfig) -> DictConfig:
    """The config veRL's trainer runs: the run's veRL config, with what the CPU needs, and no evaluation at a
    resumed step (as in an uninterrupted run)."""
    out = copy.deepcopy(verl_cfg)
    if out.trainer.device == "cpu":
        apply_overrides(out, cpu_overrides(cfg, str(out.actor_rollout_ref.model.path)))
    if out.trainer.resume_mode == "auto" and latest_step(Path(out.trainer.default_local_dir)) > 0:
        out.trainer.val_before_train = False
    return out


def preflight_cpu(cfg: DictConfig) -> None:
    """Name what would stop veRL's trainer on the CPU before any process starts."""
    import importlib.util

    import psutil

    from recipe.verl_cpu import check_versions

    check_versions()
    for module, why in (("ray", "veRL's trainer runs on Ray"), ("transfer_queue", "veRL's V1 trainer imports it")):
        if importlib.util.find_spec(module) is None:
            raise BackendUnavailableError(
                f"backend=verl: Python module {module!r} is missing ({why}); run make install"
            )
    if cfg.actor_rollout_ref.actor.strategy != "fsdp2":
        raise ConfigError(
            f"actor_rollout_ref.actor.strategy: backend=verl on the CPU runs fsdp2 only "
            f"(got {cfg.actor_rollout_ref.actor.strategy!r}; FSDP1 refuses CPU parameters)"
        )
    replicas = world_size(cfg)
    need = CPU_GIB_FIRST_REPLICA + CPU_GIB_PER_EXTRA_REPLICA * (replicas - 1)
    have = psutil.virtual_memory().available / 2**30
    if have < need:
        raise BackendUnavailableError(
            f"backend=verl on the CPU with {replicas} replica(s) needs about {need:.1f} GiB of free memory, "
            f"{have:.1f} GiB is available (trainer.n_gpus_per_node sets the replicas)"
        )


def launch_env(device: str, out_dir: Path) -> dict[str, str]:
    """The trainer's environment: the CPU platform for every veRL and vLLM process it starts, veRL's file logger
    writing next to the run (one file per launch; :func:`collect_metrics` merges them) and marking each step it
    logs (step_marks.py), and the servers writing their timelines (server_timeline.py) and running the functions the
    trainer sends them (verl_drafter_state.py)."""
    env = dict(os.environ)
    if device == "cpu":
        env[PLATFORM_ENV] = PLATFORM_NAME  # the platform gives the vLLM servers their CPU settings
    start = latest_step(out_dir)
    env["VERL_FILE_LOGGER_PATH"] = str(tracking_path(out_dir, start))
    env[TIMELINE_DIR_ENV] = str(out_dir / "server_timeline")
    env.update(marks_env(out_dir, resumed_from=start))
    env[INSECURE_SERIALIZATION_ENV] = "1"  # the trainer sends the servers functions (verl_drafter_state.py)
    return env


def worker_env_overrides(env: dict[str, str]) -> dict[str, object]:
    """On a running Ray cluster the job's workers are children of its raylets, not of the launcher, and do not
    inherit what :func:`launch_env` set (the CPU platform, the file logger's path and step marks, the servers'
    timeline directory, the servers' leave to run the trainer's functions) nor the job's id that :func:`cleanup_job`
    finds them by: Ray's ``runtime_env`` carries them to every worker of the job."""
    keys = (
        PLATFORM_ENV,
        "VERL_FILE_LOGGER_PATH",
        TIMELINE_DIR_ENV,
        STEP_MARKS_ENV,
        JOB_ENV,
        INSECURE_SERIALIZATION_ENV,
    )
    return {"+ray_kwargs.ray_init.runtime_env.env_vars": {k: env[k] for k in keys if k in env}}


def collect_metrics(out_dir: Path, tail_threshold: int) -> list[dict]:
    """``metrics.jsonl`` of a veRL run: the launches' tracking files merged, each step with the ``rollout/*``
    metrics of its rollouts in the servers (the local backend's names) and the live acceptance canary's."""
    rows = {r["step"]: r for r in merge_tracking(out_dir)}
    validated = {s for s, r in rows.items() if any(k.startswith("val-core/") for k in r)}
    for step, metrics in rollout_metrics_by_step(out_dir, validated, tail_threshold).items():
        if step in rows:
            rows[step].update(metrics)
    for step, canary in canary_rows(out_dir).items():
        if step in rows:
            rows[step].update({k: v for k, v in canary.items() if k.startswith("rollout/")})
    history = [rows[s] for s in sorted(rows)]
    write_history(out_dir, history)
    return history


def run_verl(cfg: DictConfig, verl_cfg: DictConfig) -> DictConfig | list[dict]:
    """Dry run: print and save veRL's config of the run (``config.verl_config``) and the job. Otherwise run veRL's
    own trainer on it (``verl.trainer.main_ppo``, the command the sbatch scripts run) and return the run's metrics
    history."""
    check_mapping(cfg)
    device = str(verl_cfg.trainer.device)
    out_dir = Path(verl_cfg.trainer.default_local_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    job_file = out_dir / "verl_job.id"
    if not cfg.recipe.dry_run:
        end_stale_job(job_file)
        if verl_cfg.trainer.resume_mode == "auto":
            rewind_to_logged_checkpoint(out_dir)
    verl_cfg = job_config(cfg, verl_cfg)
    env = launch_env(device, out_dir)
    if joins_ray_cluster():
        env.setdefault(JOB_ENV, f"{os.getpid()}-{time.time_ns()}")
        apply_overrides(verl_cfg, worker_env_overrides(env))
    config_file = out_dir / "verl_config.yaml"
    config_file.write_text(OmegaConf.to_yaml(verl_cfg))
    command = launch_command(config_file)
    prefix = f"{PLATFORM_ENV}={PLATFORM_NAME} " if device == "cpu" else ""
    (out_dir / "verl_launch.sh").write_text(
        "#!/usr/bin/env bash\nset -euo pipefail\n" + prefix + shlex.join(command) + "\n"
    )
    if cfg.recipe.dry_run:
        print(OmegaConf.to_yaml(verl_cfg))
        print(f"# Ray job ({cfg.trainer.nnodes} node(s) x {cfg.trainer.n_gpus_per_node} {device}):")
        print(prefix + shlex.join(command))
        print(f"# written: {out_dir / 'verl_config.yaml'}, {out_dir / 'verl_launch.sh'}")
        return verl_cfg
    if device == "cpu":
        preflight_cpu(cfg)
    elif accelerators(device) == 0:
        raise BackendUnavailableError(f"trainer.device={device}: no {device} device is visible to this process")
    source = str(cfg.spec.method)
    if source == "off":
        code = run_job(command, env, job_file)
    else:  # each draft source's acceptance checked after every weight sync while the job trains
        launch = json.loads(env[STEP_MARKS_ENV])
        with LiveCanary(out_dir, source, launch["launch"], launch["resumed_from"]):
            code = run_job(command, env, job_file)
    if code != 0:
        raise RuntimeError(f"veRL's trainer exited with code {code}; its command: {out_dir / 'verl_launch.sh'}")
    history = collect_metrics(out_dir, int(cfg.recipe.long_tail_threshold))
    plot_run(history, out_dir / "curves.png", title=f"{cfg.trainer.project_name} / {cfg.trainer.experiment_name}")
    return history
