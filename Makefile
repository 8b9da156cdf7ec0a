# Two commands a newcomer needs: `make demo` and `make test`. Both set up everything first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-fast bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

setup: $(VENV)/.installed
	tools/install-perf-analyzer.sh $(PY)

demo: $(VENV)/.installed
	$(VENV)/bin/batchpilot demo

test: setup
	$(VENV)/bin/pytest -q

bench: setup
	$(PY) bench/runtime_bench.py

clean:
	rm -rf $(VENV) .tools
