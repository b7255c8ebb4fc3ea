"""Where a tail step's time goes with SAM drafting (#18 item 4, "less per-step overhead"; output:
profile_tail_step.txt).

profile_spec_step.py priced vLLM's speculative path with a proposer that costs nothing; this runs the real one on the
long tail's requests: stragglers_alone.py's batch (the 8 samples of the prompt that makes bench_rollout.py's tail),
after one earlier rollout, ROLLOUTS rollouts per mode under cProfile (in-process engine, so the proposer's calls are
seen). Milliseconds per engine step by part; cProfile inflates Python-heavy parts, so read the shares, not the totals.

    .venv/bin/python results/sam/vs_suffix/experiments/profile_tail_step.py off,sam+group+epoch
"""

import cProfile
import pstats
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

ROLLOUTS = 20
PARTS = {  # label -> (file suffix, function name) whose cumulative time is the part's
    "engine step": ("vllm/v1/engine/core.py", "step"),
    "model forward": ("vllm/v1/worker/gpu_model_runner.py", "_model_forward"),
    "sampling (rejection sampler with drafts)": ("vllm/v1/worker/gpu_model_runner.py", "sample_tokens"),
    "of it, vLLM's rejection sampler": ("vllm/v1/sample/rejection_sampler.py", "forward"),
    "scheduler": ("vllm/v1/core/sched/scheduler.py", "schedule"),
    "scheduler update": ("vllm/v1/core/sched/scheduler.py", "update_from_output"),
    "SAM proposer (sam/vllm.py propose)": ("sam/vllm.py", "propose"),
    "of it, request ids to slots": ("sam/vllm.py", "_slots"),
    "of it, the compiled step (step_rows)": ("sam/automaton.py", "step_rows"),
}


def cumulative(stats: pstats.Stats, where: str, name: str) -> tuple[float, int]:
    total, calls = 0.0, 0
    for (file, _, func), (_, ncalls, _, cumtime, _) in stats.stats.items():
        if func == name and file.endswith(where):
            total, calls = total + cumtime, max(calls, ncalls)
    return total, calls


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
    print("| part, ms per engine step (share of the step) | " + " | ".join(sys.argv[1].split(",")) + " |")
    print("|---" * (1 + len(sys.argv[1].split(","))) + "|")
    columns = []
    for name in sys.argv[1].split(","):
        engine = bench_rollout.mode_engine(ckpt, *bench_rollout.parse_mode(name, 1024, bench_rollout.mode_defaults()))
        engine.generate(prompt, 8, sampling)
        profile, tokens, start = cProfile.Profile(), 0, time.perf_counter()
        profile.enable()
        for _ in range(ROLLOUTS):
            tokens += sum(len(r.token_ids) for r in engine.generate(prompt, 8, sampling).responses)
        profile.disable()
        wall = time.perf_counter() - start
        engine.close()
        stats = pstats.Stats(profile)
        step_s, steps = cumulative(stats, *PARTS["engine step"])
        column = {label: cumulative(stats, *where)[0] / steps * 1e3 for label, where in PARTS.items()}
        column["engine steps"] = steps
        column["tokens/s (profiled)"] = tokens / wall
        column["step"] = step_s / steps * 1e3
        columns.append(column)
    for label in [*PARTS, "engine steps", "tokens/s (profiled)"]:
        cells = []
        for c in columns:
            if label in ("engine steps", "tokens/s (profiled)"):
                cells.append(f"{c[label]:.0f}")
            elif c[label] == 0:
                cells.append("-")
            else:
                cells.append(f"{c[label]:.3f} ({c[label] / c['step']:.0%})")
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
