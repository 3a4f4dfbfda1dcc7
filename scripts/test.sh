#!/usr/bin/env bash
# The README's test command: installs opsfuse with its test extras into .venv, then runs the tests.
# GPU tests skip without a CUDA GPU, TensorRT tests without TensorRT (each with its reason).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
start=$(date +%s)
bash scripts/install.sh test
echo "install took $(( $(date +%s) - start )) s"
.venv/bin/python -m pytest -n "${OPSFUSE_TEST_WORKERS:-2}" --durations=15 "$@" tests
