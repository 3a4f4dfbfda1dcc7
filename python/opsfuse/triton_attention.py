"""The Triton golden kernel for ``com.opsfuse::FusedAttention``.

An implementation of the op contract (``ARCHITECTURE.md``) written independently of the C++/CUDA
kernels, used to produce golden outputs that every backend is compared against. It favours
accuracy over speed:

* every sum is float32 and no product is rounded below float32: float32 inputs use
  ``tl.dot(..., input_precision="ieee")`` (no TF32), so a float32 model keeps float32 accuracy;
  float16/bfloat16 ``Q @ K^T`` products are exact in the float32 accumulator;
* the softmax probabilities are not rounded to T for ``P @ V``: float32 (CPU interpreter, float32
  inputs) or, on a GPU with 16-bit inputs, split into two T parts (p = p_hi + p_lo) that feed two
  tensor-core products, keeping 16 (bfloat16) to 22 (float16) bits of each probability;
* on a GPU, ``exp`` and ``tanh`` come from libdevice (correctly rounded to a few ulp) rather
  than the approximate hardware instructions;
* a packed projection's bias (``qkv_bias``) is added to Q, K and V where they are loaded, in
  float32, and the sums are not rounded to T: with a bias the dots take float32 operands (no
  16-bit tensor-core products).

The same kernel runs on a CUDA GPU (tensors on ``cuda``) and on the CPU through Triton's
interpreter (tensors on ``cpu``). Triton decides between the two once per process, when it is
imported (``TRITON_INTERPRET``): importing this module on a machine without a CUDA GPU sets
``TRITON_INTERPRET=1`` if Triton has not been imported yet. Set it yourself before importing
Triton to force the interpreter on a GPU machine.

Layout: helpers, the kernel, the thin torch wrapper :func:`attention`, a numpy front end
:func:`attention_numpy`, and a check against the float64 reference (``python -m
opsfuse.triton_attention``).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys

import numpy as np
import torch


def _choose_interpreter() -> bool:
    """Use Triton's interpreter when asked to, or when there is no GPU to compile for."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return True
    if torch.cuda.is_available():
        return False
    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
        return True
    import triton as _triton

    if not _triton.knobs.runtime.interpret:
        raise ImportError(
            "opsfuse.triton_attention: no CUDA GPU, and Triton was imported without "
            "TRITON_INTERPRET=1; set TRITON_INTERPRET=1 before importing triton (or torch "
            "modules that import it) to run the golden kernel on the CPU")
    return True


INTERPRET = _choose_interpreter()

import triton  # noqa: E402  (after the interpreter choice)
import triton.language as tl  # noqa: E402
from triton.language.extra import libdevice  # noqa: E402

from . import contract  # noqa: E402

# Mask kinds, a compile-time argument of the kernel.
_MASK_NONE = 0
_MASK_BOOL = 1  # True (non-zero) = may attend
_MASK_ADDITIVE = 2  # added to the (scaled, soft-capped) scores

_VALUE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _attention_kernel(
    Q, K, V, Mask, KeyLengths, Out, QBias, KBias, VBias,
    stride_qb, stride_qh, stride_qm, stride_qd,  # Q is (B, Hq, Sq, D)
    stride_kb, stride_kh, stride_kn, stride_kd,  # K is (B, Hkv, Sk, D)
    stride_vb, stride_vh, stride_vn, stride_vd,  # V is (B, Hkv, Sk, Dv)
    stride_mb, stride_mh, stride_mm, stride_mn,  # Mask viewed as (B, Hq, Sq, Sk); 0 = broadcast
    stride_ob, stride_oh, stride_om, stride_od,  # Out is (B, Hq, Sq, Dv)
    stride_qbh, stride_qbd,  # QBias is (Hq, D): Q's window of qkv_bias, split into heads
    stride_kbh, stride_kbd,  # KBias is (Hkv, D)
    stride_vbh, stride_vbd,  # VBias is (Hkv, Dv)
    num_heads, group_size, seq_q, seq_k, head_dim, head_dim_v,
    scale, softcap,
    causal_offset,  # key j is visible to query i iff j <= i + causal_offset (when IS_CAUSAL)
    MASK_KIND: tl.constexpr,
    HAS_KEY_LENGTHS: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_BIAS: tl.constexpr,  # Q, K, V are the loaded values plus QBias / KBias / VBias (float32 sums)
    LIBDEVICE: tl.constexpr,  # True on a GPU: accurate exp/tanh; the interpreter has no libdevice
    TENSOR_CORES: tl.constexpr,  # float16/bfloat16 on a GPU: 16-bit dot operands (see above)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    # One program computes BLOCK_M query rows of one (batch, query head), streaming over the keys
    # in tiles of BLOCK_N with an online softmax. Grid: (cdiv(Sq, BLOCK_M), B * Hq).
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // num_heads).to(tl.int64)
    off_h = (pid_bh % num_heads).to(tl.int64)
    off_hkv = off_h // group_size  # GQA / MQA: query head h reads key/value head h // group

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # query rows
    offs_n = tl.arange(0, BLOCK_N)  # key columns within a tile
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_ok = offs_m < seq_q
    d_ok = offs_d < head_dim
    dv_ok = offs_dv < head_dim_v

    # q: (BLOCK_M, BLOCK_D), zero-padded past Sq and D so padding adds nothing to the dot.
    q_ptrs = (Q + off_b * stride_qb + off_h * stride_qh
              + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd)
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if not TENSOR_CORES:
        q = q.to(tl.float32)
    if HAS_BIAS:
        # The bias is loaded as zeros past D, so the padding still adds nothing to the dot; rows past
        # Sq get it too but are never stored.
        q_bias = tl.load(QBias + off_h * stride_qbh + offs_d * stride_qbd, mask=d_ok, other=0.0)
        q = q + q_bias.to(tl.float32)[None, :]
        k_bias = tl.load(KBias + off_hkv * stride_kbh + offs_d * stride_kbd, mask=d_ok, other=0.0)
        k_bias = k_bias.to(tl.float32)
        v_bias = tl.load(VBias + off_hkv * stride_vbh + offs_dv * stride_vbd, mask=dv_ok, other=0.0)
        v_bias = v_bias.to(tl.float32)

    k_base = K + off_b * stride_kb + off_hkv * stride_kh
    v_base = V + off_b * stride_vb + off_hkv * stride_vh
    m_base = Mask + off_b * stride_mb + off_h * stride_mh

    # Keys at or past n_end are invisible to every row of this block: stop the loop there.
    n_end = seq_k
    if HAS_KEY_LENGTHS:
        key_len = tl.load(KeyLengths + off_b)
        key_len = tl.minimum(tl.maximum(key_len, 0), seq_k).to(tl.int32)
        n_end = tl.minimum(n_end, key_len)
    if IS_CAUSAL:
        last_row = tl.minimum((pid_m + 1) * BLOCK_M, seq_q) - 1
        n_end = tl.minimum(n_end, tl.maximum(last_row + causal_offset + 1, 0))

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running row max
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running row sum of exp(s - m_i)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)  # running sum of exp(s - m_i) * v

    for start_n in range(0, n_end, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < seq_k

        # kt: (BLOCK_D, BLOCK_N), K transposed by addressing.
        kt_ptrs = k_base + cols[None, :] * stride_kn + offs_d[:, None] * stride_kd
        kt = tl.load(kt_ptrs, mask=d_ok[:, None] & col_ok[None, :], other=0.0)
        if HAS_BIAS:
            kt = kt.to(tl.float32) + k_bias[:, None]  # columns past Sk are masked out of s below
        if TENSOR_CORES:
            s = tl.dot(q, kt)  # products of 16-bit values are exact in the float32 accumulator
        else:
            s = tl.dot(q, kt.to(tl.float32), input_precision="ieee")
        s = s * scale  # (BLOCK_M, BLOCK_N)

        if HAS_SOFTCAP:
            x = s / softcap
            if LIBDEVICE:
                t = libdevice.tanh(x)
            else:
                # tanh(x) = sign(x) * e / (e + 2) with e = expm1(2|x|); expm1 through exp and log
                # (u = exp(y): expm1(y) = (u - 1) * y / log(u), exact to a few ulp, no
                # cancellation near 0). |x| is capped at 15 where tanh is 1 in float32.
                y = 2.0 * tl.minimum(tl.abs(x), 15.0)
                u = tl.exp(y)
                log_u = tl.where(u == 1.0, 1.0, tl.log(u))
                em1 = tl.where(u == 1.0, y, (u - 1.0) * (y / log_u))
                t = em1 / (em1 + 2.0)
                t = tl.where(x < 0, -t, t)
            s = softcap * t

        visible = row_ok[:, None] & col_ok[None, :]
        if MASK_KIND != 0:
            mk_ptrs = m_base + offs_m[:, None] * stride_mm + cols[None, :] * stride_mn
            if MASK_KIND == 1:
                allowed = tl.load(mk_ptrs, mask=visible, other=0)
                visible = visible & (allowed != 0)
            else:
                s = s + tl.load(mk_ptrs, mask=visible, other=0.0).to(tl.float32)
        if IS_CAUSAL:
            visible = visible & (cols[None, :] <= offs_m[:, None] + causal_offset)
        if HAS_KEY_LENGTHS:
            visible = visible & (cols[None, :] < key_len)
        s = tl.where(visible, s, float("-inf"))

        # Online softmax. A row that has seen no visible key keeps m = -inf; it is shifted by 0
        # instead, so exp(-inf - 0) = 0 and no NaN appears.
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        if LIBDEVICE:
            alpha = libdevice.exp(m_i - shift)
            p = libdevice.exp(s - shift[:, None])
        else:
            alpha = tl.exp(m_i - shift)
            p = tl.exp(s - shift[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)

        v_ptrs = v_base + cols[:, None] * stride_vn + offs_dv[None, :] * stride_vd
        v = tl.load(v_ptrs, mask=col_ok[:, None] & dv_ok[None, :], other=0.0)
        if HAS_BIAS:
            v = v.to(tl.float32) + v_bias[None, :]  # rows past Sk meet p = 0
        if TENSOR_CORES:
            # p (float32) = p_hi + p_lo, both in T: two 16-bit products keep ~16 (bf16) to 22
            # (fp16) bits of p instead of rounding the probabilities to T.
            p_hi = p.to(v.dtype)
            p_lo = (p - p_hi.to(tl.float32)).to(v.dtype)
            pv = tl.dot(p_lo, v, acc=tl.dot(p_hi, v))
        else:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    # Rows with no visible key (l = 0) yield zeros.
    has_keys = l_i > 0.0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    out = tl.where(has_keys[:, None], out, 0.0)
    o_ptrs = (Out + off_b * stride_ob + off_h * stride_oh
              + offs_m[:, None] * stride_om + offs_dv[None, :] * stride_od)
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & dv_ok[None, :])


def _error(message: str) -> ValueError:
    return ValueError(f"{contract.OP_NAME}: {message}")


def _block_sizes(device: torch.device, seq_q: int, seq_k: int, d: int, dv: int,
                 tensor_cores: bool) -> tuple[int, int, int, int]:
    block_d = max(16, triton.next_power_of_2(d))
    block_dv = max(16, triton.next_power_of_2(dv))
    if device.type == "cuda":
        # Wide heads: smaller tiles, so the q tile and the accumulator stay in registers (float32
        # FMA dots hold both operands there too).
        wide = max(block_d, block_dv) > 128
        block_m = 64 if tensor_cores or not wide else 32
        block_n = 32 if wide else 64
    else:
        # The interpreter pays per operation, not per element: large tiles, few iterations.
        block_m = 128
        block_n = 128
    block_m = min(block_m, max(16, triton.next_power_of_2(seq_q)))
    block_n = min(block_n, max(16, triton.next_power_of_2(max(seq_k, 1))))
    return block_m, block_n, block_d, block_dv


def split_heads(t: torch.Tensor, heads: int | None, name: str = "tensor", attr: str = "heads") -> torch.Tensor:
    """(B, S, H*D) -> its (B, H, S, D) view (no copy): element (b, s, h*D + d) is (b, h, s, d)."""
    if not heads or heads < 0:
        raise _error(f"{name} is 3-D (B, S, H*D), so {attr} is required (a positive int), got {heads}")
    b, s, hidden = t.shape
    if hidden % heads:
        raise _error(f"{name}'s last dimension {hidden} is not a multiple of {attr} {heads}")
    return t.unflatten(2, (heads, hidden // heads)).transpose(1, 2)


def packed_qkv_windows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_num_heads: int | None,
                       kv_num_heads: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """packed_qkv = 1: the 3-D Q, K, V read out of three (B, S, (Hq + 2*Hkv)*D) inputs of one shape
    as views (no copy): columns [0, Hq*D) of q, [Hq*D, (Hq+Hkv)*D) of k, [(Hq+Hkv)*D, end) of v."""
    shapes = (tuple(q.shape), tuple(k.shape), tuple(v.shape))
    if len(shapes[0]) != contract.PACKED_TENSOR_RANK:
        raise _error(f"packed_qkv = 1 needs the 3-D form (B, S, (q_num_heads + 2*kv_num_heads)*D), got shapes "
                     f"{shapes[0]}, {shapes[1]}, {shapes[2]}")
    if len(set(shapes)) != 1:
        raise _error(f"with packed_qkv = 1, Q, K and V must have the same shape, got {shapes[0]}, {shapes[1]}, "
                     f"{shapes[2]}")
    if not q_num_heads or not kv_num_heads or q_num_heads < 0 or kv_num_heads < 0:
        raise _error(f"packed_qkv = 1 requires q_num_heads and kv_num_heads (positive ints), got {q_num_heads}, "
                     f"{kv_num_heads}")
    columns = q_num_heads + 2 * kv_num_heads
    width = shapes[0][2]
    if width % columns:
        raise _error(f"with packed_qkv = 1, the packed last dimension {width} must be a multiple of "
                     f"q_num_heads + 2*kv_num_heads = {columns}")
    d = width // columns
    return (q.narrow(2, 0, q_num_heads * d), k.narrow(2, q_num_heads * d, kv_num_heads * d),
            v.narrow(2, (q_num_heads + kv_num_heads) * d, kv_num_heads * d))


def packed_bias_heads(qkv_bias: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      q_num_heads: int, kv_num_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`qkv_bias` ((Hq + 2*Hkv)*D,) cut as the packed windows q, k, v are: Q's part as (Hq, D), K's
    and V's as (Hkv, D), views (no copy). Checks its shape, dtype (Q's) and device."""
    width = q.shape[2] + k.shape[2] + v.shape[2]
    if tuple(qkv_bias.shape) != (width,):
        raise _error(f"qkv_bias must have shape ((q_num_heads + 2*kv_num_heads)*D,) = ({width},), got "
                     f"{tuple(qkv_bias.shape)}")
    if qkv_bias.dtype != q.dtype:
        raise _error(f"qkv_bias has dtype {qkv_bias.dtype}; expected Q's dtype {q.dtype}")
    if qkv_bias.device != q.device:
        raise _error(f"qkv_bias is on {qkv_bias.device}, Q on {q.device}")
    bq, bk, bv = qkv_bias.split([q.shape[2], k.shape[2], v.shape[2]])
    return (bq.unflatten(0, (q_num_heads, -1)), bk.unflatten(0, (kv_num_heads, -1)),
            bv.unflatten(0, (kv_num_heads, -1)))


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    key_lengths: torch.Tensor | None = None,
    scale: float | None = None,
    is_causal: int = contract.DEFAULT_IS_CAUSAL,
    softcap: float = contract.DEFAULT_SOFTCAP,
    out: torch.Tensor | None = None,
    *,
    q_num_heads: int | None = None,
    kv_num_heads: int | None = None,
    packed_qkv: int = contract.DEFAULT_PACKED_QKV,
    qkv_bias: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """FusedAttention on torch tensors (all on one device: CUDA compiles, CPU interprets).

    q: (B, Hq, Sq, D), k: (B, Hkv, Sk, D), v: (B, Hkv, Sk, Dv), all of one dtype T in
    {float32, float16, bfloat16}; attn_mask: bool or T, broadcastable to (B, Hq, Sq, Sk);
    key_lengths: (B,) int32/int64. Returns Y: (B, Hq, Sq, Dv) of dtype T (written into `out`
    when given). The 3-D form: q (B, Sq, Hq*D), k (B, Sk, Hkv*D), v (B, Sk, Hkv*Dv) with
    `q_num_heads` = Hq and `kv_num_heads` = Hkv gives Y (B, Sq, Hq*Dv); the kernel reads and
    writes it through the strides of its (B, H, S, D) views. With `packed_qkv` = 1, q, k and v
    are each the packed (B, S, (Hq + 2*Hkv)*D) tensor (normally one tensor three times) and the
    kernel reads the column windows of :func:`packed_qkv_windows` (views, no copy); Y is
    (B, S, Hq*D). `qkv_bias` ((Hq + 2*Hkv)*D,) of dtype T, only with `packed_qkv` = 1, is added
    to the packed rows as the kernel loads them (float32 sums). `block_m` / `block_n` override the
    query / key tile sizes (powers of two >= 16; tests use small tiles to exercise the online
    softmax across many tiles).
    """
    if packed_qkv not in (0, 1):
        raise _error(f"packed_qkv must be 0 or 1, got {packed_qkv}")
    if qkv_bias is not None and not packed_qkv:
        raise _error("qkv_bias is only allowed with packed_qkv = 1 (it is the packed projection's bias)")
    head_biases = None
    if packed_qkv:
        q, k, v = packed_qkv_windows(q, k, v, q_num_heads, kv_num_heads)
        if qkv_bias is not None:
            head_biases = packed_bias_heads(qkv_bias, q, k, v, q_num_heads, kv_num_heads)
    ranks = (q.dim(), k.dim(), v.dim())
    if contract.PACKED_TENSOR_RANK in ranks or contract.TENSOR_RANK not in ranks:
        if ranks != (contract.PACKED_TENSOR_RANK,) * 3:
            raise _error(f"Q, K and V must all be 4-D (B, H, S, D) or all 3-D (B, S, H*D), got shapes "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
        q4, k4, v4 = (split_heads(t, heads, name, attr) for t, heads, name, attr in (
            (q, q_num_heads, "Q", contract.ATTR_Q_NUM_HEADS), (k, kv_num_heads, "K", contract.ATTR_KV_NUM_HEADS),
            (v, kv_num_heads, "V", contract.ATTR_KV_NUM_HEADS)))
        shape = (q.shape[0], q.shape[1], q_num_heads * v4.shape[3])
        if out is None:
            out = torch.empty(shape, dtype=q.dtype, device=q.device)
        elif tuple(out.shape) != shape or out.dtype != q.dtype or out.device != q.device:
            raise _error(f"out must be {shape} {q.dtype} on {q.device}")
        _attention_4d(q4, k4, v4, attn_mask, key_lengths, scale, is_causal, softcap,
                      split_heads(out, q_num_heads, "out", contract.ATTR_Q_NUM_HEADS), q_num_heads, kv_num_heads,
                      block_m, block_n, head_biases)
        return out
    return _attention_4d(q, k, v, attn_mask, key_lengths, scale, is_causal, softcap, out, q_num_heads,
                         kv_num_heads, block_m, block_n, None)


def _attention_4d(q, k, v, attn_mask, key_lengths, scale, is_causal, softcap, out, q_num_heads, kv_num_heads,
                  block_m, block_n, head_biases) -> torch.Tensor:
    """:func:`attention` on the 4-D (B, H, S, D) tensors or views; `head_biases` is None or the (H, D)
    bias views of :func:`packed_bias_heads`."""
    for name, t in (("Q", q), ("K", k), ("V", v)):
        if t.dim() != contract.TENSOR_RANK:
            raise _error(f"{name} must be 4-D, got shape {tuple(t.shape)}")
    for attr, heads, name, t in ((contract.ATTR_Q_NUM_HEADS, q_num_heads, "Q", q),
                                 (contract.ATTR_KV_NUM_HEADS, kv_num_heads, "K", k)):
        if heads and heads != t.shape[1]:
            raise _error(f"{attr} = {heads} does not match {name}'s head dimension {t.shape[1]} "
                         "(with 4-D inputs it may only repeat it)")
        if t.dtype not in _VALUE_DTYPES:
            raise _error(f"{name} has dtype {t.dtype}; expected float32, float16 or bfloat16")
    if not (q.dtype == k.dtype == v.dtype):
        raise _error(f"Q, K, V must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    b, hq, sq, d = q.shape
    bk, hkv, sk, dk = k.shape
    bv, hv, skv, dv = v.shape
    if bk != b or bv != b:
        raise _error(f"batch sizes differ: Q {b}, K {bk}, V {bv}")
    if hv != hkv or skv != sk:
        raise _error(f"K {tuple(k.shape)} and V {tuple(v.shape)} disagree on heads or key length")
    if dk != d:
        raise _error(f"head size of K ({dk}) differs from Q ({d})")
    if hkv == 0 or hq % hkv:
        raise _error(f"query heads ({hq}) must be a multiple of key/value heads ({hkv})")
    if d == 0 or d > contract.MAX_HEAD_DIM or dv > contract.MAX_HEAD_DIM:
        raise _error(f"head sizes D={d}, Dv={dv} must be in [1, {contract.MAX_HEAD_DIM}] (D) / [0, {contract.MAX_HEAD_DIM}] (Dv)")
    if is_causal not in (contract.CAUSAL_NONE, contract.CAUSAL_UPPER_LEFT, contract.CAUSAL_LOWER_RIGHT):
        raise _error(f"is_causal must be 0, 1 or 2, got {is_causal}")
    softcap = float(softcap)
    if not softcap >= 0.0:
        raise _error(f"softcap must be >= 0, got {softcap}")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    device = q.device
    if INTERPRET and device.type != "cpu":
        raise _error(f"Triton runs interpreted in this process (TRITON_INTERPRET=1): tensors must "
                     f"be on the CPU, got {device}")
    if not INTERPRET and device.type != "cuda":
        raise _error(f"Triton compiles for the GPU in this process: tensors must be on CUDA, got "
                     f"{device} (set TRITON_INTERPRET=1 before importing triton for the CPU)")
    for name, t in (("K", k), ("V", v), ("attn_mask", attn_mask), ("key_lengths", key_lengths)):
        if t is not None and t.device != device:
            raise _error(f"{name} is on {t.device}, Q on {device}")

    if out is None:
        out = torch.empty((b, hq, sq, dv), dtype=q.dtype, device=device)
    elif out.shape != (b, hq, sq, dv) or out.dtype != q.dtype or out.device != device:
        raise _error(f"out must be {(b, hq, sq, dv)} {q.dtype} on {device}")
    if out.numel() == 0:
        return out
    if sk == 0:
        return out.zero_()  # no key to attend to: every row is fully masked

    mask_kind = _MASK_NONE
    mask_arg, mask_strides = q, (0, 0, 0, 0)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            mask_kind = _MASK_BOOL
            mask_arg = attn_mask.view(torch.uint8)
        elif attn_mask.dtype == q.dtype:
            mask_kind = _MASK_ADDITIVE
            mask_arg = attn_mask
        else:
            raise _error(f"attn_mask has dtype {attn_mask.dtype}; expected bool or {q.dtype}")
        rank = mask_arg.dim()
        if not contract.MIN_MASK_RANK <= rank <= contract.MAX_MASK_RANK:
            raise _error(f"attn_mask must have rank 2 to 4, got shape {tuple(attn_mask.shape)}")
        try:
            mask_arg = mask_arg.reshape((1,) * (4 - rank) + tuple(mask_arg.shape)).expand(b, hq, sq, sk)
        except RuntimeError:
            raise _error(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to "
                         f"(B, Hq, Sq, Sk) = {(b, hq, sq, sk)}") from None
        mask_strides = tuple(mask_arg.stride())

    kl_arg = q
    if key_lengths is not None:
        if key_lengths.dtype not in (torch.int32, torch.int64):
            raise _error(f"key_lengths has dtype {key_lengths.dtype}; expected int32 or int64")
        if tuple(key_lengths.shape) != (b,):
            raise _error(f"key_lengths must have shape ({b},), got {tuple(key_lengths.shape)}")
        kl_arg = key_lengths.contiguous()

    # With a bias, Q + b is no T value: float32 operands keep the sum unrounded (module docstring).
    tensor_cores = not INTERPRET and q.dtype != torch.float32 and head_biases is None
    bias_args, bias_strides = (q, q, q), (0,) * 6
    if head_biases is not None:
        bias_args = head_biases
        bias_strides = tuple(st for t in head_biases for st in t.stride())
    block_m_auto, block_n_auto, block_d, block_dv = _block_sizes(device, sq, sk, d, dv, tensor_cores)
    block_m = block_m or block_m_auto
    block_n = block_n or block_n_auto
    for name, size in (("block_m", block_m), ("block_n", block_n)):
        if size < 16 or size & (size - 1):
            raise _error(f"{name} must be a power of two >= 16, got {size}")
    is_cuda = device.type == "cuda"
    grid = (triton.cdiv(sq, block_m), b * hq)
    launch_options = {"num_warps": 4, "num_stages": 2} if is_cuda else {}
    with torch.cuda.device(device) if is_cuda else contextlib.nullcontext():
        _attention_kernel[grid](
            q, k, v, mask_arg, kl_arg, out, *bias_args,
            *q.stride(), *k.stride(), *v.stride(), *mask_strides, *out.stride(), *bias_strides,
            hq, hq // hkv, sq, sk, d, dv,
            scale, softcap if softcap > 0 else 1.0,
            0 if is_causal == contract.CAUSAL_UPPER_LEFT else sk - sq,
            MASK_KIND=mask_kind,
            HAS_KEY_LENGTHS=key_lengths is not None,
            IS_CAUSAL=is_causal != contract.CAUSAL_NONE,
            HAS_SOFTCAP=softcap > 0,
            HAS_BIAS=head_biases is not None,
            LIBDEVICE=not INTERPRET,
            TENSOR_CORES=tensor_cores,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, BLOCK_DV=block_dv,
            **launch_options,
        )
    return out


# --- numpy front end (used by the golden runner) -------------------------------------------------


def _bfloat16_numpy_type():
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def numpy_to_torch(a: np.ndarray) -> torch.Tensor:
    """numpy -> torch on the CPU, bfloat16 (ml_dtypes) included."""
    a = np.ascontiguousarray(a)
    if a.dtype == _bfloat16_numpy_type():
        return torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def torch_to_numpy(t: torch.Tensor) -> np.ndarray:
    """torch -> numpy, bfloat16 as ml_dtypes.bfloat16."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.uint16).numpy().view(_bfloat16_numpy_type())
    return t.numpy()


def default_device() -> torch.device:
    """The device this process runs the kernel on: the CPU when interpreting, else CUDA."""
    return torch.device("cpu") if INTERPRET else torch.device("cuda")


def attention_numpy(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    attn_mask: np.ndarray | None = None,
    key_lengths: np.ndarray | None = None,
    scale: float | None = None,
    is_causal: int = contract.DEFAULT_IS_CAUSAL,
    softcap: float = contract.DEFAULT_SOFTCAP,
    device: str | torch.device | None = None,
    q_num_heads: int | None = None,
    kv_num_heads: int | None = None,
    packed_qkv: int = contract.DEFAULT_PACKED_QKV,
    qkv_bias: np.ndarray | None = None,
) -> np.ndarray:
    """:func:`attention` on numpy arrays (either form); runs on `device` (default:
    :func:`default_device`)."""
    dev = torch.device(device) if device is not None else default_device()

    def to_dev(a):
        return None if a is None else numpy_to_torch(np.asarray(a)).to(dev)

    y = attention(to_dev(q), to_dev(k), to_dev(v), to_dev(attn_mask), to_dev(key_lengths),
                  scale=scale, is_causal=is_causal, softcap=softcap, q_num_heads=q_num_heads,
                  kv_num_heads=kv_num_heads, packed_qkv=packed_qkv, qkv_bias=to_dev(qkv_bias))
    return torch_to_numpy(y)


def _main() -> None:
    """Check against the float64 reference and time the kernel (GPU) on one shape."""
    import argparse
    import time

    from .reference import attention_reference

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="2,8,2,1025,1025,128",
                        help="B,Hq,Hkv,Sq,Sk,D (default %(default)s)")
    parser.add_argument("--dtype", default="float16", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--causal", type=int, default=0)
    args = parser.parse_args()
    b, hq, hkv, sq, sk, d = (int(x) for x in args.shape.split(","))
    dev = default_device()
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(b, hq, sq, d, generator=gen).to(dtype).to(dev)
    k = torch.randn(b, hkv, sk, d, generator=gen).to(dtype).to(dev)
    v = torch.randn(b, hkv, sk, d, generator=gen).to(dtype).to(dev)
    y = attention(q, k, v, is_causal=args.causal)
    ref = attention_reference(q.double().cpu().numpy(), k.double().cpu().numpy(),
                              v.double().cpu().numpy(), is_causal=args.causal)
    err = np.abs(y.double().cpu().numpy() - ref).max()
    print(f"max abs error vs float64 reference: {err:.3e}")
    if dev.type == "cuda":
        for _ in range(3):
            attention(q, k, v, is_causal=args.causal, out=y)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        reps = 20
        for _ in range(reps):
            attention(q, k, v, is_causal=args.causal, out=y)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) / reps * 1e3
        # FLOPs: two matrix products of 2*B*Hq*Sq*Sk*D each (halved by a causal mask).
        flops = 4.0 * b * hq * sq * sk * d * (0.5 if args.causal else 1.0)
        print(f"{ms:.3f} ms, {flops / ms * 1e-9:.1f} TFLOP/s")


if __name__ == "__main__":
    _main()
