# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# TF Serving's official builds embed TensorFlow Text 2.12.1: the slow tests load exports there too.
SERVING_VENV ?= .venv-tf212
SERVING_STAMP := $(SERVING_VENV)/.installed

.PHONY: demo test test-slow lint format install serving-venv clean

$(STAMP): setup.py pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

$(SERVING_STAMP):
	test -x $(SERVING_VENV)/bin/python || $(PYTHON) -m venv $(SERVING_VENV)
	$(SERVING_VENV)/bin/pip install --quiet --disable-pip-version-check tensorflow==2.12.1 tensorflow-text==2.12.1
	touch $(SERVING_STAMP)

# About 600 MB: only the slow tests need it.
serving-venv: $(SERVING_STAMP)

# The reference implementations the slow tests compare with (setup.py's "reference" extra, CPU wheels).
REFERENCE_STAMP := $(VENV)/.reference-installed
$(REFERENCE_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test,reference]'
	touch $(REFERENCE_STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# The main job: Multi30k EN→DE trained for 18 minutes (DEMO_MINUTES), then averaged, exported, evaluated
# and used, which takes a few minutes more (docs/benchmarks.md#the-main-job).
demo: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m tf_transformer.cli.demo

# One pytest process per core (at most 4; TEST_WORKERS=0 runs in this process). The slow tests keep a
# file's tests in one process (--dist loadfile), so module fixtures such as the multi-worker references
# are built once.
TEST_WORKERS ?= auto
PYTEST := $(PY) -m pytest -n $(TEST_WORKERS) --maxprocesses=4

test: lint
	$(PYTEST)

test-slow: lint $(SERVING_STAMP) $(REFERENCE_STAMP)
	$(PYTEST) --dist loadfile -m slow

clean:
	rm -rf $(VENV) $(SERVING_VENV) build *.egg-info .pytest_cache
