"""Statistical harness: does a (speculative) sampler draw exactly what the model's distribution says?

Samples many continuations of one prompt from each sampler (HuggingFace ``generate``; vLLM with
speculation off; vLLM with a drafter) and compares the per-position token distributions with a chi-square
test of homogeneity at every position (rare tokens pooled), combined over positions with Bonferroni. A
lossless sampler is not rejected; a biased one is (the tests show the power against a sampler at
temperature 0.85 instead of 1).

Each vLLM sampler runs in its own process, so one whose plugins are disabled (``SPEC_ROLLOUT_LOSSLESS_PATCH=0``)
cannot leak into another. Run it against any engine, e.g. on a GPU or NPU machine:

    python -m recipe.lossless_harness --model /path/to/ckpt --methods off,ngram,mtp --n 2000

which prints one line per (method, temperature, top-p) with the p-value against spec off and HF.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from recipe.paths import REPO_ROOT
from recipe.tables import markdown

END = -1  # position after the sequence ended
HARNESS_COLUMNS = ("sampler", "setting", "p vs vLLM spec off", "p vs HF generate", "max per-position TV vs off",
                   "drafts", "accepted / drafted")  # fmt: skip
DEFAULT_PROMPT = [{"role": "user", "content": "Add the numbers: 3 5 2 7 4"}]


@dataclass(frozen=True)
class Setting:
    temperature: float
    top_p: float = 1.0

    @property
    def name(self) -> str:
        return f"t{self.temperature:g}_p{self.top_p:g}"


def prompt_ids(model: str, messages: list[dict] = DEFAULT_PROMPT) -> list[int]:
    from mtp.checkpoint import load_tokenizer
    from recipe.sft.train import encode_prompt

    return encode_prompt(load_tokenizer(model), messages)


def _pad(rows: list[list[int]], length: int) -> np.ndarray:
    out = np.full((len(rows), length), END, dtype=np.int64)
    for i, r in enumerate(rows):
        r = r[:length]
        out[i, : len(r)] = r
    return out


def sample_hf(model: str, setting: Setting, n: int, max_tokens: int, seed: int, batch: int = 500) -> np.ndarray:
    """``n`` samples from transformers' ``generate`` (float32), as an [n, max_tokens] array."""
    import torch
    from transformers import AutoModelForCausalLM

    from mtp.checkpoint import load_tokenizer

    tok = load_tokenizer(model)
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    ids = torch.tensor([prompt_ids(model)])
    torch.manual_seed(seed)
    rows: list[list[int]] = []
    with torch.no_grad():
        while len(rows) < n:
            m = min(batch, n - len(rows))
            out = lm.generate(
                ids.repeat(m, 1),
                attention_mask=torch.ones(m, ids.shape[1], dtype=torch.long),
                do_sample=True,
                temperature=setting.temperature,
                top_p=setting.top_p,
                top_k=0,
                max_new_tokens=max_tokens,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
            )
            for r in out[:, ids.shape[1] :].tolist():
                rows.append(r[: r.index(tok.eos_token_id) + 1] if tok.eos_token_id in r else r)
    return _pad(rows, max_tokens)


GREEDY_PROMPTS = [
    [
        {
            "role": "user",
            "content": f"Add the numbers: {' '.join(str(1 + (i * 7 + j * 3) % 9) for j in range(2 + i % 9))}",
        }
    ]
    for i in range(16)
]


def _hybrid_drafted(worker) -> list[int]:
    """Runs in a vLLM worker: the hybrid drafter's draft tokens sent so far, by source (sam.hybrid.SOURCES), then its
    head chains sent so far by length (0, 1, 2, ...)."""
    drafter = worker.model_runner.drafter
    return drafter.drafted.tolist() + drafter.head_chains.tolist()


def sample_vllm_inprocess(
    model: str, method: str, settings: list[Setting], n: int, max_tokens: int, seed: int, k: int, dtype: str
) -> dict[str, np.ndarray]:
    """Samples per setting from one vLLM engine with speculative ``method`` (run in a child process),
    plus greedy outputs for :data:`GREEDY_PROMPTS` under key ``greedy``."""
    from vllm import SamplingParams, TokensPrompt

    from recipe.dapo.config import spec_group
    from recipe.engine import EngineOptions, make_llm, spec_counters, spec_from_config

    # the head drafts chains (its layer run on its own output): two tokens alone, up to three in the hybrid at K=3,
    # where SAM's drafts are short enough that the head's chain wins many rows
    k = {"mtp": 2, "hybrid": 3}.get(method, k)
    spec, extra = spec_from_config(spec_group(method, num_speculative_tokens=k))
    # the harness tests verification, which needs drafts everywhere: SAM sends every draft the match rules give
    # (payoff off); the hybrid, whose payoff rule picks each row's source, prices drafts as nearly free and starts
    # from a head confident enough that its chains win most rows and SAM the rows where its match is likelier, so that
    # a step's batch mixes the head's sampled chains with SAM's point masses
    if method == "sam":
        extra = {"sam": {"batch_threshold": 1 << 20, "min_match": 1, "payoff": False}}
    if method == "hybrid":
        extra["sam"].update(batch_threshold=1 << 20, min_match=1, payoff_cost=[0.01, 0.001, 1e-6, 0.0, 0.0])
        extra["hybrid"].update(head_acceptance=0.6, head_cost=0.0, head_depth=3)
    llm = make_llm(model, spec, EngineOptions(max_model_len=512, seed=seed, dtype=dtype), additional_config=extra)
    prompt = TokensPrompt(prompt_token_ids=prompt_ids(model))
    result = {}
    for setting in settings:
        params = SamplingParams(temperature=setting.temperature, top_p=setting.top_p, max_tokens=max_tokens)
        before = spec_counters(llm)
        outs = llm.generate([prompt] * n, params, use_tqdm=False)
        counters = spec_counters(llm) - before
        result[setting.name] = _pad([list(o.outputs[0].token_ids) for o in outs], max_tokens)
        result[setting.name + "_accepted"] = np.array(
            [counters.num_drafts, counters.num_draft_tokens, counters.num_accepted_tokens]
        )
        if method == "hybrid":  # draft tokens sent by source (head, SAM), then head chains by length, in this setting
            sent = np.array(llm.collective_rpc(_hybrid_drafted)[0])
            result[setting.name + "_sources"] = sent - sum(
                (v for key, v in result.items() if key.endswith("_sources")), np.zeros_like(sent)
            )
    greedy = llm.generate(
        [TokensPrompt(prompt_token_ids=prompt_ids(model, m)) for m in GREEDY_PROMPTS],
        SamplingParams(temperature=0.0, max_tokens=256),
        use_tqdm=False,
    )
    result["greedy"] = _pad([list(o.outputs[0].token_ids) for o in greedy], 256)
    return result


def sample_vllm(
    model: str,
    method: str,
    settings: list[Setting],
    n: int,
    max_tokens: int,
    seed: int = 0,
    k: int = 3,
    patch: bool = True,
    dtype: str = "float32",
) -> dict[str, np.ndarray]:
    """Run :func:`sample_vllm_inprocess` in a fresh process (``patch=False`` disables the lossless plugin)."""
    env = dict(os.environ)
    env["SPEC_ROLLOUT_LOSSLESS_PATCH"] = "1" if patch else "0"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "samples.npz"
        args = {
            "model": model,
            "method": method,
            "settings": [[s.temperature, s.top_p] for s in settings],
            "n": n,
            "max_tokens": max_tokens,
            "seed": seed,
            "k": k,
            "dtype": dtype,
            "out": str(out),
        }
        proc = subprocess.run(
            [sys.executable, "-m", "recipe.lossless_harness", "_child", json.dumps(args)],
            env=env,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"vLLM sampler {method} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
        with np.load(out) as data:
            return {key: data[key] for key in data.files}


@dataclass
class Comparison:
    p_value: float  # Bonferroni-combined over positions
    worst_position: int
    max_tv: float  # largest per-position total variation distance
    positions: int


def compare(a: np.ndarray, b: np.ndarray, min_count: int = 10) -> Comparison:
    """Chi-square homogeneity test of the token distribution at every position, Bonferroni-combined."""
    from scipy.stats import chi2_contingency

    assert a.shape[1] == b.shape[1]
    p_values, tvs = [], []
    for j in range(a.shape[1]):
        tokens = np.union1d(a[:, j], b[:, j])
        ca = np.array([(a[:, j] == t).sum() for t in tokens])
        cb = np.array([(b[:, j] == t).sum() for t in tokens])
        tvs.append(0.5 * np.abs(ca / ca.sum() - cb / cb.sum()).sum())
        common = (ca + cb) >= min_count
        table = np.stack([ca[common], cb[common]], axis=1)
        rare = np.array([ca[~common].sum(), cb[~common].sum()])
        if rare.sum() >= min_count:
            table = np.vstack([table, rare])
        if table.shape[0] < 2:
            p_values.append(1.0)
            continue
        p_values.append(float(chi2_contingency(table.T)[1]))
    worst = int(np.argmin(p_values))
    return Comparison(min(1.0, p_values[worst] * len(p_values)), worst, float(max(tvs)), len(p_values))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_child":
        args = json.loads(argv[1])
        result = sample_vllm_inprocess(
            args["model"],
            args["method"],
            [Setting(*s) for s in args["settings"]],
            args["n"],
            args["max_tokens"],
            args["seed"],
            args["k"],
            args["dtype"],
        )
        np.savez(args["out"], **result)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="HF checkpoint directory (MiMo/Qwen2)")
    parser.add_argument("--methods", default="ngram,suffix,sam,mtp,hybrid", help="comma-separated spec methods to test")
    parser.add_argument("--n", type=int, default=1500, help="samples per sampler and setting")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--settings", default="1.0:1.0,0.7:0.9", help="temperature:top_p pairs")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--no-patch", action="store_true", help="disable the lossless plugin (to see the bug)")
    parser.add_argument("--out", help="also write the table as markdown to this file")
    opts = parser.parse_args(argv)
    settings = [Setting(*map(float, s.split(":"))) for s in opts.settings.split(",")]
    ref = sample_vllm(opts.model, "off", settings, opts.n, opts.max_tokens, seed=1, dtype=opts.dtype)
    hf = {s.name: sample_hf(opts.model, s, opts.n, opts.max_tokens, seed=3) for s in settings}
    table = []  # sampler, setting, p vs vLLM spec off, p vs HF generate, max TV vs off, drafts, accepted / drafted
    for s in settings:
        c = compare(ref[s.name], hf[s.name])
        table.append(["vLLM spec off", s.name, "-", f"{c.p_value:.3g}", "-", "-", "-"])
    # the test's power: spec off at 0.85 of the first setting's temperature, which a lossless sampler must not resemble
    first = settings[0]
    biased = Setting(round(0.85 * first.temperature, 4), first.top_p)
    control = sample_vllm(opts.model, "off", [biased], opts.n, opts.max_tokens, seed=4, dtype=opts.dtype)
    c_off, c_hf = compare(control[biased.name], ref[first.name]), compare(control[biased.name], hf[first.name])
    table.append([f"power: spec off at T={biased.temperature} against {first.name}", first.name,
                  f"{c_off.p_value:.3g}", f"{c_hf.p_value:.3g}", f"{c_off.max_tv:.3f}", "-", "-"])  # fmt: skip
    for method in opts.methods.split(","):
        got = sample_vllm(
            opts.model, method, settings, opts.n, opts.max_tokens, seed=2, patch=not opts.no_patch, dtype=opts.dtype
        )
        for s in settings:
            c_off, c_hf = compare(got[s.name], ref[s.name]), compare(got[s.name], hf[s.name])
            drafts, drafted, accepted = got[s.name + "_accepted"]
            label = f"vLLM {method}" + (" (plugin off)" if opts.no_patch else "")
            table.append([label, s.name, f"{c_off.p_value:.3g}", f"{c_hf.p_value:.3g}", f"{c_off.max_tv:.3f}",
                          drafts, f"{accepted}/{drafted}"])  # fmt: skip
        print(markdown(table, HARNESS_COLUMNS), flush=True)
    if opts.out:
        Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
        Path(opts.out).write_text(markdown(table, HARNESS_COLUMNS) + "\n")


if __name__ == "__main__":
    main()
