"""Where suffix out-drafts SAM, position by position (#18, the teacher-forced goal), on scripts/bench_sam.py's
corpora at K (argv[1], default 4). Output: where_suffix_wins.txt.

At every position of every response (prompts' responses one after another, as bench_sam.teacher_forced runs them)
both drafters draft; the positions are split by where SAM's draft came from (none; the request's own text, when
SAM without group material drafts the same tokens; group material) and by whether suffix's draft is the one its
per-request tree alone gives (a second Arctic cache holding no earlier responses) or needed its global tree.

    .venv/bin/python results/sam/vs_suffix/experiments/where_suffix_wins.py 4
"""

import sys
from collections import defaultdict

import numpy as np
from teacher_forced_variants import bench_sam, load_corpora

LABELS = {"embedded_task_samples": "model samples", "vllm_sibling_files": "vLLM files"}


def accepted(draft: list[int], truth: list[int]) -> int:
    ok = 0
    while ok < len(draft) and ok < len(truth) and draft[ok] == truth[ok]:
        ok += 1
    return ok


def compare(groups: list) -> dict:
    """(SAM source, suffix source) -> [positions, SAM accepted, suffix accepted, SAM drafted, suffix drafted, the better
    of the two drafts' accepted]."""
    from omegaconf import OmegaConf

    from sam.policy import BatchDrafter, SAMOptions

    base = {**OmegaConf.to_container(bench_sam.spec_group("sam").sam), "batch_threshold": 1 << 20, "cross_epoch": False}
    sam_all = BatchDrafter(SAMOptions.from_dict(base), bench_sam.K)
    sam_own = BatchDrafter(SAMOptions.from_dict({**base, "group_sharing": False}), bench_sam.K)
    suffix, local = bench_sam.ArcticSuffix(), bench_sam.ArcticSuffix()
    slots = [
        [(sam_all.start(p, str(g).encode()), sam_own.start(p, b"")) for _ in rs] for g, (p, rs) in enumerate(groups)
    ]
    table = defaultdict(lambda: np.zeros(6))
    request = 0
    for g, (prompt, responses) in enumerate(groups):
        for r, text in enumerate(responses):
            request += 1
            suffix.cache.start_request(request, prompt)
            local.cache.start_request(request, prompt)
            a, o = slots[g][r]
            for pos in range(len(text) - 1):
                tok = text[pos : pos + 1]
                context = np.concatenate([prompt, text[: pos + 1]])
                d_all = sam_all.step(np.array([a]), tok, np.array([0, 1]), np.array([bench_sam.K]))[0]
                d_own = sam_own.step(np.array([o]), tok, np.array([0, 1]), np.array([bench_sam.K]))[0]
                d_x = suffix.step(request, tok, context)
                d_xl = local.step(request, tok, context)
                truth = text[pos + 1 : pos + 1 + bench_sam.K].tolist()
                sam_src = "none" if not d_all else "own" if d_all == d_own else "group"
                x_src = "none" if not d_x else "request tree" if d_x == d_xl else "global tree"
                ok_s, ok_x = accepted(d_all, truth), accepted(d_x, truth)
                table[sam_src, x_src] += (1, ok_s, ok_x, len(d_all), len(d_x), max(ok_s, ok_x))
            suffix.cache.stop_request(request)
            local.cache.stop_request(request)
            local.cache.evict_cached_response(request)
            sam_all.finish(a)
            sam_own.finish(o)
    return table


def main() -> None:
    bench_sam.K = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    for name, groups in load_corpora().items():
        table = compare(groups)
        total = sum(table.values())
        print(f"\n{LABELS[name]}, K={bench_sam.K}: {total[0]:.0f} positions; accepted per position SAM {total[1] / total[0]:.3f}, "
              f"suffix {total[2] / total[0]:.3f}, the better of the two at each position {total[5] / total[0]:.3f}; drafted SAM {total[3] / total[0]:.3f}, suffix {total[4] / total[0]:.3f}\n")  # fmt: skip
        print("| SAM's source | suffix's source | share of positions | SAM accepted | suffix accepted | SAM drafted | suffix drafted | suffix - SAM, per position of the corpus | where suffix's is better, by how much, per position of the corpus |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|")
        for (s, x), (n, sa, xa, sd, xd, best) in sorted(table.items(), key=lambda kv: -kv[1][0]):
            print(f"| {s} | {x} | {n / total[0]:.3f} | {sa / n:.3f} | {xa / n:.3f} | {sd / n:.2f} | {xd / n:.2f} | {(xa - sa) / total[0]:+.3f} | {(best - sa) / total[0]:+.3f} |")  # fmt: skip
        sys.stdout.flush()


if __name__ == "__main__":
    main()
