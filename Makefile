# kvsim: `make run` sets everything up and runs the quickstart; `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
KVSIM := $(VENV)/bin/kvsim

.PHONY: run test lint bench notebooks clean wheel-check

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -e .
	touch $@

# torch is pinned to the CPU build on this machine's disk first, so the `gpu`
# extra's range is already satisfied and no multi-GB CUDA build is pulled.
$(VENV)/.dev: $(VENV)/.installed
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[dev,gpu]'
	touch $@

run: $(VENV)/.installed
	$(KVSIM) run configs/quickstart.yaml --run quickstart

# The suite runs on every core (pytest-xdist; TEST_WORKERS=1 runs it in one process).
TEST_WORKERS ?= auto
test: $(VENV)/.dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache
	TRITON_INTERPRET=1 $(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal

# The property tests at 50x the cases, from a fresh random seed (printed; SEED=N repeats a
# run); every failure is saved in tests/hypothesis-failures/, which `make test` replays.
# Not part of `make test` (tens of minutes on 2 cores).
.PHONY: test-long
ifndef SEED
SEED := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif
test-long: $(VENV)/.dev
	@echo "hypothesis seed $(SEED)"
	KVSIM_HYPOTHESIS_PROFILE=long TRITON_INTERPRET=1 $(PY) -m pytest tests/reference tests/policies \
	  --hypothesis-seed=$(SEED)

# Mutation testing, not part of `make test` (hours for the whole core on 2 cores; results
# are cached in mutants/, so a rerun checks only mutants of changed functions). One module:
# `make mutate MUTANTS='kvsim.policies.ledger.block_pool*'`. See mutation/README.md.
.PHONY: mutate
mutate: $(VENV)/.dev
	$(PY) mutation/run.py $(MUTANTS)

# A built wheel in a fresh virtualenv, run from an empty directory: the quickstart by name and
# the paper's quick reproduction, with configs, traces and profiles read from the package.
WHEEL_CHECK := build/wheel-check
wheel-check: $(VENV)/.installed
	rm -rf $(WHEEL_CHECK) && mkdir -p $(WHEEL_CHECK)/empty
	$(PIP) wheel --no-deps -w $(WHEEL_CHECK)/dist .
	$(PYTHON) -m venv $(WHEEL_CHECK)/venv
	$(WHEEL_CHECK)/venv/bin/python -m pip --disable-pip-version-check -q install $(WHEEL_CHECK)/dist/kvsim-*.whl
	cd $(WHEEL_CHECK)/empty && ../venv/bin/kvsim run quickstart --quiet --out out \
	  && ../venv/bin/kvsim reproduce vllm-paper --quick --no-progress --out paper \
	  && test -f paper/report.md

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check .

bench: $(VENV)/.installed
	$(PY) -m benchmarks.run
	$(PY) -m benchmarks.profile_load
	$(PY) -m benchmarks.startup

clean:
	rm -rf $(VENV) results .pytest_cache $(WHEEL_CHECK)
