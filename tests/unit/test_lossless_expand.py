"""Lossless speculative sampling on vLLM CPU, without an engine: the plugin's fixed expansion, the bug it
fixes, its registration. The statistical proof on real engines is tests/integration/test_lossless.py."""

import os
import subprocess
import sys

import pytest
import torch

from recipe import lossless


def test_fixed_expand_follows_vllm_contract():
    cu = torch.tensor([2, 5, 6])
    out = lossless.expand_batch_to_tokens(torch.tensor([0.7, 1.3, 0.5]), cu, 6)
    assert out.tolist() == pytest.approx([0.7, 0.7, 1.3, 1.3, 1.3, 0.5])
    ints = lossless.expand_batch_to_tokens(
        torch.tensor([0, 5, 3], dtype=torch.int32), cu.int(), 6, replace_from=0, replace_to=7
    )
    assert ints.dtype == torch.int32 and ints.tolist() == [7, 7, 5, 5, 5, 3]


def test_vllm_cpu_expand_is_still_broken(monkeypatch):
    """Fails once vLLM fixes its CPU expand: then re-run the harness with the plugin off and retire it."""
    import vllm.v1.sample.rejection_sampler as rs
    from vllm.utils import cpu_triton_utils

    original = getattr(rs.expand_batch_to_tokens, "__wrapped__", rs.expand_batch_to_tokens)
    monkeypatch.setattr(rs, "expand_kernel", cpu_triton_utils.expand_kernel)  # what vLLM's CPU runner does
    temps = torch.tensor([0.7, 1.3, 0.5])
    got = original(temps, torch.tensor([2, 5, 6]), 6)
    assert not torch.allclose(got, torch.tensor([0.7, 0.7, 1.3, 1.3, 1.3, 0.5]))


def test_register_is_idempotent_and_can_be_disabled():
    import vllm.v1.sample.rejection_sampler as rs

    lossless.register()
    patched = rs.expand_batch_to_tokens
    lossless.register()
    assert rs.expand_batch_to_tokens is patched and lossless.is_patched()
    code = "from recipe import lossless; lossless.register(); print(lossless.is_patched())"
    env = {**os.environ, "SPEC_ROLLOUT_LOSSLESS_PATCH": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("False")
