"""Sampling-based evaluation of a policy checkpoint with vLLM: pass@1 and speculative acceptance.

Scoring uses the training reward's scorer (``recipe.dapo.reward.compute_score``, by data source), so evaluation and
RL reward agree on what a correct answer is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recipe.data.loader import Problem
from recipe.engine import SpecCounters, spec_counters


def score_response(text: str, ground_truth: str, data_source: str = "math_dapo") -> dict:
    """The training reward's score of one response: ``{"score": +1/-1, "acc": bool, "pred": str}``."""
    from recipe.dapo.reward import compute_score

    return compute_score(data_source, text, ground_truth)


def chat_prompts(tokenizer, problems: list[Problem]) -> list[str]:
    return [tokenizer.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=False) for p in problems]


@dataclass
class EvalResult:
    pass_at_1: float
    num_problems: int
    samples_per_problem: int
    mean_response_tokens: float
    response_lengths: list[int]
    spec: SpecCounters
    seconds: float
    samples: list[dict]  # one per response, problem by problem: prompt, text, ground truth, score, acc

    def as_dict(self) -> dict:
        return {
            "pass@1": self.pass_at_1,
            "num_problems": self.num_problems,
            "samples_per_problem": self.samples_per_problem,
            "mean_response_tokens": self.mean_response_tokens,
            "num_drafts": self.spec.num_drafts,
            "num_draft_tokens": self.spec.num_draft_tokens,
            "num_accepted_tokens": self.spec.num_accepted_tokens,
            "mean_acceptance_length": self.spec.mean_acceptance_length,
            "draft_acceptance_rate": self.spec.acceptance_rate,
            "seconds": self.seconds,
            "tokens_per_second": sum(self.response_lengths) / self.seconds if self.seconds else 0.0,
        }


def by_data_source(result: EvalResult) -> dict[str, tuple[float, float]]:
    """Accuracy and mean response length per data source of a mixed held-out set (veRL's ``val-core/<source>/...``
    keys: one file can hold several sources)."""
    out = {}
    sources = np.array([s["data_source"] for s in result.samples])
    acc = np.array([s["acc"] for s in result.samples], dtype=float)
    lengths = np.asarray(result.response_lengths, dtype=float)
    for source in sorted(set(sources.tolist())):
        mine = sources == source
        out[source] = (float(acc[mine].mean()), float(lengths[mine].mean()))
    return out


def evaluate(
    llm, problems: list[Problem], n: int, temperature: float, max_tokens: int, top_p: float = 1.0
) -> EvalResult:
    """Sample ``n`` responses per problem and score them; spec counters are the delta over this call.

    Randomness comes from the engine's seed: per-request seeds crash vLLM CPU (0.28) when a prefill is
    chunked (``CPU Generator does not use offset``)."""
    import time

    from vllm import SamplingParams

    tokenizer = llm.get_tokenizer()
    params = SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens)
    before = spec_counters(llm)
    start = time.perf_counter()
    outputs = llm.generate(chat_prompts(tokenizer, problems), params, use_tqdm=False)
    seconds = time.perf_counter() - start
    spec = spec_counters(llm) - before
    lengths, samples = [], []
    for problem, out in zip(problems, outputs, strict=True):
        for comp in out.outputs:
            scored = score_response(comp.text, problem.ground_truth, problem.data_source)
            lengths.append(len(comp.token_ids))
            samples.append(
                {"input": out.prompt, "output": comp.text, "gts": problem.ground_truth, "score": float(scored["score"]),
                 "acc": bool(scored["acc"]), "pred": scored["pred"], "data_source": problem.data_source}
            )  # fmt: skip
    return EvalResult(
        pass_at_1=float(np.mean([s["acc"] for s in samples])),
        num_problems=len(problems),
        samples_per_problem=n,
        mean_response_tokens=float(np.mean(lengths)),
        response_lengths=lengths,
        spec=spec,
        seconds=seconds,
        samples=samples,
    )
