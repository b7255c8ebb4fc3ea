"""Teacher-forced accepted tokens per position at several K on scripts/bench_sam.py's corpora (#18; output:
teacher_forced_by_k.txt). bench_sam.py's table is at K=4; the rollouts run SAM at K=6 and suffix at K=24, where a
chance cutoff that ignores the match length binds (a continuation seen once: 1/2 per token, 4 tokens at 0.05).

    .venv/bin/python results/sam/vs_suffix/experiments/teacher_forced_by_k.py '{"name": {"option": value}}' \
        ngram,suffix,sam_group,sam_group/no_prior_decay 4,6,8
"""

import json
import sys

from teacher_forced_variants import bench_sam, load_corpora

LABELS = {"embedded_task_samples": "model samples", "vllm_sibling_files": "vLLM files"}


def main() -> None:
    corpora = load_corpora()
    variants = json.loads(sys.argv[1])
    bench_sam.SAM_VARIANTS.update(variants)
    modes = sys.argv[2].split(",") + list(variants)
    print("| K | corpus | mode | accepted/position | drafted/position |\n|---|---|---|---|---|")
    for k in (int(x) for x in sys.argv[3].split(",")):
        bench_sam.K = k
        for name, groups in corpora.items():
            result = bench_sam.teacher_forced(groups, modes)
            for mode in modes:
                r = result[mode]
                print(
                    f"| {k} | {LABELS[name]} | {mode} | {r['accepted_per_position']:.3f} | {r['drafted_per_position']:.3f} |"
                )
            sys.stdout.flush()


if __name__ == "__main__":
    main()
