#!/usr/bin/env bash
# Builds, tests and benchmarks opsfuse on a machine with an NVIDIA GPU, in one go:
#   1. environment report (GPU, driver, nvcc, python packages)
#   2. optional onnxruntime-gpu from an archive (ORT_GPU_ARCHIVE, or pieces in ORT_GPU_PIECES, which
#      scripts/ortgpu_pieces.sh prepares)
#   3. build + install the package (pip, no build isolation; falls back to plain CMake)
#   4. plugin/cuda/tools/attention_cuda_check, then `pytest -m gpu tests/` in two runs: the tests
#      marked slow (compute-sanitizer memcheck + racecheck over the check driver), then the rest
#   5. `python -m opsfuse bench --device cuda`, then the BERT-base end-to-end benchmark
#      (`python -m opsfuse.bench.bert`, stage `bert`: needs onnxruntime-gpu)
#   6. optional (stage `trace`): the Hopper kernel's own clocks per item phase, a -DOPSFUSE_HOPPER_TRACE
#      build swapped in for scripts/hopper_trace.py (TRACE_GRID, TRACE_VARIANTS), output in trace.log
# Everything lands in OUTDIR: summary.txt, logs.tar.gz (every log), and the benchmark's
# cuda_bench.{json,md,png}. Each stage's exit status is in summary.txt; the script goes on after a
# failed stage where the next one can still say something.
#
# usage: scripts/gpu_run.sh OUTDIR [--stages env,ort,build,test,bench,bert,trace] [--quick]
#   CUDA_ARCHS  CMAKE_CUDA_ARCHITECTURES for this build (default: the GPU's own, e.g. 90-real)
#   BUILD_DIR   build folder (default /tmp/opsfuse-gpu-build; reused when it exists)
#   PYTEST_ARGS extra pytest arguments, split at spaces (e.g. "-x --maxfail=3"); PYTEST_K a -k
#               expression, passed whole (e.g. "stream_k or persistent_orders"); PYTEST_WORKERS
#               xdist workers (8)
#   PYTEST_PATHS what pytest collects (default tests/)
#   PYTEST_GROUPS which pytest runs, in order (default slow,fast): slow is the tests marked slow
#               (compute-sanitizer, the check driver twice; ~350 s), fast the other gpu tests (~130 s)
#   BENCH_GRIDS a subset of seed,prefill,prefill16,decode,masked
#   CHECK_TIMEOUT seconds the check driver may run before it counts as hung (300)
#   SKIP_CHECK  1: no standalone check-driver run (pytest still runs it, see the test stage)
#   TRACE_GRID  hopper_trace.py's grid (d128, seed; default its five shapes); TRACE_VARIANTS its
#               variants, space-separated NAME=VALUE[,...] switch sets (a word without "=", e.g.
#               "default", is the default launch); TRACE_DEFS more nvcc definitions for that build
#               (comma-separated, e.g. -DOPSFUSE_HOPPER_EARLY_Q=0); TRACE_TIMEOUT seconds the traced
#               runs may take (240; a trace build's kernel that hangs must not take the whole call)
set -u -o pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 OUTDIR [--stages env,ort,build,test,bench,bert] [--quick]" >&2
  exit 2
fi
OUTDIR=$(mkdir -p "$1" && cd "$1" && pwd)
shift
STAGES="env,ort,build,test,bench,bert"
QUICK=""
while [ $# -gt 0 ]; do
  case "$1" in
    --stages) STAGES="$2"; shift 2 ;;
    --quick) QUICK="--quick"; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

REPO=$(cd "$(dirname "$0")/.." && pwd)
LOGS="$OUTDIR/logs"
mkdir -p "$LOGS"
PY=${PYTHON:-python3}
BUILD_DIR=${BUILD_DIR:-/tmp/opsfuse-gpu-build}
SUMMARY="$OUTDIR/summary.txt"
export PYTHONUNBUFFERED=1
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
cd "$REPO"

note() { echo "$*" | tee -a "$SUMMARY"; }
want() { case ",$STAGES," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
stage() {  # stage NAME CMD...: runs CMD with its output in logs/NAME.log, records status and time
  local name=$1; shift
  local t0=$(date +%s)
  echo "=== $name: $*" | tee -a "$LOGS/$name.log"
  "$@" >>"$LOGS/$name.log" 2>&1
  local rc=$?
  note "$(printf '%-10s rc=%-3s %5ss' "$name" "$rc" "$(( $(date +%s) - t0 ))")"
  tail -n 25 "$LOGS/$name.log"
  return $rc
}

note "opsfuse gpu_run $(date -u '+%Y-%m-%d %H:%M:%S UTC') stages=$STAGES $QUICK"
note "commit $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?') $(git -C "$REPO" status --porcelain 2>/dev/null | wc -l) changed files"

env_info() {
  nvidia-smi || true
  nvcc --version || true
  cmake --version | head -1
  $PY -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'
  $PY -m pip list 2>/dev/null | grep -iE "^(torch|triton|onnx|onnxruntime|numpy|pybind11|scikit-build-core|cupy|ml.dtypes|pytest|matplotlib) " || true
  which compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer || true
}

# onnxruntime-gpu: a .tar.xz of the unpacked wheel (ORT_GPU_ARCHIVE), or its pieces
# (ORT_GPU_PIECES: a folder of part-* files, joined in name order), unpacked to /tmp/ortgpu and
# put ahead of the image's CPU onnxruntime on PYTHONPATH. torch is imported first everywhere
# (onnxruntime-gpu loads the CUDA 13 libraries that torch's wheels bring).
ort_setup() {
  local archive=${ORT_GPU_ARCHIVE:-/tmp/ortgpu.tar.xz}
  if [ ! -f /tmp/ortgpu/onnxruntime/__init__.py ]; then
    if [ -n "${ORT_GPU_PIECES:-}" ] && ls "$ORT_GPU_PIECES"/part-* >/dev/null 2>&1; then
      cat "$ORT_GPU_PIECES"/part-* > "$archive"
      [ -f "$ORT_GPU_PIECES/SHA256" ] && (cd "$(dirname "$archive")" && sed "s#  .*#  $archive#" "$ORT_GPU_PIECES/SHA256" | sha256sum -c -)
    fi
    [ -f "$archive" ] || { echo "no onnxruntime-gpu archive ($archive): ORT CUDA EP tests will skip"; return 3; }
    mkdir -p /tmp/ortgpu
    $PY -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$archive" /tmp/ortgpu || return 1
  fi
  PYTHONPATH=/tmp/ortgpu${PYTHONPATH:+:$PYTHONPATH} $PY -c \
    'import torch, onnxruntime as o; print(o.__version__, o.__file__, o.get_available_providers())'
}

build() {
  local archs=${CUDA_ARCHS:-$($PY -c 'import torch; m,n=torch.cuda.get_device_capability(0); print(f"{m}{n}-real")')}
  echo "CMAKE_CUDA_ARCHITECTURES=$archs"
  export ONNXRUNTIME_ROOT=${ONNXRUNTIME_ROOT:-$REPO/.ortinc}
  [ -d "$ONNXRUNTIME_ROOT" ] || unset ONNXRUNTIME_ROOT
  # TensorRT's public headers (no TensorRT runtime exists there): the plugin and its IPluginV3
  # driver test build against them when a copy is carried in .trtinc.
  export TENSORRT_ROOT=${TENSORRT_ROOT:-$REPO/.trtinc}
  [ -d "$TENSORRT_ROOT/include" ] || unset TENSORRT_ROOT
  local t0=$(date +%s)
  if $PY -m pip install --no-build-isolation --no-deps -v . \
      -C build-dir="$BUILD_DIR" \
      -C cmake.define.CMAKE_CUDA_ARCHITECTURES="$archs" \
      -C cmake.define.OPSFUSE_CUDA=ON; then
    echo "pip install: ok in $(( $(date +%s) - t0 ))s"
  else
    echo "pip install failed; falling back to CMake + a package folder on PYTHONPATH"
    cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_CUDA_ARCHITECTURES="$archs" -DOPSFUSE_CUDA=ON \
      -DPython_EXECUTABLE="$(command -v $PY)" || return 1
    cmake --build "$BUILD_DIR" || return 1
    rm -rf /tmp/opsfuse-pkg && mkdir -p /tmp/opsfuse-pkg
    cp -r python/opsfuse /tmp/opsfuse-pkg/ && cp -r graph_passes /tmp/opsfuse-pkg/opsfuse/graph_passes 2>/dev/null
    cmake --install "$BUILD_DIR" --component python --prefix /tmp/opsfuse-pkg || return 1
    echo "/tmp/opsfuse-pkg" > /tmp/opsfuse-pkg.path
  fi
  echo "build seconds: $(( $(date +%s) - t0 ))"
  (cd /tmp && $PY -c 'import opsfuse, opsfuse.cuda; print(opsfuse.__file__, opsfuse.build_info()); assert opsfuse.cuda.available()')
}

[ -f /tmp/opsfuse-pkg.path ] && export PYTHONPATH=$(cat /tmp/opsfuse-pkg.path)${PYTHONPATH:+:$PYTHONPATH}
want env && stage env env_info
if want ort; then
  stage ort ort_setup
fi
[ -f /tmp/ortgpu/onnxruntime/__init__.py ] && export PYTHONPATH=/tmp/ortgpu${PYTHONPATH:+:$PYTHONPATH}
if want build; then
  stage build build
  [ -f /tmp/opsfuse-pkg.path ] && export PYTHONPATH=$(cat /tmp/opsfuse-pkg.path)${PYTHONPATH:+:$PYTHONPATH}
fi
export OPSFUSE_CUDA_CHECK_BIN="$BUILD_DIR/plugin/cuda/attention_cuda_check"
# The TensorRT plugin's driver test finds the driver built beside the library here.
export OPSFUSE_BUILD_DIR="$BUILD_DIR"
if want test; then
  # A kernel that deadlocks must cost minutes, not the whole device call. SKIP_CHECK=1 leaves this
  # standalone run out where one call must also hold pytest, whose test_check_driver_passes runs the
  # same driver twice (default, and register stores).
  [ "${SKIP_CHECK:-0}" = 1 ] || stage check timeout "${CHECK_TIMEOUT:-300}" "$OPSFUSE_CUDA_CHECK_BIN"
  local_workers=""
  $PY -c 'import xdist' 2>/dev/null && local_workers="-n ${PYTEST_WORKERS:-8}"
  export OPSFUSE_GPU_LOGS="$LOGS"
  # Two runs, one after the other: the minutes-long sanitizer and check-driver tests, then the rest.
  # Mixed in one run on 8 workers they took past 580 s (sessions 52 and 53, both cut); apart, 351 s
  # and 127 s (session 53, H100).
  for group in $(echo "${PYTEST_GROUPS:-slow,fast}" | tr , ' '); do
    case "$group" in
      slow) marks="gpu and slow" ;;
      fast) marks="gpu and not slow" ;;
      *) note "pytest_$group: not run, PYTEST_GROUPS takes slow and fast"; continue ;;
    esac
    stage "pytest_$group" $PY -m pytest -m "$marks" ${PYTEST_PATHS:-tests/} -p no:cacheprovider -rfEs \
      --durations=15 $local_workers --junitxml="$LOGS/pytest_$group.xml" ${PYTEST_K:+-k "$PYTEST_K"} \
      ${PYTEST_ARGS:-}
    grep -E "passed|failed|error|no tests ran" "$LOGS/pytest_$group.log" | tail -1 | tee -a "$SUMMARY"
  done
fi
if want bench; then
  if [ -n "${BENCH_GRIDS:-}" ]; then  # a subset of the grids: through the module's own entry point
    stage bench $PY -m opsfuse.bench.cuda --out "$OUTDIR/bench" --grids "$BENCH_GRIDS" $QUICK ${BENCH_REPEAT:+--repeat $BENCH_REPEAT}
  else
    stage bench $PY -m opsfuse bench --device cuda --out "$OUTDIR/bench" $QUICK ${BENCH_REPEAT:+--repeat $BENCH_REPEAT}
  fi
  for f in cuda_bench.json cuda_bench.md cuda_bench.png; do
    [ -f "$OUTDIR/bench/$f" ] && cp "$OUTDIR/bench/$f" "$OUTDIR/$f"
  done
  rm -rf "$OUTDIR/bench"
fi
if want bert; then
  stage bert $PY -m opsfuse.bench.bert --out "$OUTDIR/bert" --device cuda --trace $QUICK
  for f in bert_e2e.json bert_e2e.md; do
    [ -f "$OUTDIR/bert/$f" ] && cp "$OUTDIR/bert/$f" "$OUTDIR/$f"
  done
  rm -rf "$OUTDIR/bert"
fi
if want trace; then
  [ -d "$REPO/.ortinc" ] && export ONNXRUNTIME_ROOT=${ONNXRUNTIME_ROOT:-$REPO/.ortinc}
  # shellcheck disable=SC2086  # TRACE_VARIANTS: one argument per variant
  stage trace env TRACE_GRID="${TRACE_GRID:-}" VARIANT_BUILD_DIR=/tmp/opsfuse-trace \
    scripts/with_variant.sh "-DOPSFUSE_HOPPER_TRACE${TRACE_DEFS:+,$TRACE_DEFS}" \
    timeout "${TRACE_TIMEOUT:-240}" $PY scripts/hopper_trace.py "$OUTDIR/trace.npz" \
    ${TRACE_VARIANTS:-""}
  grep -E "^B=|^   " "$LOGS/trace.log" > "$OUTDIR/trace.log"
fi
tar -czf "$OUTDIR/logs.tar.gz" -C "$OUTDIR" logs && rm -rf "$LOGS"
note "done $(date -u '+%H:%M:%S UTC')"
cat "$SUMMARY"
