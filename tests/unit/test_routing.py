"""The prompt-affinity router as veRL loads it (its own YAML loader and class resolver) and drives it: acquire
with the prompt's token ids, release when a request ends, servers leaving the pool."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROUTER_YAML = REPO / "configs" / "router" / "prompt_affinity.yaml"


@pytest.fixture
def router():
    from verl.workers.rollout.router import _load_router_yaml, _resolve_router_class

    config = _load_router_yaml(str(ROUTER_YAML))
    cls = _resolve_router_class(config["router_class"])
    return cls({"a": "handle-a", "b": "handle-b"}, config)


def test_every_sample_and_epoch_of_a_prompt_goes_to_one_server_and_new_prompts_to_the_least_loaded(router):
    assert router.require_acquire_fields() == ["prompt_ids"]
    p1, p2 = [1, 5, 9, 2], [1, 5, 9, 3]
    first = [router.acquire_server(f"p1-{i}", prompt_ids=p1) for i in range(8)]
    assert {sid for sid, _ in first} == {first[0][0]}
    other, handle = router.acquire_server("p2-0", prompt_ids=p2)  # the least loaded: the server p1 left free
    assert other != first[0][0] and handle == f"handle-{other}"
    for sid, _ in first:
        router.release_server(sid)
    router.clear_sticky_cache()  # veRL's phase switch: request ids are forgotten, prompts are not
    assert router.acquire_server("p1-next-epoch", prompt_ids=p1)[0] == first[0][0]
    assert router.get_status()["servers"] == {first[0][0]: 1, other: 1}


def test_a_prompt_whose_server_left_moves_to_a_remaining_one_and_stays_there(router):
    prompt = [7, 7, 1]
    gone, _ = router.acquire_server("r0", prompt_ids=prompt)
    router.remove_servers([gone])
    moved = {router.acquire_server(f"r{i}", prompt_ids=prompt)[0] for i in range(1, 5)}
    assert moved == {"b" if gone == "a" else "a"}


def test_a_later_turn_of_a_request_stays_on_its_server(router):
    sid, _ = router.acquire_server("conversation", prompt_ids=[1, 2])
    assert router.acquire_server("conversation", prompt_ids=[1, 2, 30, 31, 2])[0] == sid


def test_a_misspelled_router_key_is_named(router):
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['max_prompt'\]"):
        type(router)({"a": "handle-a"}, {"router_class": "x", "max_prompt": 10})


def test_the_router_keys_a_prompt_as_sam_groups_it(router, tmp_path, monkeypatch):
    """The router sees a prompt as a list of ints, SAM's proposer as the runner's int32 row: one key for both,
    or the router keeps together requests that SAM does not group (and vice versa)."""
    import numpy as np

    from recipe.dapo.server_timeline import TIMELINE_DIR_ENV
    from sam.keys import prompt_key

    monkeypatch.setenv(TIMELINE_DIR_ENV, str(tmp_path))
    logging_router = type(router)({"a": "handle-a"}, {"router_class": "x"})
    prompt = [1, 49151, 7, 300000]
    logging_router.acquire_server("r0", prompt_ids=prompt)
    logging_router._log.close()
    logged = json.loads((tmp_path / "routing.jsonl").read_text())["prompt"]
    runner_row = np.asarray(prompt, dtype=np.int64).astype(np.int32)
    assert logged == prompt_key(runner_row).hex() == prompt_key(prompt).hex()
    template = list(range(100, 140))  # prompts that share a chat template differ only after it
    assert len({prompt_key(template + [5]), prompt_key(template + [6]), prompt_key(template)}) == 3
