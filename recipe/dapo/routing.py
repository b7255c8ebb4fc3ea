"""Prompt-affine routing of rollout requests over veRL's vLLM servers (backend=verl, more than one replica).

SAM drafts from the finished responses of a prompt's siblings and from that prompt's responses in earlier
epochs, and that material lives in the server that generated it. veRL's default balancer sends each sample to
the least-loaded server under its own fresh request id, so with R replicas a sibling's response is on another
server about (R-1)/R of the time and most of SAM's sharing never happens. :class:`PromptAffinityLoadBalancer`
sends every request for a prompt (its n samples, each refill round, every later epoch) to one server: the
least-loaded one when the prompt is first seen, remembered for as long as the prompt is (LRU over
``max_prompts``). Load is balanced in units of groups; a server that leaves the pool loses its prompts to the
least-loaded servers left.

veRL loads it from ``actor_rollout_ref.rollout.router_config_path`` (configs/router/prompt_affinity.yaml), builds
it as a Ray actor with ``(servers, yaml_config)``, and hands it each request's ``prompt_ids`` because
:meth:`require_acquire_fields` asks for them. With ``SPEC_ROLLOUT_TIMELINE_DIR`` set (the launcher sets it) each
acquire is appended to ``routing.jsonl`` there: ``{"t", "prompt", "server"}``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from cachetools import LRUCache
from verl.workers.rollout.router import DEFAULT_ROUTING_CACHE_SIZE, GlobalRequestLoadBalancer

from recipe.dapo.server_timeline import TIMELINE_DIR_ENV
from sam.keys import prompt_key

ROUTING_LOG = "routing.jsonl"
CONFIG_KEYS = {"router_class", "max_prompts", "max_cache_size"}  # configs/router/prompt_affinity.yaml


class PromptAffinityLoadBalancer(GlobalRequestLoadBalancer):
    """veRL load balancer that keeps each prompt on one server (see the module docstring). veRL's
    ``clear_sticky_cache`` (phase switches, rebalancing) forgets request ids only: a prompt stays where its
    siblings' and earlier epochs' responses are."""

    def __init__(self, servers: dict[str, Any], config: dict | None = None):
        config = dict(config or {})
        unknown = sorted(set(config) - CONFIG_KEYS)
        if unknown:
            raise ValueError(f"router config: unknown key(s) {unknown}; known: {sorted(CONFIG_KEYS)}")
        super().__init__(servers, max_cache_size=int(config.get("max_cache_size", DEFAULT_ROUTING_CACHE_SIZE)))
        self._prompt_to_server: LRUCache = LRUCache(maxsize=int(config.get("max_prompts", 1_000_000)))
        directory = os.environ.get(TIMELINE_DIR_ENV)
        self._log = None
        if directory:
            Path(directory).mkdir(parents=True, exist_ok=True)
            self._log = Path(directory, ROUTING_LOG).open("a", buffering=1)  # a line per request survives a kill

    def require_acquire_fields(self) -> list[str]:
        return ["prompt_ids"]

    def acquire_server(self, request_id: str, prompt_ids: list[int] | None = None, **extra) -> tuple[str, Any]:
        """The server of this request id if it has one (a later turn), else of its prompt, else the least
        loaded, which the prompt then keeps. The first and last are veRL's own sticky, least-loaded choice."""
        key = prompt_key(prompt_ids).hex() if prompt_ids is not None else None
        prompt_server = self._prompt_to_server.get(key) if key is not None else None
        sticky = self._request_id_to_server.get(request_id)
        if sticky not in self._inflight_requests and prompt_server in self._inflight_requests:
            self._request_id_to_server[request_id] = prompt_server
        server_id, handle = super().acquire_server(request_id)
        if key is not None:
            self._prompt_to_server[key] = server_id
        if self._log is not None:
            self._log.write(json.dumps({"t": time.time(), "prompt": key, "server": server_id}) + "\n")
        return server_id, handle
