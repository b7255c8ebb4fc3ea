"""The recipe's benchmarks, one subcommand each (``python -m recipe.bench NAME [options]``), every one writing the
results folder a README cites. :data:`BENCHMARKS` is the registry the CLI lists.

A benchmark measured on a GPU machine that has torch but no vLLM or veRL (the lent device) runs a torch-only twin of
its CPU measurement, chosen with ``--gpu``: ``python -m recipe.bench verify-cost --gpu --shape qwen3-8b``."""

from __future__ import annotations

from typing import NamedTuple


class Benchmark(NamedTuple):
    module: str  # under recipe.bench
    line: str  # what it measures, one line
    gpu_module: str | None = None  # the torch-only twin ``--gpu`` runs instead


GPU_FLAG = "--gpu"

BENCHMARKS: dict[str, Benchmark] = {
    "rollout": Benchmark("rollout", "end-to-end rollouts per speculative mode, same-token pairs and 95% intervals"),
    "sam": Benchmark("sam", "SAM's proposer cost per decode step against vLLM ngram and suffix, ingest, memory"),
    "sam-real": Benchmark("sam_real", "drafters teacher-forced on the real model's rollouts, thresholds swept"),
    "proposer": Benchmark("proposer", "the proposer's own time per engine step, by batch size"),
    "verify-cost": Benchmark(
        "verify_cost",
        "what verifying K drafted tokens costs a decode step (--gpu: SmolLM2's or Qwen3's step as a CUDA graph)",
        "verify_cost_gpu",
    ),
    "mtp-overhead": Benchmark(
        "mtp_overhead",
        "online MTP training's cost over a frozen head, local and veRL updates (--gpu: the local update on a GPU)",
        "mtp_overhead_gpu",
    ),
    "head-acceptance": Benchmark(
        "head_acceptance", "an MTP head's drafts accepted at T=1 on held-out prompts, in vLLM"
    ),
    "cost-model": Benchmark(
        "cost_model", "the step-cost model fitted to measured step tables and checked where it was not fitted"
    ),
    "replay": Benchmark(
        "replay", "recorded rollouts replayed on the step-cost model; Qwen3-8B/32B on H100/H200 predicted"
    ),
    "base-model": Benchmark("base_model", "the embedded base model: pass@1, greedy accuracy, MTP acceptance"),
}
