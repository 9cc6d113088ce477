# Two commands do all set-up on a fresh machine: `make demo` (the sample app on real data, every
# available backend) and `make test` (lint and format check, then every test with coverage, types beside them).
# Beside them, `make map` packages the sample app as a MAP (one OCI image, every backend; docs/packaging.md).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST := $(PY) -m pytest
# KServe's model server, for the peer tests (tests/backends/remote/kserve.py): its pins (pandas<3, python-dateutil<3)
# clash with ours, so it gets a virtualenv of its own under the cache folder that monai_triton_ops.packaging.rootfs's
# cache_dir() names, made once (about 50 s and 450 MB here) and kept across `make clean`.
KSERVE_VERSION := 0.21.0
CACHE_DIR := $(or $(MONAI_TRITON_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/monai-triton)
KSERVE_VENV := $(CACHE_DIR)/kserve-$(KSERVE_VERSION)
# Python writes the bytecode of a module the first time a process imports it, for the next processes: a process
# environment with PYTHONDONTWRITEBYTECODE set (as container images often have) would compile anew whatever each
# of the suite's hundreds of processes imports. pip installs without compiling: of the venv's ~14,000 modules a
# run imports about a third (CONTRIBUTING.md, "Where the suite's time goes").
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup demo map test test-fast lint format-check format typecheck pytest bench docs clean

setup: $(STAMP)

# Reinstalls only when the project's requirements change; a second run starts in seconds.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# setuptools' note on editable installs is advice no one can act on; licence and build warnings still show.
	PYTHONWARNINGS='ignore:Editable installation' $(PY) -m pip install -q --no-compile -c constraints.txt -e '.[apps,test]'
	# Only the Triton server files inside this wheel are used; it pins numpy<2, hence --no-deps.
	$(PY) -m pip install -q --no-compile --no-deps nvidia-pytriton==0.7.0
	# The KServe SDK's models are the InferenceService schema that tests/deploy checks deploy/kserve against;
	# the wheel is only read, never installed here (its model-server dependencies clash with ours: KSERVE_VENV has them).
	$(PY) -m pip download -q --no-deps --dest $(VENV)/wheels kserve==$(KSERVE_VERSION)
	# Holoscan loads libcudart.so.13 before any of our code can: a .pth hook loads the declared wheel's copy.
	$(PY) -m monai_triton_ops.packaging.runtime_libs --write-site-hook
	touch $(STAMP)

# The bytecode of what the suite's workers and app processes all import (the warm interpreter's PRELOAD: torch,
# MONAI, the App SDK, Holoscan; about 3,400 modules, 12 s of CPU to compile), written by one process once per
# set-up, not by a dozen at the same moment when the suite starts. Holoscan warns of the stack limit that the app's
# entry point raises.
BYTECODE := $(VENV)/.bytecode-stamp
$(BYTECODE): $(STAMP)
	$(PY) -W 'ignore:Current stack size:RuntimeWarning' -c \
		'import importlib, tests.warm_python as w; [importlib.import_module(name) for name in w.PRELOAD]'
	touch $@

# The stamp holds the version and comes last: a half-made virtualenv is made again.
$(KSERVE_VENV)/.installed:
	rm -rf $(KSERVE_VENV)
	$(PYTHON) -m venv $(KSERVE_VENV)
	$(KSERVE_VENV)/bin/python -m pip install -q --no-compile kserve==$(KSERVE_VERSION)
	echo $(KSERVE_VERSION) > $@

demo: setup
	$(PY) apps/brain_tissue_seg/demo.py
	$(PY) apps/bundle_classify/demo.py
	$(PY) apps/bundle_detect/demo.py

# Docker with buildx if a daemon answers, else buildah (installed from Debian's packages when missing, as root);
# the Debian base is made once with mmdebstrap and cached (~/.cache/monai-triton).
map: setup
	$(VENV)/bin/monai-triton package apps/brain_tissue_seg -m model_repository

# mypy (about 30 s on a fresh clone) needs nothing the tests make: it runs beside the bytecode step and the tests,
# and its report is printed after theirs. Either failing fails `make test`; an interrupt stops both.
test: setup lint format-check
	@mkdir -p output; $(MAKE) --no-print-directory -s typecheck > output/mypy.log 2>&1 & mypy=$$!; \
	trap 'kill $$mypy 2>/dev/null' INT TERM; \
	$(MAKE) --no-print-directory pytest; tests=$$?; \
	wait $$mypy; types=$$?; echo "mypy (beside the tests):"; cat output/mypy.log; \
	[ $$tests -eq 0 ] && [ $$types -eq 0 ]

# ruff; the import contracts of pyproject.toml's [tool.importlinter] (layers, no cycles, independent backends);
# no module of the package over 400 lines (tools/module_sizes.py).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(PY) tools/module_sizes.py

format-check: setup
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

typecheck: setup
	$(VENV)/bin/mypy

# Workers of pytest-xdist: on this 2-core machine the suite's first half keeps both cores busy, its second half
# waits on servers, deadlines and exits; a fourth worker fills those waits (CONTRIBUTING.md, "Tests in parallel").
# TEST_WORKERS=0: one process.
TEST_WORKERS ?= 4

# KServe's own server is a test peer only: `make demo` does not wait for its virtualenv.
pytest: setup $(BYTECODE) $(KSERVE_VENV)/.installed
	$(PYTEST) -n $(TEST_WORKERS) --cov --cov-report=term-missing --durations=25

# The user guide, strict (a broken link, anchor or docstring fails): output/site/index.html.
docs: setup
	$(VENV)/bin/mkdocs build --strict

# W1 and W2 across every backend and the App SDK's client, interleaved: the tables and plots of docs/benchmarks.md.
bench: setup
	$(PY) benchmarks/run.py --plots docs/img

# No real server, no app runs: the quick loop while editing.
test-fast: setup
	$(PYTEST) -m "not slow and not triton"

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache .coverage output
