"""What a prompt's history costs the proposer when its group empties (#18): bench_rollout.py's SAM engine (test prompts
12-23 x 8 after warm-up and one earlier epoch) runs 12 more rollouts; per rollout, the time spent in
sam.policy.GroupStore.leave (a request's response filed with its group), and how much of it went to the groups that
emptied (where the rollout's responses join the history). Output: history_rebuild_cost.txt.

    .venv/bin/python results/sam/vs_suffix/experiments/history_rebuild_cost.py
"""

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))


def main() -> None:
    import bench_rollout
    from omegaconf import OmegaConf

    import sam.policy
    from mtp.checkpoint import load_tokenizer
    from recipe.dapo.data import load_prompts
    from recipe.sft.train import ensure_base_model

    spent = {"leave": 0.0, "finishes": 0, "emptying": 0.0}
    leave = sam.policy.GroupStore.leave

    def timed(store, key, group, response):
        start = time.perf_counter()
        last = group.active == 1
        leave(store, key, group, response)
        seconds = time.perf_counter() - start
        spent["leave"] += seconds
        spent["finishes"] += 1
        spent["emptying"] += seconds if last else 0.0

    sam.policy.GroupStore.leave = timed
    ckpt = ensure_base_model(OmegaConf.load(REPO / "configs" / "sft.yaml"))
    _, ids = load_prompts(str(ckpt.parent / "data" / "test.parquet"), load_tokenizer(ckpt), 160)
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 768}
    defaults = bench_rollout.mode_defaults()
    engine = bench_rollout.mode_engine(ckpt, *bench_rollout.parse_mode("sam+group+epoch", 256, defaults))
    engine.generate(ids[:12], 8, sampling)
    engine.generate(ids[12:24], 8, sampling)
    for rollout in range(12):
        spent.update(leave=0.0, finishes=0, emptying=0.0)
        s = engine.generate(ids[12:24], 8, sampling).timeline.summary(8)
        print(
            f"rollout {rollout + 1}: {s['rollout_time_s'] * 1e3:.0f} ms, tail {s['tail_time_s'] * 1e3:.0f} ms; "
            f"leave {spent['leave'] * 1e3:.1f} ms over {spent['finishes']} finishes, of which groups emptying "
            f"{spent['emptying'] * 1e3:.1f} ms",
            flush=True,
        )
    engine.close()


if __name__ == "__main__":
    main()
