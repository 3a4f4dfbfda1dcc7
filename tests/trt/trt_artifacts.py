"""Where the tests find the TensorRT plugin's build outputs: ``libopsfuse_trt.so`` and the driver
test program ``opsfuse_trt_driver`` (built by CMake beside the library, never installed).

Search order: ``OPSFUSE_BUILD_DIR`` (a CMake build directory), the editable install's build
directories (``<repo>/build/*``), ``<repo>/build``; for the library also the installed package
(``opsfuse.get_trt_plugin_path()``). When nothing is built but TensorRT headers are at hand
(``TENSORRT_ROOT`` or ``<repo>/.deps/tensorrt``) and nvcc exists, :func:`build_driver` configures
and builds the two targets in a private directory.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIBRARY = "libopsfuse_trt.so"
DRIVER = "opsfuse_trt_driver"


def build_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("OPSFUSE_BUILD_DIR"):
        dirs.append(Path(os.environ["OPSFUSE_BUILD_DIR"]))
    build = REPO / "build"
    if build.is_dir():
        dirs.extend(sorted(p for p in build.iterdir() if p.is_dir()))
        dirs.append(build)
    return dirs


def _in_build(name: str) -> Path | None:
    for d in build_dirs():
        for candidate in (d / "plugin" / "trt" / name, d / "trt" / name, d / name):
            if candidate.is_file():
                return candidate
    return None


def not_built_reason() -> str:
    """Why this build has no TensorRT plugin, from the generated build config when there is one."""
    try:
        from opsfuse import _build_config as cfg  # type: ignore[attr-defined]
    except ImportError:
        return "opsfuse's C++ part is not built here (no opsfuse._build_config, no OPSFUSE_BUILD_DIR)"
    if not cfg.TRT_BUILT:
        return f"the TensorRT plugin was not built: {cfg.TRT_REASON}"
    return "the TensorRT plugin was built but its files were not found"


def find_library() -> Path | None:
    found = _in_build(LIBRARY)
    if found is not None:
        return found
    try:
        import opsfuse

        return Path(opsfuse.get_trt_plugin_path())
    except Exception:  # noqa: BLE001 - not built / not installed: the caller skips with the reason
        return None


def find_driver() -> Path | None:
    return _in_build(DRIVER)


def headers_root() -> Path | None:
    """A prefix holding include/NvInferRuntime.h, as CMake would find it, or None."""
    for root in (os.environ.get("TENSORRT_ROOT"), str(REPO / ".deps" / "tensorrt")):
        if root and (Path(root) / "include" / "NvInferRuntime.h").is_file():
            return Path(root)
    return None


def build_driver(gpu_arch: str | None = None) -> tuple[Path | None, str]:
    """Configures and builds opsfuse_trt + opsfuse_trt_driver in a private directory keyed by the
    checkout and headers (reused across runs, locked against parallel workers). Returns
    (driver path or None, log or reason)."""
    root = headers_root()
    if root is None:
        return None, "no TensorRT headers (set TENSORRT_ROOT, or run plugin/trt/fetch_trt_headers.sh)"
    if shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").is_file():
        return None, "no CUDA compiler (nvcc) to build the plugin's CUDA launcher"
    if shutil.which("cmake") is None:
        return None, "cmake not found"
    key = hashlib.sha1(f"{REPO}|{root}|{gpu_arch}".encode()).hexdigest()[:12]
    build = Path(tempfile.gettempdir()) / f"opsfuse-trt-test-build-{key}"
    build.mkdir(parents=True, exist_ok=True)
    with open(build / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        configure = [
            "cmake", "-S", str(REPO), "-B", str(build), f"-DTENSORRT_ROOT={root}", "-DOPSFUSE_CUDA=ON",
            "-DCMAKE_BUILD_TYPE=Release", f"-DPython_EXECUTABLE={sys.executable}",
        ]
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"] if not (build / "CMakeCache.txt").exists() else []
        if gpu_arch:
            configure.append(f"-DCMAKE_CUDA_ARCHITECTURES={gpu_arch}")
        log = []
        for cmd in (configure, ["cmake", "--build", str(build), "--target", DRIVER, "-j", str(os.cpu_count() or 2)]):
            proc = subprocess.run(cmd, capture_output=True, text=True)
            log.append(f"$ {' '.join(cmd)}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
            if proc.returncode != 0:
                return None, "\n".join(log)
    driver = build / "plugin" / "trt" / DRIVER
    return (driver if driver.is_file() else None), "\n".join(log)
