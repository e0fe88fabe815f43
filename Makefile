# Two entry points that work on a fresh Linux machine with python3 (3.9-3.13, with shared libpython):
#   make demo   set everything up, start a server with a model, call it, print the result
#   make test   set everything up and run the test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test test-unit test-e2e server bench lint clean

$(VENV)/.test-deps: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $@

$(VENV)/.dev-deps: pyproject.toml $(VENV)/.test-deps
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $@

server: $(VENV)/.test-deps
	$(VENV)/bin/pytriton install-server

demo: server
	$(PY) examples/quickstart.py

test: server
	$(PY) -m pytest -q tests

test-unit: $(VENV)/.test-deps
	$(PY) -m pytest -q tests/unit

bench: server $(VENV)/.dev-deps
	PYTHON=$(PY) bash bench/setup_perf_analyzer.sh
	$(PY) -m bench

lint: $(VENV)/.dev-deps
	$(VENV)/bin/ruff check pytriton tests bench examples
	$(VENV)/bin/ruff format --check pytriton tests bench examples
	$(VENV)/bin/mypy pytriton

clean:
	rm -rf $(VENV) build *.egg-info
