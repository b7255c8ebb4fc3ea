"""The recipe's config: composition, veRL's keys, named errors for bad values, before any work starts."""

import dataclasses
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from recipe.dapo.config import ConfigError, validate

REPO = Path(__file__).resolve().parents[2]
CONFIGS = str(REPO / "configs")


def config(*overrides: str):
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        return compose(config_name="dapo", overrides=list(overrides))


def test_default_config_is_valid():
    cfg = config()
    validate(cfg)
    assert cfg.spec.method == "sam" and cfg.backend == "local"


def test_every_key_the_recipe_sets_outside_its_groups_is_a_verl_key():
    """configs/dapo.yaml sets veRL's keys and adds keys only in the recipe's groups (Hydra lets a config file add
    keys anywhere; a typo there would silently make a key nothing reads)."""
    import verl
    import yaml
    from hydra.core.global_hydra import GlobalHydra
    from verl.workers.config import FSDPEngineConfig

    from recipe.dapo.config import RECIPE_GROUPS, has_key, leaves

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        verl_cfg = compose(config_name="ppo_trainer")
    # veRL hands reward_kwargs to the reward manager as they are; mixed_precision is a dict field of its
    # FSDPEngineConfig, absent from its yaml, of which its FSDP engine reads three keys
    mixed = "actor_rollout_ref.actor.fsdp_config.mixed_precision."
    passed_through = ("reward.reward_kwargs", mixed)
    assert "mixed_precision" in {f.name for f in dataclasses.fields(FSDPEngineConfig)}

    recipe = yaml.safe_load((REPO / "configs" / "dapo.yaml").read_text())
    veRL_sections = {k: v for k, v in recipe.items() if k not in ("hydra", "defaults", *RECIPE_GROUPS)}
    set_keys = list(leaves(veRL_sections))
    assert len(set_keys) > 50
    unknown = [k for k in set_keys if not k.startswith(passed_through) and not has_key(verl_cfg, k)]
    assert not unknown, f"not veRL keys: {unknown}"
    precision = {k.removeprefix(mixed) for k in set_keys if k.startswith(mixed)}
    assert precision == {"param_dtype", "reduce_dtype", "buffer_dtype"}, precision


@pytest.mark.parametrize("spec", ["off", "ngram", "suffix", "sam", "mtp"])
def test_spec_groups_compose(spec):
    cfg = config(f"spec={spec}")
    validate(cfg)
    assert cfg.spec.method == spec


@pytest.mark.parametrize("spec", ["ngram", "suffix", "sam"])
def test_k_by_batch_size_schedule_reaches_vllms_speculative_config(spec):
    """The model-free methods take vLLM's K-by-batch schedule (both backends build vLLM's speculative_config with
    spec_from_config; SAM reads the key itself, sam.vllm.SAMProposer); left null, vLLM gets no key."""
    from recipe.engine import spec_from_config

    schedule = [[1, 16, 6], [17, 256, 2]]
    cfg = config(f"spec={spec}", f"spec.num_speculative_tokens_per_batch_size={schedule}".replace(" ", ""))
    validate(cfg)
    assert spec_from_config(cfg.spec)[0]["num_speculative_tokens_per_batch_size"] == schedule
    assert "num_speculative_tokens_per_batch_size" not in spec_from_config(config(f"spec={spec}").spec)[0]


def test_unknown_key_is_named():
    with pytest.raises(Exception, match="trainer.no_such_key"):
        config("trainer.no_such_key=1")


@pytest.mark.parametrize(
    "override, key",
    [
        ("actor_rollout_ref.actor.ppo_mini_batch_size=3", "actor_rollout_ref.actor.ppo_mini_batch_size"),
        ("actor_rollout_ref.rollout.n=1", "actor_rollout_ref.rollout.n"),
        ("actor_rollout_ref.model.path=/nonexistent/model", "actor_rollout_ref.model.path"),
        ("data.train_files=/nonexistent.parquet", "data.train_files"),
        ("reward.reward_kwargs.overlong_buffer_cfg.len=5000", "reward.reward_kwargs.overlong_buffer_cfg.len"),
        ("spec.sam.min_match=0", "spec.sam"),
        ("recipe.on_exhausted=maybe", "recipe.on_exhausted"),
        ("trainer.resume_mode=sometimes", "trainer.resume_mode"),
        ("backend=ray", "backend"),
        ("data.train_max_samples=0", "data.train_max_samples"),
        ("algorithm.filter_groups.metric=seq_reward", "algorithm.filter_groups.metric"),  # not a veRL V1 metric
        ("recipe.drift_probe.prompts=-1", "recipe.drift_probe.prompts"),
        ("actor_rollout_ref.rollout.val_kwargs.n=0", "actor_rollout_ref.rollout.val_kwargs.n"),
        ("trainer.logger=[console]", "trainer.logger"),  # metrics.jsonl is built from the file backend
        ("recipe.rl_prompts.max_terms=1", "recipe.rl_prompts.max_terms"),
        ("actor_rollout_ref.actor.optim.lr_scheduler_type=linear", "actor_rollout_ref.actor.optim.lr_scheduler_type"),
        ("spec.num_speculative_tokens_per_batch_size=[[2,8,4]]", "spec.num_speculative_tokens_per_batch_size"),
        ("spec.num_speculative_tokens_per_batch_size=[[1,8]]", "spec.num_speculative_tokens_per_batch_size"),
        ("actor_rollout_ref.model.lora_rank=16", "actor_rollout_ref.model.lora_rank"),  # the local actor has no LoRA
    ],
)
def test_bad_values_fail_before_work_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(config(override))


def test_spec_suffix_without_arctic_inference_names_the_make_target(monkeypatch):
    """`make demo` installs no arctic-inference (it builds from source; only spec=suffix drafts with it): a suffix
    run on such an install stops at start and says how to add it. None in sys.modules is how Python marks a module
    that cannot be imported."""
    import sys

    validate(config("spec=suffix"))
    monkeypatch.setitem(sys.modules, "arctic_inference", None)
    with pytest.raises(ConfigError, match=r"spec\.method: .*make install-suffix"):
        validate(config("spec=suffix"))


def test_sam_history_bound_must_hold_one_full_length_response():
    """A per-prompt history bound under one response of data.max_response_length (plus the lead tokens and the
    separator stored with it) would keep no history at all: an error naming the key, at the exact boundary."""
    one = ("data.max_response_length=100", "reward.reward_kwargs.overlong_buffer_cfg.len=20", "spec.sam.lead_tokens=3")
    validate(config(*one, "spec.sam.max_history_tokens=104"))
    with pytest.raises(ConfigError, match=r"spec\.sam\.max_history_tokens: must hold one response .* got 103"):
        validate(config(*one, "spec.sam.max_history_tokens=103"))
    validate(config(*one, "spec.sam.max_history_tokens=103", "spec.sam.cross_epoch=false"))  # no history kept


def test_cpu_trainer_keeps_freed_memory_for_reuse():
    """On glibc the trainer's mallopt calls succeed (each returns 1); elsewhere they are skipped, not faked."""
    import platform

    from recipe.dapo.policy import keep_freed_memory_on_cpu

    assert keep_freed_memory_on_cpu() is (platform.libc_ver()[0] == "glibc")


MEGATRON_MTP = ("spec=mtp", "backend=verl", "actor_rollout_ref.actor.strategy=megatron")  # veRL with a Megatron actor


def test_spec_mtp_lr_reaches_verls_optimizer_for_an_online_head_only():
    """veRL's optimizer config has one learning rate; the head's travels among its extra arguments, where
    mtp/verl_fsdp.py takes it out (a frozen head has no optimizer; an A/B hands both modes the same overrides)."""
    from mtp import MTP_LR_KEY
    from recipe.dapo.config import spec_overrides

    key = f"+actor_rollout_ref.actor.optim.override_optimizer_config.{MTP_LR_KEY}"
    assert spec_overrides(config("spec=mtp", "spec.mtp.lr=0.001").spec)[key] == 0.001
    assert key not in spec_overrides(config("spec=mtp").spec)
    assert key not in spec_overrides(config("spec=mtp", "spec.mtp.train=frozen", "spec.mtp.lr=0.001").spec)
    with pytest.raises(ConfigError, match=r"spec\.mtp\.lr"):
        validate(config("spec=mtp", "spec.mtp.lr=0"))
    validate(config(*MEGATRON_MTP))
    with pytest.raises(ConfigError, match=r"spec\.mtp\.lr.*Megatron"):
        validate(config(*MEGATRON_MTP, "spec.mtp.lr=0.001"))


def test_spec_mtp_lr_warmup_steps_travels_beside_the_heads_rate_and_is_checked():
    """The head's warm-up ramps its own rate, so it needs one (spec.mtp.lr) and travels beside it to mtp/verl_fsdp.py;
    a negative or fractional count, or a Megatron actor (its own optimizer), is refused naming the key."""
    from mtp import MTP_LR_WARMUP_KEY
    from recipe.dapo.config import spec_overrides

    key = f"+actor_rollout_ref.actor.optim.override_optimizer_config.{MTP_LR_WARMUP_KEY}"
    assert spec_overrides(config("spec=mtp", "spec.mtp.lr=0.001", "spec.mtp.lr_warmup_steps=4").spec)[key] == 4
    validate(config("spec=mtp", "spec.mtp.lr=0.001", "spec.mtp.lr_warmup_steps=4"))
    for bad in (("spec.mtp.lr_warmup_steps=-1", "spec.mtp.lr=0.001"), ("spec.mtp.lr_warmup_steps=1.5",
                "spec.mtp.lr=0.001"), ("spec.mtp.lr_warmup_steps=4",)):  # fmt: skip
        with pytest.raises(ConfigError, match=r"spec\.mtp\.lr_warmup_steps"):
            validate(config("spec=mtp", *bad))
    with pytest.raises(ConfigError, match=r"spec\.mtp\.lr_warmup_steps.*Megatron"):
        validate(config(*MEGATRON_MTP, "spec.mtp.lr=0.001", "spec.mtp.lr_warmup_steps=4"))


def test_spec_mtp_loss_sequence_fraction_reaches_the_fsdp_actors_model_config_and_is_checked():
    """The share of positions the online MTP loss trains on travels in the actor's HF config (veRL's override_config),
    where mtp/verl_fsdp.py's model reads it; outside (0, 1], or below 1 on a Megatron actor, it is refused."""
    from mtp import MTP_LOSS_FRACTION_KEY
    from recipe.dapo.config import spec_overrides

    key = f"+actor_rollout_ref.model.override_config.{MTP_LOSS_FRACTION_KEY}"
    assert spec_overrides(config("spec=mtp", "spec.mtp.loss_sequence_fraction=0.25").spec)[key] == 0.25
    assert key not in spec_overrides(config("spec=mtp", "spec.mtp.train=frozen").spec)
    for bad in ("0", "1.5"):
        with pytest.raises(ConfigError, match=r"spec\.mtp\.loss_sequence_fraction"):
            validate(config("spec=mtp", f"spec.mtp.loss_sequence_fraction={bad}"))
    with pytest.raises(ConfigError, match=r"spec\.mtp\.loss_sequence_fraction.*Megatron"):
        validate(config(*MEGATRON_MTP, "spec.mtp.loss_sequence_fraction=0.5"))


def test_spec_mtp_loss_vocab_topk_reaches_the_fsdp_actors_model_config_and_is_checked():
    """The online loss's vocabulary shortlist travels in the actor's HF config like the fraction; a negative or
    fractional k, or any k on a Megatron actor (whose loss is its own), is refused naming the key."""
    from mtp import MTP_VOCAB_TOPK_KEY
    from recipe.dapo.config import spec_overrides

    key = f"+actor_rollout_ref.model.override_config.{MTP_VOCAB_TOPK_KEY}"
    assert spec_overrides(config("spec=mtp", "spec.mtp.loss_vocab_topk=32").spec)[key] == 32
    assert spec_overrides(config("spec=mtp").spec)[key] == 0
    for bad in ("-1", "2.5"):
        with pytest.raises(ConfigError, match=r"spec\.mtp\.loss_vocab_topk"):
            validate(config("spec=mtp", f"spec.mtp.loss_vocab_topk={bad}"))
    with pytest.raises(ConfigError, match=r"spec\.mtp\.loss_vocab_topk.*Megatron"):
        validate(config(*MEGATRON_MTP, "spec.mtp.loss_vocab_topk=32"))


def test_spec_mtp_train_on_dropped_groups_is_refused_for_a_frozen_head_and_on_verl():
    """The head's steps on the groups dynamic filtering dropped run in the local trainer, which holds those groups:
    with a frozen head, or on backend=verl (whose trainer drops them before its actor sees them), the key is refused
    at start, named; so is a cap on their rows without the key, or below 0, and a top-p nucleus where their teacher
    comes from the rollout's log-probs (a shortlist)."""
    validate(config("spec=mtp", "spec.mtp.train_on_dropped_groups=true"))
    with pytest.raises(ConfigError, match=r"spec\.mtp\.train_on_dropped_groups.*online"):
        validate(config("spec=mtp", "spec.mtp.train=frozen", "spec.mtp.train_on_dropped_groups=true"))
    with pytest.raises(ConfigError, match=r"spec\.mtp\.train_on_dropped_groups.*backend=verl"):
        validate(config("backend=verl", "spec=mtp", "spec.mtp.train_on_dropped_groups=true"))
    validate(config("spec=mtp", "spec.mtp.train_on_dropped_groups=true", "spec.mtp.dropped_rows_per_step=16"))
    with pytest.raises(ConfigError, match=r"spec\.mtp\.dropped_rows_per_step.*train_on_dropped_groups"):
        validate(config("spec=mtp", "spec.mtp.dropped_rows_per_step=16"))
    with pytest.raises(ConfigError, match=r"spec\.mtp\.dropped_rows_per_step.*integer >= 0.*got -1"):
        validate(config("spec=mtp", "spec.mtp.train_on_dropped_groups=true", "spec.mtp.dropped_rows_per_step=-1"))
    validate(config("spec=mtp", "spec.mtp.train_on_dropped_groups=true", "spec.mtp.dropped_tokens_per_kept_token=0.5"))
    nucleus = ("spec=mtp", "spec.mtp.train_on_dropped_groups=true", "actor_rollout_ref.rollout.top_p=0.9")
    validate(config(*nucleus))  # the teacher over the whole vocabulary: any top_p
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.rollout\.top_p.*is 0\.9.*top_p=1\.0"):
        validate(config(*nucleus, "spec.mtp.loss_vocab_topk=32"))
    with pytest.raises(ConfigError, match=r"spec\.mtp\.dropped_tokens_per_kept_token.*train_on_dropped_groups"):
        validate(config("spec=mtp", "spec.mtp.dropped_tokens_per_kept_token=0.5"))
    for bad in ("-0.1", "half", "true"):
        with pytest.raises(ConfigError, match=r"spec\.mtp\.dropped_tokens_per_kept_token.*number >= 0.*got"):
            validate(
                config(
                    "spec=mtp", "spec.mtp.train_on_dropped_groups=true", f"spec.mtp.dropped_tokens_per_kept_token={bad}"
                )
            )


def test_spec_mtp_objective_reaches_the_fsdp_actors_model_config_and_is_checked():
    """What the online MTP loss matches travels in the actor's HF config like the sequence share; a value the loss
    does not know, or distill / acceptance on a Megatron actor (whose head trains on the sampled token), is refused
    at start."""
    from mtp import MTP_OBJECTIVE_KEY
    from recipe.dapo.config import spec_overrides

    key = f"+actor_rollout_ref.model.override_config.{MTP_OBJECTIVE_KEY}"
    assert spec_overrides(config("spec=mtp", "spec.mtp.objective=distill").spec)[key] == "distill"
    assert spec_overrides(config("spec=mtp").spec)[key] == "sampled"
    with pytest.raises(ConfigError, match=r"spec\.mtp\.objective.*'kl'"):
        validate(config("spec=mtp", "spec.mtp.objective=kl"))
    validate(config(*MEGATRON_MTP))
    for objective in ("distill", "acceptance"):
        validate(config("spec=mtp", f"spec.mtp.objective={objective}"))
        with pytest.raises(ConfigError, match=r"spec\.mtp\.objective.*Megatron"):
            validate(config(*MEGATRON_MTP, f"spec.mtp.objective={objective}"))


def test_verls_cpu_weight_bucket_holds_the_largest_tensor(tmp_path):
    """veRL's CPU weight sync refuses a tensor larger than its /dev/shm bucket: a real vocabulary's float32 embedding
    table (SmolLM2: 49,152 x 576 x 4 B = 108 MiB) needs a larger bucket than the embedded model's 64 MiB."""
    import json

    from recipe.dapo.verl_backend import weight_bucket_megabytes

    for name, vocab, hidden, expected in (("embedded", 320, 128, 64), ("smollm2", 49152, 576, 128)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"vocab_size": vocab, "hidden_size": hidden}))
        assert weight_bucket_megabytes(str(tmp_path / name)) == expected
    assert weight_bucket_megabytes(str(tmp_path / "not_built")) == 64


def test_the_ab_configuration_file_sets_existing_keys_to_its_values():
    """configs/ab/earlier_default.yaml reaches the composed config key by key (a misspelled key stops composition,
    and every mode of an A/B composes it the same way)."""
    from omegaconf import OmegaConf

    from recipe.ab.runner import EARLIER_DEFAULT, MODES, config_overrides

    overrides = config_overrides(EARLIER_DEFAULT)
    assert "actor_rollout_ref.actor.optim.lr_scheduler_type=constant" in overrides and len(overrides) == 10
    for mode in ("off", "sam", "sam_own"):
        cfg = config(*overrides, *MODES[mode])
        validate(cfg)
        for item in overrides:
            key, value = item.split("=", 1)
            assert str(OmegaConf.select(cfg, key)) == value, key
    assert config(*MODES["sam"]).spec.sam == config().spec.sam  # "sam" is the recipe's default drafter
    own = config(*MODES["sam_own"]).spec.sam
    assert not own.group_sharing and not own.cross_epoch


def test_lora_is_left_to_verls_actor():
    """veRL's FSDP actor takes actor_rollout_ref.model.lora_rank (peft); the local actor refuses it at start."""
    validate(config("backend=verl", "actor_rollout_ref.model.lora_rank=16"))
    with pytest.raises(ConfigError, match=r"lora_rank: is 16, but the local backend"):
        validate(config("actor_rollout_ref.model.lora_rank=16"))


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (Path(CONFIGS) / "experiment").glob("*.yaml")))
def test_every_experiment_composes_and_validates(experiment, tmp_path):
    """An experiment file's values pass the start-up checks, and the keys it sets under ``spec.mtp`` are the group's
    own: Hydra adds a key a file misspells instead of refusing it, so a typo would be ignored for a whole run. The
    checkpoint an experiment names is built by a script (not in a fresh clone): a stand-in with an MTP layer here."""
    (tmp_path / "config.json").write_text('{"architectures": ["MiMoForCausalLM"], "num_nextn_predict_layers": 1}')
    cfg = config(f"+experiment={experiment}", f"actor_rollout_ref.model.path={tmp_path}")
    validate(cfg)
    if cfg.spec.method == "mtp":
        assert set(cfg.spec.mtp) == set(config("spec=mtp").spec.mtp), experiment


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (Path(CONFIGS) / "experiment").glob("*.yaml")))
def test_every_experiment_resolves_with_every_spec_method(experiment):
    """An A/B runs an experiment with each ``spec=``: every value must resolve whatever group the method brings
    (an experiment's run name that interpolated ``spec.mtp.*`` failed for the methods without a head), and the
    start-up check of the overrides must pass."""
    from omegaconf import OmegaConf

    from recipe.dapo.config import SPEC_METHODS, check_overrides

    for method in SPEC_METHODS:
        overrides = [f"+experiment={experiment}", f"spec={method}"]
        cfg = config(*overrides)
        OmegaConf.to_container(cfg, resolve=True)
        assert check_overrides(cfg, overrides, cfg, {"spec", "experiment"}) == []


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.total_training_steps=abc", "trainer.total_training_steps: expected an integer, got 'abc'"),
        ("trainer.total_training_steps=1.5", "trainer.total_training_steps: expected an integer, got 1.5"),
        ("actor_rollout_ref.rollout.temperature=abc", "actor_rollout_ref.rollout.temperature: expected a number"),
        ("trainer.val_before_train=1", "trainer.val_before_train: expected a boolean (true or false), got 1"),
        ("spec.sam.min_match=two", "spec.sam.min_match: expected an integer, got 'two'"),
    ],
)
def test_a_value_of_the_wrong_type_is_named_with_key_value_and_type(override, message):
    from recipe.dapo.config import check_overrides

    with pytest.raises(ConfigError) as err:
        check_overrides(config(override), [override], config(), {"spec", "experiment"})
    assert str(err.value).startswith(message)


def test_values_of_the_right_type_pass_and_groups_and_open_maps_are_not_flagged():
    from recipe.dapo.config import check_overrides

    overrides = [
        "actor_rollout_ref.rollout.temperature=1",  # an integer where a float is wanted
        "trainer.total_training_steps=3",
        "actor_rollout_ref.model.path=null",
        "spec=mtp",
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.max_num_batched_tokens=64",  # veRL passes this map on whole
        "trainer.nnodes=${oc.env:SPEC_ROLLOUT_TEST_NODES}",  # an interpolation: a string until resolved, unchecked
    ]
    assert check_overrides(config(*overrides), overrides, config("spec=mtp"), {"spec", "experiment"}) == []


def test_a_plus_key_that_nothing_reads_is_a_warning_naming_it():
    from recipe.dapo.config import check_overrides

    overrides = ["+trainer.totl_training_steps=3", "+foo.bar=1"]
    warnings = check_overrides(config(*overrides), overrides, config(), {"spec", "experiment"})
    assert [w.split(": ")[1] for w in warnings] == ["+trainer.totl_training_steps", "+foo.bar"]
