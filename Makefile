# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow lint format install clean

$(STAMP): setup.py pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# The main job: Multi30k EN→DE trained, averaged, evaluated, exported and used (about 25 minutes on 2 cores).
demo: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m tf_transformer.cli.demo

test: lint
	$(PY) -m pytest

test-slow: lint
	$(PY) -m pytest -m slow

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
