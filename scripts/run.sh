#!/usr/bin/env bash
# The README's main command: installs opsfuse into .venv if needed, then rewrites the bundled
# default model, verifies it and prints the report, latency before/after and the output difference.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if ! .venv/bin/python -c "import opsfuse, opsfuse._build_config" 2>/dev/null; then
  bash scripts/install.sh
fi
.venv/bin/python -m opsfuse demo "$@"
