"""``backend=verl``: the same DAPO configuration on veRL 0.9.1's own Ray trainer (``verl.trainer.main_ppo``:
FSDP/Megatron workers, vLLM rollout servers), on clusters and, through recipe/verl_cpu.py, on this CPU.

The recipe's config is translated into Hydra overrides of veRL's own ``ppo_trainer`` config (composed from
the installed wheel, so a key veRL does not know fails here, not on the cluster):
- DAPO: ``algorithm.filter_groups``, clip ratios, ``loss_agg_mode``, veRL's ``dapo`` reward manager with
  the overlong buffer in ``reward.reward_kwargs``, and the recipe's ``math_dapo`` scorer as the custom reward
  function;
- SAM / ngram: ``actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config`` (SAM as vLLM's
  ``custom_class`` proposer ``sam.vllm.SAMProposer``, its options in ``engine_kwargs.vllm.additional_config``);
- MTP: ``actor_rollout_ref.model.mtp.*`` (rollout drafting; online training needs the Megatron actor), the
  servers loading the checkpoint's MTP layer (``rollout.load_format=auto``: FSDP weight sync carries the trunk);
- several replicas: ``rollout.router_config_path`` names the prompt-affinity router (routing.py), so a prompt's
  samples and epochs meet in one server's SAM.

``trainer.dry_run=true`` prints the composed veRL config and the command of the Ray job, and writes both
next to the run, without starting anything. A real start checks what the device needs first (on the CPU:
versions, Ray, TransferQueue, memory), runs the job as a subprocess that it cleans up after on every exit,
and collects the run's metrics and server timelines into the run directory (server_timeline.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from recipe.dapo.config import ConfigError
from recipe.dapo.report import plot_run
from recipe.dapo.server_timeline import STEP_MARKS, TIMELINE_DIR_ENV, rollout_metrics_by_step
from recipe.engine import spec_from_config
from recipe.verl_cpu import PLATFORM_ENV, PLATFORM_NAME

REPO_ROOT = Path(__file__).resolve().parents[2]
REWARD_FUNCTION = REPO_ROOT / "recipe" / "dapo" / "batch.py"  # compute_score: veRL's math_dapo scorer


class BackendUnavailableError(RuntimeError):
    """veRL's trainer cannot start here; the message names what is missing."""


def _value(v) -> str:
    """A value in Hydra's override grammar (quoted strings, ``[..]`` lists, ``{key:value}`` dicts)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list | tuple):
        return "[" + ",".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_value(x)}" for k, x in v.items()) + "}"
    return "'" + str(v).replace("\\", "\\\\").replace("'", "\\'") + "'"


def spec_overrides(spec: DictConfig) -> dict[str, object]:
    """veRL keys for the ``spec`` group (the mapping tests/test_verl_backend.py pins)."""
    method = str(spec.method)
    if method == "off":
        return {}
    k = int(spec.num_speculative_tokens)
    if method in ("ngram", "sam"):
        vllm = "+actor_rollout_ref.rollout.engine_kwargs.vllm"  # "+": keys veRL passes through to vLLM
        speculative, additional = spec_from_config(spec)  # the same vLLM settings as the local backend
        out = {f"{vllm}.speculative_config": speculative}
        if additional:
            out[f"{vllm}.additional_config"] = additional
        return out
    online = spec.mtp.train == "online"
    return {
        "actor_rollout_ref.model.mtp.enable": True,
        "actor_rollout_ref.model.mtp.enable_rollout": True,
        "actor_rollout_ref.model.mtp.enable_train": online,
        "actor_rollout_ref.model.mtp.detach_encoder": True,  # the MTP loss updates only the MTP layer
        "actor_rollout_ref.model.mtp.mtp_loss_scaling_factor": float(spec.mtp.loss_scaling_factor),
        "actor_rollout_ref.model.mtp.method": "mtp",
        "actor_rollout_ref.model.mtp.num_speculative_tokens": k,
        # the servers load the checkpoint's weights, MTP layer included: veRL's FSDP actor holds the trunk only
        # (Qwen2ForCausalLM drops model.mtp_layers.*), so weight sync refreshes the trunk and never the head,
        # which with veRL's default "dummy" load stays random and drafts at chance
        "actor_rollout_ref.rollout.load_format": "auto",
    }


def verl_overrides(cfg: DictConfig, model: str, train: str, val: str, device: str) -> dict[str, object]:
    """Every veRL key this recipe sets, from the recipe config (keys mirror veRL's, so this is mostly 1:1)."""
    data, actor, ro = cfg.data, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    algo, ob, tr = cfg.algorithm, cfg.reward_model.overlong_buffer, cfg.trainer
    model, train, val = (str(Path(p).resolve()) for p in (model, train, val))  # the job runs from the repo root
    tokenizer = Path(model, "tokenizer")
    out: dict[str, object] = {
        "data.train_files": train,
        "data.val_files": val,
        "data.train_batch_size": int(data.train_batch_size),
        "data.gen_batch_size": int(data.gen_batch_size),
        "data.max_prompt_length": int(data.max_prompt_length),
        "data.max_response_length": int(data.max_response_length),
        "data.train_max_samples": -1 if data.train_max_samples is None else int(data.train_max_samples),
        "data.val_max_samples": -1 if data.val_max_samples is None else int(data.val_max_samples),
        "data.shuffle": bool(data.shuffle),
        "data.seed": int(tr.seed),
        "data.filter_overlong_prompts": True,
        "actor_rollout_ref.model.path": model,
        "actor_rollout_ref.model.tokenizer_path": str(tokenizer) if tokenizer.is_dir() else None,
        "actor_rollout_ref.actor.strategy": str(actor.strategy),
        "actor_rollout_ref.actor.optim.lr": float(actor.optim.lr),
        "actor_rollout_ref.actor.optim.weight_decay": float(actor.optim.weight_decay),
        "actor_rollout_ref.actor.optim.betas": [float(b) for b in actor.optim.betas],
        "actor_rollout_ref.actor.ppo_mini_batch_size": int(actor.ppo_mini_batch_size),
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": int(actor.ppo_micro_batch_size_per_gpu),
        "actor_rollout_ref.actor.ppo_epochs": int(actor.ppo_epochs),
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": int(actor.ppo_micro_batch_size_per_gpu),
        "actor_rollout_ref.actor.clip_ratio_low": float(actor.clip_ratio_low),
        "actor_rollout_ref.actor.clip_ratio_high": float(actor.clip_ratio_high),
        "actor_rollout_ref.actor.clip_ratio_c": float(actor.clip_ratio_c),
        "actor_rollout_ref.actor.loss_agg_mode": str(actor.loss_agg_mode),
        "actor_rollout_ref.actor.grad_clip": float(actor.grad_clip),
        "actor_rollout_ref.actor.fsdp_config.dtype": str(ro.dtype),  # train in the dtype the rollout samples in
        "actor_rollout_ref.actor.use_kl_loss": False,  # DAPO drops the KL term
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.n": int(ro.n),
        "actor_rollout_ref.rollout.temperature": float(ro.temperature),
        "actor_rollout_ref.rollout.top_p": float(ro.top_p),
        "actor_rollout_ref.rollout.dtype": str(ro.dtype),
        "actor_rollout_ref.rollout.tensor_model_parallel_size": int(ro.tensor_model_parallel_size),
        "actor_rollout_ref.rollout.gpu_memory_utilization": float(
            ro.gpu_memory_utilization or (0.04 if device == "cpu" else 0.5)
        ),
        "actor_rollout_ref.rollout.max_num_seqs": int(ro.max_num_seqs),
        "actor_rollout_ref.rollout.enforce_eager": bool(ro.enforce_eager),
        "actor_rollout_ref.rollout.free_cache_engine": bool(ro.free_cache_engine),
        "actor_rollout_ref.rollout.seed": int(tr.seed),
        "actor_rollout_ref.rollout.router_config_path": (
            str(REPO_ROOT / ro.router_config_path) if ro.router_config_path else None
        ),
        "actor_rollout_ref.rollout.disable_log_stats": False,  # the servers' stat loggers record the timeline
        "algorithm.adv_estimator": str(algo.adv_estimator),
        "algorithm.norm_adv_by_std_in_grpo": bool(algo.norm_adv_by_std_in_grpo),
        "algorithm.use_kl_in_reward": False,
        "algorithm.filter_groups.enable": bool(algo.filter_groups.enable),
        "algorithm.filter_groups.metric": str(algo.filter_groups.metric),
        "algorithm.filter_groups.max_num_gen_batches": int(algo.filter_groups.max_num_gen_batches),
        "reward.reward_manager.name": "dapo",
        "reward.custom_reward_function.path": str(REWARD_FUNCTION),
        "reward.custom_reward_function.name": "compute_score",
        "+reward.reward_kwargs.max_resp_len": int(data.max_response_length),
        "+reward.reward_kwargs.overlong_buffer_cfg": {
            "enable": bool(ob.enable),
            "len": int(ob.len),
            "penalty_factor": float(ob.penalty_factor),
            "log": bool(ob.log),
        },
        "trainer.total_training_steps": int(tr.total_training_steps),
        "trainer.save_freq": int(tr.save_freq),
        "trainer.test_freq": int(tr.test_freq),
        "trainer.val_before_train": bool(tr.val_before_train),
        "trainer.resume_mode": str(tr.resume),
        "trainer.default_local_dir": str(tr.default_local_dir),
        "trainer.project_name": str(tr.project_name),
        "trainer.experiment_name": str(tr.experiment_name),
        "trainer.logger": list(tr.logger),
        "trainer.nnodes": int(tr.nnodes),
        "trainer.n_gpus_per_node": int(tr.n_gpus_per_node),
        "trainer.device": device,
    }
    out = {k: v for k, v in out.items() if v is not None}
    out.update(spec_overrides(cfg.spec))
    if device == "cpu":
        out.update(cpu_overrides(cfg))
    return out


def check_mapping(cfg: DictConfig) -> None:
    """What the local backend does that veRL does differently or not at all, named by key."""
    if (
        cfg.spec.method == "mtp"
        and cfg.spec.mtp.train == "online"
        and cfg.actor_rollout_ref.actor.strategy != "megatron"
    ):
        raise ConfigError(
            "spec.mtp.train: online MTP training on backend=verl needs the Megatron actor "
            "(actor_rollout_ref.actor.strategy=megatron); veRL's FSDP actor only drafts with the MTP head"
        )
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
            "algorithm.filter_groups.max_num_gen_batches and on_exhausted apply to backend=local only: veRL 0.9.1's "
            "V1 trainer ignores them and refills until train_batch_size groups are kept, with no cap on rounds",
            stacklevel=2,
        )


def compose_verl_config(overrides: dict[str, object]) -> DictConfig:
    """veRL's ``ppo_trainer`` config from the installed wheel with ``overrides`` applied (unknown keys raise)."""
    import verl
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=as_hydra_args(overrides))


def as_hydra_args(overrides: dict[str, object]) -> list[str]:
    return [f"{k}={_value(v)}" for k, v in overrides.items()]


def launch_command(overrides: dict[str, object]) -> list[str]:
    """The Ray job: veRL's own entry point with the overrides (what the sbatch scripts run on the head)."""
    return [sys.executable, "-m", "verl.trainer.main_ppo", *as_hydra_args(overrides)]


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


# One replica peaked at 7.5-7.6 GiB PSS (results/verl/backends.md); a second adds about 3.3 GiB (../shared/DESIGN.md,
# two replicas 10.4 GiB; not re-measured by this project).
CPU_GIB_FIRST_REPLICA = 7.5
CPU_GIB_PER_EXTRA_REPLICA = 3.5


def world_size(cfg: DictConfig) -> int:
    """Ranks of the job's actor: one per GPU (on the CPU, per logical GPU)."""
    return int(cfg.trainer.nnodes) * int(cfg.trainer.n_gpus_per_node)


def cpu_replicas(cfg: DictConfig) -> int:
    """vLLM servers of a CPU run: one per logical GPU (tensor parallelism 1)."""
    return world_size(cfg)


def cpu_overrides(cfg: DictConfig) -> dict[str, object]:
    """What veRL's trainer needs on a machine without accelerators (each setting checked necessary there)."""
    replicas = cpu_replicas(cfg)
    return {
        "actor_rollout_ref.model.use_remove_padding": False,  # the packed path needs flash-attn
        "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile": False,
        "+actor_rollout_ref.rollout.enable_sleep_mode": False,  # vLLM CPU has no sleep mode
        "actor_rollout_ref.rollout.agent.num_workers": 1,
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes": 64,  # a /dev/shm buffer
        "reward.num_workers": 1,
        "transfer_queue.backend.SimpleStorage.num_data_storage_units": 1,
        # veRL schedules on Ray's "GPU" resource: the CPU node declares one logical GPU per replica
        "+ray_kwargs.ray_init.num_gpus": replicas,
        # each replica's placement-group bundle takes 3 CPUs (veRL's max_colocate_count); 2 for the driver-side actors
        "ray_kwargs.ray_init.num_cpus": 2 + 3 * replicas,
    }


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
    replicas = cpu_replicas(cfg)
    need = CPU_GIB_FIRST_REPLICA + CPU_GIB_PER_EXTRA_REPLICA * (replicas - 1)
    have = psutil.virtual_memory().available / 2**30
    if have < need:
        raise BackendUnavailableError(
            f"backend=verl on the CPU with {replicas} replica(s) needs about {need:.1f} GiB of free memory, "
            f"{have:.1f} GiB is available (trainer.n_gpus_per_node sets the replicas)"
        )


def launch_env(device: str, out_dir: Path) -> dict[str, str]:
    """The trainer's environment: the CPU platform for every veRL and vLLM process it starts, and veRL's file
    logger writing next to the run (one file per launch; :func:`collect_metrics` merges them)."""
    env = dict(os.environ)
    if device == "cpu":
        env[PLATFORM_ENV] = PLATFORM_NAME  # the platform gives the vLLM servers their CPU settings
    start = latest_step(out_dir)
    env["VERL_FILE_LOGGER_PATH"] = str(out_dir / f"{TRACKING_PREFIX}{start}.jsonl")
    env[TIMELINE_DIR_ENV] = str(out_dir / "server_timeline")
    return env


TRACKING_PREFIX = "tracking_from_step_"
LATEST_FILE = "latest_checkpointed_iteration.txt"  # veRL's resume pointer in trainer.default_local_dir


def latest_step(out_dir: Path) -> int:
    latest = out_dir / LATEST_FILE
    return int(latest.read_text().strip()) if latest.is_file() else 0


def collect_metrics(out_dir: Path, tail_threshold: int) -> list[dict]:
    """``metrics.jsonl`` of a veRL run from its launches' tracking files: a relaunch resumed at step S replaces
    what the killed launch logged after S, so the history is what an uninterrupted run logs (one row a step).
    Each step also gets the ``rollout/*`` metrics of its rollouts in the servers (the local backend's names)."""
    rows: dict[int, dict] = {}
    files = sorted(out_dir.glob(f"{TRACKING_PREFIX}*.jsonl"), key=lambda p: int(p.stem.removeprefix(TRACKING_PREFIX)))
    for path in files:
        start = int(path.stem.removeprefix(TRACKING_PREFIX))
        rows = {s: r for s, r in rows.items() if s <= start}
        for line in path.read_text().splitlines():
            if line.strip():
                entry = json.loads(line)
                step = int(entry["step"])
                rows[step] = {**rows.get(step, {"step": step}), **entry["data"]}
    validated = {s for s, r in rows.items() if any(k.startswith("val-core/") for k in r)}
    for step, metrics in rollout_metrics_by_step(out_dir, validated, tail_threshold).items():
        if step in rows:
            rows[step].update(metrics)
    history = [rows[s] for s in sorted(rows)]
    (out_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))
    return history


JOB_ENV = "SPEC_ROLLOUT_JOB"  # marks every process of one job (Ray's daemons and workers inherit it)


def _shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def job_processes(job_id: str) -> list:
    """Live processes of the job ``job_id``, found by the environment they inherited (this process left out: a
    launcher started with the variable set, as tests and benchmarks do to follow a job, ends its job, not itself)."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.pid != os.getpid() and proc.environ().get(JOB_ENV) == job_id:
                found.append(proc)
    return found


def _exit_on_sigterm(signum: int, frame) -> None:
    raise SystemExit(128 + signum)


def run_job(command: list[str], env: dict[str, str], job_file: Path) -> int:
    """Run the Ray job and leave nothing behind: on any exit (also an exception, Ctrl-C, or SIGTERM, which is how
    Slurm cancels a job or ends it at its time limit) every process of the job is killed, Ray's daemons included
    (they start sessions of their own), and the /dev/shm files it created are removed. The job's id and the
    /dev/shm entries before it are kept in ``job_file`` while it runs, for :func:`end_stale_job`."""
    job_id = env.get(JOB_ENV) or f"{os.getpid()}-{time.time_ns()}"
    env = {**env, JOB_ENV: job_id}
    shm_before = _shm_entries()
    job_file.write_text(json.dumps({"id": job_id, "shm_before": sorted(shm_before)}))
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main_thread else None
    proc = subprocess.Popen(command, env=env, cwd=REPO_ROOT)
    try:
        mark_steps(proc, Path(env["VERL_FILE_LOGGER_PATH"]), job_file.parent / STEP_MARKS)
        return proc.wait()
    finally:
        cleanup_job(job_id, shm_before)
        job_file.unlink(missing_ok=True)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def mark_steps(proc: subprocess.Popen, tracking: Path, marks: Path, poll_s: float = 0.2) -> None:
    """While the job runs, note the wall time at which veRL's file logger writes each step's metrics: the
    boundaries that assign the servers' timeline rows to training steps (server_timeline.py). Reads only what
    the file gained since the last poll."""
    launch, offset, resumed_from = time.time(), 0, latest_step(marks.parent)
    while proc.poll() is None:
        time.sleep(poll_s)
        if not tracking.is_file():
            continue
        with tracking.open("rb") as fh:
            fh.seek(offset)
            new = fh.read()
        complete = new[: new.rfind(b"\n") + 1]  # a line still being written waits for the next poll
        offset += len(complete)
        now = time.time()
        with marks.open("a") as fh:
            for line in complete.splitlines():
                step = int(json.loads(line)["step"])
                fh.write(json.dumps({"step": step, "t": now, "launch": launch, "resumed_from": resumed_from}) + "\n")


def end_stale_job(job_file: Path) -> None:
    """A launcher killed outright (kill -9: no ``finally``) leaves its job running, still training and writing
    checkpoints; a relaunch in the same run directory ends it (and removes its /dev/shm files) before it reads
    the checkpoint to resume from."""
    if job_file.is_file():
        stale = json.loads(job_file.read_text())
        cleanup_job(stale["id"], set(stale["shm_before"]))
        job_file.unlink()


def cleanup_job(job_id: str, shm_before: set[str]) -> None:
    """Kill every process of the job and remove the /dev/shm entries that appeared since ``shm_before``."""
    import psutil

    procs = job_processes(job_id)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=30)
    for name in _shm_entries() - shm_before:
        path = Path("/dev/shm", name)
        with contextlib.suppress(OSError):
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def run_verl(cfg: DictConfig, model: str, train: str, val: str) -> DictConfig | list[dict]:
    """Dry run: print and save the veRL config and job. Otherwise run veRL's own trainer (``verl.trainer.main_ppo``,
    the command the sbatch scripts run) and return the run's metrics history."""
    check_mapping(cfg)
    device = resolve_device(str(cfg.trainer.device))
    out_dir = Path(cfg.trainer.default_local_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    job_file = out_dir / "verl_job.id"
    if not cfg.trainer.dry_run:
        end_stale_job(job_file)
    overrides = verl_overrides(cfg, model, train, val, device)
    if cfg.trainer.resume == "auto" and latest_step(out_dir) > 0:
        overrides["trainer.val_before_train"] = False  # as an uninterrupted run: no evaluation at the resumed step
    verl_cfg = compose_verl_config(overrides)
    command = launch_command(overrides)
    (out_dir / "verl_config.yaml").write_text(OmegaConf.to_yaml(verl_cfg))
    prefix = f"{PLATFORM_ENV}={PLATFORM_NAME} " if device == "cpu" else ""
    (out_dir / "verl_launch.sh").write_text(
        "#!/usr/bin/env bash\nset -euo pipefail\n" + prefix + shlex.join(command) + "\n"
    )
    if cfg.trainer.dry_run:
        print(OmegaConf.to_yaml(verl_cfg))
        print(f"# Ray job ({cfg.trainer.nnodes} node(s) x {cfg.trainer.n_gpus_per_node} {device}):")
        print(prefix + shlex.join(command))
        print(f"# written: {out_dir / 'verl_config.yaml'}, {out_dir / 'verl_launch.sh'}")
        return verl_cfg
    if device == "cpu":
        preflight_cpu(cfg)
    elif accelerators(device) == 0:
        raise BackendUnavailableError(f"trainer.device={device}: no {device} device is visible to this process")
    code = run_job(command, launch_env(device, out_dir), job_file)
    if code != 0:
        raise RuntimeError(f"veRL's trainer exited with code {code}; its command: {out_dir / 'verl_launch.sh'}")
    history = collect_metrics(out_dir, int(cfg.trainer.long_tail_threshold))
    plot_run(history, out_dir / "curves.png", title=f"{cfg.trainer.project_name} / {cfg.trainer.experiment_name}")
    return history
