"""backend=verl: the recipe's config is veRL 0.9.1's real ``ppo_trainer`` config (from the installed wheel) plus
the recipe's groups, the job gets it unchanged but for the inputs, device and spec; a dry run, the CPU checks,
the launcher's clean-up, and the sbatch scripts."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from recipe.dapo.config import ConfigError

REPO = Path(__file__).resolve().parents[2]
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
    """The recipe config and the config veRL's job would run, in a fresh run directory given relative (as a user
    would; the job makes it absolute): never the default runs/..., where a demo's checkpoint makes the job resume
    and turn ``trainer.val_before_train`` off."""
    import tempfile

    from recipe.dapo.__main__ import resolve_inputs

    if not any(o.startswith("trainer.default_local_dir=") for o in overrides):
        overrides = (*overrides, f"trainer.default_local_dir={os.path.relpath(tempfile.mkdtemp(prefix='run-'))}")
    from recipe.dapo.config import resolve_device, verl_config
    from recipe.dapo.verl_backend import job_config

    cfg = recipe_config(*overrides)
    return cfg, job_config(cfg, verl_config(cfg, *resolve_inputs(cfg), resolve_device(str(cfg.trainer.device))))


def flat(cfg) -> dict[str, object]:
    """Every leaf of ``cfg`` by dotted key, resolved."""
    from recipe.dapo.config import leaves

    return leaves(OmegaConf.to_container(cfg, resolve=True))


def test_the_job_runs_the_recipe_config_changing_only_inputs_device_and_spec(inputs):
    """Nothing is translated: every veRL key the recipe sets reaches veRL's trainer with the recipe's value, and
    the only keys that differ are the ones the launcher fills in."""
    relative = [f"{k}={os.path.relpath(v)}" for k, v in (a.split("=", 1) for a in inputs)]  # made absolute
    cfg, job = composed(*relative, "trainer.device=cuda", "actor_rollout_ref.actor.clip_ratio_high=0.3", "spec=sam")
    recipe_keys = {k: v for k, v in flat(cfg).items() if k.split(".")[0] not in ("backend", "spec", "recipe")}
    job_keys = flat(job)
    assert set(recipe_keys) <= set(job_keys)
    changed = {k for k, v in recipe_keys.items() if job_keys[k] != v}
    assert changed == {
        "actor_rollout_ref.model.path", "actor_rollout_ref.model.tokenizer_path", "data.train_files",
        "data.val_files", "trainer.default_local_dir", "reward.custom_reward_function.path",
        "actor_rollout_ref.rollout.router_config_path", "actor_rollout_ref.rollout.gpu_memory_utilization",
        "actor_rollout_ref.rollout.prometheus.served_model_name",  # veRL's own interpolation of model.path
        "trainer.validation_data_dir",  # the recipe's interpolation of default_local_dir, made absolute with it
    }  # fmt: skip
    assert job.trainer.validation_data_dir == f"{job.trainer.default_local_dir}/validation"
    assert job.trainer.device == "cuda" and job.actor_rollout_ref.rollout.gpu_memory_utilization == 0.5
    assert Path(job.reward.custom_reward_function.path).is_file() and Path(job.data.train_files).is_absolute()
    assert job.actor_rollout_ref.model.tokenizer_path.endswith("checkpoint/tokenizer")
    added = set(job_keys) - set(recipe_keys)
    vllm = "actor_rollout_ref.rollout.engine_kwargs.vllm."
    assert all(k.startswith(vllm) for k in added)  # the spec group, as vLLM's settings
    assert job_keys[vllm + "speculative_config.method"] == "custom_class"
    assert job_keys[vllm + "additional_config.sam.min_match"] == cfg.spec.sam.min_match


def test_spec_reaches_verl_as_the_vllm_settings_the_local_engine_gets():
    from recipe.dapo.config import spec_overrides
    from recipe.engine import spec_from_config

    vllm = "+actor_rollout_ref.rollout.engine_kwargs.vllm"
    for method in ("sam", "ngram", "suffix"):
        spec = recipe_config(f"spec={method}").spec
        speculative, additional = spec_from_config(spec)
        expected = {f"{vllm}.speculative_config": speculative}
        if additional:
            expected[f"{vllm}.additional_config"] = additional
        assert spec_overrides(spec) == expected
    overridden = recipe_config("spec=sam", "spec.sam.min_match=5", "spec.sam.min_token_prob=0.25").spec
    sam = spec_overrides(overridden)[f"{vllm}.additional_config"]["sam"]
    assert (sam["min_match"], sam["min_token_prob"]) == (5, 0.25)  # a user's override reaches veRL's servers
    assert spec_overrides(recipe_config("spec=off").spec) == {}
    for train in ("frozen", "online"):
        mtp = spec_overrides(recipe_config("spec=mtp", f"spec.mtp.train={train}").spec)
        assert mtp["actor_rollout_ref.model.mtp.enable_rollout"] is True
        assert mtp["actor_rollout_ref.model.mtp.enable_train"] is (train == "online")
        if train == "frozen":  # the actor holds no head to sync: the servers load the checkpoint's
            assert mtp["actor_rollout_ref.rollout.load_format"] == "auto"
            assert "actor_rollout_ref.model.external_lib" not in mtp
        else:  # the FSDP actor's engine trains the head and syncs it to the servers
            assert mtp["actor_rollout_ref.model.external_lib"] == "mtp.verl_fsdp"
            assert "actor_rollout_ref.rollout.load_format" not in mtp
    # the hybrid: veRL's MTP rollout (method and K from model.mtp), the rest of the local engine's vLLM settings merged
    # over it by veRL (build_mtp_speculative_config), SAM's and the hybrid's options beside
    spec = recipe_config("spec=hybrid", "spec.sam.min_match=3").spec
    hybrid, (speculative, additional) = spec_overrides(spec), spec_from_config(spec)
    assert hybrid["actor_rollout_ref.model.mtp.enable_rollout"] is True
    assert hybrid["actor_rollout_ref.model.mtp.num_speculative_tokens"] == speculative["num_speculative_tokens"]
    for key in ("disable_padded_drafter_batch", "draft_sample_method"):
        assert hybrid[f"{vllm}.speculative_config.{key}"] == speculative[key]
    assert hybrid[f"{vllm}.additional_config"] == additional and additional["sam"]["min_match"] == 3


@pytest.mark.parametrize("spec", ["off", "ngram", "suffix", "sam", "mtp", "hybrid"])
def test_every_spec_composes_against_verl_schema(inputs, spec):
    extra = ["actor_rollout_ref.actor.strategy=megatron"] if spec == "mtp" else []
    _, v = composed(*inputs, f"spec={spec}", *extra)
    spec_cfg = v.actor_rollout_ref.rollout.engine_kwargs.vllm.get("speculative_config")
    assert (spec_cfg is None) == (spec == "off")
    assert v.actor_rollout_ref.model.mtp.enable is (spec in ("mtp", "hybrid"))
    if spec in ("mtp", "hybrid"):  # what veRL's MTP config leaves out: how the head drafts (and the hybrid's switch)
        assert "method" not in spec_cfg and spec_cfg.draft_sample_method
        assert spec_cfg.get("disable_padded_drafter_batch", False) is (spec == "hybrid")


def test_a_key_verl_does_not_have_is_named():
    from hydra.errors import ConfigCompositionException

    from recipe.dapo.config import apply_overrides

    with pytest.raises(ConfigCompositionException, match="no_such_key"):
        recipe_config("actor_rollout_ref.rollout.no_such_key=1")
    cfg = recipe_config()
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref\.rollout\.no_such_key: "):
        apply_overrides(cfg, {"actor_rollout_ref.rollout.no_such_key": 1})
    apply_overrides(cfg, {"+actor_rollout_ref.rollout.engine_kwargs.vllm.no_such_key": 1})  # "+": passed through
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.no_such_key == 1


DAPO_CLUSTER_BATCH = (  # veRL's DAPO recipe: 512 prompts x 16 responses a step, mini-batches of 32 prompts
    "data.train_batch_size=512", "data.gen_batch_size=1536", "actor_rollout_ref.rollout.n=16",
    "actor_rollout_ref.actor.ppo_mini_batch_size=32",
)  # fmt: skip


def test_dry_run_prints_and_saves_the_verl_config_and_job(inputs, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "recipe.dapo", *inputs, "backend=verl", "recipe.dry_run=true", "trainer.device=cuda",
         f"trainer.default_local_dir={out}", "trainer.nnodes=2", "trainer.n_gpus_per_node=8", *DAPO_CLUSTER_BATCH],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "-m verl.trainer.main_ppo" in proc.stdout and "2 node(s) x 8 cuda" in proc.stdout
    saved = OmegaConf.load(out / "verl_config.yaml")
    assert saved.trainer.nnodes == 2 and saved.algorithm.filter_groups.enable is True
    assert saved.actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config.method == "custom_class"
    assert "spec" not in saved and "recipe" not in saved and saved.trainer.experiment_name == "sam"
    launch = shlex.split((out / "verl_launch.sh").read_text().splitlines()[-1])
    assert launch[1:3] == ["-m", "verl.trainer.main_ppo"]
    assert f"--config-path={out}" in launch and "--config-name=verl_config" in launch
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
    # veRL's FSDP engine computes in mixed_precision.param_dtype (bfloat16 when unset), not in fsdp_config.dtype
    assert v.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == v.actor_rollout_ref.rollout.dtype
    assert v.actor_rollout_ref.rollout.dtype == "float32"


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
from recipe.dapo.job import run_job
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

    from recipe.dapo.job import JOB_ENV, job_processes

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
