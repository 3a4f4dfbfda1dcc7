"""The CUDA kernel through the pybind11 binding (opsfuse.cuda.fused_attention) against the float64
reference with the 2x rule: every dtype, odd sizes, head sizes off the compiled buckets, every mask
kind, key_lengths, both causal alignments, softcap, GQA/MQA, split-KV decode, fully masked rows,
non-contiguous inputs, streams, CUDA graph capture, CuPy, and errors as exceptions."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

from accuracy import assert_within_2x_torch, random_inputs
from cuda_helpers import (BF16, fresh_rng, hopper_kernel_runs, padded_cache, poisoned, require_cuda_module, to_device,
                          to_numpy)

pytestmark = pytest.mark.gpu

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]


def run_binding(q, k, v, attn_mask=None, key_lengths=None, **attrs):
    cuda = require_cuda_module()
    import torch

    tq, tk, tv = to_device(q), to_device(k), to_device(v)
    tm = None if attn_mask is None else to_device(attn_mask)
    tl = None if key_lengths is None else torch.from_numpy(np.asarray(key_lengths)).to("cuda")
    out = poisoned((q.shape[0], q.shape[1], q.shape[2], v.shape[3]), q.dtype)
    y = cuda.fused_attention(tq, tk, tv, tm, tl, out=out, **attrs)
    assert y is out
    torch.cuda.synchronize()
    return to_numpy(y, q.dtype)


def check(q, k, v, attn_mask=None, key_lengths=None, seed=None, **attrs):
    out = run_binding(q, k, v, attn_mask, key_lengths, **attrs)
    assert np.all(np.isfinite(out.astype(np.float64))), f"NaN/unwritten output (seed {seed})"
    assert_within_2x_torch(out, q, k, v, attn_mask, key_lengths, attrs.get("scale"), attrs.get("is_causal", 0),
                           attrs.get("softcap", 0.0), what=f"cuda binding (seed {seed})")


def outputs_under(monkeypatch, envs, *args, **attrs):
    """run_binding(*args, **attrs) once per named environment ({variable: value}, set for that run
    only): the same launch under each of a switch's settings."""
    outs = {}
    for name, env in envs.items():
        with monkeypatch.context() as m:
            for key, value in env.items():
                m.setenv(key, value)
            outs[name] = run_binding(*args, **attrs)
    return outs


def assert_same_bits(outs, seed):
    """Every output bitwise equal to the first one, and finite: launches that only reorder the same
    arithmetic (which block, which step) must give the same bits."""
    names = list(outs)
    for name in names[1:]:
        np.testing.assert_array_equal(outs[name].view(np.uint16), outs[names[0]].view(np.uint16),
                                      err_msg=f"{name} and {names[0]} launches differ (seed {seed})")
    assert np.all(np.isfinite(outs[names[0]].astype(np.float64))), f"non-finite output (seed {seed})"


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("d", [40, 64, 80, 96, 128, 256])
@pytest.mark.parametrize("sq,sk", [(1, 1), (1, 1025), (97, 97), (1025, 97), (7, 1025), (1025, 1025)])
def test_sizes(dtype, d, sq, sk):
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, 1, 2, 2, sq, sk, d, d)
    check(q, k, v, seed=seed)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("is_causal", [1, 2])
@pytest.mark.parametrize("sq,sk", [(97, 97), (33, 200), (200, 33), (1, 300)])
def test_causal(dtype, is_causal, sq, sk):
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, 2, 4, 2, sq, sk, 64, 64)
    check(q, k, v, is_causal=is_causal, seed=seed)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("mask_shape", ["sq_sk", "b_1_sq_sk", "b_hq_1_sk", "1_sk"])
@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_masks(dtype, mask_shape, kind):
    rng, seed = fresh_rng()
    b, hq, hkv, sq, sk = 2, 4, 2, 65, 130
    q, k, v = random_inputs(rng, dtype, b, hq, hkv, sq, sk, 80, 80)
    shape = {"sq_sk": (sq, sk), "b_1_sq_sk": (b, 1, sq, sk), "b_hq_1_sk": (b, hq, 1, sk), "1_sk": (1, sk)}[mask_shape]
    if kind == "bool":
        mask = rng.random(shape) < 0.7
        if mask_shape == "sq_sk":
            mask[0, :] = False  # a fully masked row -> 0
    else:
        mask = rng.standard_normal(shape)
        mask[rng.random(shape) < 0.1] = -np.inf
        mask = mask.astype(dtype)
    check(q, k, v, attn_mask=mask, seed=seed)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["transposed", "offset_by_one", "odd_sk", "b_1_sq_sk"])
@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_mask_views(dtype, layout, kind):
    """Mask views that the Hopper kernel's column-pair loads cannot read -- a column stride != 1 (a
    transposed view), a base and row stride odd in elements (a column slice), an odd Sk -- take its
    general scoring; a contiguous (B,1,Sq,Sk) mask (HF's BERT export) takes the pairs. Causal 1 with
    several row and key tiles; all against the reference."""
    cuda = require_cuda_module()
    import torch

    rng, seed = fresh_rng()
    b, hq, hkv, sq = 2, 4, 2, 200
    sk = 259 if layout == "odd_sk" else 260
    q, k, v = random_inputs(rng, dtype, b, hq, hkv, sq, sk, 64, 64)
    shape = (b, 1, sq, sk) if layout == "b_1_sq_sk" else (sq, sk)
    if kind == "bool":
        mask = rng.random(shape) < 0.7
        mask[..., 0, :] = False  # fully masked rows -> 0
    else:
        mask = rng.standard_normal(shape)
        mask[rng.random(shape) < 0.1] = -np.inf
        mask = mask.astype(dtype)
    if layout == "transposed":
        tm = to_device(np.ascontiguousarray(mask.T)).T
        assert tm.stride() == (1, sq)
    elif layout == "offset_by_one":
        wide = np.zeros((sq, sk + 1), dtype=mask.dtype)
        wide[:, 1:] = mask
        tm = to_device(wide)[:, 1:]
        assert tm.stride() == (sk + 1, 1)
    else:
        tm = to_device(mask)
    tq, tk, tv = to_device(q), to_device(k), to_device(v)
    out = poisoned((b, hq, sq, 64), dtype)
    y = cuda.fused_attention(tq, tk, tv, tm, None, out=out, is_causal=1)
    torch.cuda.synchronize()
    y = to_numpy(y, dtype)
    assert np.all(np.isfinite(y.astype(np.float64))), f"NaN/unwritten output (seed {seed})"
    assert_within_2x_torch(y, q, k, v, mask, None, None, 1, 0.0, what=f"mask view {layout} (seed {seed})")


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32], ids=["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("sk", [520, 521])
@pytest.mark.parametrize("is_causal", [0, 1])
def test_padding_mask_at_lowest_value(dtype, sk, is_causal):
    """transformers' padding masks, (1 - mask) * finfo(dtype).min as a (B,1,1,Sk) additive mask: per
    batch all keys kept, a prefix ending inside a key tile, at a tile edge, one key, and none -- that
    row adds the same finite value to every score, i.e. a softmax over its scores, not zeros (bf16's
    and float32's lowest are below -FLT_MAX / log2(e): the kernels' log2 units must not overflow). An
    even Sk takes the Hopper kernel's tile classes (the padded keys add the constant without the mask
    loads), an odd one its general scoring (float32: the float32 kernel); 200 query rows per head,
    several row and key tiles."""
    rng, seed = fresh_rng()
    b, hq, hkv, sq = 5, 4, 2, 200
    q, k, v = random_inputs(rng, dtype, b, hq, hkv, sq, sk, 64, 64)
    lengths = [sk, 301, 256, 1, 0]
    keep = np.arange(sk)[None, :] < np.array(lengths)[:, None]
    lowest = float(ml_dtypes.finfo(dtype).min)
    mask = np.where(keep, 0.0, lowest).astype(dtype).reshape(b, 1, 1, sk)
    check(q, k, v, attn_mask=mask, is_causal=is_causal, seed=seed)


@pytest.mark.parametrize("is_causal", [0, 1, 2])
def test_many_row_tiles(is_causal):
    """More 128-row tiles (6 x 24 = 144) than an H100/H200 has multiprocessors: the Hopper kernel's
    persistent grid (blocks loop over row tiles), with a (B,1,Sq,Sk) additive mask, GQA 3; causal 2
    with Sq > Sk leaves the first 400 rows without any key (-> 0)."""
    rng, seed = fresh_rng()
    b, hq, hkv, sq, sk = 2, 12, 4, 700, 300
    q, k, v = random_inputs(rng, np.float16, b, hq, hkv, sq, sk, 64, 64)
    mask = rng.standard_normal((b, 1, sq, sk))
    mask[rng.random(mask.shape) < 0.1] = -np.inf
    check(q, k, v, attn_mask=mask.astype(np.float16), is_causal=is_causal, seed=seed)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kl_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("sq", [1, 50])
def test_key_lengths(dtype, kl_dtype, sq):
    rng, seed = fresh_rng()
    sk = 700
    q, k, v = random_inputs(rng, dtype, 4, 8, 2, sq, sk, 128, 128)
    lengths = np.array([0, 1, 333, sk], dtype=kl_dtype)  # 0: every key masked -> zeros
    check(q, k, v, key_lengths=lengths, is_causal=2, seed=seed)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("sq,d", [(50, 128), (300, 64), (129, 96)])
def test_key_lengths_ignore_nan_past_length(dtype, sq, d):
    """A padded cache: K and V at positions >= key_lengths[b] hold NaN. Every kernel (the Hopper
    one loads those rows through TMA, which zero-fills only past Sk) must keep them out: masked
    scores, and zeroed V rows (P = 0 times NaN is NaN)."""
    rng, seed = fresh_rng()
    sk = 700
    q, k, v = random_inputs(rng, dtype, 4, 4, 2, sq, sk, d, d)
    lengths = np.array([333, 1, 700, 128], dtype=np.int64)
    k_cache, v_cache = padded_cache(k, v, lengths)
    out = run_binding(q, k_cache, v_cache, key_lengths=lengths)
    assert np.all(np.isfinite(out.astype(np.float64))), f"NaN past key_lengths leaked (seed {seed})"
    assert_within_2x_torch(out, q, k, v, None, lengths, what=f"NaN cache tail (seed {seed})")


def wide_head_inputs(rng, dtype, shape, mask_kind, lengths):
    """Q, K, V of shape (b, hq, hkv, sq, sk, d, dv); the K, V to run with (padded_cache: NaN past each
    batch's key length where lengths are given); a (b, 1, sq, sk) bool mask with a fully masked row,
    an (sq, sk) additive one, or None; the key lengths as int64 or None."""
    b, hq, hkv, sq, sk, d, dv = shape
    q, k, v = random_inputs(rng, dtype, b, hq, hkv, sq, sk, d, dv)
    mask = None
    if mask_kind == "bool":
        mask = rng.random((b, 1, sq, sk)) < 0.8
        mask[0, 0, 3, :] = False  # a fully masked row -> 0
    elif mask_kind == "additive":
        mask = (rng.standard_normal((sq, sk)) * 2).astype(dtype)
    kl = None if lengths is None else np.array(lengths, dtype=np.int64)
    k_run, v_run = padded_cache(k, v, kl)
    return q, k, v, k_run, v_run, mask, kl


HOPPER_D256_CASES = {
    # name: (b, hq, hkv, sq, sk, d, dv), attrs, mask kind, key lengths, environment
    "causal1_boolmask_gqa2": ((2, 4, 2, 130, 260, 256, 256), {"is_causal": 1}, "bool", None, {}),
    "causal2_addmask_softcap_dv200": ((1, 3, 3, 97, 300, 256, 200), {"is_causal": 2, "softcap": 20.0}, "additive",
                                      None, {}),
    "d200_dv256_kl": ((3, 4, 4, 150, 700, 200, 256), {}, None, [333, 1, 700], {}),
    "persistent_causal1_kl_gqa4": ((2, 16, 4, 600, 600, 256, 256), {"is_causal": 1}, None, [600, 257],
                                   {"OPSFUSE_CUDA_HOPPER_PERSISTENT": "1"}),
}


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", sorted(HOPPER_D256_CASES))
def test_head_size_256_features(dtype, case, monkeypatch):
    """D = 256 with every feature (on an H100/H200 the Hopper kernel's 64-key tiles, forced also where
    the portable plan would split the keys; elsewhere the portable kernel): masks with a fully masked
    row, both causal alignments, softcap, Dv != D both ways, key_lengths with NaN in the cache past
    them (V rows of a 64-key tile zeroed), GQA, a persistent grid."""
    (b, hq, hkv, sq, sk, d, dv), attrs, mask_kind, lengths, env = HOPPER_D256_CASES[case]
    monkeypatch.setenv("OPSFUSE_CUDA_FORCE_HOPPER", "1")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    rng, seed = fresh_rng()
    q, k, v, k_run, v_run, mask, kl = wide_head_inputs(rng, dtype, (b, hq, hkv, sq, sk, d, dv), mask_kind, lengths)
    out = run_binding(q, k_run, v_run, attn_mask=mask, key_lengths=kl, **attrs)
    assert np.all(np.isfinite(out.astype(np.float64))), f"non-finite output (seed {seed})"
    assert_within_2x_torch(out, q, k, v, mask, kl, attrs.get("scale"), attrs.get("is_causal", 0),
                           attrs.get("softcap", 0.0), what=f"D=256 {case} (seed {seed})")


LATENT_CASES = {
    # name: (b, hq, hkv, sq, sk, d, dv), attrs, mask kind, key lengths; 128 < D <= 256 with Dv <= 128
    "deepseek_causal1_gqa2": ((2, 8, 4, 300, 300, 192, 128), {"is_causal": 1}, None, None),
    "deepseek_noncausal_persistent": ((2, 80, 80, 260, 520, 192, 128), {}, None, None),  # 480 items
    "deepseek_kl_gqa4": ((2, 8, 2, 200, 700, 192, 128), {}, None, [700, 333]),
    "d176_dv96_boolmask_causal2": ((2, 4, 4, 130, 260, 176, 96), {"is_causal": 2}, "bool", None),
    "d256_dv64_boolmask_kl": ((2, 4, 2, 130, 260, 256, 64), {}, "bool", [260, 77]),
    "d200_dv72_softcap_causal2": ((1, 4, 4, 97, 300, 200, 72), {"is_causal": 2, "softcap": 30.0}, "additive", None),
}


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", sorted(LATENT_CASES))
def test_latent_attention_buckets(dtype, case, monkeypatch):
    """Latent attention (DeepSeek-V3: D = 192, Dv = 128) in the Hopper kernel's own buckets: by default
    Q / K over 192 columns on 128-key tiles where D <= 192, with V, O and P V at 128 columns; with
    OPSFUSE_CUDA_HOPPER_D192=0 the (256, 128) instantiation, whose 64-key tiles are those of the
    launch with V padded to 256 columns too (OPSFUSE_CUDA_HOPPER_DV_BUCKET=0): the columns past Dv
    were zero products, so those two agree bit for bit. All within the 2x rule (elsewhere than
    Hopper every run is the portable kernel's)."""
    require_cuda_module()
    monkeypatch.setenv("OPSFUSE_CUDA_FORCE_HOPPER", "1")  # also where the portable plan would split the keys
    (b, hq, hkv, sq, sk, d, dv), attrs, mask_kind, lengths = LATENT_CASES[case]
    rng, seed = fresh_rng()
    q, k, v, k_run, v_run, mask, kl = wide_head_inputs(rng, dtype, (b, hq, hkv, sq, sk, d, dv), mask_kind, lengths)
    envs = {"v_bucket": {"OPSFUSE_CUDA_HOPPER_D192": "0"}, "padded_v": {"OPSFUSE_CUDA_HOPPER_DV_BUCKET": "0"},
            "default": {}}
    outs = outputs_under(monkeypatch, envs, q, k_run, v_run, mask, kl, **attrs)
    assert_same_bits({name: outs[name] for name in ("v_bucket", "padded_v")}, seed)
    for name in ("default", "v_bucket"):
        assert np.all(np.isfinite(outs[name].astype(np.float64))), f"{name}: non-finite output (seed {seed})"
        assert_within_2x_torch(outs[name], q, k, v, mask, kl, attrs.get("scale"), attrs.get("is_causal", 0),
                               attrs.get("softcap", 0.0), what=f"latent attention {case} {name} (seed {seed})")


SHARED_ROW_MASK_CASES = {
    # name: (b, hq, hkv, sq, sk, d), softcap, mask kind, visible keys per batch (None: random mixed)
    "d256_bool_pad": ((3, 4, 2, 70, 300, 256), 0.0, "bool", [300, 129, 0]),
    "d256_additive_pad_softcap": ((3, 2, 2, 65, 300, 256), 30.0, "additive", [64, 250, 300]),
    "d256_bool_mixed": ((2, 2, 1, 40, 200, 256), 0.0, "bool", None),
    "d128_softcap_bool_pad": ((2, 4, 4, 130, 520, 128), 50.0, "bool", [385, 128]),
    "d64_softcap_additive_finite": ((2, 4, 2, 100, 300, 64), 20.0, "finite", [200, 17]),
}


def shared_row_mask(rng, dtype, b, sk, kind, lengths):
    """A (B, 1, 1, Sk) mask, the same for every query row (mask_stride[2] == 0): a padding mask (the
    first lengths[i] keys of batch i visible) as bool, additive 0 / -inf, or additive 0 / the
    dtype's lowest finite value (a padded key is then not -inf, so no tile is uniformly masked); with
    lengths None, random keys of each batch masked."""
    if lengths is None:
        visible = rng.random((b, sk)) < 0.7
    else:
        visible = np.arange(sk)[None, :] < np.asarray(lengths)[:, None]
    visible = visible.reshape(b, 1, 1, sk)
    if kind == "bool":
        return visible
    low = -np.inf if kind == "additive" else float(np.finfo(np.float16).min if dtype == np.float16 else -3.0e38)
    return np.where(visible, 0.0, low).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", sorted(SHARED_ROW_MASK_CASES))
def test_masks_shared_by_rows_in_the_general_kernel(dtype, case, monkeypatch):
    """Padding-style masks (one row for every query) where the Hopper kernel scores through its
    general path (D = 256 with any mask; D <= 128 with softcap and a mask), which classes each key
    tile as all visible, all masked or mixed: tiles of every class, a tile cut by a batch's length,
    a batch with every key masked (zeros), additive masks with -inf and with finite lowest values."""
    (b, hq, hkv, sq, sk, d), softcap, kind, lengths = SHARED_ROW_MASK_CASES[case]
    monkeypatch.setenv("OPSFUSE_CUDA_FORCE_HOPPER", "1")
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, b, hq, hkv, sq, sk, d, d)
    mask = shared_row_mask(rng, dtype, b, sk, kind, lengths)
    attrs = {"softcap": softcap} if softcap else {}
    out = run_binding(q, k, v, attn_mask=mask, **attrs)
    assert np.all(np.isfinite(out.astype(np.float64))), f"non-finite output (seed {seed})"
    if lengths is not None and 0 in lengths:
        assert np.all(out[list(lengths).index(0)].astype(np.float32) == 0), f"a fully masked batch is not zero (seed {seed})"
    assert_within_2x_torch(out, q, k, v, mask, None, None, 0, softcap, what=f"{case} (seed {seed})")


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["fp16", "bf16"])
def test_strided_shared_row_mask(dtype, monkeypatch):
    """A padding mask read through a view with a key stride of 3 (mask_stride[3] != 1, which the
    pair-mask kernels do not take) at D = 256: the general kernel's tile classes load any layout."""
    import torch

    cuda = require_cuda_module()
    monkeypatch.setenv("OPSFUSE_CUDA_FORCE_HOPPER", "1")
    rng, seed = fresh_rng()
    b, sk = 2, 333
    q, k, v = random_inputs(rng, dtype, b, 4, 4, 90, sk, 256, 256)
    mask = shared_row_mask(rng, dtype, b, sk, "bool", [200, 64])
    backing = torch.zeros((b, sk, 3), dtype=torch.bool, device="cuda")
    backing[:, :, 1] = torch.from_numpy(mask.reshape(b, sk)).to("cuda")
    view = backing[:, None, None, :, 1]
    assert view.stride(-1) == 3
    out = poisoned((b, 4, 90, 256), dtype)
    cuda.fused_attention(to_device(q), to_device(k), to_device(v), view, None, out=out)
    torch.cuda.synchronize()
    result = to_numpy(out, dtype)
    assert np.all(np.isfinite(result.astype(np.float64))), f"non-finite output (seed {seed})"
    assert_within_2x_torch(result, q, k, v, mask, what=f"strided padding mask (seed {seed})")


DYNAMIC_ORDER_ENVS = {
    "chosen": {},  # choose_plan's: the dynamic order for these shapes on an H100/H200
    "snake": {"OPSFUSE_CUDA_HOPPER_PERSISTENT": "1", "OPSFUSE_CUDA_HOPPER_DYNAMIC": "0"},
    "sections3": {"OPSFUSE_CUDA_HOPPER_SCHED_HEADS": "3"},
}
DYNAMIC_ORDER_CASES = {
    # name: (b, hq, hkv, sq, sk, d), attrs, key lengths (NaN in the cache past them)
    "causal1_gqa3": ((1, 12, 4, 1600, 1600, 128), {"is_causal": 1}, None),  # 13 row tiles x 12
    "causal2_kl_sq_gt_sk": ((2, 8, 4, 2100, 400, 64), {"is_causal": 2}, [0, 257]),  # tiles without keys
    "kl_gqa2": ((4, 8, 4, 600, 700, 128), {}, [333, 1, 700, 128]),  # 5 row tiles x 32
}


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", sorted(DYNAMIC_ORDER_CASES))
def test_persistent_orders_agree(dtype, case, monkeypatch):
    """Causal and key_lengths grids of more row tiles than an H100/H200 has SMs: the Hopper kernel's
    dynamic order (tickets drawn from a counter in the workspace, in L2 sections of heads), the
    static snake and sections of 3 heads compute each row tile in one block whatever the order, so
    their outputs are bitwise equal, and within the 2x rule. On other GPUs all three are the same
    launch."""
    cuda = require_cuda_module()
    import torch

    (b, hq, hkv, sq, sk, d), attrs, lengths = DYNAMIC_ORDER_CASES[case]
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, b, hq, hkv, sq, sk, d, d)
    kl = None if lengths is None else np.array(lengths, dtype=np.int64)
    k_run, v_run = padded_cache(k, v, kl)  # NaN past each length must stay out
    hopper = hopper_kernel_runs()
    outs = {}
    for name, env in DYNAMIC_ORDER_ENVS.items():
        with monkeypatch.context() as m:
            for key, value in env.items():
                m.setenv(key, value)
            tq, tk = to_device(q), to_device(k_run)
            tl = None if kl is None else torch.from_numpy(kl).to("cuda")
            ws = cuda.workspace_size(tq, tk, to_device(v_run), None, tl, **attrs)
            if hopper:  # the dynamic order's ticket counter is the plan's only workspace here
                assert (ws > 0) == (name != "snake"), f"{name}: workspace {ws} bytes"
            outs[name] = run_binding(q, k_run, v_run, key_lengths=kl, **attrs)
    for name, out in outs.items():
        np.testing.assert_array_equal(out.view(np.uint16), outs["chosen"].view(np.uint16),
                                      err_msg=f"{name} order differs from the chosen one (seed {seed})")
    assert np.all(np.isfinite(outs["chosen"].astype(np.float64))), f"non-finite output (seed {seed})"
    assert_within_2x_torch(outs["chosen"], q, k, v, None, kl, None, attrs.get("is_causal", 0),
                           what=f"dynamic order {case} (seed {seed})")


STREAM_K_CASES = {
    # name: (b, hq, hkv, sq, sk, d, dv); row tiles of 128 x batch x heads >= 132 (an H100 / H200's SMs)
    "d128_gqa4_1025x1000": (2, 8, 2, 1025, 1000, 128, 128),  # 144 items of 8 key tiles
    "d64_short_items": (3, 5, 5, 1100, 300, 64, 64),  # 135 items of 3: nearly every item cut
    "d80_dv96_gqa11": (1, 33, 3, 520, 2000, 80, 96),  # 165 items of 16
    "d64_after_a_round": (4, 8, 8, 1100, 777, 64, 64),  # 288 items: a round of whole items, then 156 shared
}


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", sorted(STREAM_K_CASES))
def test_stream_k_schedule(dtype, case, monkeypatch):
    """The Hopper kernel's stream-K schedule (forced, OPSFUSE_CUDA_HOPPER_STREAM_K=1): blocks share
    the (row tile, key tile) units, and an item cut between two blocks is merged by whichever part
    finishes second -- so the output must not depend on which one that was: repeated launches are
    bitwise equal. Within the 2x rule, as the static order (STREAM_K=0) is. On other GPUs every
    variant is the portable kernel."""
    cuda = require_cuda_module()
    b, hq, hkv, sq, sk, d, dv = STREAM_K_CASES[case]
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, b, hq, hkv, sq, sk, d, dv)
    hopper = hopper_kernel_runs()
    outs = {}
    for name, value in (("static", "0"), ("stream_k", "1")):
        with monkeypatch.context() as m:
            m.setenv("OPSFUSE_CUDA_HOPPER_STREAM_K", value)
            ws = cuda.workspace_size(to_device(q), to_device(k), to_device(v), None, None)
            if hopper:  # stream-K's counts and partial slots are the plan's only workspace here
                assert (ws > 0) == (name == "stream_k"), f"{name}: workspace {ws} bytes"
            outs[name] = run_binding(q, k, v)
            if name == "stream_k":
                for _ in range(3):
                    again = run_binding(q, k, v)
                    np.testing.assert_array_equal(again.view(np.uint16), outs[name].view(np.uint16),
                                                  err_msg=f"stream-K launches differ (seed {seed})")
    for name, out in outs.items():
        assert np.all(np.isfinite(out.astype(np.float64))), f"{name}: non-finite output (seed {seed})"
        assert_within_2x_torch(out, q, k, v, what=f"{name} {case} (seed {seed})")


WG_SPLIT_CASES = {
    # name: (b, hq, hkv, sq, sk, d, dv); 64-row items x batch x heads <= 132 (one round on an H100 /
    # H200), where choose_plan splits each item's key tiles between the two consumer warpgroups
    "seed_512": (1, 12, 12, 512, 512, 64, 64),  # issue 7's seed point: 96 items of 4 key tiles
    "odd_tiles_gqa3": (2, 6, 2, 97, 300, 128, 128),  # 3 key tiles: warpgroup 1 has one turn less
    "sk129_d40_dv80": (3, 4, 4, 130, 129, 40, 80),  # the second tile holds one key
    "sq3_mqa": (2, 8, 1, 3, 2000, 64, 64),  # 3 rows (fewer per KV head: a decode shape), 16 key tiles
    "d96_1025": (1, 2, 2, 97, 1025, 96, 96),  # 9 key tiles, the last one key
}


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", sorted(WG_SPLIT_CASES))
def test_warpgroup_key_split(dtype, case, monkeypatch):
    """The Hopper kernel's warpgroup key split (choose_plan's hopper_wg_split(), on by default for
    these one-round grids) against the same launch without it (OPSFUSE_CUDA_HOPPER_WG_SPLIT=0), both
    with the Hopper kernel forced where the portable plan would split the keys: each within the 2x
    rule. On the H100 / H200 the two must differ in some bits (the split sums the keys in another
    order), which shows that the switch reached the kernel; elsewhere both are the portable kernel."""
    require_cuda_module()
    b, hq, hkv, sq, sk, d, dv = WG_SPLIT_CASES[case]
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, b, hq, hkv, sq, sk, d, dv)
    hopper = hopper_kernel_runs()
    monkeypatch.setenv("OPSFUSE_CUDA_FORCE_HOPPER", "1")
    outs = outputs_under(monkeypatch, {"split": {}, "whole": {"OPSFUSE_CUDA_HOPPER_WG_SPLIT": "0"}}, q, k, v)
    for name, out in outs.items():
        assert np.all(np.isfinite(out.astype(np.float64))), f"{name}: non-finite output (seed {seed})"
        assert_within_2x_torch(out, q, k, v, what=f"{name} {case} (seed {seed})")
    if hopper:
        assert not np.array_equal(outs["split"].view(np.uint16), outs["whole"].view(np.uint16)), \
            f"the warpgroup key split changed no bit: did it run? (seed {seed})"


CHAIN_CASES = {
    # name: (b, hq, hkv, sq, sk, d, dv), attrs; persistent plain grids of more row tiles than an
    # H100 / H200 has SMs (132) over >= 2048 keys (causal >= 1024), without a tail split or
    # stream-K, non-causal ones with a partial last key tile (whole tiles take kPlainFast): item
    # chaining (kPlainChain)
    "gqa3_1025x2100": ((2, 12, 4, 1025, 2100, 128, 128), {}),  # 216 items of 17 tiles, the last partial
    "sq100_mqa": ((3, 96, 1, 100, 2100, 128, 128), {}),  # 288 items of 100 rows
    "causal1_dynamic": ((1, 10, 5, 2100, 2100, 128, 128), {"is_causal": 1}),  # 170 items, 1..17 tiles
    "d80_dv96_causal2_snake": ((2, 12, 6, 700, 2100, 80, 96), {"is_causal": 2}),  # 144 items
    "causal1_gqa3_1100": ((2, 12, 4, 1100, 1100, 128, 128), {"is_causal": 1}),  # 216 items, 1..9 tiles
}


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", sorted(CHAIN_CASES))
def test_item_chaining(dtype, case, monkeypatch):
    """Item chaining (the Hopper kernel's kPlainChain, on by default for these persistent grids)
    against the same launch without it (OPSFUSE_CUDA_HOPPER_CHAIN=0): the chain only moves an item's
    first S product and its store next to the previous item's last P V product, so every row sees
    the same arithmetic and the outputs are bitwise equal, and within the 2x rule. (That the chain
    ran is the check driver's to assert: its chain cases fail on any other mode.)"""
    require_cuda_module()
    (b, hq, hkv, sq, sk, d, dv), attrs = CHAIN_CASES[case]
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, b, hq, hkv, sq, sk, d, dv)
    envs = {"chained": {}, "per_item": {"OPSFUSE_CUDA_HOPPER_CHAIN": "0"}}
    outs = outputs_under(monkeypatch, envs, q, k, v, **attrs)
    assert_same_bits(outs, seed)
    assert_within_2x_torch(outs["chained"], q, k, v, None, None, None, attrs.get("is_causal", 0),
                           what=f"item chaining {case} (seed {seed})")


FAST_CASES = {
    # name: (b, hq, hkv, sq, sk, d, dv); plain launches in the D = 128 bucket whose keys fill whole
    # 128-key tiles, no causal, no key_lengths: the kernel without the code they never run
    # (kPlainFast) by default
    "s1024_gqa3": (2, 12, 4, 1100, 1024, 128, 128),  # 216 items of 8 tiles, a partial row tile
    "d96_one_round": (6, 16, 16, 97, 640, 96, 96),  # 96 items of 5 tiles
    "s2048_persistent": (2, 16, 8, 1024, 2048, 128, 128),  # 16 tiles, which chaining leaves to it
}


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", sorted(FAST_CASES))
def test_whole_visible_key_tiles(dtype, case, monkeypatch):
    """The plain kernel without the key-limit scoring, split and stream-K code (kPlainFast, by
    default for these launches) against the plain kernel, or from 16 key tiles the chain
    (OPSFUSE_CUDA_HOPPER_FAST=0): every tile is scored by the same fast variant in each, so the
    outputs are bitwise equal, and within the 2x rule. (That kPlainFast ran is the check driver's to
    assert: its fast cases fail on any other mode.)"""
    require_cuda_module()
    b, hq, hkv, sq, sk, d, dv = FAST_CASES[case]
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, b, hq, hkv, sq, sk, d, dv)
    envs = {"fast": {}, "plain": {"OPSFUSE_CUDA_HOPPER_FAST": "0"}}
    outs = outputs_under(monkeypatch, envs, q, k, v)
    assert_same_bits(outs, seed)
    assert_within_2x_torch(outs["fast"], q, k, v, None, None, None, 0,
                           what=f"whole visible key tiles {case} (seed {seed})")


SEQ_CASES = {
    # name: (b, hq, hkv, sq, sk, d, dv), attrs, key_lengths; plain launches at D <= 128 over <= 8 key
    # tiles of 128: short items in sequence (kPlainSeq)
    "seed_s128": ((1, 12, 12, 128, 128, 64, 64), {}, None),  # 12 items of one key tile
    "bert_s512": ((8, 12, 12, 512, 512, 64, 64), {}, None),  # 768 items of 4: a persistent grid
    "d40_sk1_gqa3": ((2, 6, 2, 97, 1, 40, 40), {}, None),  # one key
    "causal2_kl": ((3, 10, 5, 200, 450, 64, 64), {"is_causal": 2}, [450, 0, 131]),  # items without keys
    "seed_s1024": ((1, 12, 12, 1024, 1024, 64, 64), {}, None),  # 96 items of 8 key tiles, one round
    "causal1_gqa2_sk600": ((2, 8, 4, 600, 600, 64, 64), {"is_causal": 1}, None),  # 1-5 tiles, the last partial
    # D = 128 (OPSFUSE_CUDA_HOPPER_SEQ_D128=8 forces the 8-tile case): the lazy rescale's kernels
    "d128_s1024": ((2, 8, 8, 1024, 1024, 128, 128), {}, None),  # 128 items of 8 key tiles
    "d128_causal1_gqa2_sk600": ((2, 8, 4, 600, 600, 128, 128), {"is_causal": 1}, None),
    "d96_kl_sk200": ((2, 4, 4, 300, 200, 96, 96), {}, [200, 1]),  # D = 96 in the 128 bucket, one key
}


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", sorted(SEQ_CASES))
def test_short_items_in_sequence(dtype, case, monkeypatch):
    """Short items in sequence (the Hopper kernel's kPlainSeq: by default for these launches, and
    forced for the 8-tile D = 128 one with OPSFUSE_CUDA_HOPPER_SEQ_D128=8) against the same launch
    with the overlapped key loop (OPSFUSE_CUDA_HOPPER_SEQ=0, _SEQ_D128=0): each key tile's
    S, softmax and P V only run in another order, so every row sees the same arithmetic and the
    outputs are bitwise equal, and within the 2x rule. (That kPlainSeq ran is the check driver's to
    assert: its seq cases fail on any other mode.)"""
    require_cuda_module()
    (b, hq, hkv, sq, sk, d, dv), attrs, lengths = SEQ_CASES[case]
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, b, hq, hkv, sq, sk, d, dv)
    kl = None if lengths is None else np.asarray(lengths, dtype=np.int32)
    # 128-key tiles on both sides (OPSFUSE_CUDA_HOPPER_SEQ_WIDE=0): 256-key ones round differently.
    # The two-consumer kernels also at the three-consumer kernel's shapes (OPSFUSE_CUDA_HOPPER_SEQ3=0).
    envs = {"in_sequence": {"OPSFUSE_CUDA_HOPPER_SEQ_D128": "8", "OPSFUSE_CUDA_HOPPER_SEQ_WIDE": "0",
                            "OPSFUSE_CUDA_HOPPER_SEQ3": "0"},
            "overlapped": {"OPSFUSE_CUDA_HOPPER_SEQ": "0", "OPSFUSE_CUDA_HOPPER_SEQ_D128": "0",
                           "OPSFUSE_CUDA_HOPPER_SEQ_WIDE": "0", "OPSFUSE_CUDA_HOPPER_SEQ3": "0"}}
    outs = outputs_under(monkeypatch, envs, q, k, v, None, kl, **attrs)
    assert_same_bits(outs, seed)
    assert_within_2x_torch(outs["in_sequence"], q, k, v, None, kl, None, attrs.get("is_causal", 0),
                           what=f"short items in sequence {case} (seed {seed})")


WIDE_CASES = {
    # name: (b, hq, hkv, sq, sk, d, dv), the 256-key tile limit (OPSFUSE_CUDA_HOPPER_SEQ_WIDE), extra
    # switches; plain D <= 64 launches whose keys fill 2 or more whole 256-key tiles (kPlainSeqWide)
    "seed_s1024": ((1, 12, 12, 1024, 1024, 64, 64), 4, {}),  # 96 items of 4 tiles, one round
    "bert_s512": ((8, 12, 12, 512, 512, 64, 64), 4, {}),  # 768 items of 2: a persistent grid
    "seed_s2048_tail": ((1, 12, 12, 2048, 2048, 64, 64), 8, {}),  # the tail split (clusters of 2)
    "split2_gqa2_sk768": ((2, 8, 4, 300, 768, 64, 64), 4, {"OPSFUSE_CUDA_HOPPER_SPLITS": "2"}),
    "d40_gqa3_sq97_sk512": ((8, 24, 8, 97, 512, 40, 40), 4, {}),  # D off the bucket
    "long_s4096": ((2, 8, 8, 300, 4096, 64, 64), 16, {}),  # 16 tiles
    "long_s8192_default": ((1, 4, 4, 200, 8192, 64, 64), 32, {}),  # 32 tiles: the default limit
}


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", sorted(WIDE_CASES))
def test_short_items_on_wide_tiles(dtype, case, monkeypatch):
    """Short items in sequence on 256-key tiles (the Hopper kernel's kPlainSeqWide, by
    OPSFUSE_CUDA_HOPPER_SEQ_WIDE=N) within the 2x rule, as the same launch on 128-key tiles
    (OPSFUSE_CUDA_HOPPER_SEQ_WIDE=0) is; a repeat gives the same bits (the tiles' order is fixed).
    The two tilings round differently (the running max moves per tile), so they are not compared
    bit for bit. (That the wide kernel ran is the check driver's to assert: its wide cases fail on
    any other mode.)"""
    require_cuda_module()
    (b, hq, hkv, sq, sk, d, dv), limit, extra = WIDE_CASES[case]
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, b, hq, hkv, sq, sk, d, dv)
    # The two-consumer kernels also at the three-consumer kernel's shapes (OPSFUSE_CUDA_HOPPER_SEQ3=0).
    wide = {"OPSFUSE_CUDA_HOPPER_SEQ_WIDE": str(limit), "OPSFUSE_CUDA_HOPPER_SEQ3": "0", **extra}
    envs = {"wide": wide, "wide_again": wide,
            "narrow": {"OPSFUSE_CUDA_HOPPER_SEQ_WIDE": "0", "OPSFUSE_CUDA_HOPPER_SEQ3": "0", **extra}}
    outs = outputs_under(monkeypatch, envs, q, k, v)
    assert_same_bits({name: outs[name] for name in ("wide", "wide_again")}, seed)
    for name in ("wide", "narrow"):
        assert_within_2x_torch(outs[name], q, k, v, what=f"{name} tiles {case} (seed {seed})")


SEQ3_CASES = {
    # name: (b, hq, hkv, sq, sk, d, dv); one-round plain launches at D <= 64 over 3 to 8 whole 128-key
    # tiles whose 64-row items outnumber the SMs (kPlainSeq3, by default)
    "seed_s1024": (1, 12, 12, 1024, 1024, 64, 64),  # 96 items of 8 tiles: the third warpgroup takes 2
    "gqa3_sq600_sk768": (2, 12, 4, 600, 768, 64, 64),  # 6 tiles, a partial last row tile
    "d40_sk384": (1, 30, 30, 300, 384, 40, 40),  # D off the bucket, 3 tiles: a tail of 1
    "sk640": (1, 16, 16, 1000, 640, 64, 64),  # 5 tiles
}


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", sorted(SEQ3_CASES))
def test_three_consumer_warpgroups(dtype, case, monkeypatch):
    """The three-consumer kernel (kPlainSeq3, the default here: a third warpgroup takes the last key
    tiles of both 64-row strips, merged in shared memory) within the 2x rule, as the two-consumer
    kernel for the same launch (OPSFUSE_CUDA_HOPPER_SEQ3=0) is; a repeat, and a launch without the strip warpgroups' pingpong
    turns (OPSFUSE_CUDA_HOPPER_PINGPONG=0: the same arithmetic in another interleaving), give the
    same bits. (That it ran is the check driver's to assert: its seq3 cases fail on any other mode.)"""
    require_cuda_module()
    b, hq, hkv, sq, sk, d, dv = SEQ3_CASES[case]
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, b, hq, hkv, sq, sk, d, dv)
    three = {"OPSFUSE_CUDA_HOPPER_SEQ3": "1"}
    envs = {"three": three, "three_again": three, "three_no_turns": {**three, "OPSFUSE_CUDA_HOPPER_PINGPONG": "0"},
            "two": {"OPSFUSE_CUDA_HOPPER_SEQ3": "0"}}
    outs = outputs_under(monkeypatch, envs, q, k, v)
    assert_same_bits({name: outs[name] for name in ("three", "three_again", "three_no_turns")}, seed)
    for name in ("three", "two"):
        assert_within_2x_torch(outs[name], q, k, v, what=f"{name} {case} (seed {seed})")


@pytest.mark.parametrize("graph", [False, True], ids=["stream", "graph"])
@pytest.mark.parametrize("d,causal", [(64, 0), (128, 1)], ids=["d64", "d128_causal"])
def test_dependent_launches_order_reads_and_writes(d, causal, graph, monkeypatch):
    """Back-to-back launches without a sync between them, as a model runs: each call reads the
    previous call's output as Q (read after write) and writes over the buffer the previous call
    reads as V (write after read). With OPSFUSE_CUDA_HOPPER_PDL=1 the Hopper kernel is a
    programmatic dependent launch (its blocks start while the previous kernel finishes, and wait
    for it before touching global memory); the chain must equal, bit for bit, the same chain run
    one call at a time with plain launches (OPSFUSE_CUDA_HOPPER_PDL=0). Every output buffer starts
    as NaN, so a read that overtook its writer shows. One head of 4096 rows makes a one-round grid of 32-64 blocks, each
    tens of µs long, which leaves most SMs free for the next call's blocks. (On the H200 a build
    without the kernel's wait still passed: the next grid's blocks started only as the previous
    one's ended, docs/notes/cuda_kernel.md session 25. The test holds the chain's results to the
    plain launches' wherever the hardware lets them start earlier.)"""
    cuda = require_cuda_module()
    import torch

    rng, seed = fresh_rng()
    shape = (1, 1, 4096, d)  # Sq = Sk, so an output can serve as the next call's Q or V
    first = [to_device(rng.standard_normal(shape).astype(np.float16)) for _ in range(3)]

    def chain(sync):
        bufs = [t.clone() for t in first] + [poisoned(shape, np.float16)]
        for _ in range(6):  # each call: bufs[3] = attn(bufs[0], bufs[1], bufs[2]); roles rotate by one
            q, k, v, out = bufs
            cuda.fused_attention(q, k, v, is_causal=causal, out=out)
            if sync:
                torch.cuda.synchronize()
            bufs = [out, q, k, v]  # the next call reads `out` as Q and overwrites this call's V
        return bufs  # the last four calls' outputs, newest first

    with monkeypatch.context() as m:
        m.setenv("OPSFUSE_CUDA_HOPPER_PDL", "0")
        expect = [o.clone() for o in chain(sync=True)]
    monkeypatch.setenv("OPSFUSE_CUDA_HOPPER_PDL", "1")
    if graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            chain(sync=False)  # warm-up outside capture
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=side):
                got = chain(sync=False)
        for o in got:
            o.fill_(float("nan"))
        torch.cuda.current_stream().wait_stream(side)
        g.replay()
    else:
        got = chain(sync=False)
    torch.cuda.synchronize()
    for i, (o, e) in enumerate(zip(got, expect)):
        assert torch.isfinite(o).all(), f"output {i}: NaN, a read overtook its writer (seed {seed})"
        assert torch.equal(o, e), f"output {i}: differs from the one-at-a-time chain (seed {seed})"


def test_key_lengths_clamped():
    """Values outside [0, Sk] are clamped on the device (they cannot be checked without a sync)."""
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, np.float16, 2, 2, 2, 9, 40, 64, 64)
    out = run_binding(q, k, v, key_lengths=np.array([-5, 1000], dtype=np.int64))
    expect = run_binding(q, k, v, key_lengths=np.array([0, 40], dtype=np.int64))
    np.testing.assert_array_equal(out.astype(np.float32), expect.astype(np.float32))
    assert np.all(out[0] == 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("softcap", [5.0, 50.0])
def test_softcap_with_mask_and_scale(dtype, softcap):
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, 1, 4, 1, 77, 150, 96, 64)
    mask = (rng.standard_normal((77, 150)) * 2).astype(dtype)
    check(q, k, v, attn_mask=mask, softcap=softcap, scale=0.3, is_causal=1, seed=seed)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("hq,hkv,sq,sk", [(32, 8, 1, 4100), (32, 32, 1, 2500), (8, 1, 3, 3000), (4, 2, 16, 5000)])
def test_decode_split_kv(dtype, hq, hkv, sq, sk):
    """Small Sq and long Sk: the split-KV path with its combine pass."""
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, 2, hq, hkv, sq, sk, 128, 128)
    lengths = np.array([sk, sk // 3], dtype=np.int32)
    check(q, k, v, key_lengths=lengths, is_causal=2, seed=seed)
    import opsfuse.cuda

    assert opsfuse.cuda.workspace_size(to_device(q), to_device(k), to_device(v)) > 0, "expected the split-KV path"


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_dv_differs_from_d(dtype):
    rng, seed = fresh_rng()
    for d, dv in [(40, 96), (128, 64), (256, 80), (64, 256)]:
        q, k, v = random_inputs(rng, dtype, 1, 2, 1, 70, 90, d, dv)
        check(q, k, v, is_causal=2, seed=seed)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["fp16", "bf16"])
def test_noncontiguous_inputs(dtype):
    """Strided views ((B, S, H, D) memory viewed as (B, H, S, D)), as exporters produce."""
    cuda = require_cuda_module()
    import torch

    rng, seed = fresh_rng()
    b, h, s, d = 2, 3, 50, 64
    q, k, v = random_inputs(rng, dtype, b, h, h, s, s, d, d)
    tq, tk, tv = (to_device(x).transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    assert not tq.is_contiguous()
    y = cuda.fused_attention(tq, tk, tv, is_causal=1)
    torch.cuda.synchronize()
    assert_within_2x_torch(to_numpy(y, dtype), q, k, v, is_causal=1, what=f"strided (seed {seed})")


def test_misaligned_head_size():
    """D = 59 / Dv = 111: rows not 16-byte aligned -> the element-load path."""
    rng, seed = fresh_rng()
    for dtype in (np.float16, ml_dtypes.bfloat16, np.float32):
        q, k, v = random_inputs(rng, dtype, 1, 2, 2, 33, 97, 59, 111)
        check(q, k, v, seed=seed)


def test_runs_on_given_stream_and_in_cuda_graph():
    cuda = require_cuda_module()
    import torch

    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, np.float16, 2, 8, 2, 1, 3000, 128, 128)  # split-KV: workspace too
    tq, tk, tv = to_device(q), to_device(k), to_device(v)
    expect = cuda.fused_attention(tq, tk, tv).clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = cuda.fused_attention(tq, tk, tv)
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(y, expect, rtol=0, atol=0)

    static_out = torch.full_like(expect, float("nan"))
    with torch.cuda.stream(side):
        cuda.fused_attention(tq, tk, tv, out=static_out)  # warm-up outside capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            cuda.fused_attention(tq, tk, tv, out=static_out)
    static_out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(static_out, expect, rtol=0, atol=0)


def test_cupy_arrays():
    cupy = pytest.importorskip("cupy", reason="CuPy not installed")
    cuda = require_cuda_module()
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, np.float16, 1, 4, 2, 40, 80, 64, 64)
    y = cuda.fused_attention(cupy.asarray(q), cupy.asarray(k), cupy.asarray(v), is_causal=1)
    assert isinstance(y, cupy.ndarray)
    assert_within_2x_torch(cupy.asnumpy(y), q, k, v, is_causal=1, what=f"cupy (seed {seed})")


def test_errors_are_exceptions():
    cuda = require_cuda_module()
    import torch

    q = torch.randn(1, 4, 8, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(1, 3, 8, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="FusedAttention.*multiple"):
        cuda.fused_attention(q, k, k)
    with pytest.raises(ValueError, match="FusedAttention.*head size"):
        big = torch.randn(1, 1, 2, 300, device="cuda", dtype=torch.float16)
        cuda.fused_attention(big, big, big)
    with pytest.raises(ValueError, match="FusedAttention.*is_causal"):
        cuda.fused_attention(q, q, q, is_causal=3)
    with pytest.raises(ValueError, match="FusedAttention.*element type"):
        cuda.fused_attention(q, q.float(), q)
    with pytest.raises(ValueError, match="FusedAttention.*attn_mask"):
        cuda.fused_attention(q, q, q, attn_mask=torch.ones(3, 5, device="cuda", dtype=torch.bool))
