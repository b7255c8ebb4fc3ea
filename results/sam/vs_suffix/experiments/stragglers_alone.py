"""The long tail at equal work, with natural ends (#18, the tail): bench_rollout.py's straggler prompt alone.

bench_rollout.py's rollout (test prompts 12-23 x 8) ends with the 8 samples of one prompt (test prompt 15, a 14-term
sum whose traces run 133-150 tokens; tail_rollout_texts.txt): its long tail is those 8 requests running together.
Here they are the whole batch: per mode (argv[1], bench_rollout.py's mode names) one engine generates the prompt x 8
once (the drafter's earlier epoch), then ``REPEATS`` rollouts, each printed (tokens per request-step, tokens/s,
response lengths). Unlike equal_work_tail.py the responses end where the model ends them, as a tail's do; the work is
equal in expectation (every mode samples the same distribution). Output: stragglers_alone.txt.

    .venv/bin/python results/sam/vs_suffix/experiments/stragglers_alone.py off,suffix,sam+group+epoch,sam+group+epoch/k12
"""

import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

REPEATS = 7


def main() -> None:
    import bench_rollout
    from omegaconf import OmegaConf

    from mtp.checkpoint import load_tokenizer
    from recipe.dapo.data import load_prompts
    from recipe.sft.train import ensure_base_model

    ckpt = ensure_base_model(OmegaConf.load(REPO / "configs" / "sft.yaml"))
    _, ids = load_prompts(str(ckpt.parent / "data" / "test.parquet"), load_tokenizer(ckpt), 160)
    prompt = [ids[15]]
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 768}
    for name in sys.argv[1].split(","):
        engine = bench_rollout.mode_engine(ckpt, *bench_rollout.parse_mode(name, 1024, bench_rollout.mode_defaults()))
        engine.generate(prompt, 8, sampling)
        runs = []
        for _ in range(REPEATS):
            result = engine.generate(prompt, 8, sampling)
            s = result.timeline.summary(8)
            lengths = [len(r.token_ids) for r in result.responses]
            runs.append((s["tokens_per_request_step"], s["throughput_tok_s"], min(lengths), max(lengths)))
        cells = ", ".join(f"{a:.2f} / {b:.0f} ({c}-{d})" for a, b, c, d in runs)
        print(
            f"| {name} | {np.median([r[0] for r in runs]):.2f} | {np.median([r[1] for r in runs]):.0f} | {cells} |",
            flush=True,
        )
        engine.close()


if __name__ == "__main__":
    print(
        "| mode | tokens/request-step, median | tokens/s, median | each rollout: tokens/request-step / tokens/s (lengths) |"
    )
    print("|---|---|---|---|")
    main()
