"""scripts/bench_rollout.py's mode names: a ``#tag`` runs a second engine of the same mode (the A/A control)."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "bench_rollout", Path(__file__).resolve().parents[2] / "scripts" / "bench_rollout.py"
)
bench_rollout = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_rollout)


def test_a_tagged_mode_parses_as_the_mode_it_tags() -> None:
    defaults = bench_rollout.mode_defaults()
    assert bench_rollout.parse_mode("off#2", 8, defaults) == ("off", 0, None, None)
    tagged = bench_rollout.parse_mode("sam+group@32/k3/t2#b", 8, defaults)
    assert tagged == bench_rollout.parse_mode("sam+group@32/k3/t2", 8, defaults)
    method, k, sam, _ = tagged
    assert (method, k) == ("sam", 3)
    assert {key: sam[key] for key in ("batch_threshold", "tokens_per_match", "group_sharing")} == {
        "batch_threshold": 32,
        "tokens_per_match": 2.0,
        "group_sharing": True,
    }
    assert bench_rollout.parse_mode("sam#b/k3", 8, defaults) is None  # the tag ends the name
    assert bench_rollout.parse_mode("offf#2", 8, defaults) is None
