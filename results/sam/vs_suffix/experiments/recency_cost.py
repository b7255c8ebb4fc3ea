"""Ingest and proposer step cost of one source tree's SAM next to vLLM ngram and Arctic suffix (#18; output:
recency_cost.txt). Run it for two trees one after another, alternating, to pair them on a loaded machine:

    git worktree add /tmp/headwt <commit>
    .venv/bin/python recency_cost.py /tmp/headwt; .venv/bin/python recency_cost.py "$PWD"

With ``--teacher-forced`` it also prints sam_group's teacher-forced accepted tokens per position on both corpora
(teacher_forced_variants.py's cached corpora); the RECENT_DEPTH rows were made by editing the constant in
sam/automaton.py between runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def main() -> None:
    tree = sys.argv[1]
    sys.path.insert(0, tree + "/scripts")
    sys.path.insert(0, tree)
    import bench_sam

    import sam

    assert sam.__file__.startswith(tree), sam.__file__
    ing = bench_sam.ingest(bench_sam.stdlib_tokens(1_000_000), repeats=5)
    row = bench_sam.step_cost(32768, 64, 30, np.random.default_rng(0))
    cost = {k: round(v, 3) for k, v in row.items() if k.endswith("_ms")}
    print(
        tree,
        "ingest M tokens/s",
        round(ing["tokens_per_s"] / 1e6, 2),
        "B/token",
        ing["bytes_per_token"],
        json.dumps(cost),
    )
    if "--teacher-forced" in sys.argv:
        import pickle

        corpora = pickle.loads(Path("/tmp/teacher_forced_corpora.pkl").read_bytes())
        for name, groups in corpora.items():
            accepted = bench_sam.teacher_forced(groups, ["sam_group"])["sam_group"]["accepted_per_position"]
            print(tree, name, round(accepted, 4))


if __name__ == "__main__":
    main()
