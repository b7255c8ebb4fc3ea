"""A rollout's tail at equal work (#18): B requests (one per prompt, B = argv[2]) of exactly 400 tokens (ignore_eos),
after each prompt's 16 responses were generated as the drafter's history, per mode (argv[1], bench_rollout.py's
mode names); engine-step time, steps and tokens per step, and a cProfile of the measured rollout. Output (the
summary lines): equal_work_tail.txt. Text past EOS is not what a rollout's tail generates: an instrument, not kept.

    .venv/bin/python results/sam/vs_suffix/experiments/equal_work_tail.py off,ngram,suffix,sam+group+epoch 4
"""

import cProfile
import pstats
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))


def main() -> None:
    import bench_rollout
    from omegaconf import OmegaConf

    from mtp.checkpoint import load_tokenizer
    from recipe.dapo.data import load_prompts
    from recipe.sft.train import ensure_base_model

    ckpt = ensure_base_model(OmegaConf.load(REPO / "configs" / "sft.yaml"))
    _, ids = load_prompts(str(ckpt.parent / "data" / "test.parquet"), load_tokenizer(ckpt), 160)
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 768}
    tail = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 400, "ignore_eos": True}
    defaults = bench_rollout.mode_defaults()
    for name in sys.argv[1].split(","):
        engine = bench_rollout.mode_engine(ckpt, *bench_rollout.parse_mode(name, 1024, defaults))
        engine.generate(ids[:16], 16, sampling)
        engine.generate(ids[16 : 16 + batch], 16, sampling)
        profile = cProfile.Profile()
        profile.enable()
        result = engine.generate(ids[16 : 16 + batch], 1, tail)
        profile.disable()
        steps = result.timeline.steps
        seconds, tokens = sum(s.duration_s for s in steps), sum(s.tokens for s in steps)
        print(
            f"== {name}: steps {len(steps)} tokens {tokens} time {seconds:.3f} ms/step "
            f"{1e3 * seconds / len(steps):.3f} tok/step {tokens / len(steps):.2f}"
        )
        pstats.Stats(profile).sort_stats("cumulative").print_stats(25)
        engine.close()


if __name__ == "__main__":
    main()
