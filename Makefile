# Two commands a newcomer needs: `make demo` and `make test`. Both set up everything first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup demo lint format test test-fast bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

setup: $(VENV)/.installed
	tools/install-perf-analyzer.sh $(PY)

demo: $(VENV)/.installed
	$(VENV)/bin/batchpilot demo

# ruff (lint + format check) and mypy, configured in pyproject.toml; `make format` rewrites the files.
# It uses the venv as it is (`make setup` makes it; `make test` runs setup first).
lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format:
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

test: setup lint
	$(VENV)/bin/pytest -q

bench: setup
	$(PY) bench/runtime_bench.py

clean:
	rm -rf $(VENV) .tools
