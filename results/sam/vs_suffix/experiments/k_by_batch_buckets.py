"""Tokens/s of SAM at several K within buckets of live batch size (one run, modes interleaved): is there a K-by-batch
schedule that beats a fixed K? Run: .venv/bin/python results/sam/vs_suffix/experiments/k_by_batch_buckets.py off,sam+group+epoch/k2,sam+group+epoch/k4,sam+group+epoch/k6,sam+group+epoch/k8,sam+group+epoch/k12 6
Cells: tokens/s (tokens per request-step, share of the mode's rollout time)."""

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
BUCKETS = [(1, 8), (9, 16), (17, 32), (33, 64), (65, 96)]


def main():
    from bench_rollout import mode_defaults, mode_engine, parse_mode
    from omegaconf import OmegaConf

    from mtp.checkpoint import load_tokenizer
    from recipe.dapo.data import load_prompts
    from recipe.sft.train import ensure_base_model

    ckpt = ensure_base_model(OmegaConf.load(REPO / "configs" / "sft.yaml"))
    _, ids = load_prompts(str(ckpt.parent / "data" / "test.parquet"), load_tokenizer(ckpt), 160)
    warm, prompts = ids[:12], ids[12:24]
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 768}
    defaults = mode_defaults()
    modes = sys.argv[1].split(",")
    reps = int(sys.argv[2])
    engines = {}
    for name in modes:
        parsed = parse_mode(name, 256, defaults)
        method, _, so, _ = parsed
        e = mode_engine(ckpt, *parsed)
        e.generate(warm, 8, sampling)
        if method == "suffix" or (so and so["cross_epoch"]):
            e.generate(prompts, 8, sampling)
        engines[name] = e
    acc = {n: {b: [0.0, 0.0, 0.0] for b in BUCKETS} for n in modes}  # tokens, time, request-steps
    tot = {n: [0.0, 0.0] for n in modes}
    for rep in range(reps):
        for n, e in engines.items():
            a = e.generate(prompts, 8, sampling).timeline.arrays()
            tot[n][0] += a["tokens"].sum()
            tot[n][1] += a["duration_s"].sum()
            for lo, hi in BUCKETS:
                m = (a["active"] >= lo) & (a["active"] <= hi)
                acc[n][lo, hi][0] += a["tokens"][m].sum()
                acc[n][lo, hi][1] += a["duration_s"][m].sum()
                acc[n][lo, hi][2] += a["stepped"][m].sum()
        print("rep", rep, flush=True)
    out = {}
    print("mode | overall tok/s | " + " | ".join(f"{lo}-{hi}: tok/s (tprs, time share)" for lo, hi in BUCKETS))
    for n in modes:
        cells = []
        for b in BUCKETS:
            t, d, s = acc[n][b]
            cells.append(f"{t / d:.0f} ({t / max(s, 1):.2f}, {d / tot[n][1]:.2f})" if d else "-")
        print(f"{n} | {tot[n][0] / tot[n][1]:.0f} | " + " | ".join(cells))
        out[n] = {"overall": tot[n], "buckets": {f"{lo}-{hi}": acc[n][lo, hi] for lo, hi in BUCKETS}}
    Path(__file__).with_suffix(".json").write_text(json.dumps(out, indent=1))
    for e in engines.values():
        e.close()


if __name__ == "__main__":
    main()
