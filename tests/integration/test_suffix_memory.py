"""vLLM's suffix method across a checkpoint: its global tree of earlier responses cannot be read back from vLLM,
so the local rollout engine records what goes into it (recipe/dapo/suffix_memory.py) and a new engine replays it.
The replayed tree must count what the live one counts: at every position of every response, the longest match
and the best continuation's estimated probability are the same (the continuation itself may differ where two
tie, as Arctic orders equal-count children by insertion history)."""

from __future__ import annotations

import pytest

from recipe.dapo.rollout import RolloutEngine
from recipe.engine import EngineOptions, speculative_config

OPTIONS = EngineOptions(max_model_len=256, max_num_seqs=32, dtype="float32")
SAMPLING = {"temperature": 1.0, "max_tokens": 96}


def _tree_counts(worker, contexts: list[list[int]]) -> dict:
    """In the engine's worker: the global tree's sequence count and, per context, the longest match and the best
    next token's probability."""
    from arctic_inference.suffix_decoding._C import SuffixTree

    tree = worker.model_runner.drafter.suffix_cache._global_tree
    drafts = [SuffixTree.speculate(tree, ctx, 1, 1.0, 0.0, 0.0, False) for ctx in contexts]
    return {
        "num_seqs": tree.num_seqs(),
        "drafts": [(d.match_len, round(d.probs[0], 9) if d.probs else None) for d in drafts],
    }


@pytest.fixture(scope="module")
def prompts(harness_model):
    import pandas as pd
    from transformers import AutoTokenizer

    from mtp.checkpoint import tokenizer_path

    rows = pd.read_parquet(harness_model.parent / "data" / "test.parquet").head(6)
    tok = AutoTokenizer.from_pretrained(tokenizer_path(str(harness_model)))
    texts = [tok.apply_chat_template(list(p), tokenize=False, add_generation_prompt=True) for p in rows["prompt"]]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def test_a_new_engine_replays_the_suffix_tree_a_checkpoint_saved(harness_model, prompts):
    spec = speculative_config("suffix", 8, suffix_decoding_max_tree_depth=24)
    live = RolloutEngine(str(harness_model), spec, OPTIONS)
    try:
        responses = live.generate(prompts, 4, SAMPLING).responses
        responses += live.generate(prompts, 4, SAMPLING).responses  # a second rollout: more than one round in it
        contexts = [r.token_ids[max(0, i - 24) : i] for r in responses for i in range(1, len(r.token_ids))]
        before = live.llm.collective_rpc(_tree_counts, args=(contexts,))[0]
        blob = live.drafter_state()
    finally:
        live.close()
    assert before["num_seqs"] == len(responses) == 48
    assert sum(match > 0 for match, _ in before["drafts"]) > 0.9 * len(contexts)  # every response is in the tree

    restored = RolloutEngine(str(harness_model), spec, OPTIONS)
    try:
        empty = restored.llm.collective_rpc(_tree_counts, args=(contexts[:50],))[0]
        restored.load_drafter_state(blob)
        after = restored.llm.collective_rpc(_tree_counts, args=(contexts,))[0]
        assert restored.drafter_state() == blob  # recorded again as replayed: a later checkpoint keeps it all
    finally:
        restored.close()
    assert empty["num_seqs"] == 0
    assert after == before
