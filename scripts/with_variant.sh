#!/usr/bin/env bash
# Runs one command with a compile-time variant of opsfuse._cuda swapped into the installed package
# (after `scripts/gpu_run.sh OUT --stages build`), then puts the installed module back: for
# diagnostic builds such as -DOPSFUSE_HOPPER_TRACE (scripts/hopper_trace.py,
# scripts/bert_layer_trace.py). scripts/ab_builds.sh does the same for timed sweeps.
#
# usage: scripts/with_variant.sh -DNAME=VALUE[,-DNAME2=VALUE2] CMD [ARGS...]
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 -DNAME=VALUE[,...] CMD [ARGS...]" >&2
  exit 2
fi
defs=$1
shift
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
MOD=$(cd /tmp && $PY -c 'import opsfuse._cuda as m; print(m.__file__)')
dir=${VARIANT_BUILD_DIR:-/tmp/opsfuse-variant}
"$REPO/scripts/build_variant.sh" "$dir" "$defs"
cp "$MOD" "$dir.installed.so"
trap 'cp "$dir.installed.so" "$MOD"' EXIT
cp "$dir"/plugin/python/_cuda*.so "$MOD"
echo "with_variant: $defs" >&2
"$@"
