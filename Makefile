# dflash-lab: `make demo` trains a drafter on the embedded tiny target; `make test` runs the tests; `make lab` starts
# JupyterLab on notebooks/. All create the environment in .venv on first use (Python 3.11 + pip only).
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_STEPS ?= 600

.PHONY: demo test test-fast lab env clean-venv

$(STAMP): pyproject.toml
	@command -v $(PY) >/dev/null || { echo "need $(PY) on PATH (or run: make PY=python3 ...)"; exit 1; }
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test]'
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

env: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m dflash_lab.demo --steps $(DEMO_STEPS)

test: $(STAMP)
	$(BIN)/python -m pytest -q --durations=15 tests

lab: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=notebooks $(LAB_ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q tests -m "not slow and not browser"

clean-venv:
	rm -rf $(VENV)
