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


def split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """(B, S, H*D) -> (B, H, S, D), the 4-D view of a 3-D input (element (b, s, h*D + d) is
    element (b, h, s, d))."""
    b, s, hidden = x.shape
    if num_heads <= 0 or hidden % num_heads:
        raise ValueError(f"last dimension {hidden} is not a multiple of the head count {num_heads}")
    return x.reshape(b, s, num_heads, hidden // num_heads).transpose(0, 2, 1, 3)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(B, H, S, D) -> (B, S, H*D), the inverse of split_heads."""
    b, h, s, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, s, h * d)


def packed_qkv_windows(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_num_heads: int,
                       kv_num_heads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The 3-D Q (B, S, Hq*D), K (B, S, Hkv*D), V (B, S, Hkv*D) that packed_qkv = 1 reads: the
    column windows [0, Hq*D) of `q`, [Hq*D, (Hq+Hkv)*D) of `k` and [(Hq+Hkv)*D, (Hq+2*Hkv)*D) of
    `v`, three inputs of one shape (B, S, (Hq + 2*Hkv)*D) (normally one tensor three times).
    Returns views."""
    shapes = (np.shape(q), np.shape(k), np.shape(v))
    if len(shapes[0]) != contract.PACKED_TENSOR_RANK or len(set(shapes)) != 1:
        raise ValueError(f"packed_qkv needs three rank-3 inputs of one shape, got {shapes}")
    if not q_num_heads or not kv_num_heads or q_num_heads < 0 or kv_num_heads < 0:
        raise ValueError("packed_qkv needs q_num_heads and kv_num_heads")
    columns = q_num_heads + 2 * kv_num_heads
    width = shapes[0][2]
    if width % columns:
        raise ValueError(f"packed last dimension {width} is not a multiple of q_num_heads + 2*kv_num_heads = {columns}")
    d = width // columns
    q_end, k_end = q_num_heads * d, (q_num_heads + kv_num_heads) * d
    return q[..., :q_end], k[..., q_end:k_end], v[..., k_end:]


def add_packed_bias(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                    qkv_bias: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The windows of packed_qkv_windows plus their slices of `qkv_bias` ((Hq + 2*Hkv)*D,), in
    float64: bias element c is added to column c of the packed rows, over every batch and row."""
    widths = (np.shape(q)[2], np.shape(k)[2], np.shape(v)[2])
    bias = np.asarray(qkv_bias)
    if bias.shape != (sum(widths),):
        raise ValueError(f"qkv_bias must have shape ((q_num_heads + 2*kv_num_heads)*D,) = ({sum(widths)},), "
                         f"got {bias.shape}")
    bias = bias.astype(np.float64)
    bq, bk, bv = np.split(bias, [widths[0], widths[0] + widths[1]])
    return tuple(np.asarray(t).astype(np.float64) + b for t, b in ((q, bq), (k, bk), (v, bv)))


def attention_reference(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    attn_mask: np.ndarray | None = None,
    key_lengths: np.ndarray | None = None,
    scale: float | None = None,
    is_causal: int = 0,
    softcap: float = 0.0,
    q_num_heads: int | None = None,
    kv_num_heads: int | None = None,
    packed_qkv: int = 0,
    qkv_bias: np.ndarray | None = None,
) -> np.ndarray:
    """FusedAttention in float64. Inputs of any float dtype (bfloat16 via ml_dtypes or float32
    upcast by the caller); returns float64 of shape (B, Hq, Sq, Dv), or for the 3-D form
    (Q (B, Sq, Hq*D), K (B, Sk, Hkv*D), V (B, Sk, Hkv*Dv), with q_num_heads and kv_num_heads)
    of shape (B, Sq, Hq*Dv). With packed_qkv = 1, Q, K and V are each the packed
    (B, S, (Hq + 2*Hkv)*D) tensor, read as column windows (packed_qkv_windows); Y is (B, S, Hq*D).
    `qkv_bias` ((Hq + 2*Hkv)*D,), only with packed_qkv = 1, is added to every packed row first, in
    float64 (the exact sum: docs/notes/contract_qkv_bias.md)."""
    if packed_qkv not in (0, 1):
        raise ValueError(f"packed_qkv must be 0 or 1, got {packed_qkv}")
    if qkv_bias is not None and not packed_qkv:
        raise ValueError("qkv_bias is only allowed with packed_qkv = 1")
    if packed_qkv:
        q, k, v = packed_qkv_windows(q, k, v, q_num_heads, kv_num_heads)
        if qkv_bias is not None:
            q, k, v = add_packed_bias(q, k, v, qkv_bias)
    ranks = (np.ndim(q), np.ndim(k), np.ndim(v))
    if len(set(ranks)) != 1 or ranks[0] not in (contract.TENSOR_RANK, contract.PACKED_TENSOR_RANK):
        raise ValueError(f"Q, K and V must all have rank 4 or all rank 3, got ranks {ranks}")
    if ranks[0] == contract.PACKED_TENSOR_RANK:
        if not q_num_heads or not kv_num_heads:
            raise ValueError("3-D inputs need q_num_heads and kv_num_heads")
        out = attention_reference(split_heads(np.asarray(q), q_num_heads), split_heads(np.asarray(k), kv_num_heads),
                                  split_heads(np.asarray(v), kv_num_heads), attn_mask, key_lengths, scale,
                                  is_causal, softcap)
        return merge_heads(out)
    for name, value, dim in (("q_num_heads", q_num_heads, np.shape(q)[1]), ("kv_num_heads", kv_num_heads,
                                                                            np.shape(k)[1])):
        if value and value != dim:
            raise ValueError(f"{name}={value} does not match the 4-D input's head dimension {dim}")
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
