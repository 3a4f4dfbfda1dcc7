"""The Triton golden kernel against the float64 reference, feature by feature.

Rule (as flash-attention's tests): the kernel's max abs error against the float64 reference is at
most twice PyTorch's own error when PyTorch computes the same thing in the same dtype (explicit
matmul / softmax in T), plus a small absolute floor where both are at float32 rounding level.
Outputs are poisoned with NaN before every run; inputs are fresh random data.

On a machine without a GPU the kernel runs in Triton's interpreter (CPU tensors, small shapes);
``@pytest.mark.gpu`` tests repeat the checks on CUDA at larger sizes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

# Imported first: chooses Triton's interpreter (TRITON_INTERPRET=1) when there is no GPU, which
# must happen before anything else imports triton.
from opsfuse import triton_attention as ta
from opsfuse.reference import attention_reference

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Floor added to 2 x torch's error: float32 errors of both are ~1e-7 and their ratio is noise.
ABS_FLOOR = {torch.float32: 1e-6, torch.float16: 0.0, torch.bfloat16: 0.0}

DEVICE = ta.default_device()


def torch_attention(q, k, v, attn_mask=None, key_lengths=None, scale=None, is_causal=0,
                    softcap=0.0):
    """The contract computed by PyTorch in the inputs' own dtype (the precision baseline)."""
    b, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    k = k.repeat_interleave(hq // hkv, dim=1)
    v = v.repeat_interleave(hq // hkv, dim=1)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    visible = torch.ones((b, hq, sq, sk), dtype=torch.bool, device=q.device)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            visible = visible & attn_mask
        else:
            s = s + attn_mask
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    if is_causal == 1:
        visible = visible & (j <= i)
    elif is_causal == 2:
        visible = visible & (j <= i + (sk - sq))
    if key_lengths is not None:
        visible = visible & (j[None] < key_lengths.long()[:, None, None])[:, None]
    s = s.masked_fill(~visible, float("-inf"))
    p = torch.softmax(s, dim=-1)
    p = torch.nan_to_num(p, nan=0.0)  # fully-masked rows: softmax of all -inf
    return torch.matmul(p, v)


def rand(*shape, dtype, gen):
    return torch.randn(*shape, generator=gen, dtype=torch.float32).to(dtype).to(DEVICE)


def check(q, k, v, attn_mask=None, key_lengths=None, scale=None, is_causal=0, softcap=0.0,
          **blocks):
    """Run the kernel into a NaN-poisoned output and apply the 2x-PyTorch rule."""
    b, hq, sq, _ = q.shape
    out = torch.full((b, hq, sq, v.shape[-1]), float("nan"), dtype=q.dtype, device=q.device)
    y = ta.attention(q, k, v, attn_mask, key_lengths, scale=scale, is_causal=is_causal,
                     softcap=softcap, out=out, **blocks)
    assert y is out

    def np64(t):
        return None if t is None else t.detach().cpu().to(torch.float64 if t.is_floating_point() else t.dtype).numpy()

    ref = attention_reference(np64(q), np64(k), np64(v), np64(attn_mask), np64(key_lengths),
                              scale=scale, is_causal=is_causal, softcap=softcap)
    y64 = np64(y)
    assert not np.isnan(y64).any(), "NaN in the Triton output (poisoned output not overwritten?)"
    theirs = np64(torch_attention(q, k, v, attn_mask, key_lengths, scale, is_causal, softcap))
    err = float(np.abs(y64 - ref).max()) if ref.size else 0.0
    torch_err = float(np.nan_to_num(np.abs(theirs - ref), nan=np.inf).max()) if ref.size else 0.0
    tol = 2.0 * torch_err + ABS_FLOOR[q.dtype]
    assert err <= tol, f"Triton error {err:.3e} > 2 x PyTorch error {torch_err:.3e} (+ floor)"
    return y64, ref


# --- core shapes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("sq,sk", [(97, 97), (1, 97), (97, 1), (1, 1), (33, 200)])
def test_shapes_and_dtypes(dtype, sq, sk):
    gen = torch.Generator().manual_seed(sq * 1000 + sk)
    q = rand(1, 2, sq, 40, dtype=dtype, gen=gen)
    k = rand(1, 2, sk, 40, dtype=dtype, gen=gen)
    v = rand(1, 2, sk, 40, dtype=dtype, gen=gen)
    check(q, k, v)


@pytest.mark.parametrize("d,dv", [(40, 40), (80, 24), (96, 96), (128, 128), (256, 256), (64, 200)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_head_dims(dtype, d, dv):
    gen = torch.Generator().manual_seed(d * 7 + dv)
    q = rand(1, 1, 33, d, dtype=dtype, gen=gen)
    k = rand(1, 1, 50, d, dtype=dtype, gen=gen)
    v = rand(1, 1, 50, dv, dtype=dtype, gen=gen)
    check(q, k, v)


def test_long_sequence_causal():
    gen = torch.Generator().manual_seed(1)
    q = rand(1, 1, 1025, 16, dtype=torch.float16, gen=gen)
    k = rand(1, 1, 1025, 16, dtype=torch.float16, gen=gen)
    v = rand(1, 1, 1025, 16, dtype=torch.float16, gen=gen)
    check(q, k, v, is_causal=1)


@pytest.mark.parametrize("hq,hkv", [(4, 2), (4, 1), (6, 3)])
def test_gqa_mqa(hq, hkv):
    gen = torch.Generator().manual_seed(hq * 10 + hkv)
    q = rand(2, hq, 17, 32, dtype=torch.float32, gen=gen)
    k = rand(2, hkv, 23, 32, dtype=torch.float32, gen=gen)
    v = rand(2, hkv, 23, 32, dtype=torch.float32, gen=gen)
    y, _ = check(q, k, v)
    # Query heads of one group read the same K/V: feeding K/V repeated per head gives the same Y.
    rep = hq // hkv
    y_full = ta.attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1))
    np.testing.assert_array_equal(y, y_full.double().cpu().numpy())


def test_scale_attribute():
    gen = torch.Generator().manual_seed(5)
    q = rand(1, 2, 19, 24, dtype=torch.float32, gen=gen)
    k = rand(1, 2, 21, 24, dtype=torch.float32, gen=gen)
    v = rand(1, 2, 21, 24, dtype=torch.float32, gen=gen)
    y, _ = check(q, k, v, scale=0.37)
    y_default = ta.attention(q, k, v)
    assert not np.allclose(y, y_default.double().cpu().numpy(), atol=1e-3)


def test_non_contiguous_inputs():
    # (B, S, H, D) tensors viewed as (B, H, S, D), as exporters produce after a Transpose.
    gen = torch.Generator().manual_seed(6)
    q = rand(2, 13, 3, 32, dtype=torch.float16, gen=gen).transpose(1, 2)
    k = rand(2, 29, 3, 32, dtype=torch.float16, gen=gen).transpose(1, 2)
    v = rand(2, 29, 3, 32, dtype=torch.float16, gen=gen).transpose(1, 2)
    assert not q.is_contiguous()
    check(q, k, v, is_causal=2)


# --- masks ---------------------------------------------------------------------------------------

B, HQ, SQ, SK = 2, 2, 19, 37
MASK_SHAPES = [(SQ, SK), (1, SK), (HQ, SQ, SK), (B, 1, 1, SK), (1, HQ, SQ, SK), (B, HQ, SQ, SK),
               (B, HQ, 1, 1)]


@pytest.mark.parametrize("mask_shape", MASK_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bool_mask_broadcast(dtype, mask_shape):
    gen = torch.Generator().manual_seed(hash(mask_shape) % 1000)
    q = rand(B, HQ, SQ, 32, dtype=dtype, gen=gen)
    k = rand(B, 1, SK, 32, dtype=dtype, gen=gen)
    v = rand(B, 1, SK, 32, dtype=dtype, gen=gen)
    mask = (torch.rand(*mask_shape, generator=gen) > 0.3).to(DEVICE)
    check(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("mask_shape", MASK_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_additive_mask_broadcast(dtype, mask_shape):
    gen = torch.Generator().manual_seed(hash(mask_shape) % 1000 + 1)
    q = rand(B, HQ, SQ, 32, dtype=dtype, gen=gen)
    k = rand(B, 2, SK, 32, dtype=dtype, gen=gen)
    v = rand(B, 2, SK, 32, dtype=dtype, gen=gen)
    mask = torch.randn(*mask_shape, generator=gen) * 2.0
    mask[torch.rand(*mask_shape, generator=gen) > 0.8] = float("-inf")
    check(q, k, v, attn_mask=mask.to(dtype).to(DEVICE))


# --- causal, key_lengths, softcap ---------------------------------------------------------------


@pytest.mark.parametrize("is_causal", [0, 1, 2])
@pytest.mark.parametrize("sq,sk", [(31, 31), (7, 45), (45, 7), (1, 45), (45, 1)])
def test_causal(is_causal, sq, sk):
    gen = torch.Generator().manual_seed(sq * 100 + sk + is_causal)
    q = rand(1, 2, sq, 16, dtype=torch.float32, gen=gen)
    k = rand(1, 2, sk, 16, dtype=torch.float32, gen=gen)
    v = rand(1, 2, sk, 16, dtype=torch.float32, gen=gen)
    y, ref = check(q, k, v, is_causal=is_causal)
    if is_causal == 2 and sq > sk:
        # Lower-right alignment: the first Sq - Sk queries see no key at all -> zeros.
        assert (y[:, :, : sq - sk] == 0).all()


@pytest.mark.parametrize("kl_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_key_lengths(dtype, kl_dtype):
    gen = torch.Generator().manual_seed(11)
    q = rand(4, 2, 9, 32, dtype=dtype, gen=gen)
    k = rand(4, 2, 70, 32, dtype=dtype, gen=gen)
    v = rand(4, 2, 70, 32, dtype=dtype, gen=gen)
    lengths = torch.tensor([70, 1, 0, 33], dtype=kl_dtype, device=DEVICE)
    y, _ = check(q, k, v, key_lengths=lengths)
    assert (y[2] == 0).all()  # key_lengths = 0: every key masked
    # Keys past the length do not matter.
    k2, v2 = k.clone(), v.clone()
    k2[3, :, 33:] = 100.0
    v2[3, :, 33:] = -1e4
    y2 = ta.attention(q, k2, v2, key_lengths=lengths)
    np.testing.assert_array_equal(y[3], y2[3].double().cpu().numpy())


def test_key_lengths_with_mask_and_causal():
    gen = torch.Generator().manual_seed(12)
    q = rand(2, 2, 40, 32, dtype=torch.float16, gen=gen)
    k = rand(2, 2, 40, 32, dtype=torch.float16, gen=gen)
    v = rand(2, 2, 40, 32, dtype=torch.float16, gen=gen)
    mask = (torch.rand(2, 1, 40, 40, generator=gen) > 0.2).to(DEVICE)
    lengths = torch.tensor([25, 40], dtype=torch.int64, device=DEVICE)
    check(q, k, v, attn_mask=mask, key_lengths=lengths, is_causal=1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("softcap", [0.5, 5.0, 50.0])
def test_softcap(dtype, softcap):
    gen = torch.Generator().manual_seed(int(softcap * 10))
    q = rand(1, 2, 21, 32, dtype=dtype, gen=gen) * 3
    k = rand(1, 2, 43, 32, dtype=dtype, gen=gen) * 3
    v = rand(1, 2, 43, 32, dtype=dtype, gen=gen)
    check(q, k, v, softcap=softcap)


def test_softcap_before_additive_mask():
    # Softcap applies to the scores before the mask is added: a mask far larger than the cap
    # must still shift the scores by its full value.
    gen = torch.Generator().manual_seed(13)
    q = rand(1, 1, 8, 16, dtype=torch.float32, gen=gen)
    k = rand(1, 1, 8, 16, dtype=torch.float32, gen=gen)
    v = rand(1, 1, 8, 16, dtype=torch.float32, gen=gen)
    mask = torch.zeros(8, 8)
    mask[:, 3] = 30.0  # >> softcap: key 3 dominates every row
    y, _ = check(q, k, v, attn_mask=mask.to(DEVICE), softcap=1.0)
    np.testing.assert_allclose(y[0, 0], np.broadcast_to(v[0, 0, 3].double().cpu().numpy(), (8, 16)),
                               atol=1e-6)


SMALL_TILE_CASES = (
    [(torch.float32, c, sq, sk) for c in (0, 1, 2) for sq, sk in [(50, 50), (21, 50), (50, 21)]]
    + [(t, c, 50, 37) for t in (torch.float16, torch.bfloat16) for c in (0, 2)]
)


@pytest.mark.parametrize("dtype,is_causal,sq,sk", SMALL_TILE_CASES, ids=str)
def test_small_tiles_every_feature(dtype, is_causal, sq, sk):
    # 16 x 16 tiles: several key tiles per row block, partial last tiles, rows whose visible keys
    # start or end mid-tile, tiles fully masked for some rows: the online softmax across tiles.
    gen = torch.Generator().manual_seed(sq + sk + is_causal)
    q = rand(2, 2, sq, 24, dtype=dtype, gen=gen)
    k = rand(2, 1, sk, 24, dtype=dtype, gen=gen)
    v = rand(2, 1, sk, 40, dtype=dtype, gen=gen)
    mask = torch.randn(2, 1, sq, sk, generator=gen)
    mask[:, :, :, 16:32] = float("-inf")  # one key tile masked for every row
    mask[:, :, 5] = float("-inf")  # one query row masked entirely
    lengths = torch.tensor([sk - 3, 13], dtype=torch.int32, device=DEVICE)
    check(q, k, v, mask.to(dtype).to(DEVICE), lengths, scale=0.3, is_causal=is_causal,
          softcap=3.0, block_m=16, block_n=16)


# --- fully masked rows ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_fully_masked_rows_are_zero(dtype, kind):
    gen = torch.Generator().manual_seed(14)
    q = rand(1, 2, 12, 32, dtype=dtype, gen=gen)
    k = rand(1, 2, 150, 32, dtype=dtype, gen=gen)  # several key tiles
    v = rand(1, 2, 150, 32, dtype=dtype, gen=gen)
    allowed = torch.rand(1, 2, 12, 150, generator=gen) > 0.5
    allowed[0, 0, 3] = False
    allowed[0, 1, 11] = False
    if kind == "bool":
        mask = allowed
    else:
        mask = torch.zeros(1, 2, 12, 150).masked_fill(~allowed, float("-inf")).to(dtype)
    y, _ = check(q, k, v, attn_mask=mask.to(DEVICE), softcap=2.0)
    assert (y[0, 0, 3] == 0).all() and (y[0, 1, 11] == 0).all()


def test_empty_key_sequence():
    q = torch.randn(1, 2, 3, 8).to(DEVICE)
    k = torch.randn(1, 2, 0, 8).to(DEVICE)
    v = torch.randn(1, 2, 0, 8).to(DEVICE)
    out = torch.full((1, 2, 3, 8), float("nan"), device=DEVICE)
    ta.attention(q, k, v, out=out)
    assert (out == 0).all()


# --- numpy front end and errors ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_numpy_front_end(dtype):
    import ml_dtypes

    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(15)
    q = rng.standard_normal((1, 2, 5, 16)).astype(np_dtype)
    k = rng.standard_normal((1, 1, 9, 16)).astype(np_dtype)
    v = rng.standard_normal((1, 1, 9, 16)).astype(np_dtype)
    mask = rng.random((5, 9)) > 0.3
    y = ta.attention_numpy(q, k, v, mask, np.array([7], dtype=np.int32), is_causal=2)
    assert y.dtype == np_dtype and y.shape == (1, 2, 5, 16)
    ref = attention_reference(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                              mask, np.array([7]), is_causal=2)
    tol = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 2e-2}[dtype]
    np.testing.assert_allclose(y.astype(np.float64), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("bad,match", [
    (dict(q=(1, 3, 4, 8), k=(1, 2, 5, 8), v=(1, 2, 5, 8)), "multiple of key/value heads"),
    (dict(k=(1, 1, 5, 16)), "head size of K"),
    (dict(v=(1, 1, 6, 8)), "disagree"),
    (dict(q=(2, 2, 4, 8)), "batch sizes"),
    (dict(q=(2, 4, 8)), "4-D"),
    (dict(q=(1, 2, 4, 300), k=(1, 1, 5, 300)), "head sizes"),
    (dict(mask=(3, 5)), "does not broadcast"),
    (dict(mask=(5,)), "rank 2 to 4"),
    (dict(mask_dtype=torch.int32), "expected bool"),
    (dict(kl=(2,)), "key_lengths must have shape"),
    (dict(kl_dtype=torch.float32), "key_lengths has dtype"),
    (dict(is_causal=3), "is_causal"),
    (dict(softcap=-1.0), "softcap"),
    (dict(block_n=24), "block_n must be a power of two"),
])
def test_bad_inputs_raise(bad, match):
    q = torch.randn(*bad.get("q", (1, 2, 4, 8))).to(DEVICE)
    k = torch.randn(*bad.get("k", (1, 1, 5, q.shape[-1]))).to(DEVICE)
    v = torch.randn(*bad.get("v", (1, 1, 5, 8))).to(DEVICE)
    mask = None
    if "mask" in bad or "mask_dtype" in bad:
        mask = torch.ones(*bad.get("mask", (4, 5)), dtype=bad.get("mask_dtype", torch.bool)).to(DEVICE)
    kl = None
    if "kl" in bad or "kl_dtype" in bad:
        kl = torch.ones(*bad.get("kl", (1,)), dtype=bad.get("kl_dtype", torch.int32)).to(DEVICE)
    with pytest.raises(ValueError, match=f"FusedAttention: .*{match}"):
        ta.attention(q, k, v, mask, kl, is_causal=bad.get("is_causal", 0),
                     softcap=bad.get("softcap", 0.0), block_n=bad.get("block_n"))


# --- the same checks on a GPU at larger sizes -----------------------------------------------------

gpu_only = pytest.mark.skipif(ta.INTERPRET, reason="Triton runs interpreted in this process")


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", [40, 80, 96, 128, 256])
@pytest.mark.parametrize("sq,sk", [(1025, 1025), (1, 1025), (97, 1025), (1025, 97)])
def test_gpu_large(dtype, d, sq, sk):
    gen = torch.Generator().manual_seed(d + sq + sk)
    q = rand(1, 4, sq, d, dtype=dtype, gen=gen)
    k = rand(1, 2, sk, d, dtype=dtype, gen=gen)
    v = rand(1, 2, sk, d, dtype=dtype, gen=gen)
    check(q, k, v, is_causal=2)


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_every_feature(dtype):
    gen = torch.Generator().manual_seed(99)
    b, hq, hkv, sq, sk, d = 3, 4, 2, 257, 1025, 128
    q = rand(b, hq, sq, d, dtype=dtype, gen=gen)
    k = rand(b, hkv, sk, d, dtype=dtype, gen=gen)
    v = rand(b, hkv, sk, 96, dtype=dtype, gen=gen)
    for mask in [(torch.rand(b, 1, sq, sk, generator=gen) > 0.2).to(DEVICE),
                 (torch.randn(1, hq, 1, sk, generator=gen)).to(dtype).to(DEVICE)]:
        for kl_dtype in (torch.int32, torch.int64):
            lengths = torch.tensor([1025, 0, 700], dtype=kl_dtype, device=DEVICE)
            for is_causal in (0, 1, 2):
                check(q, k, v, mask, lengths, scale=0.1, is_causal=is_causal, softcap=20.0)


# --- the 3-D form (B, S, H*D) with q_num_heads / kv_num_heads -------------------------------------


def _split(t, heads):
    return t.unflatten(2, (heads, t.shape[2] // heads)).transpose(1, 2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hq,hkv,sq,sk,d,dv", [(6, 2, 7, 33, 40, 24), (4, 1, 1, 17, 64, 64), (3, 3, 19, 5, 16, 32)])
def test_3d_form_matches_the_4d_form_and_the_reference(dtype, hq, hkv, sq, sk, d, dv):
    # A seed per case, as the rest of this file: this file's 2x rule has no rounding floor for
    # bfloat16, and a lucky-exact PyTorch on a small output fails it now and then on fresh data.
    gen = torch.Generator().manual_seed(hq * 100000 + sq * 1000 + sk * 10 + d)
    q = rand(2, sq, hq * d, dtype=dtype, gen=gen)
    k = rand(2, sk, hkv * d, dtype=dtype, gen=gen)
    v = rand(2, sk, hkv * dv, dtype=dtype, gen=gen)
    mask = rand(2, 1, sq, sk, dtype=dtype, gen=gen)
    lengths = torch.tensor([sk, max(1, sk // 2)], dtype=torch.int64, device=DEVICE)
    attrs = dict(is_causal=2, softcap=4.0, scale=0.3)
    y3 = ta.attention(q, k, v, mask, lengths, q_num_heads=hq, kv_num_heads=hkv, block_m=16, block_n=16, **attrs)
    assert tuple(y3.shape) == (2, sq, hq * dv) and y3.dtype == dtype
    # The float64 reference on the 4-D views (2x rule), then the 4-D form on contiguous copies of
    # the same data: the kernel reads both through strides, so the results are bitwise equal.
    q4, k4, v4 = (_split(t, h).contiguous() for t, h in ((q, hq), (k, hkv), (v, hkv)))
    y4, _ = check(q4, k4, v4, mask, lengths, block_m=16, block_n=16, **attrs)
    y3_as_4d = _split(y3, hq).to(torch.float64).cpu().numpy()
    np.testing.assert_array_equal(y3_as_4d, y4)


def test_3d_form_is_read_through_views_not_copies():
    t = torch.randn(2, 5, 6 * 8, device=DEVICE)
    view = ta.split_heads(t, 6, "Q", "q_num_heads")
    assert view.shape == (2, 6, 5, 8) and view.data_ptr() == t.data_ptr()
    assert view.stride() == (5 * 48, 8, 48, 1)
    assert torch.equal(view[1, 4, 3], t[1, 3, 4 * 8:5 * 8])


def test_3d_numpy_front_end_and_default_scale():
    rng = np.random.default_rng()
    q = rng.standard_normal((1, 6, 4 * 40)).astype(np.float32)
    k = rng.standard_normal((1, 9, 2 * 40)).astype(np.float32)
    v = rng.standard_normal((1, 9, 2 * 24)).astype(np.float32)
    y = ta.attention_numpy(q, k, v, q_num_heads=4, kv_num_heads=2, is_causal=1)
    assert y.shape == (1, 6, 4 * 24)
    ref = attention_reference(q, k, v, q_num_heads=4, kv_num_heads=2, is_causal=1)  # scale 1/sqrt(40)
    np.testing.assert_allclose(y, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shapes,heads,match", [
    (((1, 4, 16), (1, 2, 5, 8), (1, 2, 5, 8)), (2, 2), "all be 4-D .* or all 3-D"),
    (((1, 4, 16), (1, 5, 8), (1, 5, 8)), (None, 1), "so q_num_heads is required"),
    (((1, 4, 16), (1, 5, 8), (1, 5, 8)), (2, None), "so kv_num_heads is required"),
    (((1, 4, 18), (1, 5, 8), (1, 5, 8)), (4, 1), "Q's last dimension 18 is not a multiple of q_num_heads 4"),
    (((1, 4, 16), (1, 5, 8), (1, 5, 7)), (2, 2), "V's last dimension 7 is not a multiple of kv_num_heads 2"),
    (((1, 2, 4, 8), (1, 1, 5, 8), (1, 1, 5, 8)), (4, 1), "q_num_heads = 4 does not match Q's head dimension 2"),
])
def test_3d_bad_arguments_raise(shapes, heads, match):
    q, k, v = (torch.randn(*s, device=DEVICE) for s in shapes)
    with pytest.raises(ValueError, match=f"FusedAttention: .*{match}"):
        ta.attention(q, k, v, q_num_heads=heads[0], kv_num_heads=heads[1])


def test_golden_runs_a_3d_node():
    from onnx import helper

    from opsfuse import golden

    rng = np.random.default_rng()
    q = rng.standard_normal((2, 5, 6 * 16)).astype(np.float32)
    k = rng.standard_normal((2, 7, 2 * 16)).astype(np.float32)
    v = rng.standard_normal((2, 7, 2 * 8)).astype(np.float32)
    node = helper.make_node("FusedAttention", ["Q", "K", "V"], ["Y"], domain="com.opsfuse", name="n3d",
                            q_num_heads=6, kv_num_heads=2, softcap=5.0)
    y = golden.run_fused_attention(node, [q, k, v])
    ref = attention_reference(q, k, v, softcap=5.0, q_num_heads=6, kv_num_heads=2)
    assert y.shape == (2, 5, 6 * 8)
    np.testing.assert_allclose(y, ref, atol=1e-5, rtol=1e-5)


# --- packed Q/K/V (packed_qkv = 1): column windows of (B, S, (Hq + 2*Hkv)*D) inputs ---------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hq,hkv,s,d", [(6, 2, 7, 40), (4, 1, 1, 64), (3, 3, 19, 16)])
@pytest.mark.parametrize("shared", [True, False], ids=["one_tensor", "three_tensors"])
def test_packed_qkv_matches_the_unpacked_3d_form(dtype, hq, hkv, s, d, shared):
    gen = torch.Generator().manual_seed(hq * 100000 + s * 1000 + d * 10 + shared)
    width = (hq + 2 * hkv) * d
    p = rand(2, s, width, dtype=dtype, gen=gen)
    k, v = (p, p) if shared else (rand(2, s, width, dtype=dtype, gen=gen), rand(2, s, width, dtype=dtype, gen=gen))
    mask = rand(2, 1, s, s, dtype=dtype, gen=gen)
    lengths = torch.tensor([s, max(1, s // 2)], dtype=torch.int64, device=DEVICE)
    attrs = dict(is_causal=1, softcap=4.0)
    heads = dict(q_num_heads=hq, kv_num_heads=hkv)
    y = ta.attention(p, k, v, mask, lengths, packed_qkv=1, block_m=16, block_n=16, **heads, **attrs)
    assert tuple(y.shape) == (2, s, hq * d) and y.dtype == dtype
    # The unpacked 3-D form on contiguous copies of the windows: bitwise equal (strides only).
    qw, kw, vw = p[..., :hq * d], k[..., hq * d:(hq + hkv) * d], v[..., (hq + hkv) * d:]
    y3 = ta.attention(qw.contiguous(), kw.contiguous(), vw.contiguous(), mask, lengths, block_m=16, block_n=16,
                      **heads, **attrs)
    assert torch.equal(y, y3)
    # And the float64 reference on the windows (2x rule), through the 4-D views.
    y4, _ = check(*(_split(t, h).contiguous() for t, h in ((qw, hq), (kw, hkv), (vw, hkv))), mask, lengths,
                  block_m=16, block_n=16, **attrs)
    np.testing.assert_array_equal(_split(y, hq).to(torch.float64).cpu().numpy(), y4)


def test_packed_qkv_windows_are_views_at_the_right_columns():
    t = torch.randn(2, 5, (6 + 2 * 2) * 8, device=DEVICE)
    q, k, v = ta.packed_qkv_windows(t, t, t, 6, 2)
    assert (q.shape, k.shape, v.shape) == ((2, 5, 48), (2, 5, 16), (2, 5, 16))
    assert q.data_ptr() == t.data_ptr()
    assert k.data_ptr() == t.data_ptr() + 48 * t.element_size()
    assert v.data_ptr() == t.data_ptr() + 64 * t.element_size()
    assert k.stride() == v.stride() == (5 * 80, 80, 1)


def test_packed_qkv_numpy_front_end_and_golden_node():
    from onnx import helper

    from opsfuse import golden

    rng = np.random.default_rng()
    p = rng.standard_normal((2, 5, (6 + 2 * 2) * 16)).astype(np.float32)
    y = ta.attention_numpy(p, p, p, q_num_heads=6, kv_num_heads=2, packed_qkv=1)
    ref = attention_reference(p, p, p, q_num_heads=6, kv_num_heads=2, packed_qkv=1)  # scale 1/sqrt(16)
    assert y.shape == (2, 5, 6 * 16)
    np.testing.assert_allclose(y, ref, atol=1e-5, rtol=1e-5)
    node = helper.make_node("FusedAttention", ["P", "P", "P"], ["Y"], domain="com.opsfuse", name="packed",
                            q_num_heads=6, kv_num_heads=2, packed_qkv=1, is_causal=1)
    y = golden.run_fused_attention(node, [p, p, p])
    ref = attention_reference(p, p, p, q_num_heads=6, kv_num_heads=2, packed_qkv=1, is_causal=1)
    np.testing.assert_allclose(y, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shapes,heads,packed,match", [
    (((1, 2, 4, 8),) * 3, (2, 1), 1, "packed_qkv = 1 needs the 3-D form"),
    (((1, 4, 32), (1, 4, 32), (1, 4, 24)), (2, 1), 1, "must have the same shape"),
    (((1, 4, 30),) * 3, (2, 1), 1, "must be a multiple of q_num_heads \\+ 2\\*kv_num_heads = 4"),
    (((1, 4, 32),) * 3, (2, None), 1, "requires q_num_heads and kv_num_heads"),
    (((1, 4, 32),) * 3, (2, 1), 2, "packed_qkv must be 0 or 1"),
])
def test_packed_qkv_bad_arguments_raise(shapes, heads, packed, match):
    q, k, v = (torch.randn(*s, device=DEVICE) for s in shapes)
    with pytest.raises(ValueError, match=f"FusedAttention: .*{match}"):
        ta.attention(q, k, v, q_num_heads=heads[0], kv_num_heads=heads[1], packed_qkv=packed)


# --- qkv_bias (packed_qkv = 1): Q, K, V are the windows of P + qkv_bias -----------------------------


def _packed_torch_attention(p, bias, hq, hkv, attn_mask=None, key_lengths=None, **attrs):
    """PyTorch's baseline for a packed node with a bias: the graph's Add in T (P + bias rounded to T
    once, as the Add qkv_bias replaces), the windows split into heads, then torch_attention in T."""
    pb = p + bias
    d = p.shape[2] // (hq + 2 * hkv)
    q, k, v = pb[..., :hq * d], pb[..., hq * d:(hq + hkv) * d], pb[..., (hq + hkv) * d:]
    y4 = torch_attention(_split(q, hq), _split(k, hkv), _split(v, hkv), attn_mask, key_lengths, **attrs)
    return y4.transpose(1, 2).flatten(2)


def check_packed_bias(p, bias, hq, hkv, attn_mask=None, key_lengths=None, scale=None, is_causal=0, softcap=0.0,
                      **blocks):
    """The packed kernel with qkv_bias into a NaN-poisoned output, held to the 2x-PyTorch rule against
    the float64 reference (which sums P + bias exactly). The floor is float32 rounding at the
    output's size (a 100x bias makes outputs ~100)."""
    b, s, width = p.shape
    d = width // (hq + 2 * hkv)
    out = torch.full((b, s, hq * d), float("nan"), dtype=p.dtype, device=p.device)
    attrs = dict(scale=scale, is_causal=is_causal, softcap=softcap)
    y = ta.attention(p, p, p, attn_mask, key_lengths, out=out, q_num_heads=hq, kv_num_heads=hkv, packed_qkv=1,
                     qkv_bias=bias, **attrs, **blocks)
    assert y is out

    def np64(t):
        return None if t is None else t.detach().cpu().to(torch.float64 if t.is_floating_point() else t.dtype).numpy()

    ref = attention_reference(np64(p), np64(p), np64(p), np64(attn_mask), np64(key_lengths), q_num_heads=hq,
                              kv_num_heads=hkv, packed_qkv=1, qkv_bias=np64(bias), **attrs)
    y64 = np64(y)
    assert not np.isnan(y64).any(), "NaN in the Triton output (poisoned output not overwritten?)"
    theirs = np64(_packed_torch_attention(p, bias, hq, hkv, attn_mask, key_lengths, **attrs))
    err = float(np.abs(y64 - ref).max())
    torch_err = float(np.nan_to_num(np.abs(theirs - ref), nan=np.inf).max())
    tol = 2.0 * torch_err + ABS_FLOOR[p.dtype] * max(1.0, float(np.abs(ref).max()))
    assert err <= tol, f"Triton error {err:.3e} > 2 x PyTorch error {torch_err:.3e} (+ floor)"
    return y64, ref


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bias_scale", [0.5, 100.0], ids=["small_bias", "bias_100x"])
@pytest.mark.parametrize("hq,hkv,s,d,softcap", [(6, 2, 19, 40, 0.0), (4, 1, 7, 17, 30.0), (3, 3, 33, 16, 5.0)])
def test_packed_qkv_bias_against_the_reference(dtype, bias_scale, hq, hkv, s, d, softcap):
    # GQA windows (Hkv < Hq), an odd D, several tiles (16 x 16), and softcap (where K's bias does
    # not cancel in the softmax), with biases at the projections' scale and 100x it.
    gen = torch.Generator().manual_seed(hq * 10000 + s * 100 + d + int(bias_scale))
    width = (hq + 2 * hkv) * d
    p = rand(2, s, width, dtype=dtype, gen=gen)
    bias = (bias_scale * torch.randn(width, generator=gen)).to(dtype).to(DEVICE)
    mask = rand(2, 1, s, s, dtype=dtype, gen=gen)
    lengths = torch.tensor([s, max(1, s // 2)], dtype=torch.int64, device=DEVICE)
    y, ref = check_packed_bias(p, bias, hq, hkv, mask, lengths, is_causal=1, softcap=softcap, scale=0.3,
                               block_m=16, block_n=16)
    assert y.shape == (2, s, hq * d)
    # The bias is not dropped: without it the reference differs by far more than the tolerance.
    unbiased = attention_reference(p.double().cpu().numpy(), p.double().cpu().numpy(), p.double().cpu().numpy(),
                                   mask.double().cpu().numpy(), lengths.cpu().numpy(), scale=0.3, is_causal=1,
                                   softcap=softcap, q_num_heads=hq, kv_num_heads=hkv, packed_qkv=1)
    assert np.abs(ref - unbiased).max() > 0.1 * bias_scale


def test_packed_qkv_bias_equals_adding_it_first_in_float32():
    # float32: the kernel's float32 sum on load is the sum a separate Add writes, so the two graphs
    # give bitwise the same Y (the sums and every later operation are the same float32 ops).
    gen = torch.Generator().manual_seed(21)
    hq, hkv, d = 4, 2, 24
    p = rand(2, 37, (hq + 2 * hkv) * d, dtype=torch.float32, gen=gen)
    bias = 3.0 * rand((hq + 2 * hkv) * d, dtype=torch.float32, gen=gen)
    heads = dict(q_num_heads=hq, kv_num_heads=hkv, packed_qkv=1, softcap=7.0, is_causal=2, block_m=16, block_n=16)
    y = ta.attention(p, p, p, qkv_bias=bias, **heads)
    added = p + bias
    assert torch.equal(y, ta.attention(added, added, added, **heads))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_packed_qkv_bias_fully_masked_rows_are_zero(dtype):
    # All probabilities of such a row are zero: V's bias must not reach it (zeros, not b_v).
    gen = torch.Generator().manual_seed(22)
    hq, hkv, d, s = 4, 2, 16, 40
    p = rand(3, s, (hq + 2 * hkv) * d, dtype=dtype, gen=gen)
    bias = (100.0 * torch.randn((hq + 2 * hkv) * d, generator=gen)).to(dtype).to(DEVICE)
    allowed = torch.rand(3, 1, s, s, generator=gen) > 0.3
    allowed[0, 0, 5] = False
    lengths = torch.tensor([s, 0, 9], dtype=torch.int32, device=DEVICE)
    y, _ = check_packed_bias(p, bias, hq, hkv, allowed.to(DEVICE), lengths, block_m=16, block_n=16)
    assert (y[0, 5] == 0).all() and (y[1] == 0).all()
    assert (y[2] != 0).all()


def test_packed_qkv_bias_numpy_front_end_and_golden_node():
    from onnx import helper

    from opsfuse import golden

    rng = np.random.default_rng(23)
    hq, hkv, d = 6, 2, 16
    p = rng.standard_normal((2, 5, (hq + 2 * hkv) * d)).astype(np.float32)
    bias = (20.0 * rng.standard_normal((hq + 2 * hkv) * d)).astype(np.float32)
    heads = dict(q_num_heads=hq, kv_num_heads=hkv, packed_qkv=1)
    ref = attention_reference(p, p, p, qkv_bias=bias, softcap=8.0, **heads)
    y = ta.attention_numpy(p, p, p, qkv_bias=bias, softcap=8.0, **heads)
    np.testing.assert_allclose(y, ref, atol=1e-4, rtol=1e-5)
    # A node with all six inputs, attn_mask and key_lengths empty, as the rewrite writes it.
    node = helper.make_node("FusedAttention", ["P", "P", "P", "", "", "bias"], ["Y"], domain="com.opsfuse",
                            name="packed_bias", softcap=8.0, **heads)
    y = golden.run_fused_attention(node, [p, p, p, None, None, bias])
    np.testing.assert_allclose(y, ref, atol=1e-4, rtol=1e-5)
    lengths = np.array([5, 2], dtype=np.int64)
    node.input[4] = "kl"
    y = golden.run_fused_attention(node, [p, p, p, None, lengths, bias])
    np.testing.assert_allclose(y, attention_reference(p, p, p, None, lengths, qkv_bias=bias, softcap=8.0, **heads),
                               atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("bias,packed,match", [
    (dict(), 0, "qkv_bias is only allowed with packed_qkv = 1"),
    (dict(n=31), 1, r"qkv_bias must have shape \(\(q_num_heads \+ 2\*kv_num_heads\)\*D,\) = \(32,\), got \(31,\)"),
    (dict(shape=(1, 32)), 1, r"qkv_bias must have shape .* got \(1, 32\)"),
    (dict(dtype=torch.float16), 1, "qkv_bias has dtype torch.float16; expected Q's dtype torch.float32"),
])
def test_packed_qkv_bias_bad_arguments_raise(bias, packed, match):
    p = torch.randn(1, 4, 32, device=DEVICE)
    b = torch.zeros(bias.get("shape", (bias.get("n", 32),)), dtype=bias.get("dtype", torch.float32), device=DEVICE)
    with pytest.raises(ValueError, match=f"FusedAttention: .*{match}"):
        ta.attention(p, p, p, q_num_heads=2, kv_num_heads=1, packed_qkv=packed, qkv_bias=b)


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bias_scale", [0.5, 100.0], ids=["small_bias", "bias_100x"])
def test_gpu_packed_qkv_bias(dtype, bias_scale):
    gen = torch.Generator().manual_seed(24 + int(bias_scale))
    b, s, hq, hkv, d = 2, 513, 12, 4, 64
    width = (hq + 2 * hkv) * d
    p = rand(b, s, width, dtype=dtype, gen=gen)
    bias = (bias_scale * torch.randn(width, generator=gen)).to(dtype).to(DEVICE)
    lengths = torch.tensor([s, 300], dtype=torch.int64, device=DEVICE)
    for softcap in (0.0, 30.0):
        check_packed_bias(p, bias, hq, hkv, None, lengths, is_causal=1, softcap=softcap)
