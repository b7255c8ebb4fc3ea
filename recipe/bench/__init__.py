"""The recipe's benchmarks, one subcommand each (``python -m recipe.bench NAME [options]``), every one writing the
results folder a README cites. :data:`BENCHMARKS` is the registry the CLI lists."""

from __future__ import annotations

BENCHMARKS: dict[str, tuple[str, str]] = {  # name -> (module under recipe.bench, what it measures, one line)
    "rollout": ("rollout", "end-to-end rollouts per speculative mode, same-token pairs and 95% intervals"),
    "sam": ("sam", "SAM's proposer cost per decode step against vLLM ngram and suffix, ingest, memory"),
    "sam-real": ("sam_real", "drafters teacher-forced on the real model's rollouts, thresholds swept"),
    "proposer": ("proposer", "the proposer's own time per engine step, by batch size"),
    "verify-cost": ("verify_cost", "what verifying K drafted tokens costs a decode step, on this machine"),
    "verify-cost-gpu": ("verify_cost_gpu", "the same on a GPU: SmolLM2's decode step as a CUDA graph"),
    "mtp-overhead": ("mtp_overhead", "online MTP training's cost over a frozen head, local and veRL updates"),
    "mtp-overhead-gpu": ("mtp_overhead_gpu", "online MTP training's cost over a frozen head on a GPU"),
    "head-acceptance": ("head_acceptance", "an MTP head's drafts accepted at T=1 on held-out prompts, in vLLM"),
    "head-fit": ("head_fit", "each head's fit to a trained policy: its acceptance against a head refitted to it"),
    "head-swap": ("head_swap", "a frozen and an online head on one trunk in one engine: rollout speed, acceptance"),
    "backends": ("backends", "backend=local against backend=verl: start-up, step time, processes, memory"),
    "routing": ("routing", "prompt-affinity routing over vLLM server replicas against veRL's least-loaded"),
    "dtype": ("dtype", "bfloat16 against float32 sampling speed on this CPU"),
    "cost-model": (
        "cost_model",
        "the step-cost model fitted to measured step tables and checked where it was not fitted",
    ),
    "replay": ("replay", "recorded rollouts replayed on the step-cost model; Qwen3-8B/32B on H100/H200 predicted"),
    "base-model": ("base_model", "the embedded base model: pass@1, greedy accuracy, MTP acceptance"),
}
