"""compute-sanitizer memcheck and racecheck over plugin/cuda/tools/attention_cuda_check, the
standalone driver that runs the launcher on a representative set of cases (every dtype, mask kind,
causal mode, key_lengths, softcap, GQA, odd sizes, split-KV) against a float64 host reference.
scripts/gpu_run.sh builds the driver and sets OPSFUSE_CUDA_CHECK_BIN."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

# Each runs the check driver over all its cases, or under a sanitizer: minutes apiece.
pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def _driver():
    path = os.environ.get("OPSFUSE_CUDA_CHECK_BIN", "")
    if not path or not os.path.isfile(path):
        pytest.skip("OPSFUSE_CUDA_CHECK_BIN is not set to a built attention_cuda_check (scripts/gpu_run.sh sets it)")
    return path


# The Hopper kernel writes Y through shared memory and TMA stores at D <= 128; its register stores
# (D = 256, and any layout the driver refuses as a TMA map) are checked on every case as well.
@pytest.mark.parametrize("env", [{}, {"OPSFUSE_CUDA_HOPPER_TMA_STORE": "0"}], ids=["default", "register_stores"])
def test_check_driver_passes(env):
    proc = subprocess.run([_driver()], capture_output=True, text=True, timeout=600, env={**os.environ, **env})
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_compute_sanitizer(tool):
    driver = _driver()
    sanitizer = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not os.path.isfile(sanitizer):
        pytest.skip("compute-sanitizer not found")
    args = [sanitizer, f"--tool={tool}", "--error-exitcode=9"]
    if tool == "memcheck":
        args.append("--leak-check=full")
    if tool == "racecheck":
        args += ["--racecheck-report=all"]
    proc = subprocess.run(args + [driver, "--quick"], capture_output=True, text=True, timeout=900)
    print(proc.stdout[-4000:])
    log_dir = os.environ.get("OPSFUSE_GPU_LOGS")
    if log_dir and os.path.isdir(log_dir):
        with open(os.path.join(log_dir, f"sanitizer_{tool}.log"), "w") as f:
            f.write(" ".join(args + [driver, "--quick"]) + "\n" + proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "ERROR SUMMARY: 0 errors" in proc.stdout or "RACECHECK SUMMARY: 0 hazards" in proc.stdout, proc.stdout[-3000:]
