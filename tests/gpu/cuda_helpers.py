"""Shared pieces of the GPU tests: fresh random inputs on the device, NaN-poisoned outputs, and the
2x rule (tests/accuracy.py) applied to results computed on the GPU."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

BF16 = np.dtype(ml_dtypes.bfloat16)


class FakeTensor:
    """A stand-in that exposes only __cuda_array_interface__ (contiguous, 16-byte aligned address),
    for the module's paths that never touch memory: validation and planning, testable without a GPU."""

    def __init__(self, shape, typestr="<f2"):
        self.shape = shape
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (4096, False),
                                         "strides": None, "version": 3}


def fresh_rng():
    """A generator seeded from the OS: every run draws new data; the seed is in failure messages."""
    seed = int.from_bytes(os.urandom(4), "little")
    return np.random.default_rng(seed), seed


def torch_dtype(np_dtype):
    import torch

    return {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16, BF16: torch.bfloat16}[
        np.dtype(np_dtype)
    ]


def to_device(a):
    """numpy (bfloat16 via ml_dtypes) -> torch CUDA tensor of the same dtype."""
    import torch

    a = np.ascontiguousarray(a)
    if a.dtype == BF16:
        return torch.from_numpy(a.astype(np.float32)).to("cuda").to(torch.bfloat16)
    return torch.from_numpy(a).to("cuda")


def to_numpy(t, np_dtype):
    import torch

    if t.dtype == torch.bfloat16:
        return t.float().cpu().numpy().astype(BF16)
    return t.cpu().numpy().astype(np_dtype)


def poisoned(shape, np_dtype):
    import torch

    return torch.full(shape, float("nan"), dtype=torch_dtype(np_dtype), device="cuda")


def require_cuda_module():
    import opsfuse.cuda

    if not opsfuse.cuda.available():
        pytest.fail("opsfuse._cuda is not importable on a GPU machine: build the package with nvcc present")
    return opsfuse.cuda


def hopper_kernel_runs():
    """Whether launches here can take the sm_90a kernel: an H100 / H200 and a build that compiled it."""
    import torch

    import opsfuse

    archs = str(opsfuse.build_info().get("cuda_architectures", ""))
    return torch.cuda.get_device_capability() == (9, 0) and "90" in archs


def padded_cache(k, v, lengths):
    """K and V as a padded cache: copies holding NaN at every position >= lengths[b] of batch b, which
    a kernel must keep out (masked scores, zeroed V rows); the inputs themselves when lengths is None."""
    if lengths is None:
        return k, v
    k_cache, v_cache = k.copy(), v.copy()
    for i, n in enumerate(lengths):
        k_cache[i, :, n:, :] = np.nan
        v_cache[i, :, n:, :] = np.nan
    return k_cache, v_cache
