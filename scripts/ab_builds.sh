#!/usr/bin/env bash
# Build-time A/B sweeps on a GPU machine (for knobs that are compile-time: a temporary `#ifndef NAME`
# default in a kernel header, as session 7 of docs/notes/cuda_kernel.md used). Run after
# `scripts/gpu_run.sh OUT --stages env,build` has installed opsfuse (the base build, tag "base").
# Each other variant is a CMake build of this checkout (Release, the GPU's own architecture) with its
# nvcc definitions in CMAKE_CUDA_FLAGS; its opsfuse._cuda module is swapped into the installed package
# for its sweep. Variants run in rounds (base A B ... base A B ...), each sweep its own process with
# its own cuDNN column, so that the machine's drift shows in the repeated columns.
#
# usage: scripts/ab_builds.sh GRID ROUNDS TAG=-DNAME=VALUE[,-DNAME2=VALUE2] ...
#   GRID    ab_sweep.py grids (d64, pshort, prefill, decode, ...), comma-separated; "bert" is
#           scripts/bert_attention_sweep.py (BERT's attention layer, BERT_LAYOUTS of its layouts),
#           "bertctx" scripts/bert_layer_in_context.py (that layer alone and between the model's
#           GEMMs, BERTCTX_CONTEXTS of its contexts, default alone,layer)
#   e.g.    scripts/ab_builds.sh d64,bert 2 four=-DOPSFUSE_MY_KNOB=4 eight=-DOPSFUSE_MY_KNOB=8
#   AB_CHECK=1  also builds each variant's check driver (plugin/cuda/tools) and runs it before the
#               sweeps; a variant that fails a case is reported and still swept
#   AB_VARIANTS more ab_sweep.py variants for every build's sweep, space-separated (e.g.
#               "OPSFUSE_CUDA_HOPPER_CHAIN=2": a run-time switch beside each build's default; with
#               AB_INTERLEAVED=1 they are timed side by side with cuDNN in each build's process)
#   AB_PARALLEL=1  builds the variants at the same time (each ninja on all cores: on a 16-core
#               machine two or three builds take about the time of one and a half)
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 GRID ROUNDS TAG=-DNAME=VALUE[,...] ..." >&2
  exit 2
fi
GRID=$1 ROUNDS=$2
shift 2
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
MOD=$(cd /tmp && $PY -c 'import opsfuse._cuda as m; print(m.__file__)')
WORK=${AB_BUILD_DIR:-/tmp/opsfuse-ab}
mkdir -p "$WORK"
cp "$MOD" "$WORK/base.so"
tags=(base)
build_one() {  # TAG DEFS
  "$REPO/scripts/build_variant.sh" "$WORK/build-$1" "$2" _cuda ${AB_CHECK:+attention_cuda_check}
}
if [ -n "${AB_PARALLEL:-}" ]; then
  pids=()
  for spec in "$@"; do
    build_one "${spec%%=*}" "${spec#*=}" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done  # set -e: a failed build stops the script here
fi
for spec in "$@"; do
  tag=${spec%%=*} defs=${spec#*=}
  dir="$WORK/build-$tag"
  [ -n "${AB_PARALLEL:-}" ] || build_one "$tag" "$defs"
  cp "$dir"/plugin/python/_cuda*.so "$WORK/$tag.so"
  tags+=("$tag")
  echo "built $tag ($defs)"
  if [ -n "${AB_CHECK:-}" ]; then
    timeout "${CHECK_TIMEOUT:-300}" "$dir/plugin/cuda/attention_cuda_check" > "$WORK/check-$tag.log" 2>&1 \
      && echo "check $tag: $(tail -n 1 "$WORK/check-$tag.log")" \
      || { echo "check $tag FAILED:"; grep -v " ok " "$WORK/check-$tag.log" | tail -n 20; }
  fi
done
for round in $(seq 1 "$ROUNDS"); do
  for tag in "${tags[@]}"; do
    cp "$WORK/$tag.so" "$MOD"
    for grid in ${GRID//,/ }; do
      echo "=== round $round: $tag ($grid)"
      if [ "$grid" = bert ]; then
        $PY "$REPO/scripts/bert_attention_sweep.py" D=1
      elif [ "$grid" = bertctx ]; then
        $PY "$REPO/scripts/bert_layer_in_context.py" 30 "${BERTCTX_CONTEXTS:-alone,layer}"
      else
        # shellcheck disable=SC2086 # AB_VARIANTS: one word per variant
        $PY "$REPO/scripts/ab_sweep.py" "$grid" D=1 ${AB_VARIANTS:-}
      fi
    done
  done
done
cp "$WORK/base.so" "$MOD"  # the installed package as it was
