# `make demo` and `make test` set everything up on a fresh machine: they create .venv, install the
# pinned CPU torch first (so pip does not pull a CUDA build), then the project and its test extras.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
PYTEST_ARGS ?=

.PHONY: install demo test lint clean

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==$(TORCH_VERSION)
	$(PY) -m pip install -q -e ".[test]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) examples/demo.py

test: install
	$(PY) -m pytest -q -n auto --maxprocesses 4 $(PYTEST_ARGS)

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
