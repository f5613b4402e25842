# Two commands for a fresh machine: `make demo` and `make test`. Both build .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/slipstream demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/mypy

test: lint
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
