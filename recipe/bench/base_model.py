"""Measure the base model and write ``results/base/``: data length distribution, pass@1 at temperature 1 on
the test split, and the MTP head's mean acceptance length in vLLM on the model's own samples.

    python -m recipe.bench base-model [--n 4] [sft overrides, e.g. train.steps=500]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from recipe.paths import REPO_ROOT


def main() -> None:
    from omegaconf import OmegaConf

    from mtp.checkpoint import load_tokenizer
    from recipe.data.loader import load_problems
    from recipe.data.task import length_stats
    from recipe.engine import EngineOptions, make_llm, speculative_config
    from recipe.evaluate import evaluate
    from recipe.sft.train import config_hash, ensure_base_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=4, help="samples per test problem")
    parser.add_argument("--out", default=str(REPO_ROOT / "results" / "base"))
    parser.add_argument("overrides", nargs="*", help="dotted SFT config overrides")
    args = parser.parse_args()

    cfg = OmegaConf.merge(OmegaConf.load(REPO_ROOT / "configs" / "sft.yaml"), OmegaConf.from_dotlist(args.overrides))
    ckpt = ensure_base_model(cfg)
    root = ckpt.parent
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    tok = load_tokenizer(ckpt)
    train = load_problems(root / "data" / "train.parquet")
    test = load_problems(root / "data" / "test.parquet")
    data_lengths = [len(tok(p.solution, add_special_tokens=False)["input_ids"]) + 1 for p in train]

    options = EngineOptions(max_model_len=2048)
    metrics: dict = {"checkpoint_hash": config_hash(cfg), "train_reference_length_tokens": length_stats(data_lengths)}
    llm = make_llm(str(ckpt), None, options)
    off = evaluate(llm, test, n=args.n, temperature=1.0, max_tokens=1024)
    greedy = evaluate(llm, test, n=1, temperature=0.0, max_tokens=1024)
    del llm
    llm = make_llm(str(ckpt), speculative_config("mtp", 1), options)
    mtp = evaluate(llm, test, n=args.n, temperature=1.0, max_tokens=1024)
    del llm
    metrics["sampled_t1_spec_off"] = off.as_dict()
    metrics["greedy_spec_off"] = greedy.as_dict()
    metrics["sampled_t1_spec_mtp"] = mtp.as_dict()
    metrics["sampled_response_length_tokens"] = length_stats(off.response_lengths)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    shutil.copy(root / "sft_loss.png", out / "sft_loss.png")
    shutil.copy(root / "sft_history.jsonl", out / "sft_history.jsonl")

    d, s = metrics["train_reference_length_tokens"], metrics["sampled_response_length_tokens"]
    lines = [
        "# Base model (embedded task)",
        "",
        f"Produced by `python -m recipe.bench base-model --n {args.n}` (SFT config hash `{config_hash(cfg)}`,"
        f" {cfg.train.steps} steps, {_param_count(ckpt)} parameters).",
        "",
        "| metric | value |",
        "|---|---|",
        f"| pass@1, temperature 1, test split ({off.num_problems} problems x {args.n} samples) | {off.pass_at_1:.3f} |",
        f"| greedy accuracy, test split | {greedy.pass_at_1:.3f} |",
        f"| MTP mean acceptance length in vLLM (1 draft token, temperature 1) | {mtp.spec.mean_acceptance_length:.3f} |",
        f"| MTP draft acceptance rate | {mtp.spec.acceptance_rate:.3f} |",
        f"| pass@1 with MTP speculation (same sampler, lossless) | {mtp.pass_at_1:.3f} |",
        "",
        "Length distribution in tokens (response incl. EOS):",
        "",
        "| set | mean | p50 | p90 | p99 | max |",
        "|---|---|---|---|---|---|",
        f"| reference traces, train split | {d['mean']:.1f} | {d['p50']:.0f} | {d['p90']:.0f} | {d['p99']:.0f} | {d['max']} |",
        f"| base model samples, test split | {s['mean']:.1f} | {s['p50']:.0f} | {s['p90']:.0f} | {s['p99']:.0f} | {s['max']} |",
        "",
        "![SFT loss](sft_loss.png)",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines))
    print("\n".join(lines))


def _param_count(ckpt: Path) -> str:
    from safetensors.torch import load_file

    return f"{sum(t.numel() for t in load_file(str(ckpt / 'model.safetensors')).values()) / 1e6:.2f}M"


if __name__ == "__main__":
    main()
