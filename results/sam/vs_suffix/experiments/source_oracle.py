"""How much could SAM gain teacher-forced by choosing its draft source better? (#18; output: source_oracle.txt)

Drafts every position of the two corpora of scripts/bench_sam.py (K=4, configs/spec/sam.yaml) from the request's own
text alone, from its group material alone, and from every prompt's responses in one group (suffix's global tree),
then reports the per-position oracle over those sources and, binned by the own-text and group match lengths, how
much own text accepts over group material where both draft.

    .venv/bin/python results/sam/vs_suffix/experiments/source_oracle.py 2>/dev/null | sed -n '/^## /,$p' > results/sam/vs_suffix/experiments/source_oracle.txt
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO_ROOT / "scripts"))
sys.path.insert(0, str(REPO_ROOT))

import bench_sam  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from sam.policy import BatchDrafter, SAMOptions  # noqa: E402

K = 4
EDGES = [2, 3, 4, 6, 10, 20, 1 << 30]


def per_position(groups, variant: dict, one_group: bool = False) -> np.ndarray:
    """Rows (accepted, drafted, own match length, sibling match length) per position."""
    opts = {**OmegaConf.to_container(bench_sam.spec_group("sam").sam), "batch_threshold": 1 << 20,
            "cross_epoch": False, **variant}  # fmt: skip
    d = BatchDrafter(SAMOptions.from_dict(opts), K)
    slots = [[d.start(p, b"all" if one_group else str(g).encode()) for _ in rs] for g, (p, rs) in enumerate(groups)]
    rows = []
    for g, (_, responses) in enumerate(groups):
        for r, text in enumerate(responses):
            s = slots[g][r]
            for pos in range(len(text) - 1):
                draft = d.step(np.array([s]), text[pos : pos + 1], np.array([0, 1]), np.array([K]))[0]
                truth = text[pos + 1 : pos + 1 + len(draft)].tolist()
                ok = 0
                while ok < len(draft) and ok < len(truth) and draft[ok] == truth[ok]:
                    ok += 1
                rows.append((ok, len(draft), d.requests[s][0].match_length, d.src_len[s, 0]))
            d.finish(s)
    return np.array(rows)


def main() -> None:
    corpora = {
        "embedded_task_samples": bench_sam.task_samples(24, 8),
        "vllm_sibling_files": bench_sam.sibling_files(8, 6000),
    }
    for name, groups in corpora.items():
        default = per_position(groups, {})
        own = per_position(groups, {"group_sharing": False})
        group = per_position(groups, {"own_bonus": -(1 << 20)})
        every = per_position(groups, {"own_bonus": -(1 << 20)}, one_group=True)
        print(f"## {name}: accepted per position (drafted per position)")
        for label, rows in (("defaults", default), ("own text only", own), ("group only", group),
                            ("all prompts' responses only", every)):  # fmt: skip
            print(f"{label:32s} {rows[:, 0].mean():.3f} ({rows[:, 1].mean():.3f})")
        best2 = np.maximum(own[:, 0], group[:, 0])
        print(f"{'oracle own/group':32s} {best2.mean():.3f}")
        print(f"{'oracle own/group/all prompts':32s} {np.maximum(best2, every[:, 0]).mean():.3f}")
        nothing = default[:, 1] == 0  # the defaults draft nothing: draft from every prompt's responses instead
        fallback = np.where(nothing, every[:, 0], default[:, 0]), np.where(nothing, every[:, 1], default[:, 1])
        print(f"{'defaults, else all prompts':32s} {fallback[0].mean():.3f} ({fallback[1].mean():.3f})")
        both = (own[:, 1] > 0) & (group[:, 1] > 0)
        print("own accepted minus group accepted where both draft, rows: own match length, columns: group's")
        print("      " + " ".join(f"g>={e:<3d}" for e in EDGES[:-1]))
        for i in range(len(EDGES) - 1):
            line = f"o>={EDGES[i]:<3d}"
            for j in range(len(EDGES) - 1):
                m = both & (own[:, 2] >= EDGES[i]) & (own[:, 2] < EDGES[i + 1])
                m &= (group[:, 3] >= EDGES[j]) & (group[:, 3] < EDGES[j + 1])
                line += f" {(own[m, 0] - group[m, 0]).mean():+6.2f}" if m.sum() > 30 else "      ."
            print(line)
        print()


if __name__ == "__main__":
    main()
