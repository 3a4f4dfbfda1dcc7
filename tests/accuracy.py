"""The accuracy rule every kernel test uses: against the float64 reference, a kernel's error is at
most twice the error of PyTorch computing the same attention at the same precision, plus a floor
of rounding noise relative to the output's magnitude: half an ulp for float16/bfloat16 (so a
lucky-exact PyTorch cannot fail a correctly rounded kernel) and 4 ulps for float32, where
PyTorch's blocked matrix products sum more accurately than any streaming (online-softmax)
accumulation over thousands of keys, and both errors sit near 1e-7. NaN never passes."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from opsfuse.reference import attention_reference, causal_visible

_EPS = {
    np.dtype(np.float32): float(np.finfo(np.float32).eps),
    np.dtype(np.float16): float(np.finfo(np.float16).eps),
    np.dtype(ml_dtypes.bfloat16): float(ml_dtypes.finfo(ml_dtypes.bfloat16).eps),
}


def random_inputs(rng, dtype, b, hq, hkv, sq, sk, d, dv):
    """Fresh standard-normal Q, K, V (never zeros) in `dtype`."""
    q = rng.standard_normal((b, hq, sq, d)).astype(dtype)
    k = rng.standard_normal((b, hkv, sk, d)).astype(dtype)
    v = rng.standard_normal((b, hkv, sk, dv)).astype(dtype)
    return q, k, v


def biased_sums(x, bias):
    """x + bias (numpy broadcasting) twice: rounded to x's dtype from a float32 sum -- the graph's
    Add, and so the inputs of PyTorch's yardstick -- and exact in float64, the reference's inputs
    (assert_within_2x_torch's `exact`)."""
    rounded = (x.astype(np.float32) + bias.astype(np.float32)).astype(x.dtype)
    return rounded, x.astype(np.float64) + bias.astype(np.float64)


def random_mask(rng, kind, shape, dtype):
    """A fresh mask of `shape`: bool (70 % True) or additive in `dtype` (standard normal, 20 %
    -inf)."""
    if kind == "bool":
        return rng.random(shape) < 0.7
    mask = rng.standard_normal(shape).astype(dtype)
    mask[rng.random(shape) < 0.2] = -np.inf
    return mask


def torch_attention(q, k, v, attn_mask=None, key_lengths=None, scale=None, is_causal=0, softcap=0.0):
    """PyTorch computing the contract in the inputs' own precision (the yardstick of the 2x rule)."""
    import torch

    def to_torch(a):
        a = np.asarray(a)
        if a.dtype == np.dtype(ml_dtypes.bfloat16):
            return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
        return torch.from_numpy(np.ascontiguousarray(a))

    tq, tk, tv = to_torch(q), to_torch(k), to_torch(v)
    b, hq, sq, d = tq.shape
    hkv, sk = tk.shape[1], tk.shape[2]
    tk = tk.repeat_interleave(hq // hkv, dim=1)
    tv = tv.repeat_interleave(hq // hkv, dim=1)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    s = (tq @ tk.transpose(-1, -2)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    visible = torch.ones((b, hq, sq, sk), dtype=torch.bool)
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        if m.dtype == np.bool_:
            visible &= torch.from_numpy(np.broadcast_to(m, (b, hq, sq, sk)).copy())
        else:
            s = s + to_torch(m)
    visible &= torch.from_numpy(causal_visible(sq, sk, is_causal))
    if key_lengths is not None:
        lengths = torch.from_numpy(np.asarray(key_lengths).astype(np.int64))
        visible &= (torch.arange(sk)[None, :] < lengths[:, None])[:, None, None, :]
    s = s.masked_fill(~visible, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    out = p @ tv
    return out.float().numpy().astype(np.float64)


def max_abs_error(out, ref) -> float:
    out = np.asarray(out).astype(np.float64)
    if not np.all(np.isfinite(out)):
        return math.inf
    return float(np.max(np.abs(out - ref))) if out.size else 0.0


def assert_within_2x_torch(out, q, k, v, attn_mask=None, key_lengths=None, scale=None, is_causal=0, softcap=0.0,
                           what: str = "kernel", exact=None):
    """Asserts the 2x rule for `out`; returns (kernel error, torch error). `exact`: float64 (q, k, v)
    for the reference where the kernel's inputs are exact sums that q, k, v (PyTorch's inputs, in
    the kernel's dtype) round, e.g. projections plus qkv_bias."""
    ref = attention_reference(*(exact or (q, k, v)), attn_mask, key_lengths, scale, is_causal, softcap)
    assert out.shape == ref.shape, f"{what}: shape {out.shape}, expected {ref.shape}"
    out64 = np.asarray(out).astype(np.float64)
    assert not np.any(np.isnan(out64)), f"{what}: output has NaN"
    err = max_abs_error(out64, ref)
    torch_out = torch_attention(q, k, v, attn_mask, key_lengths, scale, is_causal, softcap)
    torch_err = max_abs_error(torch_out, ref)
    ulps = 4.0 if np.dtype(q.dtype) == np.float32 else 0.5
    floor = ulps * _EPS[np.dtype(q.dtype)] * max(1.0, float(np.max(np.abs(ref))) if ref.size else 1.0)
    assert err <= 2 * torch_err + floor, (
        f"{what}: max abs error {err:.3g} > 2 x PyTorch's {torch_err:.3g} + {floor:.2g} ({q.dtype})"
    )
    return err, torch_err
