"""Who drafts better in the long tail: teacher-forced drafting on each prompt's longest response (the straggler a
rollout's tail waits for), run after its siblings as finished material, by position within it (#18, the tail).

Responses: the base model's samples (scripts/bench_sam.py's task_samples: vLLM, temperature 1) to 24 held-out
prompts x 16. In each group the longest response runs last; the table counts its positions only, in buckets of
position, at SAM's e2e K (6) and 12 and at suffix's (24) and 6. Output: tail_teacher_forced.txt.

    .venv/bin/python results/sam/vs_suffix/experiments/tail_teacher_forced.py >> results/sam/vs_suffix/experiments/tail_teacher_forced.txt
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))

import bench_sam  # noqa: E402

BUCKETS = ((0, 64), (64, 192), (192, 384), (384, 1 << 20))


def run(groups: list, mode: str, k: int) -> np.ndarray:
    """Per bucket: [positions, drafted, accepted] over the longest response of each group."""
    from omegaconf import OmegaConf

    from sam.policy import BatchDrafter, SAMOptions

    bench_sam.K = k
    out = np.zeros((len(BUCKETS), 3))
    arctic = bench_sam.ArcticSuffix() if mode == "suffix" else None
    if arctic is None:
        opts = {**OmegaConf.to_container(bench_sam.spec_group("sam").sam), "batch_threshold": 1 << 20, "cross_epoch": False}
        drafter = BatchDrafter(SAMOptions.from_dict(opts), k)
        slots = [[drafter.start(p, str(g).encode()) for _ in rs] for g, (p, rs) in enumerate(groups)]
    request = 0
    for g, (prompt, responses) in enumerate(groups):
        for r, text in enumerate(responses):
            request += 1
            last = r == len(responses) - 1
            if arctic is not None:
                arctic.cache.start_request(request, prompt)
            for pos in range(len(text) - 1):
                if arctic is not None:
                    draft = arctic.step(request, text[pos : pos + 1], np.concatenate([prompt, text[: pos + 1]]))
                else:
                    draft = drafter.step(np.array([slots[g][r]]), text[pos : pos + 1], np.array([0, 1]), np.array([k]))[0]
                if not last:
                    continue
                truth = text[pos + 1 : pos + 1 + len(draft)].tolist()
                ok = 0
                while ok < len(draft) and ok < len(truth) and draft[ok] == truth[ok]:
                    ok += 1
                b = next(i for i, (lo, hi) in enumerate(BUCKETS) if lo <= pos < hi)
                out[b] += (1, len(draft), ok)
            if arctic is not None:
                arctic.cache.stop_request(request)
            else:
                drafter.finish(slots[g][r])
    return out


def main() -> None:
    groups = bench_sam.task_samples(24, 16)
    groups = [(p, sorted(rs, key=len)) for p, rs in groups]
    lengths = [len(rs[-1]) for _, rs in groups]
    print(f"longest response per group: median {np.median(lengths):.0f}, max {max(lengths)} tokens; "
          f"all responses: median {np.median([len(r) for _, rs in groups for r in rs]):.0f}")  # fmt: skip
    head = " | ".join(f"positions {lo}-{hi if hi < 1 << 20 else ''}" for lo, hi in BUCKETS)
    print(f"\naccepted per position (drafted per position), the longest response of each group\n\n| mode | K | {head} |")
    print("|---|---|" + "---|" * len(BUCKETS))
    for mode, k in (("suffix", 24), ("suffix", 6), ("sam_group", 6), ("sam_group", 12)):
        t = run(groups, mode, k)
        cells = " | ".join(f"{a / n:.3f} ({d / n:.2f}), n={n:.0f}" if n else "-" for n, d, a in t)
        print(f"| {mode} | {k} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
