"""Lossless speculative sampling on vLLM CPU engines: the statistical proof.

The harness (recipe/lossless_harness.py) samples one prompt many times per sampler and compares
per-position token distributions; see its docstring for running it against a GPU or NPU engine.
"""

import numpy as np
import pytest

from recipe.lossless_harness import Setting, compare, sample_hf, sample_vllm

pytestmark = [pytest.mark.vllm_side, pytest.mark.statistical]

ALPHA = 1e-3  # per comparison; the biased samplers below are rejected at p far below this
N = 1500
MAX_TOKENS = 48
SETTINGS = [Setting(1.0, 1.0), Setting(0.7, 0.9)]
BIASED = Setting(0.85, 1.0)


@pytest.fixture(scope="module")
def samples(harness_model):
    """All samplers of the statistical tests, drawn once (each vLLM engine in its own process)."""
    model = str(harness_model)
    vllm_runs = {
        "off": sample_vllm(model, "off", [*SETTINGS, BIASED], N, MAX_TOKENS, seed=1),
        "ngram": sample_vllm(model, "ngram", SETTINGS, N, MAX_TOKENS, seed=2),
        "suffix": sample_vllm(model, "suffix", SETTINGS, N, MAX_TOKENS, seed=7),
        "sam": sample_vllm(model, "sam", SETTINGS, N, MAX_TOKENS, seed=3),
        "mtp": sample_vllm(model, "mtp", SETTINGS, N, MAX_TOKENS, seed=4),
        "hybrid": sample_vllm(model, "hybrid", SETTINGS, N, MAX_TOKENS, seed=8),
        "ngram_unpatched": sample_vllm(model, "ngram", SETTINGS[:1], N, MAX_TOKENS, seed=5, patch=False),
    }
    hf = {s.name: sample_hf(model, s, N, MAX_TOKENS, seed=6) for s in SETTINGS}
    return vllm_runs, hf


def test_reference_samplers_agree(samples):
    runs, hf = samples
    for s in SETTINGS:
        result = compare(runs["off"][s.name], hf[s.name])
        assert result.p_value > ALPHA, (s, result)


def test_harness_has_power_against_a_biased_sampler(samples):
    runs, hf = samples
    biased = runs["off"][BIASED.name]
    assert compare(biased, hf[SETTINGS[0].name]).p_value < ALPHA
    assert compare(biased, runs["off"][SETTINGS[0].name]).p_value < ALPHA


@pytest.mark.parametrize("method", ["ngram", "suffix", "sam", "mtp", "hybrid"])
def test_speculative_sampling_is_lossless(samples, method):
    runs, hf = samples
    for s in SETTINGS:
        drafts, drafted, accepted = runs[method][s.name + "_accepted"]
        assert drafts > 1000 and accepted > 1000, (method, s, drafts, drafted, accepted)  # drafting really ran
        if method == "hybrid":  # both sources drafted, so batches mixed sampled head drafts with SAM's point masses
            head, sam, *chains = runs[method][s.name + "_sources"]
            assert head > 1000 and sam > 1000, (s, head, sam)
            assert sum(chains[2:]) > 100, (s, chains)  # head chains deeper than one token (by length: chains)
        vs_off, vs_hf = compare(runs[method][s.name], runs["off"][s.name]), compare(runs[method][s.name], hf[s.name])
        assert vs_off.p_value > ALPHA and vs_hf.p_value > ALPHA, (method, s, vs_off, vs_hf)


def test_without_the_plugin_cpu_speculation_is_biased(samples):
    """The bug the plugin fixes, seen end to end; if this fails, vLLM fixed it and the plugin can go."""
    runs, hf = samples
    s = SETTINGS[0]
    assert compare(runs["ngram_unpatched"][s.name], runs["off"][s.name]).p_value < ALPHA
    assert compare(runs["ngram_unpatched"][s.name], hf[s.name]).p_value < ALPHA


@pytest.mark.parametrize("method", ["ngram", "suffix", "sam", "mtp", "hybrid"])
def test_greedy_is_token_identical(samples, method):
    runs, _ = samples
    np.testing.assert_array_equal(runs[method]["greedy"], runs["off"]["greedy"])
