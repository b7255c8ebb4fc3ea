"""The DAPO loop of the local backend (one machine, CPU or one GPU).

Per step: generation rounds of ``gen_batch_size`` prompts x ``n`` samples on the vLLM engine, DAPO reward
(veRL's DAPORewardManager: math_dapo rule score + overlong buffer), dynamic filtering of zero-variance
groups until ``train_batch_size`` groups are kept, GRPO advantage and the DAPO policy loss from
``verl.trainer.ppo.core_algos`` (clip-higher, token-mean) on the in-process torch policy, the online MTP
loss when ``spec.mtp.train=online``, then the weights (trunk and MTP layer) are synced into the engine.
Metrics use veRL's names and go through ``verl.utils.tracking.Tracking``.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from mtp.checkpoint import load_checkpoint, save_checkpoint
from recipe.dapo.batch import (
    ROLLOUT_TEACHER_KEYS,
    RewardFunction,
    build_batch,
    kept_groups,
    select_groups,
    spread_rows,
)
from recipe.dapo.canary import AcceptanceCanary, counts_since
from recipe.dapo.data import PromptStream, load_prompts
from recipe.dapo.drift import DriftProbe, load_or_sample_probe
from recipe.dapo.policy import Actor
from recipe.dapo.report import PROBE_PREFIX, plot_run, step_line
from recipe.dapo.rollout import Rollout, rollout_engine
from recipe.dapo.run_dir import (
    TRACKING_PREFIX,
    checkpoint_dir,
    latest_step,
    merge_tracking,
    prune_checkpoints,
    set_latest_step,
    tracking_path,
    write_history,
)
from recipe.dapo.timeline import step_rollout_metrics, timed, timeline_path
from recipe.engine import head_draft_depth
from recipe.evaluate import by_data_source

logger = logging.getLogger(__name__)


class TrainingDataExhaustedWarning(UserWarning):
    """Dynamic filtering hit max_num_gen_batches before train_batch_size groups were kept."""


def _rows(max_samples: int) -> int | None:
    """veRL's ``data.*_max_samples``: -1 is all rows."""
    return None if max_samples < 0 else int(max_samples)


class DAPOTrainer:
    """The local loop over the recipe's parts. ``cfg`` is the recipe's config (veRL's keys plus the recipe's
    groups); ``verl_cfg`` is veRL's config of the run (``config.verl_config``), which names the inputs and
    configures the reward exactly as veRL's trainer gets it on backend=verl."""

    def __init__(self, cfg: DictConfig, verl_cfg: DictConfig):
        self.cfg, self.options = cfg, cfg.recipe
        self.out_dir = Path(verl_cfg.trainer.default_local_dir)
        self.validation_dir = verl_cfg.trainer.validation_data_dir
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.seed = int(cfg.data.seed)
        self._seed_everything(self.seed)
        model_path = verl_cfg.actor_rollout_ref.model.path

        self.actor = Actor(
            load_checkpoint(model_path, dtype=torch.float32), cfg, head_draft_depth(cfg.spec, model_path)
        )
        self.policy = self.actor.policy

        self.engine: Rollout = rollout_engine(cfg, model_path, self.actor.rollout_teacher_topk)
        ro, data = cfg.actor_rollout_ref.rollout, cfg.data
        self.tokenizer = self.engine.tokenizer
        problems, prompt_ids = load_prompts(
            verl_cfg.data.train_files, self.tokenizer, data.max_prompt_length, max_rows=_rows(data.train_max_samples)
        )
        self.stream = PromptStream(problems, prompt_ids, self.seed, data.shuffle)
        self.val_problems, self.val_prompt_ids = load_prompts(
            verl_cfg.data.val_files, self.tokenizer, data.max_prompt_length, max_rows=_rows(data.val_max_samples)
        )
        probe = self.options.train_probe
        self.probe_problems = problems[: int(probe.prompts)] if probe.prompts > 0 else []
        self.model_path = model_path
        self.drift: DriftProbe | None = None
        self.reward = RewardFunction(verl_cfg)
        self.sampling = {"temperature": ro.temperature, "top_p": ro.top_p, "max_tokens": data.max_response_length}
        self.global_step = 0
        self.tracking = None  # veRL's Tracking, made in fit once the step it starts at is known
        self.canary = AcceptanceCanary()  # each draft source's acceptance across weight syncs

    # -- set-up ---------------------------------------------------------------------------------------

    def _seed_everything(self, seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed % (2**32))
        torch.manual_seed(seed)

    def _make_tracking(self):
        from verl.utils.tracking import Tracking

        backends = list(self.cfg.trainer.logger)
        if "wandb" in backends and not os.environ.get("WANDB_API_KEY") and not Path.home().joinpath(".netrc").exists():
            os.environ.setdefault("WANDB_MODE", "offline")
        os.environ["VERL_FILE_LOGGER_PATH"] = str(tracking_path(self.out_dir, self.global_step))
        os.environ.setdefault("WANDB_DIR", str(self.out_dir))
        return Tracking(
            project_name=self.cfg.trainer.project_name,
            experiment_name=self.cfg.trainer.experiment_name,
            default_backend=backends,
            config=OmegaConf.to_container(self.cfg, resolve=True),
        )

    # -- checkpoints ----------------------------------------------------------------------------------

    def save(self) -> Path:
        """``global_step_N/`` in the run directory (as veRL): fp32 HF policy, optimizer and its schedule, cursor,
        RNG, drafter memory and the acceptance canary's levels."""
        path = checkpoint_dir(self.out_dir, self.global_step)
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_checkpoint(self.policy, self.tokenizer, tmp / "actor", dtype=torch.float32)
        state = {
            "global_step": self.global_step,
            "optimizer": self.actor.optimizer.state_dict(),
            "lr_scheduler": self.actor.lr_scheduler.state_dict(),
            "cursor": (self.stream.cursor.epoch, self.stream.cursor.position),
            "torch_rng": torch.get_rng_state(),
            "numpy_rng": np.random.get_state(),
            "python_rng": random.getstate(),
            "drafter_state": self.engine.drafter_state(),
            "canary_level": self.canary.level,
        }
        torch.save(state, tmp / "trainer_state.pt")
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)
        set_latest_step(self.out_dir, self.global_step)
        prune_checkpoints(self.out_dir, self.cfg.trainer.max_actor_ckpt_to_keep)
        return path

    def try_resume(self) -> bool:
        step = latest_step(self.out_dir)
        if self.cfg.trainer.resume_mode != "auto" or step == 0:
            return False
        path = checkpoint_dir(self.out_dir, step)
        resumed = load_checkpoint(path / "actor", dtype=torch.float32)
        self.policy.load_state_dict(resumed.state_dict())
        state = torch.load(path / "trainer_state.pt", weights_only=False)
        self.actor.optimizer.load_state_dict(state["optimizer"])
        self.actor.lr_scheduler.load_state_dict(state["lr_scheduler"])
        self.stream.cursor.epoch, self.stream.cursor.position = state["cursor"]
        torch.set_rng_state(state["torch_rng"])
        np.random.set_state(state["numpy_rng"])
        random.setstate(state["python_rng"])
        if state.get("drafter_state") is not None:
            self.engine.load_drafter_state(state["drafter_state"])
        self.canary.level = state.get("canary_level", {})
        self.global_step = state["global_step"]
        logger.info("resumed from %s (step %d)", path, self.global_step)
        return True

    # -- one step -------------------------------------------------------------------------------------

    def collect(self, timing: dict[str, float]) -> tuple[object, object, dict[str, float]]:
        """Generation rounds with DAPO dynamic filtering until ``train_batch_size`` groups are kept. Returns the kept
        batch, the responses it leaves out when the online head trains on them (``spec.mtp.train_on_dropped_groups``: the
        dropped groups and any kept beyond ``train_batch_size``, with the trunk states the rollout computed for them, at
        most ``spec.mtp.dropped_rows_per_step`` of them and ``spec.mtp.dropped_tokens_per_kept_token`` response tokens per
        token of the kept batch; else None), and the rounds' metrics."""
        from verl import DataProto

        cfg = self.cfg
        fg = cfg.algorithm.filter_groups
        n = cfg.actor_rollout_ref.rollout.n
        want = cfg.data.train_batch_size
        metric = str(fg.metric)
        kept_batch, kept, left_out = None, 0, []
        drafts_before = self.engine.draft_counts()
        rounds: list[dict] = []
        scores_all = []
        while True:
            r = len(rounds) + 1
            problems, prompt_ids = self.stream.next(cfg.data.gen_batch_size)
            uids = [f"s{self.global_step}r{r}p{i}" for i in range(len(problems))]
            seed = hash((int(cfg.actor_rollout_ref.rollout.seed), self.global_step, r)) % (2**31)
            self.engine.reseed(seed)
            start = time.perf_counter()
            with timed(timing, "gen"):
                result = self.engine.generate(
                    prompt_ids,
                    n,
                    self.sampling,
                    progress=bool(self.options.progress_bar),
                    keep_trunk_states=self.actor.head_trains_on_dropped,
                    teacher_topk=self.actor.rollout_teacher_topk,
                )
            gen_s = time.perf_counter() - start
            with timed(timing, "reward"):
                batch = build_batch(
                    result.responses,
                    problems,
                    uids,
                    self.tokenizer.pad_token_id,
                    cfg.data.max_prompt_length,
                    cfg.data.max_response_length,
                )
                self.reward(batch)
            scores_all.append(batch.non_tensor_batch["score"].astype(float))
            keep = kept_groups(batch, metric) if fg.enable else list(dict.fromkeys(uids))
            tl = result.timeline.summary(int(self.options.long_tail_threshold))
            rounds.append({"gen_s": gen_s, "kept": len(keep), "groups": len(problems), **tl})
            self._save_timeline(result.timeline, r)
            if self.actor.head_trains_on_dropped:  # the head's data: the groups filtering drops
                kept_uids = set(keep)
                dropped = [uid for uid in uids if uid not in kept_uids]
                if dropped:
                    left_out.append(select_groups(batch, dropped))
            if keep:
                batch = select_groups(batch, keep)
                kept_batch = batch if kept_batch is None else DataProto.concat([kept_batch, batch])
                kept += len(keep)
            if not fg.enable or kept >= want:
                break
            if fg.max_num_gen_batches > 0 and r >= fg.max_num_gen_batches:
                if self.options.on_exhausted == "error":
                    raise ValueError(
                        f"num_gen_batches={r} >= max_num_gen_batches={fg.max_num_gen_batches} with {kept} of "
                        f"{want} groups kept. Please check if your data are too difficult. You could also try "
                        "set algorithm.filter_groups.max_num_gen_batches=0 to enable endless trials."
                    )
                warnings.warn(
                    f"step {self.global_step}: kept {kept} of {want} groups after {r} generation rounds "
                    f"(algorithm.filter_groups.max_num_gen_batches); training on what was kept",
                    TrainingDataExhaustedWarning,
                    stacklevel=2,
                )
                break
        if kept_batch is not None and kept > want:
            if self.actor.head_trains_on_dropped:
                left_out.append(kept_batch[want * n :])
            kept_batch = kept_batch[: want * n]
        if kept_batch is not None:  # the update runs the trunk over its rows anyway
            for key in ROLLOUT_TEACHER_KEYS:
                kept_batch.non_tensor_batch.pop(key, None)
        stats = self._round_metrics(rounds, np.concatenate(scores_all))
        # the step's rollouts, all after the sync that ended the step before
        stats.update(self.canary.check(self.global_step, counts_since(drafts_before, self.engine.draft_counts())))
        if not left_out:
            return kept_batch, None, stats
        left_out = DataProto.concat(left_out)
        stats["mtp/left_out_responses"] = float(len(left_out))
        if kept_batch is None:  # no update this step, so no head steps either
            return None, None, stats
        rng = np.random.default_rng((int(cfg.actor_rollout_ref.rollout.seed), self.global_step))
        max_tokens = float(cfg.spec.mtp.dropped_tokens_per_kept_token) * int(kept_batch.batch["attention_mask"].sum())
        head_rows = spread_rows(left_out, rng, cfg.spec.mtp.dropped_rows_per_step, max_tokens)
        return kept_batch, head_rows if len(head_rows) else None, stats

    def _save_timeline(self, timeline, round_index: int) -> None:
        folder = self.out_dir / "timelines"
        folder.mkdir(exist_ok=True)
        timeline.save(timeline_path(folder, self.global_step, round_index))

    def _round_metrics(self, rounds: list[dict], scores: np.ndarray) -> dict[str, float]:
        m = {
            "train/num_gen_batches": len(rounds),
            "train/num_kept_groups": sum(r["kept"] for r in rounds),
            "train/num_generated_groups": sum(r["groups"] for r in rounds),
            "train/gen_score_mean": float(scores.mean()),
            **step_rollout_metrics(rounds),
            "timing_s/gen_round_mean": float(np.mean([r["gen_s"] for r in rounds])),
        }
        for i, r in enumerate(rounds):
            m[f"timing_s/gen_round_{i + 1}"] = r["gen_s"]
        return m

    def validate(self) -> dict[str, float]:
        """Held-out accuracy as veRL evaluates it (``rollout.val_kwargs``: mean@n, sampled as in rollouts), greedy
        accuracy too when that is sampled, and the sampled accuracy on the fixed training probe (the per-step
        training reward mixes policy change with the difficulty of whatever prompts came up). Every held-out
        sample goes to ``trainer.validation_data_dir`` in veRL's format, the greedy ones under ``greedy/``."""
        max_tokens = self.cfg.data.max_response_length
        vk = self.cfg.actor_rollout_ref.rollout.val_kwargs
        # (accuracy metric, length metric, dump sub-folder, samples per problem, temperature, top_p)
        passes = [(f"mean@{vk.n}", "mean", "", int(vk.n), float(vk.temperature) if vk.do_sample else 0.0, vk.top_p)]
        if vk.do_sample:
            passes.append(("greedy", "greedy", "greedy", 1, 0.0, 1.0))
        metrics = {}
        for acc_name, length_name, subdir, n, temperature, top_p in passes:
            res = self.engine.evaluate(self.val_problems, n, temperature, float(top_p), max_tokens)
            for source, (accuracy, length) in by_data_source(res).items():
                metrics[f"val-core/{source}/acc/{acc_name}"] = accuracy
                metrics[f"val-aux/{source}/response_length/{length_name}"] = length
            self._dump_validation(res.samples, subdir)
        if self.probe_problems:
            ro, n = self.cfg.actor_rollout_ref.rollout, int(self.options.train_probe.n)
            probe = self.engine.evaluate(self.probe_problems, n, ro.temperature, ro.top_p, max_tokens)
            metrics[f"{PROBE_PREFIX}/acc/mean@{n}"] = probe.pass_at_1
            metrics[f"{PROBE_PREFIX}/response_length/mean"] = probe.mean_response_tokens
        return metrics

    def drift_metrics(self) -> dict[str, float]:
        return self.drift.measure(self.policy) if self.drift is not None else {}

    def _dump_validation(self, samples: list[dict], subdir: str) -> None:
        """veRL's writer of validation generations (``<validation_data_dir>/<step>.jsonl``), as its trainer calls it."""
        folder = self.validation_dir
        if not folder:
            return
        from verl.trainer.ppo.ray_trainer import RayPPOTrainer

        columns = {k: [s[k] for s in samples] for k in samples[0]}
        extra = {k: v for k, v in columns.items() if k not in ("input", "output", "gts", "score")}
        RayPPOTrainer._write_generations(
            columns["input"], columns["output"], columns["gts"], columns["score"], extra,
            str(Path(folder, subdir)), self.global_step,
        )  # fmt: skip

    def make_drift_probe(self) -> DriftProbe | None:
        """``recipe.drift_probe``: the starting policy's responses to the first validation problems, sampled by the
        engine while it still holds the starting weights (before a resumed run's sync), and the starting policy."""
        probe = self.options.drift_probe
        if probe.prompts <= 0:
            return None

        def sample() -> list[dict]:
            self.engine.reseed(self.seed)
            prompts = self.val_prompt_ids[: int(probe.prompts)]
            result = self.engine.generate(prompts, int(probe.n), self.sampling)
            return [{"prompt": r.prompt_ids, "response": r.token_ids} for r in result.responses]

        sequences = load_or_sample_probe(self.out_dir, sample)
        start = load_checkpoint(self.model_path, dtype=torch.float32)
        return DriftProbe(start, sequences, float(self.cfg.actor_rollout_ref.rollout.temperature))

    def fit(self) -> list[dict]:
        from verl.trainer.ppo.metric_utils import (
            compute_data_metrics,
            compute_throughout_metrics,
            compute_timing_metrics,
        )

        tr = self.cfg.trainer
        self.drift = self.make_drift_probe()
        resumed = self.try_resume()
        self.engine.sync_weights(self.policy.state_dict())
        if not resumed:  # a fresh run in a used directory: earlier runs' launches are not part of its history
            for stale in self.out_dir.glob(f"{TRACKING_PREFIX}*.jsonl"):
                stale.unlink()
        self.tracking = self._make_tracking()  # a resumed run's earlier launches stay; the merge supersedes them
        history = merge_tracking(self.out_dir)
        total = int(tr.total_training_steps)

        def record(step: int, metrics: dict[str, float]) -> None:
            """One row of metrics to veRL's Tracking backends, and metrics.jsonl: the merge of the tracking files
            at the start of this launch plus the rows this launch's file has received since (kept in memory)."""
            self.tracking.log(data=metrics, step=step)
            history.append({"step": step, **metrics})
            write_history(self.out_dir, history)

        from tqdm import tqdm

        if tr.val_before_train and not resumed:
            record(0, {k: float(v) for k, v in {**self.validate(), **self.drift_metrics()}.items()})
            tqdm.write(step_line(0, total, history[-1]))

        bar = tqdm(
            range(self.global_step + 1, total + 1),
            desc="dapo",
            disable=not self.options.progress_bar,
            dynamic_ncols=True,
        )
        for step in bar:
            self.global_step = step
            timing: dict[str, float] = {}
            metrics: dict[str, float] = {}
            with timed(timing, "step"):
                batch, left_out, round_metrics = self.collect(timing)
                metrics.update(round_metrics)
                if batch is None:
                    warnings.warn(
                        f"step {step}: no group with reward variance; skipping the update",
                        TrainingDataExhaustedWarning,
                        stacklevel=2,
                    )
                else:
                    self.engine.sleep()
                    if left_out is not None and self.actor.head_trains_on_dropped:
                        metrics.update(self.actor.train_head(left_out, timing))
                    metrics.update(self.actor.update(batch, timing))
                    self.engine.wake_up()
                    with timed(timing, "update_weights"):
                        self.engine.sync_weights(self.policy.state_dict())
                    with timed(timing, "drift"):
                        metrics.update(self.drift_metrics())
                if (tr.test_freq > 0 and step % tr.test_freq == 0) or step == total:
                    with timed(timing, "testing"):
                        metrics.update(self.validate())
            if batch is not None:
                batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(-1).tolist()  # as veRL sets it
                metrics.update(compute_data_metrics(batch, use_critic=False))
                metrics.update(compute_timing_metrics(batch, timing))
                metrics.update(compute_throughout_metrics(batch, timing, n_gpus=1))
            metrics.update({f"timing_s/{k}": v for k, v in timing.items()})
            metrics["training/global_step"] = step
            metrics["training/epoch"] = self.stream.cursor.epoch
            metrics = {k: float(v) for k, v in metrics.items() if np.isscalar(v)}
            record(step, metrics)
            tqdm.write(step_line(step, total, metrics))
            if (tr.save_freq > 0 and step % tr.save_freq == 0) or step == total:
                self.save()
        plot_run(history, self.out_dir / "curves.png", title=f"{tr.project_name} / {tr.experiment_name}")
        self.tracking.finish()
        return history
