"""Teacher-forced variants of SAM drafting on scripts/bench_sam.py's corpora (#18; output: teacher_forced_variants.txt).

Run with recency_and_backoff.patch applied to sam/ at e906066 (its options: own_latest 1 / 2 / 3 = own-text drafts
copied, by brute force, from the latest earlier occurrence with / without running into the copy, or from the first;
own_min_match; backoff_depth > 0 = Witten-Bell interpolation down the suffix links with backoff_weight; backoff_depth
-1 = group material copied from its latest occurrence instead of the counted continuation):

    .venv/bin/python teacher_forced_variants.py '{"name": {"option": value, ...}, ...}' suffix,sam_group
"""

from __future__ import annotations

import json
import pickle
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))

import bench_sam  # noqa: E402

CACHE = Path("/tmp/teacher_forced_corpora.pkl")  # sampling the model's corpus takes a minute; reuse it between runs


def load_corpora() -> dict[str, list]:
    """bench_sam.py's two corpora, from the cache when an earlier run (of this or teacher_forced_by_k.py) left it."""
    if CACHE.exists():
        return pickle.loads(CACHE.read_bytes())
    corpora = {
        "embedded_task_samples": bench_sam.task_samples(24, 8),
        "vllm_sibling_files": bench_sam.sibling_files(8, 6000),
    }
    CACHE.write_bytes(pickle.dumps(corpora))
    return corpora


def main() -> None:
    corpora = load_corpora()
    variants = json.loads(sys.argv[1])
    bench_sam.SAM_VARIANTS.update(variants)
    modes = sys.argv[2].split(",") + list(variants)
    for name, groups in corpora.items():
        start = time.time()
        result = bench_sam.teacher_forced(groups, modes)
        for mode in modes:
            r = result[mode]
            print(f"{name} {mode}: accepted/position {r['accepted_per_position']:.3f}, drafted/position "
                  f"{r['drafted_per_position']:.3f}, accepted/drafted {r['draft_acceptance_rate']:.3f}")  # fmt: skip
        print(f"{name}: {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
