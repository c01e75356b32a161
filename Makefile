# Makefile: the two commands a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: demo test build clean

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	touch $@

# Build requirements go into the venv so rebuilds reuse build/ (no isolated build environment).
$(VENV)/.build-deps: $(VENV)/.created
	$(PIP) install -q "scikit-build-core>=0.10" "nanobind>=2.4"
	touch $@

build: $(VENV)/.build-deps
	$(PIP) install -q --no-build-isolation -e .

$(VENV)/.test-deps: $(VENV)/.build-deps pyproject.toml
	$(PIP) install -q --no-build-isolation -e ".[test]"
	touch $@

demo: build
	$(VENV)/bin/quantmatmul demo

test: $(VENV)/.test-deps build
	$(PY) -m pytest -q

clean:
	rm -rf build $(VENV)
