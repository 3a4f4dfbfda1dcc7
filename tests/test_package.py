"""The public API and CLI: library paths, build info, `info` and `--help`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import opsfuse
from opsfuse.cli import COMMANDS


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "opsfuse", *args], capture_output=True, text=True, timeout=300)


def test_library_path_registers_in_onnxruntime():
    import onnxruntime as ort

    path = opsfuse.get_library_path()
    assert os.path.isfile(path) and path.endswith(".so")
    so = ort.SessionOptions()
    so.register_custom_ops_library(path)


def test_trt_plugin_path_or_reason():
    info = opsfuse.build_info()
    if info["tensorrt"]:
        assert os.path.isfile(opsfuse.get_trt_plugin_path())
    else:
        with pytest.raises(opsfuse.LibraryNotBuiltError, match="not built"):
            opsfuse.get_trt_plugin_path()


def test_info_reports_versions_paths_and_parts():
    proc = _cli("info", "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    import onnx
    import onnxruntime

    assert info["opsfuse"] == opsfuse.__version__
    assert info["onnx"] == onnx.__version__ and info["onnxruntime"] == onnxruntime.__version__
    assert info["ort_library"] == opsfuse.get_library_path()
    assert info["cpu"] is True
    assert isinstance(info["cuda"], bool) and isinstance(info["tensorrt"], bool)
    text = _cli("info")
    assert text.returncode == 0 and "CUDA kernel" in text.stdout and "TensorRT" in text.stdout


def test_help_lists_every_subcommand():
    proc = _cli("--help")
    assert proc.returncode == 0
    for name in COMMANDS:
        assert name in proc.stdout, f"{name} missing from --help"
