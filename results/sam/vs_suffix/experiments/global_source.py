"""Every prompt's finished responses as a third source, used only where its match beats the prompt's own material by a
margin (#18, the teacher-forced goal on the vLLM files; output: global_source.txt).

source_oracle.txt found that a third source holding every prompt's responses (what suffix's global tree holds) is
worth +0.11 accepted per position on the vLLM files to an oracle, and every rule tried so far lost it: all responses
in one group (longest match wins) lost 2.8% on the model's samples and drafted more than suffix; drafting from them
only where SAM drafts nothing gained +0.75% at more drafting than suffix. Here the global material wins only when its
match is longer than the longest of the request's own text and its siblings by a margin.

Two drafters step side by side at every position, as bench_sam.teacher_forced runs them: the defaults (own text +
siblings), and the same options with every prompt's finished responses as one group. A rule takes the second's draft
when its group match exceeds the first's longest match by at least a margin and is at least a minimum length ("empty":
only where the defaults draft nothing); "own 2 -> 1" also cuts own-text drafts from a 2-token match to one token, to ask
whether the drafting the third source adds can be paid for where the defaults draft worst (the share of those drafts'
tokens accepted is printed per corpus).

    .venv/bin/python results/sam/vs_suffix/experiments/global_source.py 4
"""

import sys

import numpy as np
from teacher_forced_variants import bench_sam, load_corpora
from where_suffix_wins import accepted

LABELS = {"embedded_task_samples": "model samples", "vllm_sibling_files": "vLLM files"}
RULES = [  # (margin, minimum global match, own 2-token matches draft one token); margin None: never
    *((m, 0, False) for m in (0, 2, 4, 8, 16, "empty")),
    *((2, g, False) for g in (6, 9, 12, 16)),
    *((2, g, True) for g in (0, 6, 9, 12, 16)),
    (None, 0, True),
]


def records(groups: list) -> list[tuple]:
    """Per position: the defaults' longest local match, the global match, both drafts' accepted counts and lengths,
    and whether the defaults' draft is own text from a 2-token match."""
    from omegaconf import OmegaConf

    from sam.policy import BatchDrafter, SAMOptions

    base = {**OmegaConf.to_container(bench_sam.spec_group("sam").sam), "batch_threshold": 1 << 20, "cross_epoch": False}
    local = BatchDrafter(SAMOptions.from_dict(base), bench_sam.K)
    every = BatchDrafter(SAMOptions.from_dict(base), bench_sam.K)
    slots = [
        [(local.start(p, str(g).encode()), every.start(p, b"all")) for _ in rs] for g, (p, rs) in enumerate(groups)
    ]
    out = []
    for g, (_, responses) in enumerate(groups):
        for r, text in enumerate(responses):
            a, b = slots[g][r]
            for pos in range(len(text) - 1):
                tok = text[pos : pos + 1]
                d_local = local.step(np.array([a]), tok, np.array([0, 1]), np.array([bench_sam.K]))[0]
                d_every = every.step(np.array([b]), tok, np.array([0, 1]), np.array([bench_sam.K]))[0]
                own_len, sib_len = local.requests[a][0].match_length, int(local.src_len[a, 0])
                truth = text[pos + 1 : pos + 1 + bench_sam.K].tolist()
                own_short = bool(d_local) and own_len == 2 and own_len >= sib_len  # own text wins ties
                out.append((max(own_len, sib_len), int(every.src_len[b, 0]), accepted(d_local, truth), len(d_local),
                            accepted(d_every, truth), len(d_every), own_short))  # fmt: skip
            local.finish(a)
            every.finish(b)
    return out


def apply(rule: tuple, recs: list[tuple]) -> tuple[float, float]:
    margin, min_global, cut_own = rule
    acc = drafted = 0
    for longest, glob, ok_l, n_l, ok_e, n_e, own_short in recs:
        if margin is None:
            use = False
        elif margin == "empty":
            use = n_l == 0
        else:
            use = glob - longest >= margin and glob >= min_global
        if use:
            acc, drafted = acc + ok_e, drafted + n_e
        elif cut_own and own_short:
            acc, drafted = acc + min(ok_l, 1), drafted + 1
        else:
            acc, drafted = acc + ok_l, drafted + n_l
    return acc / len(recs), drafted / len(recs)


def main() -> None:
    bench_sam.K = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    for name, groups in load_corpora().items():
        recs = records(groups)
        print(f"\n{LABELS[name]}, K={bench_sam.K}: {len(recs)} positions")
        short = [(ok, n) for _, _, ok, n, _, _, own_short in recs if own_short]
        print(f"own-text drafts from a 2-token match: {len(short) / len(recs):.3f} of positions, "
              f"{sum(ok for ok, _ in short) / sum(n for _, n in short):.3f} of their tokens accepted\n")  # fmt: skip
        print("| global material used where | own 2 -> 1 | accepted/position | drafted/position |\n|---|---|---|---|")
        for rule in RULES:
            margin, min_global, cut_own = rule
            if margin is None:
                where = "never (the defaults)" if not cut_own else "never"
            elif margin == "empty":
                where = "the defaults draft nothing"
            else:
                where = f"its match is >= {margin} longer" + (f" and >= {min_global}" if min_global else "")
            acc, drafted = apply(rule, recs)
            print(f"| {where} | {'yes' if cut_own else 'no'} | {acc:.3f} | {drafted:.3f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
