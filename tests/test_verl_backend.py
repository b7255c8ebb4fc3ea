"""backend=verl: the recipe config composed against veRL 0.9.1's real config schema (from the installed
wheel), the exact spec mappings, a dry run, the no-accelerator stop, and the sbatch scripts."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from recipe.dapo.config import ConfigError

REPO = Path(__file__).resolve().parents[1]
SHELL_SCRIPTS = sorted((REPO / "scripts" / "slurm").iterdir()) + sorted((REPO / "scripts").glob("*.sh"))


def recipe_config(*overrides: str):
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        return compose(config_name="dapo", overrides=["backend=verl", *overrides])


@pytest.fixture(scope="module")
def inputs(harness_model) -> list[str]:
    data = harness_model.parent / "data"
    return [
        f"actor_rollout_ref.model.path={harness_model}",
        f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'test.parquet'}",
    ]


def composed(*overrides: str):
    from recipe.dapo.__main__ import resolve_inputs
    from recipe.dapo.verl_backend import compose_verl_config, resolve_device, verl_overrides

    cfg = recipe_config(*overrides)
    device = resolve_device(str(cfg.trainer.device))
    return cfg, compose_verl_config(verl_overrides(cfg, *resolve_inputs(cfg), device))


def test_dapo_settings_land_on_verl_keys(inputs):
    cfg, v = composed(*inputs, "actor_rollout_ref.actor.clip_ratio_high=0.3", "data.gen_batch_size=24")
    assert v.algorithm.filter_groups.enable is True and v.algorithm.filter_groups.metric == "acc"
    assert v.algorithm.filter_groups.max_num_gen_batches == cfg.algorithm.filter_groups.max_num_gen_batches
    assert v.algorithm.adv_estimator == "grpo" and v.actor_rollout_ref.actor.use_kl_loss is False
    assert v.actor_rollout_ref.actor.clip_ratio_high == 0.3 and v.actor_rollout_ref.actor.clip_ratio_low == 0.2
    assert v.actor_rollout_ref.actor.loss_agg_mode == "token-mean"
    assert v.data.gen_batch_size == 24 and v.data.train_batch_size == cfg.data.train_batch_size
    assert v.reward.reward_manager.name == "dapo"
    assert v.reward.custom_reward_function.path.endswith("recipe/dapo/batch.py")
    buffer = v.reward.reward_kwargs.overlong_buffer_cfg
    assert (buffer.enable, buffer.len, buffer.penalty_factor) == (True, 192, 1.0)
    assert v.reward.reward_kwargs.max_resp_len == cfg.data.max_response_length
    assert v.actor_rollout_ref.model.tokenizer_path.endswith("checkpoint/tokenizer")
    assert v.trainer.total_training_steps == cfg.trainer.total_training_steps


def test_spec_mappings_are_exactly_the_expected_verl_keys():
    from recipe.dapo.verl_backend import spec_overrides

    vllm = "+actor_rollout_ref.rollout.engine_kwargs.vllm"
    sam = recipe_config("spec=sam").spec
    assert spec_overrides(sam) == {
        f"{vllm}.speculative_config": {
            "method": "custom_class",
            "model": "sam.vllm.SAMProposer",
            "num_speculative_tokens": sam.num_speculative_tokens,
        },
        f"{vllm}.additional_config": {"sam": OmegaConf.to_container(sam.sam)},
    }
    assert spec_overrides(recipe_config("spec=ngram").spec) == {
        f"{vllm}.speculative_config": {
            "method": "ngram",
            "num_speculative_tokens": 4,
            "prompt_lookup_min": 2,
            "prompt_lookup_max": 5,
        }
    }
    assert spec_overrides(recipe_config("spec=off").spec) == {}
    mtp = "actor_rollout_ref.model.mtp"
    assert spec_overrides(recipe_config("spec=mtp", "spec.mtp.train=frozen").spec) == {
        f"{mtp}.enable": True,
        f"{mtp}.enable_rollout": True,
        f"{mtp}.enable_train": False,
        f"{mtp}.detach_encoder": True,
        f"{mtp}.mtp_loss_scaling_factor": 0.2,
        f"{mtp}.method": "mtp",
        f"{mtp}.num_speculative_tokens": 1,
        "actor_rollout_ref.rollout.load_format": "auto",
    }


@pytest.mark.parametrize("spec", ["off", "ngram", "sam", "mtp"])
def test_every_spec_composes_against_verl_schema(inputs, spec):
    extra = ["actor_rollout_ref.actor.strategy=megatron"] if spec == "mtp" else []
    _, v = composed(*inputs, f"spec={spec}", *extra)
    spec_cfg = v.actor_rollout_ref.rollout.engine_kwargs.vllm.get("speculative_config")
    assert (spec_cfg is None) == (spec in ("off", "mtp"))
    assert v.actor_rollout_ref.model.mtp.enable is (spec == "mtp")


def test_unknown_verl_key_fails_at_compose():
    from hydra.errors import ConfigCompositionException

    from recipe.dapo.verl_backend import compose_verl_config

    with pytest.raises(ConfigCompositionException, match="no_such_key"):
        compose_verl_config({"actor_rollout_ref.rollout.no_such_key": 1})


def test_online_mtp_on_fsdp_is_refused_by_key():
    from recipe.dapo.verl_backend import check_mapping

    with pytest.raises(ConfigError, match=r"^spec\.mtp\.train: .*strategy=megatron"):
        check_mapping(recipe_config("spec=mtp", "spec.mtp.train=online"))


DAPO_CLUSTER_BATCH = (  # veRL's DAPO recipe: 512 prompts x 16 responses a step, mini-batches of 32 prompts
    "data.train_batch_size=512", "data.gen_batch_size=1536", "actor_rollout_ref.rollout.n=16",
    "actor_rollout_ref.actor.ppo_mini_batch_size=32",
)  # fmt: skip


def test_dry_run_prints_and_saves_the_verl_config_and_job(inputs, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "recipe.dapo", *inputs, "backend=verl", "trainer.dry_run=true", "trainer.device=cuda",
         f"trainer.default_local_dir={out}", "trainer.nnodes=2", "trainer.n_gpus_per_node=8", *DAPO_CLUSTER_BATCH],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "-m verl.trainer.main_ppo" in proc.stdout and "2 node(s) x 8 cuda" in proc.stdout
    saved = OmegaConf.load(out / "verl_config.yaml")
    assert saved.trainer.nnodes == 2 and saved.algorithm.filter_groups.enable is True
    launch = shlex.split((out / "verl_launch.sh").read_text().splitlines()[-1])
    assert launch[1:3] == ["-m", "verl.trainer.main_ppo"]
    assert any(a.startswith("+actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config={method:'custom_class'")
               for a in launch)  # fmt: skip
    assert subprocess.run(["bash", "-n", str(out / "verl_launch.sh")]).returncode == 0


def test_cpu_start_names_too_little_memory_before_any_process_starts(inputs, tmp_path):
    from recipe.dapo.__main__ import run
    from recipe.dapo.verl_backend import BackendUnavailableError

    cfg = recipe_config(
        *inputs, "trainer.device=cpu", "trainer.n_gpus_per_node=16", *DAPO_CLUSTER_BATCH,
        f"trainer.default_local_dir={tmp_path}",
    )  # fmt: skip
    with pytest.raises(BackendUnavailableError, match=r"16 replica\(s\) needs about 60\.0 GiB"):
        run(cfg)
    assert not (tmp_path / "verl_job.id").exists()  # nothing was started


def test_cpu_dry_run_sets_what_verl_needs_on_the_cpu(inputs):
    _, v = composed(*inputs, "trainer.device=cpu", "trainer.n_gpus_per_node=2")
    assert v.trainer.device == "cpu" and v.ray_kwargs.ray_init.num_gpus == 2
    assert v.actor_rollout_ref.actor.strategy == "fsdp2" and v.actor_rollout_ref.rollout.enable_sleep_mode is False
    assert v.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    assert v.actor_rollout_ref.actor.fsdp_config.dtype == v.actor_rollout_ref.rollout.dtype == "float32"


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: p.name)
def test_shell_scripts_parse_and_pass_shellcheck(script):
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    proc = subprocess.run([shellcheck, "-x", str(script)], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


LAUNCHER = """
import os
import sys
from pathlib import Path
from recipe.dapo.verl_backend import run_job
out = Path(sys.argv[1])
# the job: a process with a child of its own, as veRL's driver has Ray daemons and workers
job = [sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)"]
run_job(job, {**os.environ, "VERL_FILE_LOGGER_PATH": str(out / "tracking.jsonl")}, out / "verl_job.id")
"""


def test_sigterm_to_the_launcher_ends_the_whole_job(tmp_path):
    """Slurm cancels a job (scancel, time limit) with SIGTERM: the launcher must take its job down with it."""
    import os
    import signal
    import time
    import uuid

    from recipe.dapo.verl_backend import JOB_ENV, job_processes

    job_id = f"test-{uuid.uuid4().hex}"
    env = {**os.environ, JOB_ENV: job_id}
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path)], cwd=REPO, env=env)
    try:
        deadline = time.monotonic() + 60
        while len(job_processes(job_id)) < 3 and time.monotonic() < deadline:  # launcher, job, its child
            time.sleep(0.2)
        assert len(job_processes(job_id)) >= 3 and (tmp_path / "verl_job.id").is_file()
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 128 + signal.SIGTERM
        assert not job_processes(job_id)
        assert not (tmp_path / "verl_job.id").exists()
    finally:
        for proc in job_processes(job_id):
            proc.kill()


def test_a_mini_batch_that_does_not_split_over_the_ranks_is_named_before_anything_starts():
    from recipe.dapo.verl_backend import check_mapping

    two_ranks = (
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    )
    check_mapping(recipe_config(*two_ranks, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"))  # 8 per rank
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref\.actor\.ppo_micro_batch_size_per_gpu: .* 8 per rank"):
        check_mapping(recipe_config(*two_ranks, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16"))
