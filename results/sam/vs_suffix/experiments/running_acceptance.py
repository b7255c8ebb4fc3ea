"""Draft length from the request's own running acceptance (#18 item 2, the one estimate the drafter did not use yet),
teacher-forced on scripts/bench_sam.py's corpora at several K. Output: running_acceptance.txt.

Each request keeps the share of its drafted tokens the next step confirmed (teacher-forced: the next token against
the previous draft's first; a Beta(a, b) prior, decayed by ``decay`` per tried token so it follows the request), and
its draft is cut to the longest n with share ** n >= ``theta``. Done outside the drafter (a subclass of
sam.policy.BatchDrafter stepping the same compiled code), so only cutting is tried, never lengthening.

    .venv/bin/python results/sam/vs_suffix/experiments/running_acceptance.py 4,6
"""

import math
import sys

import numpy as np
from teacher_forced_variants import bench_sam, load_corpora

import sam.policy

LABELS = {"embedded_task_samples": "model samples", "vllm_sibling_files": "vLLM files"}
PLAIN = sam.policy.BatchDrafter
RULE: dict = {}  # the running-acceptance rule of the mode being run (empty: none)


class RunningAcceptanceDrafter(PLAIN):
    """BatchDrafter whose drafts are cut by each request's running acceptance (RULE)."""

    def step(self, slots: np.ndarray, tokens: np.ndarray, offsets: np.ndarray, ks: np.ndarray) -> list[list[int]]:
        if not RULE:
            return super().step(slots, tokens, offsets, ks)
        state = self.__dict__.setdefault("running", {})
        ks = ks.copy()
        for r, s in enumerate(slots.tolist()):
            draft, hits, tries = state.get(s, ([], RULE["a"], RULE["a"] + RULE["b"]))
            fed = tokens[offsets[r] : offsets[r + 1]].tolist()
            ok = 0
            while ok < len(draft) and ok < len(fed) and draft[ok] == fed[ok]:
                ok += 1
            tried = ok + (1 if ok < len(draft) and ok < len(fed) else 0)
            for i in range(tried):
                hits = hits * RULE["decay"] + (1.0 if i < ok else 0.0)
                tries = tries * RULE["decay"] + 1.0
            share = hits / tries
            cap = ks[r] if share >= 1 else int(math.log(RULE["theta"]) / math.log(max(share, 1e-9)))
            ks[r] = max(RULE["floor"], min(int(ks[r]), cap))
            state[s] = (draft, hits, tries)
        drafts = super().step(slots, tokens, offsets, ks)
        for s, d in zip(slots.tolist(), drafts, strict=True):
            state[s] = (d, *state[s][1:])
        return drafts


RULES = {
    "sam_group": {},
    "running/t0.05": {"a": 1.0, "b": 1.0, "decay": 0.97, "theta": 0.05, "floor": 1},
    "running/t0.1": {"a": 1.0, "b": 1.0, "decay": 0.97, "theta": 0.1, "floor": 1},
    "running/t0.2": {"a": 1.0, "b": 1.0, "decay": 0.97, "theta": 0.2, "floor": 1},
    "running/t0.1/nodecay": {"a": 1.0, "b": 1.0, "decay": 1.0, "theta": 0.1, "floor": 1},
}


def main() -> None:
    sam.policy.BatchDrafter = RunningAcceptanceDrafter
    corpora = load_corpora()
    print("| K | corpus | mode | accepted/position | drafted/position |\n|---|---|---|---|---|")
    for k in (int(x) for x in sys.argv[1].split(",")):
        bench_sam.K = k
        for name, groups in corpora.items():
            for mode, rule in (("suffix", {}), *RULES.items()):
                RULE.clear()
                RULE.update(rule)
                if mode != "suffix":
                    bench_sam.SAM_VARIANTS[mode] = {}
                r = bench_sam.teacher_forced(groups, [mode])[mode]
                print(f"| {k} | {LABELS[name]} | {mode} | {r['accepted_per_position']:.3f} | {r['drafted_per_position']:.3f} |")  # fmt: skip
                sys.stdout.flush()


if __name__ == "__main__":
    main()
