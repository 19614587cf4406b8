# The two commands: `make run` (the demo) and `make test` (the suite). Both set up what they need.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
CONFIG ?= examples/demo.yaml
STAMP  := $(VENV)/.installed

.PHONY: run test lint typecheck setup model bench eval clean

run: setup
	$(BIN)/toolsearch up --config $(CONFIG)

test: setup
	scripts/ensure-redis
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest $(PYTEST_ARGS)

setup: $(STAMP) model

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

model: $(STAMP)
	$(BIN)/toolsearch model prepare

bench: setup
	$(BIN)/toolsearch bench --out bench-results

eval: setup
	$(BIN)/toolsearch eval --all

clean:
	rm -rf $(VENV) .toolsearch .pytest_cache .mypy_cache .ruff_cache
