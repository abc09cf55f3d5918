# Two commands for a fresh machine: `make sweep` (the main job) and `make test`.
# Both create .venv with pip when it is missing; torch comes from the local wheel cache
# where one is configured (see README), so nothing needs uv or poetry.
# Keep pip's byte-compiling (26 s of the install): where PYTHONDONTWRITEBYTECODE is set, as on
# these machines, no import writes a .pyc, and every process (each Ray worker) would compile
# torch and ray from source (tried: with --no-compile the tests ran at about half speed).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SWEEP  ?= sweeps/local_cpu.yaml
ARGS   ?=

.PHONY: sweep test test-fast lint venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

sweep: $(STAMP)
	$(BIN)/python -m raybench.sweep $(SWEEP) $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q -ra --durations=30

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -ra -m "not ray"

lint: $(STAMP)
	$(BIN)/ruff check raybench tests

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
