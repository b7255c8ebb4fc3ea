"""Own-text drafts by counts instead of the latest occurrence (#18, the teacher-forced goal on the vLLM files; output:
own_counted.txt).

Arctic's per-request tree scores a continuation of the request's own text by how often it followed the match; SAM's
own text copies what followed the match's latest earlier occurrence. On the vLLM files, 62% of positions draft from
own text (where_suffix_wins.txt: 46.8% + 14.8%), so this asks what counting would give there before building it into the automaton.
At every position where SAM's draft comes from own text (the draft SAM without group material gives), it is replaced
by one of the same length whose tokens follow the most frequent continuation of the longest earlier context (n-gram
counts of the own text, orders 1..MAX_ORDER; ties to the latest), optionally only where that continuation's share of
the context's occurrences is at least a threshold. Drafted tokens per position stay exactly SAM's.

    .venv/bin/python results/sam/vs_suffix/experiments/own_counted.py 4
"""

import sys
from collections import defaultdict

import numpy as np
from teacher_forced_variants import bench_sam, load_corpora
from where_suffix_wins import accepted

LABELS = {"embedded_task_samples": "model samples", "vllm_sibling_files": "vLLM files"}
MAX_ORDER = 24
# the counted draft is used where its first token's share of the context's occurrences is at least this
SHARES = (0.0, 0.5, 0.67)


class NgramCounts:
    """Next-token counts (and the latest position) of every context of length 1..MAX_ORDER seen in one text."""

    def __init__(self) -> None:
        self.table: dict[tuple, dict[int, list[int]]] = defaultdict(dict)
        self.text: list[int] = []

    def extend(self, tokens) -> None:
        for t in tokens:
            t = int(t)
            n = len(self.text)
            for order in range(1, min(MAX_ORDER, n) + 1):
                cell = self.table[tuple(self.text[n - order :])].setdefault(t, [0, 0])
                cell[0] += 1
                cell[1] = n
            self.text.append(t)

    def best(self, context: list[int]) -> tuple[int, float] | None:
        """The most frequent continuation of the longest seen suffix of ``context`` and its share."""
        for order in range(min(MAX_ORDER, len(context)), 0, -1):
            nexts = self.table.get(tuple(context[len(context) - order :]))
            if nexts:
                tok, (count, _) = max(nexts.items(), key=lambda kv: (kv[1][0], kv[1][1]))
                return tok, count / sum(c for c, _ in nexts.values())
        return None

    def draft(self, length: int) -> tuple[list[int], float]:
        context = list(self.text)
        out, first_share = [], 0.0
        for i in range(length):
            best = self.best(context)
            if best is None:
                break
            if i == 0:
                first_share = best[1]
            out.append(best[0])
            context.append(best[0])
        return out, first_share


def compare(groups: list) -> dict:
    from omegaconf import OmegaConf

    from sam.policy import BatchDrafter, SAMOptions

    base = {**OmegaConf.to_container(bench_sam.spec_group("sam").sam), "batch_threshold": 1 << 20, "cross_epoch": False}
    sam_all = BatchDrafter(SAMOptions.from_dict(base), bench_sam.K)
    sam_own = BatchDrafter(SAMOptions.from_dict({**base, "group_sharing": False}), bench_sam.K)
    slots = [
        [(sam_all.start(p, str(g).encode()), sam_own.start(p, b"")) for _ in rs] for g, (p, rs) in enumerate(groups)
    ]
    total = defaultdict(float)
    for g, (prompt, responses) in enumerate(groups):
        for r, text in enumerate(responses):
            a, o = slots[g][r]
            counts = NgramCounts()
            counts.extend(prompt)
            for pos in range(len(text) - 1):
                tok = text[pos : pos + 1]
                counts.extend(tok)
                d_all = sam_all.step(np.array([a]), tok, np.array([0, 1]), np.array([bench_sam.K]))[0]
                d_own = sam_own.step(np.array([o]), tok, np.array([0, 1]), np.array([bench_sam.K]))[0]
                truth = text[pos + 1 : pos + 1 + bench_sam.K].tolist()
                ok = accepted(d_all, truth)
                total["positions"] += 1
                total["drafted"] += len(d_all)
                total["sam"] += ok
                own = bool(d_all) and d_all == d_own
                if own:
                    counted, share = counts.draft(len(d_all))
                    ok_c = accepted(counted, truth)
                    total["own positions"] += 1
                    total["own sam"] += ok
                    total["own counted"] += ok_c
                    total["own differs"] += counted != d_all
                for s in SHARES:
                    total[f"share {s}"] += ok_c if own and share >= s else ok
            sam_all.finish(a)
            sam_own.finish(o)
    return total


def main() -> None:
    bench_sam.K = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    for name, groups in load_corpora().items():
        t = compare(groups)
        n = t["positions"]
        print(f"\n{LABELS[name]}, K={bench_sam.K}: {n:.0f} positions, drafted {t['drafted'] / n:.3f} per position")
        print(f"- SAM (defaults): {t['sam'] / n:.3f} accepted per position")
        for s in SHARES:
            print(f"- own-text drafts by counts where the first token's share >= {s}: {t[f'share {s}'] / n:.3f}")
        m = t["own positions"]
        print(f"- on the {m / n:.3f} of positions drafted from own text: latest occurrence {t['own sam'] / m:.3f}, "
              f"counts {t['own counted'] / m:.3f}; the drafts differ at {t['own differs'] / m:.3f} of them")  # fmt: skip
        sys.stdout.flush()


if __name__ == "__main__":
    main()
