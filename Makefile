# The two commands a new user needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# What `make demo` runs, and what `make test` adds (pytest, Playwright, ruff, mypy).
RUNTIME := $(VENV)/.installed-runtime
DEV     := $(VENV)/.installed-dev

.PHONY: demo test install install-dev system-packages lint typecheck eval bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(RUNTIME): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --editable .
	touch $@

$(DEV): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --editable '.[dev]'
	touch $@ $(RUNTIME)

install: $(RUNTIME)

install-dev: $(DEV)

## demo: install the gateway only, then serve the sample shop with the chat bubble on
## http://127.0.0.1:8080/ (PARLEY_PORT=8081 make demo for another port)
demo: $(RUNTIME)
	$(BIN)/parley serve --demo

## test: install with the development tools, lint, type-check, run the whole test suite
## (on PYTEST_WORKERS processes, a test file each at a time; 2 unless told)
PYTEST_WORKERS ?= 2
test: system-packages lint typecheck
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile

## system-packages: what pip cannot install, Debian's Chromium (browser tests) and
## redis-server; installed with apt-get as .ci/run does when the user is root, else named
system-packages:
	@missing=""; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	[ -x "$${PARLEY_TEST_CHROMIUM:-/usr/bin/chromium}" ] || missing="$$missing chromium"; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "apt-get install$$missing"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -qq $$missing >/dev/null; } \
		|| echo "could not install$$missing; the tests that need them will fail" >&2; \
	else \
		echo "missing:$$missing (as root: apt-get install$$missing); the tests that need them will fail" >&2; \
	fi

lint: $(DEV)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(DEV)
	$(BIN)/mypy

## eval: retrieval quality (hit@1, hit@5, MRR@10) and answer quality (right, confidently
## wrong, deferred, risk-coverage, confidence calibration) on the bundled multilingual shop and
## on the Corona-Warn-App FAQ (real support content, English and German; about 6 minutes)
eval: $(DEV)
	$(BIN)/python -m bench.eval_retrieval
	$(BIN)/python -m bench.eval_answers
	$(BIN)/python -m bench.eval_faq

## bench: every benchmark three times beside its floor or baseline, then once under py-spy;
## the medians, ratios and profiles go to docs/PERFORMANCE.md (about an hour on two cores;
## BENCH_ARGS="--only memory --runs 5" for part of it)
BENCH_ARGS ?=
bench: $(DEV)
	$(BIN)/python -m bench.all $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .bench
