#!/usr/bin/env bash
# Builds a compile-time variant of opsfuse (Release, the GPU's own architecture, or CUDA_ARCH) in
# DIR with nvcc definitions DEFS in CMAKE_CUDA_FLAGS: the one build that scripts/ab_builds.sh (timed
# sweeps) and scripts/with_variant.sh (one command) swap into the installed package. Logs go to
# DIR.cmake.log and DIR.build.log.
#
# usage: scripts/build_variant.sh DIR -DNAME=VALUE[,-DNAME2=VALUE2] [TARGET ...]   (default target _cuda)
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 DIR -DNAME=VALUE[,...] [TARGET ...]" >&2
  exit 2
fi
dir=$1 defs=$2
shift 2
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
ARCH=${CUDA_ARCH:-$($PY -c 'import torch; m, n = torch.cuda.get_device_capability(0); print(f"{m}{n}-real")')}
mkdir -p "$(dirname "$dir")"  # the logs sit beside DIR (session 24: a fresh /tmp/ab failed here)
cmake -S "$REPO" -B "$dir" -G Ninja -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DOPSFUSE_CUDA=ON \
  ${ONNXRUNTIME_ROOT:+-DONNXRUNTIME_ROOT="$ONNXRUNTIME_ROOT"} -DPython_EXECUTABLE="$(command -v $PY)" \
  "-DCMAKE_CUDA_FLAGS=${defs//,/ }" > "$dir.cmake.log"
ninja -C "$dir" "${@:-_cuda}" > "$dir.build.log"
