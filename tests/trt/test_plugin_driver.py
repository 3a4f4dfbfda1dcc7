"""The TensorRT plugin driven through its IPluginV3 interfaces on the GPU by opsfuse_trt_driver
(plugin/trt/test/drive_plugin.cpp): create from fields, output types and shape expressions, format
negotiation, clone, serialize and re-create, configure, enqueue on a stream, compared with the
float64 reference. THIS IS NOT A TENSORRT ENGINE RUN: TensorRT cannot be installed where opsfuse is
tested, so the driver plays TensorRT's part with fakes (see plugin/trt/README.md);
tests/trt/test_trt_engine.py is the engine test where TensorRT exists."""

from __future__ import annotations

import subprocess

import pytest

from trt_artifacts import build_driver, find_driver, not_built_reason

pytestmark = pytest.mark.gpu


def test_plugin_driver_on_gpu():
    driver = find_driver()
    if driver is None:
        driver, log = build_driver(gpu_arch="native")
        if driver is None:
            pytest.skip(f"opsfuse_trt_driver not built ({not_built_reason()}); building it here failed: "
                        f"{log.strip().splitlines()[-1] if log.strip() else 'no log'}")
    library = driver.parent / "libopsfuse_trt.so"
    cmd = [str(driver)] + (["--library", str(library)] if library.is_file() else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    print(proc.stdout)
    assert "NOT a TensorRT engine run" in proc.stdout
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "ALL PASSED" in proc.stdout
