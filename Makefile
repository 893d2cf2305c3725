# Every target does its own set-up: a fresh machine with only Python can run `make test` or `make demo`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install services test check lint typecheck docs demo bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

services:
	bash .ci/services.sh

## The whole test suite against the real servers (started here if they are down).
test: install services
	$(PY) -m pytest

lint: install
	$(PY) -m ruff check asynclock tests benchmarks examples
	$(PY) -m ruff format --check asynclock tests benchmarks examples

typecheck: install
	$(PY) -m mypy

docs: install
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet --site-dir build/site

check: lint typecheck docs

## The webhook storm, without and with asynclock (memory:// unless STATE=redis://... is given).
demo: install
	$(VENV)/bin/asynclock demo $(if $(STATE),--state $(STATE),)

bench: install services
	$(VENV)/bin/asynclock bench all $(if $(STATE),--state $(STATE),)

clean:
	rm -rf $(VENV) build dist .mypy_cache .pytest_cache .ruff_cache
