"""Build the stale-head drift scenario (#19): the default base model's trunk with the MTP layer of an earlier base
model, as MiMo-RL starts RL with a head trained before the trunk's last fine-tuning.

The earlier model is the embedded SFT stopped early (``--early-steps`` optimizer steps on the same data, tokenizer
and seed, its own warmup and cosine schedule); its MTP layer was trained on that trunk's hidden states, not on the
final trunk's. Everything the MTP layer shares with the trunk (embeddings, LM head) comes from the final model, as
it does in vLLM's MiMo MTP drafter. Writes ``--out`` (a MiMo checkpoint) and prints the A/B command that runs
frozen against online MTP from it:

    .venv/bin/python scripts/stale_head.py [--early-steps 200] [--out artifacts/stale_head/checkpoint]
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))


def main() -> None:
    from omegaconf import OmegaConf

    from mtp.checkpoint import load_checkpoint, load_tokenizer, save_checkpoint
    from recipe.sft.train import ensure_base_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--early-steps", type=int, default=200, help="SFT optimizer steps of the head's model")
    parser.add_argument("--out", default=str(REPO_ROOT / "artifacts" / "stale_head" / "checkpoint"))
    args = parser.parse_args()
    cfg = OmegaConf.load(REPO_ROOT / "configs" / "sft.yaml")
    if not 0 < args.early_steps < cfg.train.steps:
        raise SystemExit(
            f"--early-steps must be in 1..{cfg.train.steps - 1} (the default SFT's steps), got {args.early_steps}"
        )
    final = ensure_base_model(cfg)
    early_cfg = OmegaConf.merge(
        cfg, {"train": {"steps": args.early_steps, "warmup_steps": min(cfg.train.warmup_steps, args.early_steps // 4)}}
    )
    early = ensure_base_model(early_cfg)
    if load_tokenizer(early).get_vocab() != load_tokenizer(final).get_vocab():
        raise SystemExit(f"{early} and {final} have different tokenizers: the head cannot be moved between them")
    model, head_model = load_checkpoint(final), load_checkpoint(early)
    if len(head_model.model.mtp_layers) == 0:
        raise SystemExit(f"{early} has no MTP layer")
    model.model.mtp_layers.load_state_dict(head_model.model.mtp_layers.state_dict())
    out = save_checkpoint(
        model,
        load_tokenizer(final),
        args.out,
        extra_config={"stale_head": {"trunk": str(final), "mtp_layers": str(early)}},
    )
    # --earlier-default trains on the default base model's SFT train split; its test split is the default val_files
    command = [
        ".venv/bin/python", "-m", "recipe.ab", "--name", "stale_head_s0", "--modes", "mtp_frozen,mtp_online", "--earlier-default",
        "recipe.progress_bar=false", f"actor_rollout_ref.model.path={out}", "trainer.total_training_steps=100", "data.seed=0",
    ]  # fmt: skip
    print(f"stale-head checkpoint: {out}\nA/B: {shlex.join(command)}")


if __name__ == "__main__":
    main()
