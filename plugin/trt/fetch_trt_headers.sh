#!/usr/bin/env bash
# Fetches the public C++ headers (include/ only) of the open-source NVIDIA/TensorRT repository
# into DEST (default: <repo>/.deps/tensorrt, ignored by git), where plugin/trt/CMakeLists.txt
# looks for them when TENSORRT_ROOT is not set. Enough to compile libopsfuse_trt.so; TensorRT's
# libraries are not needed to build (the plugin finds libnvinfer in the process when loaded).
#   plugin/trt/fetch_trt_headers.sh [REF [DEST]]
#     REF   a branch or tag of NVIDIA/TensorRT: release/10.13 (default), release/11.1, main, ...
#   OPSFUSE_TRT_HEADERS_REPO  another clone URL or a local git directory (default: GitHub)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ref="${1:-release/10.13}"
dest="${2:-$here/../../.deps/tensorrt}"
repo="${OPSFUSE_TRT_HEADERS_REPO:-https://github.com/NVIDIA/TensorRT.git}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "fetch_trt_headers: $repo@$ref include/ -> $dest" >&2
if [ -d "$repo" ] && git --git-dir="$repo" rev-parse --git-dir >/dev/null 2>&1; then
  git --git-dir="$repo" archive "$ref" include | tar -x -C "$tmp"
elif [ -d "$repo/.git" ]; then
  git -C "$repo" archive "$ref" include | tar -x -C "$tmp"
else
  git clone -q --depth 1 --branch "$ref" --filter=blob:none --sparse "$repo" "$tmp/src"
  git -C "$tmp/src" sparse-checkout set include
  mv "$tmp/src/include" "$tmp/include"
fi
test -f "$tmp/include/NvInferRuntime.h"
mkdir -p "$dest"
rm -rf "$dest/include"
mv "$tmp/include" "$dest/include"
grep -hE '^#define (NV_TENSORRT|TRT)_(MAJOR|MINOR|PATCH)' "$dest/include/NvInferVersion.h" | head -3 >&2
