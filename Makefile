# tiermem: `make help` lists the targets. Every target sets up its own virtual environment.
.DEFAULT_GOAL := help
SHELL := /bin/bash

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
NODE_STAMP := tests/node/node_modules/.installed-stamp
PROTO_FILES := $(wildcard proto/tiermem/v1/*.proto)

# Server settings for `make serve` (see README "Configuration").
HOST ?= 127.0.0.1
PORT ?= 50051
DATA_DIR ?= ./data

.PHONY: help venv proto check-proto serve test test-fast lint bench clean

help: ## Show this help
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP) ## Create the virtual environment and install tiermem with its dev tools

proto: $(STAMP) ## Regenerate the Python stubs in proto/tiermem/v1 from the .proto files
	$(PY) -m grpc_tools.protoc -Iproto --python_out=proto --pyi_out=proto --grpc_python_out=proto $(PROTO_FILES)

check-proto: proto ## Fail if the checked-in stubs differ from what proto/ generates
	@git diff --exit-code --stat -- proto/ || { echo "generated stubs drift from proto/: run 'make proto' and commit"; exit 1; }
	@test -z "$$(git status --porcelain --untracked-files=all -- proto/)" || { git status --short -- proto/; echo "untracked generated files in proto/"; exit 1; }

$(NODE_STAMP): tests/node/package.json tests/node/package-lock.json
	cd tests/node && npm ci --no-audit --no-fund --loglevel=error
	touch $(NODE_STAMP)

serve: proto ## Run the server on $(HOST):$(PORT) with data in $(DATA_DIR)
	$(PY) -m tiermem.server --host $(HOST) --port $(PORT) --data-dir $(DATA_DIR)

test: proto $(NODE_STAMP) ## Run the whole test suite (Python and the Node.js client)
	$(PY) -m pytest

test-fast: proto ## Run the test suite without the slow tests
	$(PY) -m pytest -m "not slow"

lint: $(STAMP) ## Lint and type-check
	$(VENV)/bin/ruff check server client kernels tests bench proto/tiermem/*.py
	$(VENV)/bin/ruff format --check server client kernels tests bench proto/tiermem/*.py
	$(VENV)/bin/mypy server client kernels

bench: proto ## Run the benchmarks: suite (vs empty RPC and FAISS), recall, consolidation pass
	$(PY) bench/suite.py --out bench/results
	$(PY) bench/recall.py --json bench/results/recall.json
	$(PY) bench/consolidation.py --engine 20000 --json bench/results/consolidation.json

clean: ## Remove the virtual environment and caches (keeps ./data)
	rm -rf $(VENV) tests/node/node_modules .pytest_cache .mypy_cache .ruff_cache
