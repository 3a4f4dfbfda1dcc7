"""The FusedAttention contract computed in float64 with numpy: the arbiter every kernel is tested
against. Plain loops over nothing: vectorized numpy on (B, Hq, Sq, Sk) score tensors, so keep
the sizes of tests moderate.
"""

from __future__ import annotations

import math

import numpy as np

from . import contract


def causal_visible(seq_q: int, seq_k: int, is_causal: int) -> np.ndarray:
    """Boolean (Sq, Sk) matrix: True where query i may attend key j under `is_causal`."""
    i = np.arange(seq_q)[:, None]
    j = np.arange(seq_k)[None, :]
    if is_causal == contract.CAUSAL_NONE:
        return np.ones((seq_q, seq_k), dtype=bool)
    if is_causal == contract.CAUSAL_UPPER_LEFT:
        return j <= i
    if is_causal == contract.CAUSAL_LOWER_RIGHT:
        return j <= i + (seq_k - seq_q)
    raise ValueError(f"is_causal must be 0, 1 or 2, got {is_causal}")


def attention_reference(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    attn_mask: np.ndarray | None = None,
    key_lengths: np.ndarray | None = None,
    scale: float | None = None,
    is_causal: int = 0,
    softcap: float = 0.0,
) -> np.ndarray:
    """FusedAttention in float64. Inputs of any float dtype (bfloat16 via ml_dtypes or float32
    upcast by the caller); returns float64 of shape (B, Hq, Sq, Dv)."""
    q64 = np.asarray(q, dtype=np.float64)
    k64 = np.asarray(k, dtype=np.float64)
    v64 = np.asarray(v, dtype=np.float64)
    b, hq, sq, d = q64.shape
    hkv, sk = k64.shape[1], k64.shape[2]
    if hq % hkv:
        raise ValueError(f"Hq={hq} is not a multiple of Hkv={hkv}")
    group = hq // hkv
    k64 = np.repeat(k64, group, axis=1)
    v64 = np.repeat(v64, group, axis=1)
    if scale is None:
        scale = 1.0 / math.sqrt(d)

    s = np.einsum("bhqd,bhkd->bhqk", q64, k64) * float(scale)
    if softcap > 0:
        s = softcap * np.tanh(s / softcap)
    visible = np.ones((b, hq, sq, sk), dtype=bool)
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        if m.dtype == np.bool_:
            visible &= np.broadcast_to(m, visible.shape)
        else:
            s = s + np.broadcast_to(m.astype(np.float64), s.shape)
    visible &= causal_visible(sq, sk, is_causal)[None, None]
    if key_lengths is not None:
        lengths = np.asarray(key_lengths).astype(np.int64)
        visible &= (np.arange(sk)[None, :] < lengths[:, None])[:, None, None, :]
    s = np.where(visible, s, -np.inf)

    row_max = s.max(axis=-1, keepdims=True) if sk else np.full((b, hq, sq, 1), -np.inf)
    empty = ~np.isfinite(row_max) & (row_max < 0)  # every key masked
    safe_max = np.where(empty, 0.0, row_max)
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.exp(s - safe_max)
        denom = p.sum(axis=-1, keepdims=True)
        p = np.where(empty, 0.0, p / np.where(empty, 1.0, denom))
    return np.einsum("bhqk,bhkd->bhqd", p, v64)
