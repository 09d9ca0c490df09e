# statetier developer workflow. On a fresh machine `make demo` and `make test` install everything.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=
# pytest-xdist workers of `make test` (0: one process): much of the suite waits on Spark, servers
# and subprocesses rather than computing, so workers overlap those waits
PYTEST_WORKERS ?= 2

.PHONY: all install bytecode test demo lint bench docs clean

all: test

# The runtime distributions (backend, compaction, operator) and the development ones: tools (the
# demos and benchmarks of `statetier demo` and `statetier bench`) and kubetest (the Kubernetes
# test environment of the tests, `make sandbox` and `statetier-operator bench`).
DISTRIBUTIONS := backend compaction operator tools kubetest

$(STAMP): requirements-dev.txt $(DISTRIBUTIONS:%=%/pyproject.toml)
	@scripts/install-system-deps.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt \
		-e 'backend[spark]' -e compaction -e operator -e 'tools[spark,compaction,rocksdb]' \
		-e kubetest
	$(BIN)/statetier pyspark-bytecode
	@touch $@

install: $(STAMP)

# Bytecode of the repository's own modules, which pip installs editable and so compiles none of.
# The state hosts, Spark's Python workers and the jobs' processes import them by the hundred;
# where PYTHONDONTWRITEBYTECODE is set (CI's environment sets it) no process writes what it
# compiled, so each compiled them again: about 0.3 s of CPU per process. Measured on
# tests/spark/test_spark_pipeline.py with two workers: 289 s without, 266 s with. compileall
# skips what is current, so this costs a second when nothing changed.
SOURCES := backend/src compaction/src operator/src tools/src kubetest/src tests docs examples

bytecode: $(STAMP)
	@$(BIN)/python -m compileall -q -j 0 $(SOURCES) >/dev/null

test: bytecode
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

demo: bytecode
	$(BIN)/statetier demo

# ruff, mypy --strict (the packages, then each example) and the import contracts: the tests that
# make test runs too, so the two cannot check different things
lint: $(STAMP)
	$(BIN)/python -m pytest -q -n 0 -p no:cacheprovider tests/test_lint.py \
		tests/test_import_contracts.py::test_the_tree_keeps_every_contract

# Every benchmark runs even when an earlier one misses its target; the target exits with the
# names of those that missed.
BENCHMARKS := state typed-values state-read state-bootstrap wordcount state-scale checkpoint savepoint compaction spark-wordcount timers compaction-offload

bench: bytecode
	@missed=""; for name in $(BENCHMARKS); do \
		echo "== statetier bench $$name"; \
		$(BIN)/statetier bench $$name || missed="$$missed $$name"; \
	done; \
	if [ -n "$$missed" ]; then echo "benchmarks that missed a target:$$missed"; exit 1; fi

docs: $(STAMP)
	$(BIN)/statetier config docs > docs/configuration.md

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis .import_linter_cache

# Operator (issue 6). `make sandbox`: the operator at work without a cluster (API emulator,
# operator, webhooks, kubectl apply of crds/ and examples/), narrated, then everything stops.
# `make e2e-kind`: the same scenarios on kind where Docker and kind exist; skips cleanly elsewhere.
.PHONY: sandbox e2e-kind

sandbox: $(STAMP)
	$(BIN)/statetier-operator sandbox --repo .

e2e-kind: $(STAMP)
	BIN=$(BIN) operator/e2e-kind.sh

# Packaging (issue 8). `make chart-lint`: the chart rendered, linted and validated (helm-python-sdk,
# no helm binary); `make rules-test`: promtool on the alert rules; `make manifests`: the chart as
# plain manifests in dist/statetier.yaml (VALUES=my-values.yaml to override).
.PHONY: chart-lint rules-test manifests
VALUES ?=

chart-lint: $(STAMP)
	$(BIN)/python -m pytest -q tests/packaging/test_packaging_chart.py

rules-test:
	cd charts/statetier/rules && promtool check rules statetier-alerts.yaml
	cd charts/statetier/rules/tests && promtool test rules statetier-alerts-test.yaml

manifests: $(STAMP)
	@mkdir -p dist
	$(BIN)/python charts/render.py $(if $(VALUES),-f $(VALUES)) > dist/statetier.yaml
	@echo "wrote dist/statetier.yaml"
