# One-command set-up: every target creates .venv and installs what it needs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
SOAK_ARGS ?=

.PHONY: test test-fast test-slow test-py310 test-ray-oldest test-sglang lint format demo bench bench-quick soak data clean chromium

# Sizes measured on 2026-11-27 (Python 3.11, x86-64 Linux; `du -sh` of each fresh venv):
#   .venv       `make test` (the [dev] extra)       3.3 GB: torch 0.75 GB (CPU build), triton 1.0 GB (a
#                                                   requirement of xgrammar), ray 0.24 GB, pyarrow/pandas 0.25 GB
#   .venv-demo  `make demo` (plain install)         0.5 GB: no torch
#   `pip install -e '.[devserver]'` (CPU dev server) 1.3 GB: torch 2.13.0+cpu

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# DeepSeek V3.2's own encoder (encoding_dsv32.py) as SGLang's wheel ships it: the reference that
# tests/test_chat_families.py compares our V3.2 encoder with. Only the wheel is downloaded (39 MB, no
# dependencies, never installed; the same file whatever this Python is); the tests read that one file.
SGLANG_REFERENCE ?= 0.5.23
REFERENCES := $(VENV)/references

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
		--abi cp311 --platform manylinux_2_34_x86_64 -d $(REFERENCES) sglang==$(SGLANG_REFERENCE)
	touch $(STAMP)

# The demo gets its own small venv with only the core install (what `pip install strands-slime` gives):
# no torch, no test tools: 0.5 GB instead of the 3.3 GB dev set-up that `make test` builds.
DEMO_VENV ?= .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed

$(DEMO_VENV)/bin/python:
	$(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/python -m pip install -q --upgrade pip

$(DEMO_STAMP): pyproject.toml | $(DEMO_VENV)/bin/python
	$(DEMO_VENV)/bin/python -m pip install -q -e .
	touch $(DEMO_STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The viewer's browser tests drive headless Chromium (the Debian package `chromium`); without it they
# skip and say why. No other target installs system packages: `make chromium` does, when asked (as
# root, with apt-get; CI's .ci/run asks), and says what it does.
chromium:
	@if command -v chromium >/dev/null 2>&1; then echo "chromium is installed: $$(command -v chromium)"; \
	elif [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
	  echo "make chromium installs the Debian package with apt-get as root; here run: sudo apt-get install chromium"; exit 1; \
	else echo "installing the Debian package chromium with apt-get (for the viewer's browser tests)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; fi

# Test lanes (tests/conftest.py): unit (one process), integration (other processes, slime's code, a
# browser), slow (over ~2 s each; tests/durations.md). CI (.ci/run) runs test, test-slow, test-py310.
# Each runs its modules on two pytest-xdist workers (a module stays on one worker: its fixtures, a Ray
# cluster, are built once): the slow lane mostly waits on subprocesses and deadlines, and two workers
# took it from 26 to 12 min on 2 cores (2026-11-29). XDIST= runs them in this one process.
XDIST ?= -n 2 --dist loadfile

test: lint
	$(BIN)/python -m pytest --lane unit --lane integration $(XDIST) $(PYTEST_ARGS)

test-fast: lint
	$(BIN)/python -m pytest --lane unit $(XDIST) $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(BIN)/python -m pytest --lane slow $(XDIST) $(PYTEST_ARGS)

# Python 3.10, the oldest version pyproject accepts: the unit lane in a second venv without torch (its
# pinned wheel is for 3.11; tests that need it are not collected). The interpreter comes from pyenv
# (CI's base image ships it) or PATH; where there is none the lane says so and passes.
PYENV_ROOT ?= $(HOME)/.pyenv
PY310 ?= $(firstword $(wildcard $(PYENV_ROOT)/versions/3.10.*/bin/python3.10) $(shell python3.10 -c 'import sys; print(sys.executable)' 2>/dev/null))
PY310_VENV ?= .venv-py310
PY310_STAMP := $(PY310_VENV)/.installed

$(PY310_STAMP): pyproject.toml
	$(PY310) -m venv $(PY310_VENV)
	$(PY310_VENV)/bin/python -m pip install -q --upgrade pip
	$(PY310_VENV)/bin/python -m pip install -q -e '.[test,verify,bench]'
	touch $(PY310_STAMP)

ifeq ($(strip $(PY310)),)
test-py310:
	@echo "test-py310: skipped, no Python 3.10 interpreter (none in $(PYENV_ROOT)/versions or on PATH)"
else
test-py310: $(PY310_STAMP)
	$(PY310_VENV)/bin/python -m pytest --lane unit $(XDIST) $(PYTEST_ARGS)
endif

# The oldest Ray that slime's images use (its ROCm images pin ray 2.47.1; .venv has the newest we test,
# pyproject's pin): the Ray backends' tests (tests/test_executor_ray.py, a 3-node local cluster, ~3 min)
# against it. Its venv holds only that ray (no dependencies: 69 MB wheel) and reads everything else from
# .venv's packages through a .pth file, after its own: its ray shadows .venv's. Not part of CI's lanes.
RAY_OLDEST ?= 2.47.1
RAY_OLDEST_VENV ?= .venv-ray$(subst .,,$(RAY_OLDEST))
RAY_OLDEST_STAMP := $(RAY_OLDEST_VENV)/.installed

$(RAY_OLDEST_STAMP): $(STAMP)
	rm -rf $(RAY_OLDEST_VENV)
	$(PYTHON) -m venv $(RAY_OLDEST_VENV)
	$(BIN)/python -c 'import site; print(site.getsitepackages()[0])' > \
		"$$($(RAY_OLDEST_VENV)/bin/python -c 'import site; print(site.getsitepackages()[0])')/main-venv.pth"
	$(RAY_OLDEST_VENV)/bin/python -m pip install -q --no-deps ray==$(RAY_OLDEST)
	touch $(RAY_OLDEST_STAMP)

test-ray-oldest: $(RAY_OLDEST_STAMP)
	$(RAY_OLDEST_VENV)/bin/python -c 'import ray; assert ray.__version__ == "$(RAY_OLDEST)", ray.__version__'
	$(RAY_OLDEST_VENV)/bin/python -m pytest --lane slow tests/test_executor_ray.py $(PYTEST_ARGS)

# The SGLang lane: real SGLang 0.5.23 on the CPU (tests/sglang, docs/sglang-lane.md). Not part of
# `make test`; .ci/run adds it when STRANDS_SLIME_SGLANG_LANE=1. Its venv is built once (about 6.3 GB,
# 4-15 min on 2 cores) from a curated, pinned list: tests/sglang/requirements.txt says why not the 11 GB
# `pip install sglang`. The tests start the servers they need and stop them.
SGLANG_VENV ?= .venv-sglang
SGLANG_STAMP := $(SGLANG_VENV)/.installed
SGLANG_VERSION := 0.5.23

$(SGLANG_STAMP): tests/sglang/requirements.txt tests/sglang/constraints.txt
	rm -rf $(SGLANG_VENV)
	$(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/python -m pip install -q --upgrade pip
	$(SGLANG_VENV)/bin/python -m pip install -q -r tests/sglang/requirements.txt -c tests/sglang/constraints.txt
	$(SGLANG_VENV)/bin/python -m pip install -q --no-deps sglang==$(SGLANG_VERSION)
	touch $(SGLANG_STAMP)

test-sglang: $(STAMP) $(SGLANG_STAMP)
	SGLANG_PYTHON=$(SGLANG_VENV)/bin/python $(BIN)/python -m pytest -c tests/sglang/pytest.ini tests/sglang $(PYTEST_ARGS)

demo: $(DEMO_STAMP)
	$(DEMO_VENV)/bin/strands-slime demo --overwrite

data: $(STAMP)
	$(BIN)/python -m data_prep.download --dataset all --out $${DATA_DIR:-data}

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_provider.py --setup-peer || echo "no peer venv (needs Python >= 3.12): measuring ours only"
	$(BIN)/python benchmarks/run_all.py

bench-quick: $(STAMP)
	$(BIN)/python benchmarks/run_all.py --quick

# fault-injection soak (not in CI; tests/test_soak.py runs a 300-episode version); SOAK_ARGS=--write-doc updates docs/soak.md
soak: $(STAMP)
	$(BIN)/python benchmarks/soak.py $(SOAK_ARGS)

clean:
	rm -rf $(VENV) $(DEMO_VENV) $(PY310_VENV) $(SGLANG_VENV) .venv-peer .pytest_cache .ruff_cache .hypothesis build *.egg-info
