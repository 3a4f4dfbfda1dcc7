"""libopsfuse_trt.so where TensorRT is absent (CPU only): it exports only the two entry points, has
no undefined TensorRT symbols (so it loads anywhere), loads and reports why it cannot register,
and the driver program runs every plugin interface except the enqueue numerics (--no-gpu).
Also compiles the plugin sources against each TensorRT header version given in
OPSFUSE_TRT_HEADER_DIRS (os.pathsep-separated prefixes holding include/NvInferRuntime.h)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trt_artifacts import REPO, find_driver, find_library, headers_root, not_built_reason

ENTRY_POINTS = {"getCreators", "setLoggerFinder"}
PLUGIN_SOURCES = ["fused_attention_plugin.cc", "fused_attention_creator.cc", "trt_runtime.cc", "plugin_library.cc"]


@pytest.fixture(scope="module")
def library() -> Path:
    path = find_library()
    if path is None:
        pytest.skip(not_built_reason())
    return path


def _nm(library: Path, *flags: str) -> list[str]:
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) not installed")
    out = subprocess.run(["nm", "-D", *flags, str(library)], check=True, capture_output=True, text=True).stdout
    return [line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()]


def test_exports_only_the_entry_points(library):
    defined = set(_nm(library, "--defined-only"))
    assert defined == ENTRY_POINTS, f"{library} exports {sorted(defined - ENTRY_POINTS)} beyond {sorted(ENTRY_POINTS)}"


def test_no_tensorrt_link_dependency(library):
    undefined = _nm(library, "--undefined-only")
    tensorrt = [s for s in undefined if "nvinfer1" in s or s in {"getPluginRegistry", "getLogger"}
                or s.startswith(("createInfer", "getInferLib"))]
    assert not tensorrt, f"undefined TensorRT symbols would make loading fail without TensorRT: {tensorrt}"
    if shutil.which("readelf"):
        dyn = subprocess.run(["readelf", "-d", str(library)], check=True, capture_output=True, text=True).stdout
        needed = [line for line in dyn.splitlines() if "(NEEDED)" in line]
        assert not [n for n in needed if "libnvinfer" in n], needed


def _libnvinfer_loadable() -> bool:
    try:
        import tensorrt  # noqa: F401
    except Exception:  # noqa: BLE001
        pass
    else:
        return True
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout
    except OSError:
        return False
    return "libnvinfer.so" in out


LOAD_SCRIPT = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_LOCAL)
get_creators = lib.getCreators
get_creators.restype = ctypes.c_void_p
get_creators.argtypes = [ctypes.POINTER(ctypes.c_int32)]
n = ctypes.c_int32(-1)
creators = get_creators(ctypes.byref(n))
lib.setLoggerFinder.argtypes = [ctypes.c_void_p]
lib.setLoggerFinder(None)
print("creators", n.value, bool(creators))
"""


def test_loads_without_tensorrt_and_says_why_it_cannot_register(library):
    if _libnvinfer_loadable():
        pytest.skip("TensorRT's libnvinfer is installed here: registration at load would succeed")
    proc = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, str(library)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "creators 1 True" in proc.stdout
    assert "FusedAttention creator not registered at load" in proc.stderr
    assert "libnvinfer" in proc.stderr


def test_driver_without_gpu(library):
    driver = find_driver()
    if driver is None:
        pytest.skip(f"opsfuse_trt_driver not found in OPSFUSE_BUILD_DIR or {REPO / 'build'}; {not_built_reason()}")
    proc = subprocess.run([str(driver), "--no-gpu", "--library", str(library)], capture_output=True, text=True,
                          timeout=300)
    print(proc.stdout[-6000:])
    assert "NOT a TensorRT engine run" in proc.stdout
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "ALL PASSED" in proc.stdout


def _header_dirs() -> list[Path]:
    dirs = [Path(p) for p in os.environ.get("OPSFUSE_TRT_HEADER_DIRS", "").split(os.pathsep) if p]
    root = headers_root()
    if root is not None and root not in dirs:
        dirs.append(root)
    return [d for d in dirs if (d / "include" / "NvInferRuntime.h").is_file()]


def _cuda_include() -> Path | None:
    candidates = [Path(p) / "include" for p in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")) if p]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(Path(nvcc).resolve().parent.parent / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    return next((c for c in candidates if (c / "cuda_runtime_api.h").is_file()), None)


@pytest.mark.parametrize("source", PLUGIN_SOURCES)
def test_sources_compile_against_each_header_version(source):
    dirs = _header_dirs()
    if not dirs:
        pytest.skip("no TensorRT headers: set TENSORRT_ROOT or OPSFUSE_TRT_HEADER_DIRS, or run "
                    "plugin/trt/fetch_trt_headers.sh")
    cuda = _cuda_include()
    cxx = shutil.which("c++") or shutil.which("g++")
    if cuda is None or cxx is None:
        pytest.skip("no C++ compiler or CUDA headers (cuda_runtime_api.h)")
    for d in dirs:
        cmd = [cxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-isystem", str(d / "include"),
               "-isystem", str(cuda), "-I", str(REPO / "plugin"), str(REPO / "plugin" / "trt" / source)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{source} against {d}:\n{proc.stderr[-4000:]}"
