"""The one scorer of training rewards and validation, by data source. veRL loads it by file path as the run's
``reward.custom_reward_function`` (configs/dapo.yaml), so it imports nothing of the recipe."""

from __future__ import annotations


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info=None, **kwargs) -> dict:
    """The one scorer of training rewards and validation: veRL's ``math_dapo`` rule for every math source (the
    embedded task's included); for the real model's ``word_problems`` the last number of the response (veRL's GSM8K
    flexible extraction: SmolLM2-135M ends with "The answer is 20." far more often than with DAPO's "Answer:"
    line), scored +1/-1 as math_dapo scores; veRL's dispatcher otherwise."""
    from verl.utils.reward_score import default_compute_score, gsm8k, math_dapo

    if data_source == "word_problems":
        pred = gsm8k.extract_solution(solution_str, method="flexible")
        pred = pred.replace(",", "").rstrip(".") if pred is not None else None
        acc = pred == ground_truth
        return {"score": 1.0 if acc else -1.0, "acc": acc, "pred": pred if pred is not None else "[INVALID]"}
    if data_source in ("tiny_sum", "math_dapo", "math") or data_source.startswith("aime"):
        return math_dapo.compute_score(solution_str, ground_truth)
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)
