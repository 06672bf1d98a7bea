# tailguard: every target sets up what it needs on a fresh machine (Python 3.11 + JDK 17).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: help venv test lint unit demo bench bench-quick bench-log bench-policy bench-agent bench-sim clean

help:
	@echo "make demo   run the main job on the embedded default (broker, local cluster, services)"
	@echo "make test   lint, type-check and run the whole test suite"
	@echo "make bench  the benchmarks (also bench-quick, bench-log, bench-policy, bench-agent, bench-sim)"

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest -q tests

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

demo: $(STAMP)
	$(BIN)/tailguard demo

bench-log: $(STAMP)
	$(BIN)/python benchmarks/log_throughput.py

bench-policy: $(STAMP)
	$(BIN)/python benchmarks/policy_throughput.py

bench-agent: $(STAMP)
	$(BIN)/python benchmarks/agent_overhead.py

bench-sim: $(STAMP)
	$(BIN)/python benchmarks/simulate.py

bench: $(STAMP)
	$(BIN)/tailguard bench

bench-quick: $(STAMP)
	$(BIN)/tailguard bench --quick

clean:
	rm -rf $(VENV) work .pytest_cache .mypy_cache .ruff_cache .hypothesis
