# Every target creates the environment it needs on a fresh machine.
# torch is a test-only reference, pinned to the local CPU build (an unpinned torch pulls a CUDA build).
VENV   ?= .venv
PYTHON ?= python3
BIN     = $(VENV)/bin

.PHONY: venv demo test test-fast lint bench clean

# Two stamps: `make demo` installs the package and its run-time dependencies only; `make test`
# adds the test extra (the references: torch, diffusers, transformers).
RUN_STAMP  = $(VENV)/.installed-run
TEST_STAMP = $(VENV)/.installed-test

$(RUN_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $(RUN_STAMP)

$(TEST_STAMP): $(RUN_STAMP)
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[test,serve]'
	touch $(TEST_STAMP)

venv: $(TEST_STAMP)

## demo: the main job (built-in tiny random model, no downloads): prompt -> out/demo.mp4
demo: $(RUN_STAMP)
	$(BIN)/wanjax generate --model demo --prompt "A cat plays the piano in a jazz club" \
		--output_video out/demo.mp4 --preview out/demo.png --metrics_json out/demo.json

# Two pytest workers, each test module whole on one (its module fixtures built once): measured on
# 2 cores, the whole suite 1,985 s -> 1,497 s and the fast path 283 s -> 212 s (README, Tests; now
# 800 s and 131 s with the suite's settings in tests/conftest.py).
PYTEST = $(BIN)/python -m pytest -q -n 2 --dist loadfile

## test: the whole test suite (parity against diffusers on tiny models)
test: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(PYTEST) tests

## test-fast: the suite less its `slow` cases (subprocesses, large parity cases, end-to-end runs, serving, TPU pipeline compiles)
test-fast: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(PYTEST) -m "not slow" tests

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check src tests benchmarks

## bench: side-by-side DiT benchmark against diffusers (not part of the tests)
bench: $(TEST_STAMP)
	$(BIN)/python benchmarks/dit_vs_diffusers.py --layers 2 --repeats 5

clean:
	rm -rf $(VENV) out
