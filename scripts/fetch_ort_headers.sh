#!/usr/bin/env bash
# Downloads Debian 13's libonnxruntime-dev (ONNX Runtime 1.21 C/C++ headers) and unpacks it into
# DEST (default: <repo>/.deps/onnxruntime) with dpkg -x. Installs nothing system-wide: apt uses a
# private sources list, state and cache under DEST. The custom-op ABI is forward compatible, so a
# library built against these headers loads in onnxruntime 1.21 and newer.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dest="${1:-$here/../.deps/onnxruntime}"
suite="${OPSFUSE_ORT_DEBIAN_SUITE:-trixie}"
work="$dest/.apt"
mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
cat > "$work/sources.list" <<SOURCES
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main
SOURCES
apt_opts=(
  -o Dir::Etc::SourceList="$work/sources.list"
  -o Dir::Etc::SourceParts=/dev/null
  -o Dir::State::Lists="$work/lists"
  -o Dir::Cache="$work/cache"
  -o Debug::NoLocking=1
  -o APT::Sandbox::User=root
)
echo "fetch_ort_headers: apt-get update ($suite, private lists under $work)" >&2
apt-get "${apt_opts[@]}" update -qq >&2
(cd "$work" && apt-get "${apt_opts[@]}" download libonnxruntime-dev >&2)
deb="$(ls "$work"/libonnxruntime-dev_*.deb | head -n 1)"
dpkg -x "$deb" "$dest"
test -f "$dest/usr/include/onnxruntime/onnxruntime_cxx_api.h"
echo "fetch_ort_headers: unpacked $(basename "$deb") into $dest" >&2
