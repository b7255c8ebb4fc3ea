"""Where a speculative engine step's time goes on this CPU: cProfile of one rollout of 64 requests x 200 tokens
(ignore_eos) with spec off and with scripts/bench_verify_cost.py's proposer drafting exactly K=1 and K=6 tokens per
request per step; the target model's kernels and the samplers, summed over the rollout's steps.

    .venv/bin/python results/sam/vs_suffix/experiments/profile_spec_step.py > results/sam/vs_suffix/experiments/profile_spec_step.txt
"""

import cProfile
import pstats
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

ROWS = {  # what to report -> pstats function name (file suffix, function)
    "matmuls (oneDNN)": ("~", "<built-in method torch._ops._C.onednn_mm>"),
    "attention": ("~", "<built-in method torch._ops._C.cpu_attention_with_kv_cache>"),
    "sampler (spec off) / rejection sampler incl. bonus tokens": None,
    "model forward (all modules)": ("torch/nn/modules/module.py", "_call_impl"),
    "scheduler": ("vllm/v1/core/sched/scheduler.py", "schedule"),
}


def cumulative(stats: pstats.Stats, file_suffix: str, func: str) -> float:
    return sum(
        v[3]
        for (f, _, name), v in stats.stats.items()
        if name == func and (file_suffix == "~" or f.endswith(file_suffix))
    )


def main() -> None:
    from omegaconf import OmegaConf

    from mtp.checkpoint import load_tokenizer
    from recipe.dapo.data import load_prompts
    from recipe.dapo.rollout import RolloutEngine
    from recipe.engine import EngineOptions
    from recipe.sft.train import ensure_base_model

    ckpt = ensure_base_model(OmegaConf.load(REPO / "configs" / "sft.yaml"))
    _, ids = load_prompts(str(ckpt.parent / "data" / "test.parquet"), load_tokenizer(ckpt), 160)
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 200, "ignore_eos": True}
    options = EngineOptions(max_model_len=1024, seed=0, dtype="float32")
    print("| seconds over one rollout | spec off | K=1 | K=6 |\n|---|---|---|---|")
    cells: dict[str, list[str]] = {}
    for k in (0, 1, 6):
        spec = None
        if k:
            spec = {
                "method": "custom_class",
                "model": "bench_verify_cost.FixedDraftProposer",
                "num_speculative_tokens": k,
            }
        engine = RolloutEngine(str(ckpt), spec, options, free_cache_engine=False)
        engine.generate(ids[:64], 1, sampling)
        profile = cProfile.Profile()
        profile.enable()
        result = engine.generate(ids[:64], 1, sampling)
        profile.disable()
        engine.close()
        stats = pstats.Stats(profile)
        sampler = (
            cumulative(stats, "vllm/v1/sample/rejection_sampler.py", "forward")
            if k
            else cumulative(stats, "vllm/v1/sample/sampler.py", "forward")
        )
        values = {
            "engine steps": f"{len(result.timeline.steps)}",
            "rollout (engine steps' wall time)": f"{sum(s.duration_s for s in result.timeline.steps):.3f}",
        }
        for label, where in ROWS.items():
            values[label] = f"{sampler if where is None else cumulative(stats, *where):.3f}"
        for label, value in values.items():
            cells.setdefault(label, []).append(value)
    for label, row in cells.items():
        print(f"| {label} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
