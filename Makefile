# One entry point for everything. `make demo` and `make test` do their own set-up from a clean clone.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
TS := bindings/typescript
STAMP := $(VENV)/.installed

.PHONY: demo test test-deps check fmt fmt-check lint typecheck imports pytest ts-test codegen codegen-check bench bench-smoke bench-services clean setup node

$(STAMP): pyproject.toml $(wildcard workers/*/pyproject.toml)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]' -e workers/meshes -e workers/metadata-extract -e workers/thumbnail-render -e workers/semantic-analyse -e workers/metadata-extract-http -e workers/marketplace-etsy
	@touch $(STAMP)

setup: $(STAMP)

$(TS)/node_modules/.installed: $(TS)/package.json $(TS)/package-lock.json
	cd $(TS) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# the TypeScript worker depends on the built bindings (file:../../bindings/typescript)
TSW := workers/metadata-extract-ts
$(TSW)/node_modules/.installed: $(TSW)/package.json $(TSW)/package-lock.json $(TS)/node_modules/.installed
	cd $(TSW) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

node: $(TS)/node_modules/.installed $(TSW)/node_modules/.installed
	cd $(TS) && npm run --silent build
	cd $(TSW) && npm run --silent build

demo: $(STAMP) node
	$(BIN)/accord demo

# the 3D corpus the worker tests sweep (Debian's assimp-testmodels), installed where apt exists
test-deps:
	@if ! dpkg -s assimp-testmodels >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends assimp-testmodels; \
	fi

test: $(STAMP) node test-deps
	$(MAKE) check

check: fmt-check lint typecheck imports codegen-check pytest ts-test bench-smoke

fmt:
	$(BIN)/ruff format src tests bench workers
	$(BIN)/ruff check --fix src tests bench workers

fmt-check:
	$(BIN)/ruff format --check src tests bench workers

lint:
	$(BIN)/ruff check src tests bench workers

typecheck:
	$(BIN)/mypy

imports:
	$(BIN)/lint-imports

codegen: $(STAMP)
	$(BIN)/accord contracts codegen
	$(BIN)/accord contracts docs

codegen-check:
	$(BIN)/accord contracts codegen --check
	$(BIN)/accord contracts docs --check

pytest:
	$(BIN)/pytest

# the fault test on PostgreSQL at 1,000 runs (make test runs it with 200)
.PHONY: soak
soak: $(STAMP)
	ACCORD_SOAK_RUNS=1000 $(BIN)/pytest tests/e2e/test_postgres_faults.py -k kill_9_of_engines -s

ts-test: node
	cd $(TS) && npm run --silent build && npm test --silent
	cd $(TSW) && npm run --silent build && npm test --silent

# Redis, RabbitMQ and PostgreSQL (127.0.0.1:5432) on loopback for the store and transport
# benchmarks, started when not answering (PostgreSQL: the Debian cluster's service); the peers'
# own virtual environments are made by bench/bench_peers.py (bench/.venvs/)
bench-services: $(STAMP)
	$(PY) -c "from tests.services import ensure_rabbitmq, ensure_redis; ensure_redis(); ensure_rabbitmq()"
	@pg_isready -q -h 127.0.0.1 -p 5432 || { service postgresql start && sleep 3; } || pg_ctlcluster --skip-systemctl-redirect 15 main start
	@pg_isready -h 127.0.0.1 -p 5432

bench: $(STAMP) node bench-services
	$(PY) -m bench

bench-smoke: $(STAMP) bench-services
	$(PY) -m bench --smoke

clean:
	rm -rf $(VENV) $(TS)/node_modules $(TS)/dist .accord
