# Two commands for a fresh machine: `make demo` and `make test`. Both build .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo transport-demo test bench lint clean system-deps ext asan test-pure docs

# One environment with the dev extras serves both `demo` and `test`, so `make test` after `make demo`
# installs nothing more. The demo alone needs only the core dependencies: `pip install . && slipstream demo`.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,pipeline,docs]'
	touch $(STAMP)

# The end-to-end tour: typed streams and a server with UDP and IPC clients, recorded; the Spark report
# (its path is printed); the live abuse-list loop. About half a minute here; output in demo-output/.
demo: $(STAMP)
	bash scripts/ensure-system-deps.sh java
	$(VENV)/bin/slipstream pipeline demo --output demo-output

# The transport alone: two processes exchange messages over shared memory and print what they measured.
transport-demo: $(STAMP)
	$(VENV)/bin/slipstream demo

# The documentation site (docs/: Markdown guides and the API reference from the docstrings) into
# build/docs, rebuilt whole (-E: docstrings are not sources Sphinx tracks); warnings are errors.
docs: $(STAMP)
	$(PY) -m sphinx -W --keep-going -E -q -b html docs build/docs
	@echo "open build/docs/index.html"

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/mypy

# System packages the tests need (nft, ip for the netns test hosts; Java 17 for Spark, chromium for the
# report check); no apt call when present.
system-deps:
	bash scripts/ensure-system-deps.sh

# The C fast path, built in place (so the editable install and PYTHONPATH=src both find it); warnings are errors.
# With SLIPSTREAM_REQUIRE_EXTENSIONS=1 a failed build fails here (and removes an earlier build) instead of
# falling back to pure Python.
ext: $(STAMP)
	$(PY) setup.py -q build_ext --inplace

# The whole suite with the extension (it must build and load), the differential tests, then a short
# pure-Python run, then the differential and fuzz tests under ASan/UBSan (about 1.5 minutes; a scratch build).
test: lint system-deps
	SLIPSTREAM_REQUIRE_EXTENSIONS=1 $(MAKE) ext
	SLIPSTREAM_REQUIRE_EXTENSIONS=1 $(PY) -m pytest -q --durations=30
	$(MAKE) test-pure
	$(MAKE) asan

# Pure-Python smoke run: the fallback a machine without a compiler gets.
test-pure: $(STAMP)
	SLIPSTREAM_NO_EXTENSIONS=1 $(PY) -m pytest -q -p no:cacheprovider tests/test_logbuffer.py tests/test_ipc.py \
		tests/test_sender.py tests/test_import_floors.py tests/test_readme.py tests/test_network_session.py

# The differential and fuzz tests against a build with AddressSanitizer and UBSan, made in a scratch copy
# of the tree (the in-place extension is left as it is); bounded by a timeout.
asan: $(STAMP)
	bash scripts/asan.sh $(PY)

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build
	find src -name '*.so' -delete
