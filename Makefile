# The two commands: `make run` (the demo) and `make test` (the suite). Both set up what they need.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
CONFIG ?= examples/demo.yaml
STAMP  := $(VENV)/.installed
# third-party MCP servers the tests run and the MCP conformance suite (Node), installed from their
# lock file; npm's postinstall (patch-conformance.mjs) fits the suite to Node 20
SERVERS := tests/servers
SERVERS_STAMP := $(SERVERS)/node_modules/.installed
# the pin of pyproject.toml's torch extra, and where its CPU build comes from
TORCH_VERSION ?= 2.13.0
TORCH_INDEX   ?= https://download.pytorch.org/whl/cpu

# pytest workers: most tests wait on processes of their own, so two workers fill the two cores a
# small machine has; a file's tests stay on one worker, where its module's stack was started
TEST_WORKERS ?= 2

.PHONY: run test lint typecheck setup model bench eval clean

run: setup
	$(BIN)/toolsearch up --config $(CONFIG)

test: setup
	scripts/ensure-redis
	scripts/ensure-chromium
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

setup: $(STAMP) model $(SERVERS_STAMP)

# `.[dev]` is every extra (indexer, torch, model, bench) and the test tools. torch comes first from
# PyTorch's CPU index: PyPI's Linux wheels of torch pull several GB of CUDA libraries the CPU
# embedder never loads. Where that index is unreachable, pip takes torch from the configured index
# instead; an installed torch of the pinned version is kept as it is.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --timeout 15 --retries 1 --index-url $(TORCH_INDEX) \
		'torch==$(TORCH_VERSION)' 2>/dev/null \
		|| echo "PyTorch's CPU index is unreachable: torch comes from the configured index"
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Without npm the tests that need these servers are skipped, saying why.
$(SERVERS_STAMP): $(SERVERS)/package-lock.json $(SERVERS)/patch-conformance.mjs
	@if command -v npm >/dev/null 2>&1; then \
		npm ci --prefix $(SERVERS) --no-audit --no-fund --loglevel=error && touch $@; \
	else echo "npm not found: the tests that run Node MCP servers will be skipped"; fi

model: $(STAMP)
	$(BIN)/toolsearch model prepare

bench: setup
	$(BIN)/toolsearch bench --out bench-results

eval: setup
	$(BIN)/toolsearch eval --all

clean:
	rm -rf $(VENV) .toolsearch .pytest_cache .mypy_cache .ruff_cache $(SERVERS)/node_modules
