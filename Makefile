# dflash-lab: `make demo` trains a drafter on the embedded tiny target; `make test` runs the tests; `make lab` starts
# JupyterLab on working copies of notebooks/ and a link to runs/ (lab/, gitignored). All create the environment in
# .venv on first use (Python 3.11 + pip only).
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
DEMO_STEPS ?= 600
# make test: test files run on this many processes (pytest-xdist; a file's tests stay in one process, so its
# module fixtures are built once); 2 = the CI machine's cores
TEST_WORKERS ?= 2
# make lab: LAB_DIR holds the working copies; LAB_PORT is the server's port; LAB_ARGS go to `jupyter lab` as they are,
# e.g. a remote machine: make lab LAB_ARGS=--no-browser (then: ssh -L 8888:localhost:8888 <host>, open the URL it prints)
LAB_DIR ?= lab
LAB_PORT ?= 8888
LAB_ARGS ?=
# JupyterLab refuses to start as root without --allow-root (containers and cloud GPU machines often run as root)
ROOT_ARGS := $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: demo test test-fast lab lab-copies env clean-venv

# Two stamps: the base environment (everything `make demo` and `make lab` use) and the test extras on top of it, so a
# first `make demo` never waits for pytest, playwright, tensorboard and triton.
$(STAMP): pyproject.toml widgets/kernel_logs.py
	@command -v $(PY) >/dev/null || { echo "need $(PY) on PATH (or run: make PY=python3 ...)"; exit 1; }
	@echo "[make] creating the environment in $(VENV) (once; later commands reuse it)"
	test -d $(VENV) || $(PY) -m venv $(VENV)
	@echo "[make] installing torch, transformers, JupyterLab, ipywidgets, plotly, papermill, matplotlib, pandas, pyarrow"
	@echo "[make]   (~3 GB in $(VENV), torch alone ~0.75 GB): 5-6 min on a loaded 2-core machine, nothing printed meanwhile"
	$(BIN)/pip install -q --disable-pip-version-check -e .
	@echo "[make] registering the Jupyter kernel of this environment (quiet kernel logs)"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	$(BIN)/python -m widgets.kernel_logs install
	touch $(STAMP)
	@echo "[make] environment ready"

$(TEST_STAMP): $(STAMP)
	@echo "[make] installing the test extras (pytest, pytest-xdist, playwright, tensorboard, triton, chitchat-dataset,"
	@echo "[make]   speculators and what it imports, for the export check): ~1-2 min more, once"
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test]'
	# the export check's reference loader; --no-deps: its pins pull a CUDA torch (what it imports: the test extra)
	$(BIN)/pip install -q --disable-pip-version-check --no-deps speculators==0.9.0
	# vLLM's and SGLang's own sources (only their .py files, ~10 s): the serving tests run their loaders on the CPU
	$(BIN)/python tests/engines_fetch.py $(VENV)/engines
	touch $(TEST_STAMP)

env: $(STAMP)

demo: $(STAMP)
	@echo "[make] demo: $(DEMO_STEPS) training steps on the embedded tiny target (CPU), then the evaluation: ~12 min on 2 loaded cores"
	$(BIN)/python -m dflash_lab.workflows.demo --steps $(DEMO_STEPS)

test: $(TEST_STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 tests

lab-copies: $(STAMP)
	$(BIN)/python -m widgets.workspace --into $(LAB_DIR)

# The news pop-up ("get notified about official Jupyter news?") is JupyterLab's announcements plugin: off, once
LAB_PAGE_CONFIG := $(VENV)/etc/jupyter/labconfig/page_config.json

$(LAB_PAGE_CONFIG): $(STAMP)
	$(BIN)/jupyter labextension disable --level=sys_prefix @jupyterlab/apputils-extension:announcements >/dev/null 2>&1

# lab/ holds the working copies and lab/runs, a link to runs/: both open from the file browser
lab: lab-copies $(LAB_PAGE_CONFIG)
	$(BIN)/jupyter lab --notebook-dir=$(LAB_DIR) --port=$(LAB_PORT) $(ROOT_ARGS) $(LAB_ARGS)

test-fast: $(TEST_STAMP)
	$(BIN)/python -m pytest -q tests -m "not slow and not browser"

clean-venv:
	rm -rf $(VENV)
