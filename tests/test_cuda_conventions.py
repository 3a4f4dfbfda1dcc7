"""The CUDA library's conventions, read from its sources (no GPU, no build): every kernel launch
names the stream the runtime gave and is checked, and the library calls no CUDA runtime function
that allocates or synchronizes. A new runtime call must be added to ALLOWED here on purpose, with
the reason it neither allocates nor waits. The check driver and micro-benchmarks (plugin/cuda/tools)
are programs of their own and are not scanned."""

from __future__ import annotations

import re
from pathlib import Path

PLUGIN = Path(__file__).resolve().parents[1] / "plugin"
SOURCES = sorted(p for p in PLUGIN.rglob("*") if p.suffix in {".cu", ".cuh", ".cc", ".h", ".inc"}
                 and "tools" not in p.relative_to(PLUGIN).parts and "test" not in p.relative_to(PLUGIN).parts)

# Runtime calls the library makes; none of them allocates device memory or waits for the device.
ALLOWED = {
    "cudaGetLastError", "cudaGetErrorString", "cudaGetErrorName",  # error reporting
    "cudaGetDevice", "cudaSetDevice", "cudaStreamGetDevice",  # the stream's device, host-side state only
    "cudaDeviceGetAttribute", "cudaFuncGetAttributes", "cudaFuncSetAttribute",
    "cudaOccupancyMaxActiveClusters",  # launch configuration queries
    "cudaStreamIsCapturing",  # decides graph-safe paths; does not synchronize
    "cudaGetDriverEntryPointByVersion",  # cuTensorMapEncodeTiled without linking libcuda
    "cudaLaunchKernelEx", "cudaMemsetAsync",  # stream-ordered
}


def _code(path: Path) -> str:
    """The file without comments, so that prose naming a call does not count."""
    text = re.sub(r"/\*.*?\*/", "", path.read_text(), flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def test_sources_found():
    names = {p.name for p in SOURCES}
    assert {"attention_cuda.cu", "hopper_launch.cuh", "flash_tc.cuh"} <= names


def test_runtime_calls_are_the_allowed_ones():
    used = {}
    for path in SOURCES:
        for name in re.findall(r"\b(cuda[A-Z][A-Za-z0-9]*)\s*\(", _code(path)):
            used.setdefault(name, set()).add(str(path.relative_to(PLUGIN)))
    unexpected = {name: sorted(files) for name, files in used.items() if name not in ALLOWED}
    assert not unexpected, f"CUDA runtime calls outside the allowed set (allocating or synchronizing?): {unexpected}"
    assert {"cudaGetLastError", "cudaLaunchKernelEx"} <= set(used)


def test_every_launch_names_a_stream_and_is_checked():
    launches = 0
    for path in SOURCES:
        code = _code(path)
        for m in re.finditer(r"<<<(.*?)>>>\s*\([^;]*\);", code, flags=re.S):
            launches += 1
            where = f"{path.relative_to(PLUGIN)}:{code.count(chr(10), 0, m.start()) + 1}"
            config = [c.strip() for c in re.split(r",(?![^(]*\))", m.group(1))]
            assert len(config) == 4 and config[3] == "stream", (
                f"{where}: launch without the runtime's stream: <<<{m.group(1)}>>>")
            after = code[m.end():m.end() + 400]
            assert "cudaGetLastError()" in after, f"{where}: launch not followed by cudaGetLastError()"
        for m in re.finditer(r"cudaLaunchKernelEx\s*\(", code):
            launches += 1
            line = code[code.rfind("\n", 0, m.start()) + 1:code.find("\n", m.end())]
            assert re.search(r"(=|return)\s*cudaLaunchKernelEx", line), (
                f"{path.relative_to(PLUGIN)}: cudaLaunchKernelEx's result is dropped: {line.strip()}")
    assert launches >= 8
