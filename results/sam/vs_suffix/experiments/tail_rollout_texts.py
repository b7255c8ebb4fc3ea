"""Who drafts better on the responses a rollout's tail is made of (#18, the tail): teacher-forced on the texts of
bench_rollout.py's own workload, not bench_sam.py's shorter samples. Output: tail_rollout_texts.txt.

bench_rollout.py's prompts (test prompts 12-23, 8 samples each, temperature 1, max_tokens 768) are generated twice by
vLLM without drafting: the first rollout is the drafters' earlier epoch, the second the rollout measured. Its
stragglers are its ``--tail`` (8) longest responses: the ones left when at most 8 requests are active. Each drafter
sees the earlier epoch (SAM: as each prompt's history; suffix: in its global tree), then every other response of the
rollout as finished material (siblings; suffix's global tree), then drafts at every position of each straggler;
accepted and drafted tokens per position are counted by position in the straggler.

    .venv/bin/python results/sam/vs_suffix/experiments/tail_rollout_texts.py
"""

import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))

import bench_sam  # noqa: E402

BUCKETS = ((0, 64), (64, 192), (192, 384), (384, 1 << 20))
TAIL = 8


def rollouts() -> tuple[list[np.ndarray], list[list[np.ndarray]], list[list[np.ndarray]]]:
    """Prompts, and per prompt the earlier epoch's and the measured rollout's responses (spec off, vLLM)."""
    from omegaconf import OmegaConf

    from mtp.checkpoint import load_tokenizer
    from recipe.dapo.data import load_prompts
    from recipe.dapo.rollout import RolloutEngine
    from recipe.engine import EngineOptions
    from recipe.sft.train import ensure_base_model

    ckpt = ensure_base_model(OmegaConf.load(REPO / "configs" / "sft.yaml"))
    _, ids = load_prompts(str(ckpt.parent / "data" / "test.parquet"), load_tokenizer(ckpt), 160)
    prompts = ids[12:24]
    engine = RolloutEngine(str(ckpt), None, EngineOptions(max_model_len=1024, seed=0, dtype="float32"), None)
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 768}
    epochs = []
    for _ in range(2):
        by_prompt: list[list[np.ndarray]] = [[] for _ in prompts]
        for r in engine.generate(prompts, 8, sampling).responses:
            by_prompt[r.prompt_index].append(np.asarray(r.token_ids, dtype=np.int32))
        epochs.append(by_prompt)
    engine.close()
    return [np.asarray(p, dtype=np.int32) for p in prompts], epochs[0], epochs[1]


def accepted(draft: list[int], truth: list[int]) -> int:
    ok = 0
    while ok < len(draft) and ok < len(truth) and draft[ok] == truth[ok]:
        ok += 1
    return ok


def run(
    prompts: list, earlier: list, rollout: list, stragglers: set, mode: str, k: int, lockstep: bool, stepped: bool
) -> np.ndarray:
    """Per bucket of position: [positions, drafted, accepted] over the stragglers; ``stepped``: only at the
    positions a decode step lands on (a step takes the accepted draft and one more token, as vLLM's does)."""
    from omegaconf import OmegaConf

    from sam.policy import BatchDrafter, SAMOptions

    bench_sam.K = k
    out = np.zeros((len(BUCKETS), 3))
    arctic = bench_sam.ArcticSuffix() if mode == "suffix" else None
    drafter = None
    if arctic is None:
        opts = {**OmegaConf.to_container(bench_sam.spec_group("sam").sam), "batch_threshold": 1 << 20}
        drafter = BatchDrafter(SAMOptions.from_dict(opts), k)
    request = 0

    def feed(g: int, texts: list, measured: list[bool], lockstep: bool = False) -> None:
        """Draft along the prompt's texts: one after another, or (``lockstep``) the measured ones together, one
        token each in turn, as requests that run at once (the others first, finished)."""
        nonlocal request
        slots = [drafter.start(prompts[g], str(g).encode()) for _ in texts] if drafter else []
        ids = list(range(request + 1, request + 1 + len(texts)))
        request += len(texts)
        waves = [[i] for i in range(len(texts)) if not (lockstep and measured[i])]
        if lockstep and any(measured):
            waves.append([i for i in range(len(texts)) if measured[i]])
        for wave in waves:
            for i in wave:
                if arctic is not None:
                    arctic.cache.start_request(ids[i], prompts[g])
            pos = dict.fromkeys(wave, 0)  # each text's next position to draft at; tokens up to it are fed
            fed = dict.fromkeys(wave, 0)
            while any(pos[i] < len(texts[i]) - 1 for i in wave):
                for i in wave:
                    text = texts[i]
                    p = pos[i]
                    if p >= len(text) - 1:
                        continue
                    tok = text[fed[i] : p + 1]
                    fed[i] = p + 1
                    if arctic is not None:
                        draft = arctic.step(ids[i], tok, np.concatenate([prompts[g], text[: p + 1]]))
                    else:
                        offsets = np.array([0, len(tok)])
                        draft = drafter.step(np.array([slots[i]]), tok, offsets, np.array([k]))[0]
                    ok = accepted(draft, text[p + 1 : p + 1 + len(draft)].tolist())
                    if measured[i]:
                        b = next(j for j, (lo, hi) in enumerate(BUCKETS) if lo <= p < hi)
                        out[b] += (1, len(draft), ok)
                    pos[i] = p + 1 + (ok if stepped and measured[i] else 0)
            for i in wave:
                if arctic is not None:
                    arctic.cache.stop_request(ids[i])
                elif not lockstep or not measured[i]:
                    drafter.finish(slots[i])
        if drafter and lockstep:
            for i in range(len(texts)):
                if measured[i]:
                    drafter.finish(slots[i])

    for g, texts in enumerate(earlier):
        feed(g, texts, [False] * len(texts))
    for g, texts in enumerate(rollout):  # stragglers last within their prompt, after every other prompt's siblings
        order = sorted(range(len(texts)), key=lambda i: (g, i) in stragglers)
        feed(g, [texts[i] for i in order], [(g, i) in stragglers for i in order], lockstep)
    return out


def main() -> None:
    prompts, earlier, rollout = rollouts()
    lengths = sorted(((len(t), g, i) for g, ts in enumerate(rollout) for i, t in enumerate(ts)), reverse=True)
    stragglers = {(g, i) for _, g, i in lengths[:TAIL]}
    all_lengths = [n for n, _, _ in lengths]
    print(
        f"rollout: {len(all_lengths)} responses, median {np.median(all_lengths):.0f} tokens; its {TAIL} stragglers: "
        f"{sorted((n for n, _, _ in lengths[:TAIL]), reverse=True)} tokens, from "
        f"{len({g for _, g, _ in lengths[:TAIL]})} prompts"
    )
    head = " | ".join(f"positions {lo}-{hi if hi < 1 << 20 else ''}" for lo, hi in BUCKETS)
    for stepped in (False, True):
        what = (
            "tokens per decode step (accepted + 1; drafted per step), at the positions the steps land on"
            if stepped
            else "accepted per position (drafted per position), drafting at every position"
        )
        print(f"\n{what}, the stragglers\n\n| stragglers | mode | K | {head} | all |")
        print("|---|---|---|" + "---|" * (len(BUCKETS) + 1))
        for lockstep in (False, True):
            for mode, k in (("suffix", 24), ("suffix", 6), ("sam_group", 6), ("sam_group", 12), ("sam_group", 24)):
                t = run(prompts, earlier, rollout, stragglers, mode, k, lockstep, stepped)
                cells = [
                    "-" if not n else f"{stepped + a / n:.3f} ({d / n:.2f}), n={n:.0f}"
                    for n, d, a in [*t, t.sum(axis=0)]
                ]
                label = "together" if lockstep else "after their siblings"
                print(f"| {label} | {mode} | {k} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
