#!/usr/bin/env bash
# benchmarks/device.sh: one call on the device host (Intel Xeon, AMX, 16 cores): build, self-tests, the suite natively, the per-level benchmarks; logs and JSON under $OUT.
#
# From the tool: run(command="bash benchmarks/device.sh", timeout_s=...). Settings by environment:
#   LEVELS (amx,avx512_vnni), THREADS (16,2), REPEAT (7), BENCHES (the benchmarks/*.py scripts, in
#   order; `BENCHES=scaling THREADS=1,2,4,8,16` for the scaling record issues 10 and 11 ask for;
#   cold_decode: decode on weights from memory, COLD_MB of codes per shape; `BENCHES=blocking
#   LEVELS=amx` compares the QLinearMatMul driver's blockings in one process, BLOCKINGS (its
#   SETTINGS: "k_block=512;task_rows=32,k_block=256") in place of its grid; transformer_shapes:
#   MiniLM / BERT-sized calls of tens of microseconds, where the pool's wake and wait show),
#   TESTS=0 to skip the suite, TEST_TIMEOUT (s per test
#   file; the files run in parallel), TEST_FILES (tests/test_*.py), BENCH_TIMEOUT (s per script),
#   PY (python3), BUILD=0 to use the installed build, FUZZ_MINUTES (0) to run tests/fuzz.py there
#   (the differential fuzzer, natively on AMX), CNN (none) the models benchmarks/cnn.py compares with
#   ORT at each of THREADS (`CNN="mobilenet_v2 resnet18"`: the depthwise and convolution kernels). A rehearsal here, before spending device time:
#   BUILD=0 PY=.venv/bin/python TEST_FILES=tests/test_version.py LEVELS=avx2 THREADS=2 REPEAT=2 \
#     BENCHES=levels bash benchmarks/device.sh
# Measured 2026-11-26: build 21 s, suite 23 s, the four scripts at 2 levels x 2 thread counts and
# 5 rounds about 80 s; a machine's start took about 30 s of device time.
# An import that crashes (as the eighteenth session's did there) is reported with the self-test trace
# and the native frames (benchmarks/crash_report.c), then the script stops.
# The machine has no package registry: the build uses its own scikit-build-core and nanobind, and
# the suite runs without SIMDe (native tables only: that is the point of running there).
set -u
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
LEVELS=${LEVELS:-amx,avx512_vnni}
THREADS=${THREADS:-16,2}
REPEAT=${REPEAT:-7}
BENCHES=${BENCHES:-levels level4_decode float_levels level0_decode cold_decode}
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/device.log") 2>&1  # appended: several runs in one call keep every log

lscpu | grep -E "Model name|^CPU\(s\)|Thread|Flags" | cut -c1-600
"$PY" -m pip list 2>/dev/null | grep -i -E "^(onnxruntime|onnx|torch|numpy|scikit-build-core|nanobind) "
if [ "${BUILD:-1}" != 0 ]; then
  SECONDS=0
  "$PY" -m pip install -q --no-build-isolation --no-deps . || exit 1
  echo "build: ${SECONDS} s"
fi
if ! "$PY" -c "import quantmatmul as q, json; print(json.dumps(q.cpu_info()))"; then
  # Where the import died: the self-test step (QUANTMATMUL_TRACE_SELF_TEST) and the native frames
  # (benchmarks/crash_report.c, preloaded; addr2line on the offsets needs a -g build).
  ulimit -a | grep -E "stack|virtual"
  gcc -shared -fPIC -O1 -o /tmp/crash_report.so benchmarks/crash_report.c &&
    QUANTMATMUL_TRACE_SELF_TEST=1 LD_PRELOAD=/tmp/crash_report.so "$PY" -X faulthandler -c "import quantmatmul" 2>&1 |
    tail -n 60
  exit 1
fi

if [ "${TESTS:-1}" != 0 ]; then
  SECONDS=0
  logs=$(mktemp -d)
  pids=()
  for f in ${TEST_FILES:-tests/test_*.py}; do
    QUANTMATMUL_NUM_THREADS=2 OMP_NUM_THREADS=1 timeout "${TEST_TIMEOUT:-200}" \
      "$PY" -m pytest -q -rfEs -p no:cacheprovider "$f" >"$logs/$(basename "$f" .py).log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"  # not a bare wait: that also waits for the tee above
  for f in "$logs"/*.log; do echo "== $f"; tail -n 40 "$f"; done >"$OUT/tests.log"
  echo "suite: ${SECONDS} s"
  for f in "$logs"/*.log; do echo "$(basename "$f"): $(tail -n 1 "$f")"; done
fi

if [ "${FUZZ_MINUTES:-0}" != 0 ]; then  # tests/fuzz.py on the native tables (AMX included), 16 threads among its counts
  "$PY" tests/fuzz.py --minutes "$FUZZ_MINUTES" --threads 2,7,16 | tail -n 40
fi

for s in $BENCHES; do
  SECONDS=0
  extra=()  # blocking.py's SETTINGS, where BLOCKINGS gives them (else its grid)
  [ "$s" = blocking ] && [ -n "${BLOCKINGS:-}" ] && extra=("$BLOCKINGS")
  timeout "${BENCH_TIMEOUT:-200}" "$PY" "benchmarks/$s.py" "$LEVELS" "$THREADS" "$REPEAT" "$OUT/$s.json" ${extra[@]+"${extra[@]}"}
  echo "$s: ${SECONDS} s"
done

for m in ${CNN:-}; do  # quantized CNNs against ORT (benchmarks/cnn.py: QDQ / QOperator, uint8 / int8)
  for t in ${THREADS//,/ }; do
    SECONDS=0
    timeout "${BENCH_TIMEOUT:-200}" "$PY" benchmarks/cnn.py "$t" "$REPEAT" 224 "$m"
    echo "cnn $m $t threads: ${SECONDS} s"
  done
done
