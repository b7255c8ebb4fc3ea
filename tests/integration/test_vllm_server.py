"""SAM and the rollout timeline inside a real vLLM OpenAI API server (what veRL's rollout replicas run), on
whichever vLLM this environment has (``make test-compat`` runs it on every version of the matrix).

- The server loads this package's ``vllm.stat_logger_plugins`` entry point and writes one timeline row per engine
  step, with the step's drafted and accepted tokens.
- Drafting stays on when a request asks for log-probabilities (vLLM issue 34497 reports speculation silently off
  then; veRL's rollouts can ask for them): a request with ``logprobs`` drafts and accepts as one without does.
- Without a speculative config (spec=off) every engine step emits one token per active request and drafts nothing:
  the rollout metrics of a spec=off run (1.0 tokens per request-step) rest on this, checked here instead of in a veRL
  launch of its own.

The server runs in its own session; the test kills the whole group and removes the /dev/shm entries it made,
also when an assertion fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from recipe.dapo.job import shm_entries
from recipe.dapo.server_timeline import TIMELINE_DIR_ENV, load_rows
from recipe.engine import speculative_config

pytestmark = pytest.mark.vllm_side

PROMPTS = 4
MAX_TOKENS = 48
START_TIMEOUT_S = 600


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        raise AssertionError(f"{url} answered {err.code}: {err.read().decode()[:2000]}") from err


@contextlib.contextmanager
def _running_server(model: Path, timeline_dir: Path, *spec_args: str):
    """A vLLM API server over ``model`` with ``spec_args``, writing its timeline to ``timeline_dir``: its base URL.
    The whole process group is killed and its /dev/shm entries removed afterwards."""
    from recipe.vllm_tokenizer import tokenizer_args

    log_path = timeline_dir.parent / f"{timeline_dir.name}.log"
    port = _free_port()
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        *(f"--{k.replace('_', '-')}={v}" for k, v in tokenizer_args(model).items()),
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--enforce-eager", "--max-model-len", "256", "--gpu-memory-utilization", "0.05",
        "--seed", "0", *spec_args,
    ]  # fmt: skip
    env = {**os.environ, TIMELINE_DIR_ENV: str(timeline_dir), "VLLM_CPU_KVCACHE_SPACE": "1"}
    shm_before = shm_entries()
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM server exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"vLLM server not up in {START_TIMEOUT_S}s:\n{log_path.read_text()[-4000:]}")
                time.sleep(2)
        yield base
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        for name in shm_entries() - shm_before:
            Path("/dev/shm", name).unlink(missing_ok=True)


@pytest.fixture(scope="module")
def server(harness_model, tmp_path_factory):
    """A vLLM API server over the harness model drafting with SAM (every draft its match rules give), its timeline
    directory and base URL."""
    timeline_dir = tmp_path_factory.mktemp("server_timeline")
    spec = speculative_config("sam", 3)
    sam_options = {"payoff": False}  # the mechanics under test, not the payoff rule's choice to draft
    spec_args = ("--speculative-config", json.dumps(spec), "--additional-config", json.dumps({"sam": sam_options}))
    with _running_server(harness_model, timeline_dir, *spec_args) as base:
        yield base, timeline_dir, str(harness_model)


def _prompt_ids(model: str) -> list[list[int]]:
    """The first ``PROMPTS`` held-out problems, as token ids (greedy requests take one sample each)."""
    import pandas as pd

    from mtp.checkpoint import load_tokenizer

    tok = load_tokenizer(model)
    prompts = pd.read_parquet(Path(model).parent / "data" / "test.parquet")["prompt"].head(PROMPTS)
    texts = [tok.apply_chat_template(list(p), tokenize=False, add_generation_prompt=True) for p in prompts]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def _drafting_of_one_request(server, logprobs: int | None) -> tuple[dict, list[dict]]:
    """Send one completion request (``PROMPTS`` prompts, greedy) and return its response and the timeline rows the
    server wrote for it (rows are flushed when the server's queue drains)."""
    base, timeline_dir, model = server
    before = sum(len(rows) for rows in load_rows(timeline_dir).values())
    body = {"model": model, "prompt": _prompt_ids(model), "max_tokens": MAX_TOKENS, "temperature": 0}
    if logprobs is not None:
        body["logprobs"] = logprobs
    response = _post(f"{base}/v1/completions", body)
    deadline = time.monotonic() + 30
    while True:  # the logger flushes on the step that drains the queue, just after the response is sent
        rows = [r for rs in load_rows(timeline_dir).values() for r in rs][before:]
        if rows and rows[-1]["drained"]:
            return response, rows
        assert time.monotonic() < deadline, "the server's timeline did not record the request's steps"
        time.sleep(0.5)


def test_the_server_records_a_timeline_row_per_engine_step_with_sams_drafts(server):
    response, rows = _drafting_of_one_request(server, logprobs=None)
    assert len(response["choices"]) == PROMPTS
    finished = [length for r in rows for _rid, length in r["finished"]]
    assert len(finished) == PROMPTS and all(0 < n <= MAX_TOKENS for n in finished)
    assert max(r["active"] for r in rows) == PROMPTS
    # every token the server emitted is in the timeline: the sum of its rows' tokens is the responses' length
    assert sum(r["tokens"] for r in rows) == sum(finished)
    assert sum(r["started"] for r in rows) == PROMPTS  # each request's prefill ends in one step
    drafted, accepted = sum(r["draft_tokens"] for r in rows), sum(r["accepted_tokens"] for r in rows)
    assert drafted > 0 and 0 < accepted <= drafted


def test_requesting_logprobs_does_not_turn_drafting_off(server):
    plain, plain_rows = _drafting_of_one_request(server, logprobs=None)
    scored, scored_rows = _drafting_of_one_request(server, logprobs=2)
    assert all(c["logprobs"] and len(c["logprobs"]["token_logprobs"]) > 0 for c in scored["choices"])
    # greedy: the same tokens with and without log-probabilities, and SAM drafts and is accepted in both
    assert [c["text"] for c in scored["choices"]] == [c["text"] for c in plain["choices"]]
    for rows in (plain_rows, scored_rows):
        assert sum(r["accepted_tokens"] for r in rows) > 0
    drafted = [sum(r["draft_tokens"] for r in rows) for rows in (plain_rows, scored_rows)]
    assert drafted[1] >= drafted[0] // 2, f"drafting fell from {drafted[0]} to {drafted[1]} tokens with logprobs"


def test_without_speculation_the_timeline_has_one_token_per_request_step_and_no_drafts(harness_model, tmp_path):
    """spec=off (veRL's servers with no speculative config): every engine step emits exactly one token per active
    request, which is what makes the rollout's tokens per request-step 1.0 and its acceptance length 1.0."""
    timeline_dir = tmp_path / "server_timeline"
    timeline_dir.mkdir()
    with _running_server(harness_model, timeline_dir) as base:
        _, rows = _drafting_of_one_request((base, timeline_dir, str(harness_model)), logprobs=None)
    decoding = [r for r in rows if r["tokens"] > 0]
    assert decoding and max(r["active"] for r in rows) == PROMPTS
    assert all(r["drafts"] == r["draft_tokens"] == r["accepted_tokens"] == 0 for r in rows)
    assert all(r["tokens"] == r["active"] for r in decoding if not r["finished"]), decoding[:5]
