# statetier developer workflow. On a fresh machine `make demo` and `make test` install everything.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: all install test demo lint bench docs clean

all: test

$(STAMP): requirements-dev.txt backend/pyproject.toml compaction/pyproject.toml operator/pyproject.toml
	@scripts/install-system-deps.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt \
		-e backend -e compaction -e operator
	@touch $@

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

demo: $(STAMP)
	$(BIN)/statetier demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	@# examples share the module name example.py, so each is checked on its own
	@for f in examples/*/example.py; do $(BIN)/mypy --strict $$f || exit 1; done

bench: $(STAMP)
	$(BIN)/statetier bench state

docs: $(STAMP)
	$(BIN)/statetier config docs > docs/configuration.md

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
