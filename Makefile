# One entry point for everything. `make demo` and `make test` do their own set-up from a clean clone.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
TS := bindings/typescript
STAMP := $(VENV)/.installed

.PHONY: demo test test-deps check fmt fmt-check lint typecheck imports pytest ts-test codegen codegen-check bench bench-smoke bench-services clean setup node ui-build bytecode

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

# the web UI (ui/): bundled into the folder `accord serve` serves under /ui/ (not committed)
UI := ui
UI_STATIC := src/accord/adapters/ingress/ui_static
$(UI)/node_modules/.installed: $(UI)/package.json $(UI)/package-lock.json
	cd $(UI) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

$(UI_STATIC)/index.html: $(UI)/node_modules/.installed $(UI)/index.html $(UI)/build.mjs $(UI)/tsconfig.json $(wildcard $(UI)/src/*.ts $(UI)/src/*/*.ts $(UI)/src/*.css)
	cd $(UI) && npm run --silent build

ui-build: $(UI_STATIC)/index.html

node: $(TS)/node_modules/.installed $(TSW)/node_modules/.installed ui-build
	cd $(TS) && npm run --silent build
	cd $(TSW) && npm run --silent build

demo: $(STAMP) node
	$(BIN)/accord demo

# the 3D corpus the worker tests sweep (Debian's assimp-testmodels) and the browser the UI tests
# drive (Debian's chromium), installed where apt exists (one apt-get update for both)
test-deps:
	@missing=""; for p in assimp-testmodels chromium; do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing; \
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

# the project's bytecode, written before the suites start the hundreds of `accord` processes they
# run: where PYTHONDONTWRITEBYTECODE is set, an import never writes it, and each process would
# compile every module again (half a second of CPU per process)
bytecode: $(STAMP)
	$(PY) -m compileall -q -j 0 -x '/(node_modules|\.venvs?)/' src workers bench tests > /dev/null

pytest: bytecode
	$(BIN)/pytest

# the fault tests at their full size: on PostgreSQL at 1,000 runs (make test runs it with 200),
# the scale-out soak at 1,000 runs (make test: 500), and kill -9 of an engine owning shards
# during 1,000 runs on BullMQ and on Redis Cluster (make test: 400; RabbitMQ 300 in both)
.PHONY: soak
soak: $(STAMP) bench-services bytecode
	ACCORD_SOAK_RUNS=1000 $(BIN)/pytest tests/e2e/test_postgres_faults.py -k kill_9_of_engines -s
	ACCORD_SOAK_RUNS=1000 $(BIN)/pytest tests/integration/test_scale_out.py -s
	ACCORD_SHARD_KILL_RUNS=1000 $(BIN)/pytest tests/integration/test_shard_faults.py -s

# the UI's browser tests, writing each page's screenshot to docs/ui/ (make test writes them to
# the temp folder, leaving the tree as it was)
.PHONY: ui-shots
ui-shots: $(STAMP) node test-deps
	ACCORD_UI_SHOTS=docs/ui $(BIN)/pytest tests/integration/test_ui_browser.py

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

bench: $(STAMP) node bench-services bytecode
	$(PY) -m bench

bench-smoke: $(STAMP) bench-services bytecode
	$(PY) -m bench --smoke

# The monorepo (docs/monorepo.md). `make test-affected BASE=origin/main` runs the suites a change
# since BASE reaches (`accord dev affected`): each worker's, and the platform's own when the change
# is outside workers/ and the docs; `make test` still runs everything.
BASE ?= HEAD
COMPOSE ?= $(shell command -v podman-compose >/dev/null 2>&1 && echo podman-compose || echo docker compose)
.PHONY: test-affected stack-up stack-down sparse-all sparse-marketplace-etsy sparse-metadata-extract sparse-metadata-extract-http sparse-metadata-extract-ts sparse-semantic-analyse sparse-thumbnail-render

test-affected: $(STAMP) node
	$(BIN)/accord dev affected --base $(BASE) --run

# the local stack of compose.yaml: Redis, RabbitMQ, the engine, the API and every worker
stack-up:
	$(COMPOSE) -f compose.yaml up -d --build

stack-down:
	$(COMPOSE) -f compose.yaml down

# work on one worker: a cone-mode sparse checkout of what reaches it (`accord dev affected`'s
# inputs; root files are always there); `make sparse-all` brings back the whole tree
sparse-marketplace-etsy:
	git sparse-checkout set --cone workers/marketplace-etsy src schemas .github

sparse-metadata-extract:
	git sparse-checkout set --cone workers/metadata-extract workers/meshes src examples/models schemas .github

sparse-metadata-extract-http:
	git sparse-checkout set --cone workers/metadata-extract-http workers/metadata-extract workers/meshes src schemas .github

sparse-metadata-extract-ts:
	git sparse-checkout set --cone workers/metadata-extract-ts bindings/typescript schemas .github

sparse-semantic-analyse:
	git sparse-checkout set --cone workers/semantic-analyse workers/meshes src examples/models schemas .github

sparse-thumbnail-render:
	git sparse-checkout set --cone workers/thumbnail-render workers/meshes src examples/models schemas .github

sparse-all:
	git sparse-checkout disable

clean:
	rm -rf $(VENV) $(TS)/node_modules $(TS)/dist .accord $(UI)/node_modules $(UI_STATIC)
