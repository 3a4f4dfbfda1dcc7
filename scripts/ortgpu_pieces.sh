#!/usr/bin/env bash
# Prepares onnxruntime-gpu for a GPU machine that cannot download it and takes at most ~64 MB per
# call: downloads the Python 3.12 wheel here, unpacks it, packs it as one .tar.xz (the unpacked
# package, ~205 MB for 1.31.1) and splits that into pieces of 55 MB, one folder per piece
# (OUTDIR/p1/part-0, OUTDIR/p2/part-1, ...; the last folder also holds SHA256 of the whole archive).
#
# usage: scripts/ortgpu_pieces.sh OUTDIR [VERSION]      (default VERSION 1.31.1; OUTDIR ignored by git,
#                                                        e.g. .whl)
# Then, while the GPU machine stays held (back-to-back calls), carry one folder per call and copy
# its piece into the machine's temp folder, which outlives the call:
#     call k:  mkdir -p /tmp/ortp && cp OUTDIR/pk/* /tmp/ortp/      (carry: OUTDIR/pk)
#     last:    ORT_GPU_PIECES=/tmp/ortp scripts/gpu_run.sh OUT --stages ort,...
# gpu_run.sh's ort stage joins the pieces in name order, checks SHA256 and unpacks them onto
# PYTHONPATH (torch is imported before onnxruntime: the wheel links the CUDA 13 libraries torch brings).
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 OUTDIR [VERSION]" >&2
  exit 2
fi
out=$1 version=${2:-1.31.1}
py=${PYTHON:-python3}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 "onnxruntime-gpu==$version" -d "$work"
wheel=$(ls "$work"/onnxruntime_gpu-*.whl)
mkdir -p "$work/unpacked"
"$py" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$wheel" "$work/unpacked"
tar -C "$work/unpacked" -cf - . | xz -T0 -6 > "$work/ortgpu.tar.xz"
rm -rf "$out"/p[0-9]*
(cd "$work" && split -b 55M -d -a 1 ortgpu.tar.xz part-)
i=1
for piece in $(ls "$work"/part-* | sort); do
  mkdir -p "$out/p$i"
  mv "$piece" "$out/p$i/"
  last="$out/p$i"
  i=$((i + 1))
done
(cd "$work" && sha256sum ortgpu.tar.xz) > "$last/SHA256"
echo "onnxruntime-gpu $version: $((i - 1)) pieces in $out/p1 .. $last"
du -sh "$out"/p[0-9]*
