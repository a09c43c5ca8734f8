# The two commands of the README: `make run` (demo on Azurite) and `make test` (whole suite).
# Both set everything up from a fresh clone: a venv with pinned packages and Azurite from npm.

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
ORDERS ?= 100
WORKERS ?= 2
DEMO_ARGS ?=

.PHONY: setup run test lint format unit integration e2e clean

setup: $(VENV)/.installed node_modules/.installed

$(VENV)/.installed: requirements.txt requirements-dev.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

run: setup
	$(PY) -m sas_local.demo --orders $(ORDERS) --workers $(WORKERS) $(DEMO_ARGS)

test: setup lint
	$(PY) -m pytest

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

unit integration e2e: setup
	$(PY) -m pytest -m $@

clean:
	rm -rf $(VENV) node_modules .pytest_cache .mypy_cache .ruff_cache .sas-run
