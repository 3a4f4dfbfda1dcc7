"""The decode kernels (plugin/cuda/flash_decode.cuh, and on sm_90 hopper/hopper_decode.cuh with TMA
loads: float16 / bfloat16, at most 16 query rows per (batch, kv head), D and Dv <= 128) through the
binding, against the float64 reference with the 2x
rule: the parts of the contract that test_cuda_binding.py checks only on prefill shapes -- every
mask kind and broadcast, softcap, misaligned rows (element loads), Dv != D -- plus causal with
several query positions per head, splits that get no keys, and run-to-run determinism."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from accuracy import assert_within_2x_torch, random_inputs
from cuda_helpers import fresh_rng, padded_cache, require_cuda_module, to_device, to_numpy
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


# On sm_90 decode runs the TMA kernel (hopper/hopper_decode.cuh); OPSFUSE_CUDA_HOPPER_DECODE=0 takes
# the portable cp.async kernel. Both merge a split grid's splits of one (batch, kv head) as a
# thread-block cluster through distributed shared memory where every cluster fits at once
# (choose_plan), else through the workspace and the combine kernel (OPSFUSE_CUDA_DECODE_NO_CLUSTER=1:
# always). B * Hkv = 64 -> 4 splits on an H100/H200 (132 SMs, 2 blocks each), whose clusters do not
# all fit; "splits2" (OPSFUSE_CUDA_DECODE_SPLITS=2) makes clusters of 2, which do. Elsewhere these
# run whatever plan the device gets, against the same reference.
CLUSTER_MODES = ["default", "splits2", "splits2_no_cluster", "portable", "portable_no_cluster"]


def _mode(monkeypatch, mode):
    for name in ("OPSFUSE_CUDA_DECODE_NO_CLUSTER", "OPSFUSE_CUDA_HOPPER_DECODE", "OPSFUSE_CUDA_DECODE_SPLITS"):
        monkeypatch.delenv(name, raising=False)
    if mode.startswith("portable"):
        monkeypatch.setenv("OPSFUSE_CUDA_HOPPER_DECODE", "0")
    if mode.startswith("splits2"):
        monkeypatch.setenv("OPSFUSE_CUDA_DECODE_SPLITS", "2")
    if mode.endswith("no_cluster"):
        monkeypatch.setenv("OPSFUSE_CUDA_DECODE_NO_CLUSTER", "1")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("mode", CLUSTER_MODES)
@pytest.mark.parametrize("b,hq,hkv,sq,sk,d,dv", [(8, 32, 8, 1, 5000, 128, 128), (4, 16, 8, 1, 9000, 64, 64),
                                                   (8, 16, 8, 3, 3000, 128, 64), (8, 8, 8, 1, 2000, 40, 96)])
def test_decode_split_merge(monkeypatch, dtype, mode, b, hq, hkv, sq, sk, d, dv):
    """Long Sk, split: GQA packing, several query positions (causal 2), Dv != D, off-bucket D."""
    _mode(monkeypatch, mode)
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, b, hq, hkv, sq, sk, d, dv)
    check(q, k, v, is_causal=2 if sq > 1 else 0, seed=seed)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("mode", CLUSTER_MODES)
def test_decode_split_merge_empty_splits_and_masked_rows(monkeypatch, dtype, mode):
    """key_lengths that leave whole splits (or every split) of a batch empty, and fully masked rows
    (bool mask per (batch, head)): 0, never NaN."""
    _mode(monkeypatch, mode)
    rng, seed = fresh_rng()
    b, hq, hkv, sk = 8, 16, 8, 6000
    q, k, v = random_inputs(rng, dtype, b, hq, hkv, 1, sk, 128, 128)
    lengths = np.array([0, 5, 70, sk, 3000, 1, 64, 129], dtype=np.int64)
    mask = rng.random((b, hq, 1, sk)) < 0.8
    mask[1, 3, 0, :] = False
    mask[3, :, 0, :] = False
    mask[6, 0, 0, 70:] = False
    check(q, k, v, attn_mask=mask, key_lengths=lengths, seed=seed)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("mode", CLUSTER_MODES)
def test_decode_split_merge_strided_and_softcap(monkeypatch, dtype, mode):
    """Non-contiguous K/V rows ((B, S, H, D) memory viewed as (B, H, S, D)) with an additive mask
    and softcap through the split merge."""
    cuda = require_cuda_module()
    import torch

    _mode(monkeypatch, mode)
    rng, seed = fresh_rng()
    b, hq, hkv, sk, d = 8, 32, 8, 4000, 128
    q, k, v = random_inputs(rng, dtype, b, hq, hkv, 1, sk, d, d)
    mask = (rng.standard_normal((b, 1, 1, sk)) * 2).astype(dtype)
    tq = to_device(q)
    tk, tv = (to_device(x).transpose(1, 2).contiguous().transpose(1, 2) for x in (k, v))
    tm = to_device(mask)
    assert not tk.is_contiguous()
    y = cuda.fused_attention(tq, tk, tv, tm, softcap=30.0)
    torch.cuda.synchronize()
    assert_within_2x_torch(to_numpy(y, dtype), q, k, v, mask, softcap=30.0, what=f"strided split (seed {seed})")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_decode_split_merge_deterministic_and_equal(monkeypatch, dtype):
    """The cluster merge takes the splits in the combine kernel's order: bitwise equal run to run,
    and equal (to float rounding) to the combine path."""
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, 8, 32, 8, 1, 7000, 128, 128)
    _mode(monkeypatch, "default")
    first = run_binding(q, k, v).astype(np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(run_binding(q, k, v).astype(np.float32), first)
    for mode in ("splits2", "splits2_no_cluster", "portable", "portable_no_cluster"):
        _mode(monkeypatch, mode)
        other = run_binding(q, k, v).astype(np.float32)
        np.testing.assert_allclose(first, other, rtol=1e-2, atol=1e-3, err_msg=f"{mode} (seed {seed})")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("d,dv", [(60, 56), (124, 128), (120, 104)])
@pytest.mark.parametrize("mode", ["default", "portable"])
def test_decode_padded_rows(monkeypatch, dtype, d, dv, mode):
    """16-byte aligned rows (a 64 / 128 element row pitch) shorter than the pitch: the cp.async
    kernel zero-fills the columns past D / Dv, the TMA kernel gets them zero-filled as outside the
    tensor map (its column extent is D / Dv, its row stride the pitch); the last tile partial
    (Sk % 64 != 0)."""
    cuda = require_cuda_module()
    _mode(monkeypatch, mode)
    import torch

    rng, seed = fresh_rng()
    b, hq, hkv, sq, sk = 8, 16, 8, 1, 3001
    q, k, v = random_inputs(rng, dtype, b, hq, hkv, sq, sk, d, dv)
    pitch = 64 if max(d, dv) <= 64 else 128

    def padded(x):
        t = torch.zeros(x.shape[:3] + (pitch,), dtype=to_device(x).dtype, device="cuda")
        t[..., : x.shape[3]] = to_device(x)
        return t[..., : x.shape[3]]

    tq, tk, tv = padded(q), padded(k), padded(v)
    assert tk.stride(2) == pitch
    y = cuda.fused_attention(tq, tk, tv, is_causal=2)
    torch.cuda.synchronize()
    assert_within_2x_torch(to_numpy(y, dtype), q, k, v, is_causal=2, what=f"padded rows (seed {seed})")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("mode", ["default", "portable"])
@pytest.mark.parametrize("hq,hkv,sq,d", [(32, 8, 1, 128), (8, 8, 1, 64), (16, 4, 2, 96)])
def test_decode_ignores_cache_past_key_lengths(monkeypatch, dtype, mode, hq, hkv, sq, d):
    """A padded KV cache: keys and values at positions >= key_lengths[b] hold NaN (never written).
    The TMA kernel loads those rows (it zero-fills only past Sk); their scores are masked and their
    V rows zeroed before P V (P = 0 times NaN would be NaN). Lengths end inside a 64-key tile, on a
    tile edge, at 0 and at Sk."""
    _mode(monkeypatch, mode)
    rng, seed = fresh_rng()
    b, sk = 5, 2000
    q, k, v = random_inputs(rng, dtype, b, hq, hkv, sq, sk, d, d)
    lengths = np.array([1000, 77, 0, sk, 128], dtype=np.int64)
    k_cache, v_cache = padded_cache(k, v, lengths)
    out = run_binding(q, k_cache, v_cache, key_lengths=lengths, is_causal=2 if sq > 1 else 0)
    assert np.all(np.isfinite(out.astype(np.float64))), f"NaN past key_lengths leaked (seed {seed})"
    assert_within_2x_torch(out, q, k, v, None, lengths, None, 2 if sq > 1 else 0, 0.0,
                           what=f"NaN cache tail ({mode}, seed {seed})")
