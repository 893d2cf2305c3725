# Every target does its own set-up: a fresh machine with only Python can run `make test` or `make demo`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install services test redis-range check lint typecheck docs demo bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

services:
	bash .ci/services.sh

## The whole test suite against the real servers (started here if they are down), then the
## Redis conformance subset on the other ends of the declared redis-py range. The suite runs
## in TEST_WORKERS processes (pytest-xdist): most of its time is spent waiting on servers,
## subprocesses and timeouts, not on the CPU, and every test has its own key namespace.
TEST_WORKERS ?= 4
## --tb=native: CPython 3.11.7's ast.parse can raise "AST constructor recursion depth mismatch"
## while pytest formats a failure's source (getstatementrange_ast), which crashes an xdist worker
## and ends the whole run in INTERNALERROR; the native traceback parses no source.
test: install services
	$(PY) -m pytest -n $(TEST_WORKERS) --tb=native
	$(MAKE) redis-range

## The main venv has the redis-py that arq pulls (5.3.x: arq needs redis < 6). The lowest one
## asynclock declares and the newest get a small venv each: mypy on the package and the Redis
## conformance tests (plain and Cluster), about 45 s each.
REDIS_RANGE ?= 5.0.1 latest
REDIS_RANGE_TESTS := tests/conformance/test_lock.py \
	tests/conformance/test_cluster.py tests/conformance/test_fair.py
.venv-redis-%/.installed-stamp: pyproject.toml
	$(PYTHON) -m venv .venv-redis-$*
	.venv-redis-$*/bin/python -m pip install --quiet --upgrade pip
	.venv-redis-$*/bin/python -m pip install --quiet -e '.[all,prometheus,otel,web]' \
		pytest pytest-asyncio pytest-timeout hypothesis mypy rich \
		'redis[hiredis]$(if $(filter latest,$*),>=5.0.1,==$*)'
	touch $@

redis-range: services $(foreach v,$(REDIS_RANGE),.venv-redis-$(v)/.installed-stamp)
	@for v in $(REDIS_RANGE); do \
		py=.venv-redis-$$v/bin/python; \
		echo "== redis-py $$($$py -c 'import redis; print(redis.__version__)')"; \
		$$py -m mypy --strict asynclock --exclude asynclock/integrations || exit 1; \
		$$py -m pytest -q -p no:cacheprovider -m redis $(REDIS_RANGE_TESTS) || exit 1; \
	done

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
	rm -rf $(VENV) .venv-redis-* build dist .mypy_cache .pytest_cache .ruff_cache
