# tiermem: `make help` lists the targets. Every target sets up its own virtual environment.
.DEFAULT_GOAL := help
SHELL := /bin/bash

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
NODE_STAMP := tests/node/node_modules/.installed-stamp
PROTO_FILES := $(wildcard proto/tiermem/v1/*.proto)
TYPECHECK := .typecheck

# The benchmark's own environment: chromadb (the peer) and matplotlib (plots), kept out of $(VENV)
# because chromadb brings its own grpcio/protobuf pins. BENCH_ARGS go to bench/suite.py.
BENCH_VENV ?= .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed-stamp
BENCH_PACKAGES ?= chromadb matplotlib numpy
BENCH_ARGS ?=
SHARDS_ARGS ?=  # what `make bench-shards` passes to bench/shards.py

# Server settings for `make serve` (docs/configuration.md).
HOST ?= 127.0.0.1
PORT ?= 50051
DATA_DIR ?= ./data
SEARCH_PROCESSES ?=

.PHONY: help venv proto check-proto lint-proto proto-baseline go-toolchain go-stubs check-go-stubs proxy-toolchain serve test test-fast test-cluster lint bench bench-venv bench-smoke bench-quality bench-keywords bench-shards image-check clean

help: ## Show this help
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP) ## Create the virtual environment and install tiermem with its dev tools

$(BENCH_STAMP):
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install --quiet $(BENCH_PACKAGES)
	touch $(BENCH_STAMP)

bench-venv: $(BENCH_STAMP) ## Create .venv-bench with chromadb and matplotlib (the suite's peer and plots)

proto: $(STAMP) ## Regenerate the Python stubs in proto/tiermem/v1 from the .proto files
	$(PY) -m grpc_tools.protoc -Iproto --python_out=proto --pyi_out=proto --grpc_python_out=proto $(PROTO_FILES)

check-proto: proto ## Fail if the checked-in stubs differ from what proto/ generates
	@git diff --exit-code --stat -- proto/ || { echo "generated stubs drift from proto/: run 'make proto' and commit"; exit 1; }
	@test -z "$$(git status --porcelain --untracked-files=all -- proto/)" || { git status --short -- proto/; echo "untracked generated files in proto/"; exit 1; }

$(NODE_STAMP): tests/node/package.json tests/node/package-lock.json
	cd tests/node && npm ci --no-audit --no-fund --loglevel=error
	touch $(NODE_STAMP)

# buf (from npm, pinned in tests/node) checks the contract: proto/buf.yaml says what and why.
BUF := tests/node/node_modules/.bin/buf

lint-proto: $(NODE_STAMP) ## buf format, buf lint (STANDARD) and buf breaking against proto/buf-baseline.binpb
	$(BUF) format --diff --exit-code proto
	$(BUF) lint proto
	$(BUF) breaking proto --against proto/buf-baseline.binpb

proto-baseline: $(NODE_STAMP) ## Record the current contract as the baseline buf breaking compares with
	$(BUF) build proto --exclude-source-info -o proto/buf-baseline.binpb

# Go: stubs in gen/go/tiermem/v1 (the proto's go_package) and the example in examples/go, built
# with Debian's Go toolchain and libraries (GOPATH mode: no module proxy needed). GO_PACKAGES is
# what `make go-toolchain` installs with apt-get (as root); the example's test needs them.
GO_PACKAGES := golang-go golang-google-grpc-dev golang-google-genproto-dev golang-google-protobuf-dev \
	golang-github-golang-protobuf-1-5-dev protoc-gen-go protoc-gen-go-grpc

go-toolchain: ## Install Debian's Go toolchain, gRPC libraries and protoc plugins (apt-get, as root)
	@dpkg -s $(GO_PACKAGES) >/dev/null 2>&1 || { \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(GO_PACKAGES) >/dev/null \
		|| { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(GO_PACKAGES) >/dev/null; }; }
	@go version

go-stubs: $(NODE_STAMP) ## Regenerate the Go stubs in gen/go/tiermem/v1 (buf generate, buf.gen.yaml)
	$(BUF) generate proto

check-go-stubs: go-stubs ## Fail if the checked-in Go stubs differ from what proto/ generates
	@git diff --exit-code --stat -- gen/go || { echo "Go stubs drift from proto/: run 'make go-stubs' and commit"; exit 1; }
	@test -z "$$(git status --porcelain --untracked-files=all -- gen/go)" || { git status --short -- gen/go; echo "untracked generated files in gen/go"; exit 1; }

serve: $(STAMP) ## Run the server on $(HOST):$(PORT) with data in $(DATA_DIR) (SEARCH_PROCESSES=N: N processes serving)
	$(PY) -m tiermem.server --host $(HOST) --port $(PORT) --data-dir $(DATA_DIR)$(if $(SEARCH_PROCESSES), --search-processes $(SEARCH_PROCESSES))

test: proto $(NODE_STAMP) ## Run the whole test suite (Python and the Node.js client) but the cluster test
	$(PY) -m pytest -m "not cluster"

proxy-toolchain: ## Install Debian's HAProxy, the proxy of the cluster test (apt-get, as root)
	@command -v haproxy >/dev/null 2>&1 || test -x /usr/sbin/haproxy || { \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q haproxy >/dev/null \
		|| { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q haproxy >/dev/null; }; }

test-cluster: proto proxy-toolchain ## Three shards behind HAProxy on loopback: 50 tenants, a move under writes, a kill -9
	$(PY) -m pytest -m cluster

test-fast: proto ## Run the test suite without the slow tests
	$(PY) -m pytest -m "not slow and not cluster"

lint: $(STAMP) ## Lint and type-check
	$(VENV)/bin/ruff check server client kernels integrations tests bench proto/tiermem/*.py
	$(VENV)/bin/ruff format --check server client kernels integrations tests bench proto/tiermem/*.py
	@# mypy sees the installed layout (tiermem.server, ...) through a tree of links, so imports across modules resolve
	@rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)/tiermem
	@for f in proto/tiermem/*; do ln -s "$$PWD/$$f" $(TYPECHECK)/tiermem/; done
	@for d in server client kernels; do ln -s "$$PWD/$$d" $(TYPECHECK)/tiermem/$$d; done
	@for d in mcp langgraph; do ln -s "$$PWD/integrations/$$d" $(TYPECHECK)/tiermem/$$d; done
	cd $(TYPECHECK) && ../$(VENV)/bin/mypy --config-file ../pyproject.toml -p tiermem.server -p tiermem.client -p tiermem.kernels -p tiermem.mcp -p tiermem.langgraph

bench: proto ## Run the benchmark suite at 100k (vs empty RPC, FAISS, Chroma; recall, start-up, plots), the consolidation kernels, threads vs processes
	@$(MAKE) --no-print-directory $(BENCH_STAMP) || echo "bench: could not set up $(BENCH_VENV); the suite runs without Chroma and plots"
	$(PY) bench/suite.py --out bench/results $(BENCH_ARGS)
	$(PY) bench/consolidation.py --engine 20000 --json bench/results/consolidation.json
	$(PY) bench/gil.py --json bench/results/gil.json

# Conversations with questions and evidence (the format bench/quality.py reads); never copied into the repository.
QUALITY_DATA ?= ../shared/data/locomo-dev

bench-quality: proto ## Retrieval quality on real conversations (QUALITY_DATA=dir): recall and hit at 5 and 10 against cosine, BM25 and RRF
	$(PY) bench/quality.py --data $(QUALITY_DATA) --out bench/results

bench-keywords: proto ## The keyword pass alone at 1,000,000 memories against tantivy and bm25s (bench/keywords.py --peers)
	$(PY) bench/keywords.py --peers --json bench/results/keywords.json

bench-smoke: proto ## A tiny run of the suite (what tests/test_bench_smoke.py runs), without Chroma
	$(PY) bench/suite.py --n 600 --dim 32 --seconds 0.5 --recall-queries 20 --no-chroma --out bench/results/smoke

bench-shards: proto proxy-toolchain ## Searches/s against 1..cores local tenant shards behind HAProxy (bench/shards.py; SHARDS_ARGS="--max-shards 4" ...)
	$(PY) bench/shards.py --json bench/results/shards.json $(SHARDS_ARGS)

image-check: ## Build the Dockerfile's image without Docker Hub (debootstrap, buildah, podman; as root) and check it serves
	bash deploy/check-image.sh

clean: ## Remove the virtual environment and caches (keeps ./data)
	rm -rf $(VENV) $(BENCH_VENV) tests/node/node_modules .pytest_cache .mypy_cache .ruff_cache $(TYPECHECK)
