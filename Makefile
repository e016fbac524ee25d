# The two commands a new user needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test install lint typecheck eval clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --editable '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## demo: install, then serve the sample shop with the chat bubble on http://127.0.0.1:8080/
demo: $(STAMP)
	$(BIN)/parley serve --demo

## test: install, lint, type-check core/ and channels/, run the whole test suite
test: lint typecheck
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

## eval: retrieval quality (hit@1, hit@5, MRR@10) and answer quality (facts, deferrals,
## confidence calibration) on the bundled multilingual shop
eval: $(STAMP)
	$(BIN)/python -m bench.eval_retrieval
	$(BIN)/python -m bench.eval_answers

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
