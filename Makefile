# Two commands for a fresh machine: `make sweep` (the main job) and `make test`.
# Both create .venv with pip when it is missing and install exactly the versions in
# requirements.lock (every direct and transitive dependency, as the tests ran with them), through
# pip and its configured indexes and wheel folders, so nothing needs uv or poetry.
# `make lock` re-resolves the lock from pyproject.toml's ranges (then run `make test`).
# Keep pip's byte-compiling (26 s of the install): where PYTHONDONTWRITEBYTECODE is set, as on
# these machines, no import writes a .pyc, and every process (each Ray worker) would compile
# torch and ray from source (tried: with --no-compile the tests ran at about half speed).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
LOCK   := requirements.lock
PIP_TOOLS := pip-tools==7.6.2
SWEEP  ?= sweeps/local_cpu.yaml
ARGS   ?=

.PHONY: sweep test test-fast lint venv lock clean

venv: $(STAMP)

# The lock is a constraints file: it pins whatever the project needs and adds nothing it does
# not (on Python 3.10 pip may add a back-port the 3.11 lock lacks, unpinned). The build backend
# comes from the lock too (no build isolation, which would fetch the newest setuptools).
$(STAMP): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c $(LOCK) setuptools wheel
	$(BIN)/python -m pip install --quiet -c $(LOCK) --no-build-isolation -e '.[dev]'
	touch $(STAMP)

# Refresh the lock: resolve pyproject.toml's ranges today, in a throwaway pip-tools venv.
lock:
	rm -rf .lockenv && $(PYTHON) -m venv .lockenv
	.lockenv/bin/python -m pip install --quiet --upgrade pip $(PIP_TOOLS)
	.lockenv/bin/pip-compile --quiet --upgrade --extra dev --all-build-deps --strip-extras \
	  --allow-unsafe --no-emit-index-url --no-emit-find-links --no-emit-trusted-host \
	  --output-file $(LOCK) pyproject.toml
	rm -rf .lockenv

sweep: $(STAMP)
	$(BIN)/python -m raybench.sweep $(SWEEP) $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q -ra --durations=30

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -ra -m "not ray"

lint: $(STAMP)
	$(BIN)/ruff check raybench tests

clean:
	rm -rf $(VENV) .lockenv build *.egg-info .pytest_cache .ruff_cache
