# The two commands of the README: `make run` (demo on Azurite) and `make test` (whole suite).
# Both set everything up from a fresh clone: a venv with pinned packages and Azurite from npm.

# Independent prerequisites (the venv and npm, lint and the suite) are made side by side.
MAKEFLAGS += --jobs=2
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
ORDERS ?= 100
WORKERS ?= 2
DEMO_ARGS ?=
CHROMIUM := /usr/bin/chromium
# Playwright drives Debian's Chromium (sas_local/browser.py); it must never fetch a browser.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD := 1

.PHONY: setup run fast test suite lint format unit integration e2e clean lock hooks chaos bench chromium \
	openapi infra

setup: $(VENV)/.installed node_modules/.installed

# uv installs the pinned packages (with requirements.txt's hashes checked) in seconds where pip
# takes a minute; every run of `make test` from a fresh clone starts with it.
UV_VERSION := 0.13.9
UV_INSTALL := $(VENV)/bin/uv pip install --quiet --python $(PY)

$(VENV)/.installed: requirements.txt requirements-dev.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	$(UV_INSTALL) -r requirements.txt
	$(UV_INSTALL) -r requirements-dev.txt
	$(UV_INSTALL) --no-deps -e .
	touch $@

# requirements.txt (the hashed lock Azure's remote build installs) from requirements.in, resolved
# against PyPI only: this machine's pip config (find-links, extra indexes) is ignored.
lock: $(VENV)/.installed
	env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null \
	  $(VENV)/bin/pip-compile --quiet --generate-hashes --strip-extras --allow-unsafe \
	  -o requirements.txt requirements.in

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

run: setup
	$(PY) -m sas_local.demo --orders $(ORDERS) --workers $(WORKERS) $(DEMO_ARGS)

# The domain and the core services on in-memory fakes: seconds, no Azurite, no Node.
fast: $(VENV)/.installed
	$(PY) -m pytest -m fast --hypothesis-profile=fast tests/unit

# Two pytest-xdist workers, each with an Azurite of its own; tests sharing a costly fixture (an
# end-to-end stack, the deploy venvs) stay on one worker (tests/conftest.py, shared_by).
TEST_WORKERS ?= 2

# Lint beside the suite: mypy's minute overlaps the first tests' waiting.
test: lint suite

suite: setup chromium
	$(PY) -m pytest -n $(TEST_WORKERS) -m "not broken_builds" --cov --cov-report=term:skip-covered

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Git hooks (.pre-commit-config.yaml): ruff, mypy and file hygiene before each commit.
hooks: $(VENV)/.installed
	$(VENV)/bin/pre-commit install

unit integration: setup
	$(PY) -m pytest -n $(TEST_WORKERS) -m $@

e2e: setup chromium
	$(PY) -m pytest -n $(TEST_WORKERS) -m $@

# Headless Chromium for the dashboard's end-to-end test (tests/e2e/test_dashboard.py) and its
# screenshot: Debian's package, installed when missing. It needs root and apt-get (as CI has):
# anything else fails here, loudly, rather than skipping the test.
chromium: $(CHROMIUM)

$(CHROMIUM):
	apt-get update
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium

# docs/openapi.json from the app's own schema (tests/unit/test_openapi.py fails when stale).
openapi: setup
	$(PY) -m sas_local.openapi

# The parts of infra/ that follow from the app's workflows (workflows/): each agent's queues,
# each HTTP agent's URL parameters and settings. A unit test fails when they are stale.
infra: setup
	$(PY) -m sas_local.infra

clean:
	rm -rf $(VENV) node_modules .pytest_cache .mypy_cache .ruff_cache .sas-run

# The broken builds the checker must catch (those make test leaves out), then a chaos campaign
# (docs/reliability.md): the whole local stack under a seeded schedule of every fault kind,
# then an independent checker; exits non-zero on any violation.
CHAOS_ORDERS ?= 5000
SEED ?= 42
CHAOS_ARGS ?=

chaos: setup
	$(PY) -m pytest -n $(TEST_WORKERS) -m broken_builds tests/chaos
	$(PY) -m sas_local.chaos --orders $(CHAOS_ORDERS) --seed $(SEED) $(CHAOS_ARGS)

# The storage benchmark (docs/benchmarks.md): raw Azurite rates, exact requests per order and the
# limit they imply, end-to-end throughput and latency per worker count, the supervisor's sweep.
# Writes docs/benchmarks.{md,json,png}. BENCH_ARGS=--quick for the CI-sized run,
# BENCH_ARGS="--compare <rev>" to measure another commit side by side.
BENCH_ARGS ?=

bench: setup
	$(PY) -m sas_local.bench $(BENCH_ARGS)
