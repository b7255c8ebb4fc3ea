"""An MTP head grafted onto the real model (SmolLM2-135M-Instruct, mtp/graft.py): vLLM serves the grafted MiMo
checkpoint with the Llama checkpoint's greedy tokens, token for token, drafts with the new head (method ``mtp``)
without changing them, and the DAPO entry names a checkpoint without an MTP layer under ``spec=mtp``.

Compared in float32, where they match exactly. In bf16 vLLM's Qwen2 and Llama layers round differently (Qwen2's add
the zero q/k/v bias), and one of these three greedy answers flipped at a near-tie after 18 identical tokens."""

from pathlib import Path

import pytest

from recipe.models import resolve_model

MODEL = "smollm2-135m-instruct"
QUESTIONS = [
    "What is 17 + 25?",
    "Mia has 12 apples. She gives 5 to Tom. How many apples does she have now?",
    "A box holds 6 rows of 4 eggs. How many eggs are in the box?",
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from mtp.graft import graft_mtp

    llama = resolve_model(MODEL)
    return llama, graft_mtp(llama, tmp_path_factory.mktemp("graft") / "smollm2-mtp")


def greedy(path, spec, prompts, max_tokens=24, dtype="float32"):
    from vllm import SamplingParams, TokensPrompt

    from recipe.engine import EngineOptions, make_llm, spec_counters

    llm = make_llm(str(path), spec, EngineOptions(max_model_len=512, dtype=dtype, gpu_memory_utilization=0.1))
    try:
        outs = llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts],
            SamplingParams(temperature=0.0, max_tokens=max_tokens),
            use_tqdm=False,
        )
        return [list(o.outputs[0].token_ids) for o in outs], spec_counters(llm)
    finally:
        llm.llm_engine.engine_core.shutdown()


def test_the_grafted_checkpoint_keeps_the_trunks_greedy_tokens_and_drafts_with_its_head(checkpoints):
    from mtp.checkpoint import load_tokenizer
    from recipe.engine import speculative_config

    llama, grafted = checkpoints
    tokenizer = load_tokenizer(grafted)
    assert tokenizer.chat_template  # the chat template travels with the graft
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, return_dict=False)
        for q in QUESTIONS
    ]
    expected, _ = greedy(llama, None, prompts)
    got, _ = greedy(grafted, None, prompts)
    assert got == expected, [tokenizer.decode(t) for t in got + expected]
    drafted, counters = greedy(grafted, speculative_config("mtp", 1), prompts)
    assert counters.num_drafts > 0  # the grafted head drafted ...
    assert drafted == expected  # ... and greedy verification kept the trunk's tokens


def refused_at_start(tmp_path, match: str, *overrides: str) -> None:
    """``python -m recipe.dapo`` with ``overrides`` stops with a ConfigError matching ``match`` before writing its run."""
    from hydra import compose, initialize_config_dir

    from recipe.dapo.__main__ import CONFIG_DIR, run
    from recipe.dapo.config import ConfigError

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose("dapo", overrides=[*overrides, f"trainer.default_local_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match=match):
        run(cfg)
    assert not (tmp_path / "run").exists()


def test_spec_mtp_on_a_checkpoint_without_an_mtp_layer_says_how_to_graft_one(tmp_path):
    refused_at_start(
        tmp_path, r"spec=mtp: .* has no MTP layer .*python -m mtp.graft",
        f"actor_rollout_ref.model.path={MODEL}", "backend=verl", "spec=mtp",
    )  # fmt: skip


def test_spec_mtp_deeper_than_the_head_was_trained_names_the_key_and_how_to_train_it(checkpoints, tmp_path):
    _, grafted = checkpoints  # a fresh graft: its layer drafts one token a step
    refused_at_start(
        tmp_path, r"spec.num_speculative_tokens=3: .* 1 token\(s\) .*recipe.mtp_head --depth 3",
        f"actor_rollout_ref.model.path={grafted}", "spec=mtp", "spec.num_speculative_tokens=3",
    )  # fmt: skip


def test_vllm_serve_drafts_deep_with_the_built_in_head_as_users_deploy_it(tmp_path):
    """The shipped head as a user deploys a draft model: ``vllm serve`` on the built-in head's checkpoint with
    ``--speculative-config '{"method": "mtp", "num_speculative_tokens": K}'`` (K: the depth it was trained for), one
    completion request, and acceptance read from the server's Prometheus ``/metrics``: drafts accepted at every depth."""
    import json
    import re
    import sys
    import urllib.request

    from mtp.checkpoint import load_tokenizer, trained_depth

    sys.path.insert(0, str(Path(__file__).parent))
    from test_vllm_server import _post, _running_server

    checkpoint = resolve_model("smollm2-135m-instruct-mtp")
    k = trained_depth(checkpoint)
    assert k >= 2, f"the shipped head drafts {k} token(s) a step"
    spec = json.dumps({"method": "mtp", "num_speculative_tokens": k})
    (tmp_path / "timeline").mkdir()
    with _running_server(checkpoint, tmp_path / "timeline", "--speculative-config", spec) as base:
        tok = load_tokenizer(checkpoint)
        chats = [[{"role": "user", "content": q}] for q in QUESTIONS]
        texts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]
        prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        body = {"model": str(checkpoint), "prompt": prompts, "max_tokens": 160, "temperature": 0}
        response = _post(f"{base}/v1/completions", body)
        with urllib.request.urlopen(f"{base}/metrics", timeout=30) as page:
            metrics = page.read().decode()
    assert len(response["choices"]) == len(QUESTIONS) and all(c["text"] for c in response["choices"])
    # the recipe's tokenizer mode loads the checkpoint's tokenizer/ without vLLM's config probe and its ERROR lines
    errors = [line for line in (tmp_path / "timeline.log").read_text().splitlines() if " ERROR " in line]
    assert not errors, errors[:3]
    per_pos = {
        int(pos): float(value)
        for pos, value in re.findall(
            r'spec_decode_num_accepted_tokens_per_pos_total\{[^}]*position="(\d+)"[^}]*\} (\S+)', metrics
        )
    }
    drafts = float(re.search(r"spec_decode_num_drafts_total\{[^}]*\} (\S+)", metrics)[1])
    assert drafts > 0 and sorted(per_pos) == list(range(k)), (drafts, per_pos)
    assert all(per_pos[pos] > 0 for pos in range(k)), per_pos  # the head's drafts accepted at every depth
