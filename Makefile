# forumpulse — the two commands are `make demo` and `make test`; everything else is scripted below them.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | sha1sum | cut -c1-12)
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: help install native lock demo test lint unit bench bench-dos-latency eval up down status dashboards clean system-deps

help:
	@echo "make demo   - create .venv, install, simulate weeks of forum traffic, ingest into chDB (./data), detect, summarise"
	@echo "make test   - install everything the tests need (Debian packages, Kafka jars, .venv) and run the whole suite"
	@echo "make bench  - benchmarks side by side with peers; writes BENCHMARKS.md (slow, not part of test)"
	@echo "make eval   - detector evaluation (NAB, NASA 1995, simulator, CrowdSec cases); reads ../shared/data"
	@echo "make up / down / status - local real stack (Kafka, syslog-ng, owner process) under ./run"

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || bash deploy/bootstrap-python.sh $(PYTHON)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || { echo "python3 -m venv failed: apt-get install python3-venv"; exit 1; }
	$(BIN)/pip install -q --upgrade pip==25.3
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	@rm -f $(VENV)/.installed-*; touch $@

native: $(STAMP)  ## build the fast path's C scanner now (else built on first use; without gcc the numpy path runs)
	@$(BIN)/python -m forumpulse.pipeline.native

install: $(STAMP) native  ## + the project's bytecode: an editable install has none, and with PYTHONDONTWRITEBYTECODE set (as on CI images) every command would compile its modules again (~40 ms of each start)
	@$(BIN)/python -m compileall -q pipeline detectors dashboards schemas >/dev/null

lock:  ## regenerate constraints.txt (exact versions of every dependency) after changing a pin in pyproject.toml
	bash deploy/lock.sh

demo: install
	$(BIN)/forumpulse demo

system-deps:
	bash deploy/install-system-deps.sh

test: install system-deps
	$(BIN)/ruff check .
	bash deploy/mypy.sh $(BIN)
	$(BIN)/pytest -q --timeout=900

unit: install
	$(BIN)/pytest -q -m "not kafka and not syslogng and not netns and not browser"

lint: install
	$(BIN)/ruff check .
	bash deploy/mypy.sh $(BIN)

bench: install system-deps
	$(BIN)/python -m forumpulse.pipeline.bench

eval: install
	$(BIN)/python -m forumpulse.detectors.evaluate
	$(BIN)/python -m forumpulse.detectors.eval_dos

bench-dos-latency: install system-deps
	$(BIN)/python deploy/bench_dos_latency.py

up: install system-deps
	bash deploy/stack.sh up

down:
	bash deploy/stack.sh down

status:
	bash deploy/stack.sh status

dashboards: install
	$(BIN)/python -m forumpulse.dashboards.build

clean:
	rm -rf data build .pytest_cache .mypy_cache .ruff_cache
