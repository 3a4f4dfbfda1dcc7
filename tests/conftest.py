"""Markers: `gpu` tests skip without a CUDA GPU, `tensorrt` tests skip without TensorRT; `slow` tests
take minutes each (scripts/gpu_run.sh runs them in a pytest run of their own)."""

from __future__ import annotations

import functools
import importlib.util
import os

import pytest


@functools.lru_cache(maxsize=None)
def cuda_gpu_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


@functools.lru_cache(maxsize=None)
def tensorrt_available() -> bool:
    try:
        import tensorrt  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "not usable here"
        return False
    return True


def pytest_configure(config):
    # Without a GPU, Triton (imported by the Triton reference and by torch._dynamo) runs in its
    # interpreter; set this before anything imports triton, whatever the test order.
    if not cuda_gpu_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="no CUDA GPU on this machine (torch.cuda.is_available() is False)")
    skip_trt = pytest.mark.skip(reason="TensorRT not installed (import tensorrt failed)")
    for item in items:
        # get_closest_marker, not item.keywords: keywords also hold folder names (tests/gpu/).
        if item.get_closest_marker("gpu") and not cuda_gpu_available():
            item.add_marker(skip_gpu)
        if item.get_closest_marker("tensorrt") and not tensorrt_available():
            item.add_marker(skip_trt)
