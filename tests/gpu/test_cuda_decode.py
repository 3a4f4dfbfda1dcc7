"""The decode kernel (plugin/cuda/flash_decode.cuh: float16 / bfloat16, at most 16 query rows per
(batch, kv head), D and Dv <= 128) through the binding, against the float64 reference with the 2x
rule: the parts of the contract that test_cuda_binding.py checks only on prefill shapes -- every
mask kind and broadcast, softcap, misaligned rows (element loads), Dv != D -- plus causal with
several query positions per head, splits that get no keys, and run-to-run determinism."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from accuracy import random_inputs
from cuda_helpers import fresh_rng
from test_cuda_binding import check, run_binding

pytestmark = pytest.mark.gpu

DTYPES = [np.float16, ml_dtypes.bfloat16]
DTYPE_IDS = ["fp16", "bf16"]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("mask_shape", ["sq_sk", "b_1_sq_sk", "b_hq_sq_sk", "1_sk"])
@pytest.mark.parametrize("hq,hkv,sq,d", [(8, 2, 1, 128), (8, 2, 4, 64), (4, 4, 3, 96)])
def test_decode_masks(dtype, kind, mask_shape, hq, hkv, sq, d):
    rng, seed = fresh_rng()
    b, sk = 2, 1000
    q, k, v = random_inputs(rng, dtype, b, hq, hkv, sq, sk, d, d)
    shape = {"sq_sk": (sq, sk), "b_1_sq_sk": (b, 1, sq, sk), "b_hq_sq_sk": (b, hq, sq, sk), "1_sk": (1, sk)}[mask_shape]
    if kind == "bool":
        mask = rng.random(shape) < 0.7
        if mask_shape == "sq_sk":
            mask[0, :] = False  # a fully masked row -> 0
    else:
        mask = rng.standard_normal(shape)
        mask[rng.random(shape) < 0.1] = -np.inf
        if mask_shape == "b_hq_sq_sk":
            mask[0, 0, 0, :] = -np.inf  # a fully masked row -> 0
        mask = mask.astype(dtype)
    check(q, k, v, attn_mask=mask, seed=seed)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("softcap", [5.0, 50.0])
def test_decode_softcap(dtype, softcap):
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, 2, 8, 2, 2, 700, 128, 128)
    mask = (rng.standard_normal((2, 700)) * 2).astype(dtype)
    check(q, k, v, attn_mask=mask, softcap=softcap, scale=0.3, is_causal=2, seed=seed)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("d,dv", [(59, 111), (40, 96), (128, 64), (80, 80), (7, 9)])
def test_decode_head_sizes(dtype, d, dv):
    """Off-bucket and misaligned head sizes (59/111, 7/9: element loads), Dv != D."""
    rng, seed = fresh_rng()
    for hq, hkv, sq, sk in [(4, 1, 1, 333), (4, 2, 2, 1500)]:
        q, k, v = random_inputs(rng, dtype, 2, hq, hkv, sq, sk, d, dv)
        check(q, k, v, is_causal=2, seed=seed)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("is_causal", [1, 2])
@pytest.mark.parametrize("hq,hkv,sq,sk", [(16, 4, 4, 1000), (2, 1, 8, 64), (2, 2, 5, 4), (1, 1, 1, 1)])
def test_decode_causal_rows(dtype, is_causal, hq, hkv, sq, sk):
    """Several query positions per head in one 16-row tile; causal 1 with Sk >> Sq leaves most keys
    masked (and some splits with no visible key)."""
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, 2, hq, hkv, sq, sk, 128, 128)
    lengths = np.array([sk, max(sk // 3, 0)], dtype=np.int64)
    check(q, k, v, key_lengths=lengths, is_causal=is_causal, seed=seed)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_decode_key_lengths_across_splits(dtype):
    """One batch whose few keys fall into a single split: the other splits write empty partials."""
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, 3, 8, 2, 1, 6000, 128, 128)
    check(q, k, v, key_lengths=np.array([0, 5, 6000], dtype=np.int32), seed=seed)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_decode_deterministic(dtype):
    """Split-KV with the in-block merge of the warps: bitwise equal from run to run."""
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, 2, 32, 8, 1, 5000, 128, 128)
    first = run_binding(q, k, v)
    for _ in range(3):
        np.testing.assert_array_equal(run_binding(q, k, v).astype(np.float32), first.astype(np.float32))
