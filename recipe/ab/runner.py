"""Running a seeded A/B: every mode the same config, data and seed, in its own ``python -m recipe.dapo`` process.

A crash of one mode loses nothing of the others, and a rerun resumes a killed mode from its checkpoint and skips
finished ones. Modes take turns in chunks of training steps, each chunk resuming the mode's run from its checkpoint
(a resumed run logs what an uninterrupted one would), so that slow and fast spells of a shared machine fall on every
mode alike instead of on whichever mode ran during them. With several seeds each seed is an A/B of its own
(``data.seed``: the data order, the rollout engine's sampling and, on backend=local, the policy's RNGs), its runs under
``seed<s>/``, taking turns with the others' chunk by chunk.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from recipe.dapo.run_dir import read_history
from recipe.paths import REPO_ROOT

EARLIER_DEFAULT = REPO_ROOT / "configs" / "ab" / "earlier_default.yaml"

MODES: dict[str, list[str]] = {  # mode name -> the Hydra overrides that select it
    "off": ["spec=off"],
    "ngram": ["spec=ngram"],  # vLLM's n-gram drafter
    "suffix": ["spec=suffix"],  # Arctic Inference's suffix decoding, as vLLM ships it
    "sam": ["spec=sam"],  # the recipe's default drafter (configs/spec/sam.yaml: own text, siblings, earlier epochs,
    # every prompt's responses; each request's source picked by the payoff rule's learned chances by evidence level)
    "sam_own": ["spec=sam", "spec.sam.group_sharing=false", "spec.sam.cross_epoch=false"],  # own text only
    "sam_every": ["spec=sam", "spec.sam.payoff=false"],  # the default without the payoff rule: every draft it finds
    "sam_eager": ["spec=sam", "spec.sam.defer_idle=false"],  # the default working every step where nothing can pay
    # the longest match, no corpus of every prompt's responses (the default before scored drafting)
    "sam_longest": ["spec=sam", "spec.sam.scored=false", "spec.sam.global_sharing=false"],
    "mtp_frozen": ["spec=mtp", "spec.mtp.train=frozen"],
    "mtp_online": ["spec=mtp", "spec.mtp.train=online"],
    "hybrid": ["spec=hybrid"],  # SAM and the online MTP head in one engine, chosen per request (sam/hybrid.py)
}

HEAD_MODES = ("mtp_frozen", "mtp_online", "hybrid")  # the modes that draft with the MTP head


def base_mode(mode: str) -> str | None:
    """The mode a run name selects: a mode of :data:`MODES`, or ``<mode>-<n>`` (n >= 2), a further run of that mode
    (an A/A control: the spread between two runs of one mode is what the machine's noise alone moves); None if
    neither."""
    name, _, copy = mode.rpartition("-")
    if name in MODES and copy.isdigit() and int(copy) >= 2:
        return name
    return mode if mode in MODES else None


def modes_on_disk(root: Path) -> list[str]:
    """The run names under an A/B's (or one seed's) folder, in :data:`MODES`' order, each mode's further runs after it."""
    names = [p.name for p in root.iterdir() if p.is_dir() and base_mode(p.name)] if root.is_dir() else []
    order = list(MODES)
    return sorted(names, key=lambda n: (order.index(base_mode(n)), len(n), n))


def seed_dir(root: Path, seed: int | None) -> Path:
    """Where an A/B's runs of one seed go: ``<root>``, or ``<root>/seed<s>`` in a multi-seed A/B."""
    return root if seed is None else root / f"seed{seed}"


def run_dir_of(root: Path, mode: str, seed: int | None) -> Path:
    """Where a mode's run of an A/B goes: ``<root>/<mode>``, or ``<root>/seed<s>/<mode>`` in a multi-seed A/B."""
    return seed_dir(root, seed) / mode


def seeds_on_disk(root: Path) -> list[int]:
    """The seeds a multi-seed A/B has runs of (its ``seed<s>/`` folders), ascending; [] for a single-seed A/B."""
    return sorted(int(p.name.removeprefix("seed")) for p in root.glob("seed*") if p.name[4:].isdigit())


def earlier_default() -> list[str]:
    """configs/ab/earlier_default.yaml as Hydra overrides, after the embedded base model's SFT train split (built once
    if missing) as ``data.train_files``."""
    from recipe.sft.train import ensure_base_model

    train = ensure_base_model(OmegaConf.load(REPO_ROOT / "configs" / "sft.yaml")).parent / "data" / "train.parquet"
    return [f"data.train_files={train}", *config_overrides(EARLIER_DEFAULT)]


def config_overrides(path: Path) -> list[str]:
    """A YAML file of recipe config keys as Hydra overrides (``a.b.c=value``)."""

    def dotted(tree: dict, prefix: str = "") -> list[str]:
        return [
            item
            for key, value in tree.items()
            for item in (dotted(value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}={value}"])
        ]

    return dotted(OmegaConf.to_container(OmegaConf.load(path)))


def composed(overrides: list[str]) -> DictConfig:
    """The recipe's config with ``overrides``, as ``python -m recipe.dapo`` composes it."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base=None):
        return compose(config_name="dapo", overrides=overrides)


def chunk_ends(steps: int, chunk_steps: int) -> list[int]:
    """The step each turn of a mode runs to: every ``chunk_steps`` steps, and the last (``chunk_steps <= 0``: all
    at once)."""
    if chunk_steps <= 0:
        return [steps]
    return [*range(chunk_steps, steps, chunk_steps), steps]


def turn_warnings(steps: int, chunk_steps: int, test_freq: int, save_freq: int) -> list[str]:
    """What turns of ``chunk_steps`` add to an uninterrupted run: the trainer evaluates and checkpoints at its last
    step, so a turn that ends between ``trainer.test_freq`` (``save_freq``) steps adds an evaluation (a checkpoint)."""
    ends = chunk_ends(steps, chunk_steps)[:-1]
    out = []
    for key, freq, work in (("test_freq", test_freq, "evaluation"), ("save_freq", save_freq, "checkpoint")):
        extra = [end for end in ends if freq <= 0 or end % freq]
        if extra:
            out.append(
                f"[ab] warning: --chunk-steps {chunk_steps} is not a multiple of trainer.{key}={freq}: every mode "
                f"does an extra {work} at step(s) {extra} (slower, and its time is in those steps' step time)"
            )
    return out


def run_modes(
    name: str, modes: list[str], overrides: list[str], runs_root: Path, chunk_steps: int, seeds: list[int] | None = None
) -> None:
    """Each mode (of each seed) in its own ``python -m recipe.dapo`` process, runs taking turns chunk by chunk;
    finished runs are skipped, killed ones resume. ``seeds``: one A/B per seed (``data.seed``), under ``seed<s>/``;
    None: one A/B at the config's seed."""
    cfg = composed([*overrides, *MODES[base_mode(modes[0])]])  # with a mode's spec group, which overrides may set
    steps = int(cfg.trainer.total_training_steps)
    optim = cfg.actor_rollout_ref.actor.optim
    if cfg.backend == "verl" and len(chunk_ends(steps, chunk_steps)) > 1 and optim.lr_scheduler_type != "constant":
        raise SystemExit(
            "[ab] veRL's trainer spans the learning-rate schedule over each turn's trainer.total_training_steps, so "
            "turns would change a cosine schedule: run backend=verl A/Bs with --chunk-steps 0 or "
            "actor_rollout_ref.actor.optim.lr_scheduler_type=constant"
        )
    for warning in turn_warnings(steps, chunk_steps, int(cfg.trainer.test_freq), int(cfg.trainer.save_freq)):
        print(warning, file=sys.stderr, flush=True)
    overrides = [o for o in overrides if not o.startswith("trainer.total_training_steps=")]
    if seeds is not None:
        overrides = [o for o in overrides if not o.startswith("data.seed=")]
    pending = []
    for seed in seeds if seeds is not None else [None]:
        for mode in modes:
            label = mode if seed is None else f"{mode} (seed {seed})"
            run_dir = run_dir_of(runs_root / name, mode, seed)
            done = read_history(run_dir)
            if done and done[-1]["step"] >= steps:
                print(f"[ab] {label}: finished ({steps} steps) in {run_dir}, skipped", flush=True)
            else:
                pending.append((mode, seed, label, run_dir))
    for end in chunk_ends(steps, chunk_steps):
        for mode, seed, label, run_dir in pending:
            done = read_history(run_dir)
            if done and done[-1]["step"] >= end:
                continue
            args = [
                *overrides,
                *MODES[base_mode(mode)],
                *([] if seed is None else [f"data.seed={seed}"]),
                f"trainer.total_training_steps={end}",
                f"actor_rollout_ref.actor.optim.total_training_steps={steps}",  # the whole run's lr schedule
                f"trainer.default_local_dir={run_dir}",
                # Hydra's copy of the composed config, which the tables read (recipe.ab.render; the recipe's own
                # runs keep none)
                f"hydra.run.dir={run_dir}/hydra",
                "hydra.output_subdir=.hydra",
                f"trainer.experiment_name={mode if seed is None else f'{mode}-seed{seed}'}",
                "trainer.resume_mode=auto",
            ]
            print(f"[ab] {label}: python -m recipe.dapo {' '.join(args)}", flush=True)
            proc = subprocess.run([sys.executable, "-m", "recipe.dapo", *args], cwd=REPO_ROOT)
            if proc.returncode != 0:
                raise SystemExit(f"[ab] {label} failed (exit {proc.returncode}); rerun the same command to resume")
