# Runifold conversation services. `make run` and `make test` are all a fresh
# machine needs: they create the virtual environment and install everything.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROTOS := $(shell find proto -name '*.proto' | sort)
# The Python sources that ruff and mypy check.
PY_SRC := services clients/python tests bench tools
# The CPU build of torch, installed before everything else (see $(STAMP)).
TORCH := torch==2.13.0
export XDG_RUNTIME_DIR ?= /tmp
export HF_HUB_OFFLINE := 1
export PATH := $(abspath $(BIN)):$(PATH)
export TRANSFORMERS_OFFLINE := 1

.PHONY: install tools node run test lint gen gen-check bench fmt clean deploy-sync soak \
  bench-peers
NODE_STAMP := clients/node/node_modules/.package-lock.json

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first: on these machines this is the CPU wheel from local disk; left to
	# sentence-transformers, a bare torch requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

## Tools the operations tests (tests/ops) need beyond pip: promtool (Debian's
## prometheus package; its service is not started). kubectl (for `kubectl
## kustomize`) comes with this kind of machine. Fast when already there.
tools:
	@command -v promtool >/dev/null || { \
	  echo "installing promtool (apt-get install prometheus)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }
	@command -v kubectl >/dev/null || echo "warning: no kubectl: k8s rendering tests will fail"

## Start the all-in-one server (all services, embedded PostgreSQL) on 127.0.0.1:50051.
run: $(STAMP)
	$(BIN)/python -m services

## The TypeScript client's packages (npm ci from the committed lock file).
$(NODE_STAMP): clients/node/package.json clients/node/package-lock.json
	cd clients/node && npm ci --no-audit --no-fund --loglevel=error
	@touch $(NODE_STAMP)

node: $(NODE_STAMP)

## The whole test suite: unit, integration (real PostgreSQL), end-to-end (real gRPC).
test: $(STAMP) tools node
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

## ruff, mypy, buf lint and the generated-code freshness check.
lint: $(STAMP) gen-check
	$(BIN)/ruff check $(PY_SRC)
	$(BIN)/ruff format --check $(PY_SRC)
	$(BIN)/mypy $(PY_SRC)
	$(BIN)/buf lint
	@if git rev-parse --verify -q main >/dev/null; then \
	  $(BIN)/buf breaking --against '.git#branch=main' && echo "buf breaking: no change breaks main"; \
	else echo "buf breaking: no local main branch to compare with"; fi

fmt: $(STAMP)
	$(BIN)/ruff check --fix $(PY_SRC)
	$(BIN)/ruff format $(PY_SRC)

## Python, gRPC and mypy stubs of $(PROTOS) into the directory $(1).
define protoc
$(BIN)/python -m grpc_tools.protoc -I proto --python_out=$(1) --grpc_python_out=$(1) \
  --mypy_out=$(1) --mypy_grpc_out=$(1) $(PROTOS) >/dev/null
endef

## Regenerate gen/ from proto/ (committed).
gen: $(STAMP)
	rm -rf gen && mkdir -p gen
	$(call protoc,gen)
	$(BIN)/python -m tools.api_docs

## Fail when gen/ differs from a fresh generation.
gen-check: $(STAMP)
	@tmp=$$(mktemp -d) && \
	$(call protoc,$$tmp) && \
	if diff -r $$tmp gen >/dev/null; then echo "gen/ is up to date"; rm -rf $$tmp; \
	else diff -r $$tmp gen | head -20; rm -rf $$tmp; echo "gen/ is stale: run make gen"; exit 1; fi
	@$(BIN)/python -m tools.api_docs --check

## Regenerate k8s/base/prometheusrule.yaml from deploy/prometheus/rules/runifold.rules.yml.
deploy-sync: $(STAMP)
	$(BIN)/python -m tests.ops.sync

## Benchmarks (figures printed; no thresholds).
bench: $(STAMP)
	$(BIN)/python -m bench $(BENCH_ARGS)

## Mixed load against the all-in-one server (not part of test or CI). Concurrency and
## duration: SOAK_ARGS="--concurrency 16 --duration 600" or RUNIFOLD_SOAK_CONCURRENCY /
## RUNIFOLD_SOAK_DURATION_S. Prints throughput, p50/p99 per RPC, errors by code, RSS.
soak: $(STAMP)
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

bench-peers: $(STAMP) $(PEERS_STAMP)
	$(BIN)/python -m bench.peers $(PEERS_ARGS)

clean:
	rm -rf $(VENV) $(PEERS_VENV) .runifold .pytest_cache .mypy_cache .ruff_cache \
	  clients/node/node_modules clients/node/dist
