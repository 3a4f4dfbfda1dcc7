#!/usr/bin/env bash
# Creates .venv (if missing) and installs opsfuse into it from this checkout, building the C++/CUDA
# parts (the ONNX Runtime headers are fetched on first build when none are installed).
#   scripts/install.sh            runtime only
#   scripts/install.sh test       with the test extras (torch 2.13.0 CPU, triton, polygraphy, transformers)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
extras="${1:-}"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
spec="."
[ -n "$extras" ] && spec=".[$extras]"
# Editable install: the package's Python files stay in the checkout, the built libraries go to
# the virtual environment; a rebuild is incremental (build/).
.venv/bin/python -m pip install --disable-pip-version-check -q -e "$spec"
.venv/bin/python -m opsfuse info
