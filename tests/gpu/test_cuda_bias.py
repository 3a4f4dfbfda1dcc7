"""Q/K/V biases through the CUDA binding (q_bias / k_bias / v_bias: the ONNX op's qkv_bias split,
docs/notes/contract_qkv_bias.md), against the float64 reference on the exact sums with the 2x rule
(PyTorch's yardstick computes on the sums rounded to the dtype, as the graph's Add did).

Two implementations are covered: the Hopper prefill kernel adds the biases itself (Q's into its
shared-memory tile, V's in the epilogue, K's left out as a per-row constant that softmax removes),
and every other plan reads biased copies of Q and K that a separate launch writes (bias_fold.h):
float32, decode shapes, softcap with a K bias, and OPSFUSE_CUDA_DISABLE_HOPPER=1; of those, the
float32 kernel adds V's bias in its epilogue, the mma.sync and decode kernels read a copy of V
too. On GPUs other than the H200's sm_90 every case is a copies' path. The Hopper kernel's schedules (persistent, dynamic,
stream-K, key splits, tail split, stores from registers) each get a case, since each has its own
way to the epilogue that adds V's bias."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from accuracy import assert_within_2x_torch, biased_sums, random_inputs
from cuda_helpers import fresh_rng, poisoned, require_cuda_module, to_device, to_numpy

pytestmark = pytest.mark.gpu

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]
HALF = [np.float16, ml_dtypes.bfloat16]
HALF_IDS = ["fp16", "bf16"]


def random_biases(rng, dtype, hq, hkv, d, dv, scale=1.0, which="qkv"):
    """Fresh biases (hq*d,), (hkv*d,), (hkv*dv,) in `dtype`; None for those not in `which`."""
    sizes = {"q": hq * d, "k": hkv * d, "v": hkv * dv}
    return tuple((scale * rng.standard_normal(sizes[n])).astype(dtype) if n in which else None for n in "qkv")


def biased(x, bias, exact: bool):
    """x (B, H, S, D) plus bias (H*D,) per head: in float64, or rounded to x's dtype from float32."""
    if bias is None:
        return x.astype(np.float64) if exact else x
    return biased_sums(x, bias.reshape(1, x.shape[1], 1, x.shape[3]))[1 if exact else 0]


def run_biased(q, k, v, biases, attn_mask=None, key_lengths=None, misaligned=False, **attrs):
    """misaligned: each bias 2 bytes past a 16-byte boundary (a view one element into a copy)."""
    cuda = require_cuda_module()
    import torch

    def device_bias(b):
        return to_device(np.concatenate([b[:1], b]))[1:] if misaligned else to_device(b)

    qb, kb, vb = (None if b is None else device_bias(b) for b in biases)
    tm = None if attn_mask is None else to_device(attn_mask)
    tl = None if key_lengths is None else torch.from_numpy(np.asarray(key_lengths)).to("cuda")
    out = poisoned((q.shape[0], q.shape[1], q.shape[2], v.shape[3]), q.dtype)
    y = cuda.fused_attention(to_device(q), to_device(k), to_device(v), tm, tl, out=out, q_bias=qb, k_bias=kb,
                             v_bias=vb, **attrs)
    torch.cuda.synchronize()
    return to_numpy(y, q.dtype)


def check_biased(q, k, v, biases, attn_mask=None, key_lengths=None, seed=None, what="", misaligned=False, **attrs):
    out = run_biased(q, k, v, biases, attn_mask, key_lengths, misaligned, **attrs)
    assert np.all(np.isfinite(out.astype(np.float64))), f"{what}: NaN/unwritten output (seed {seed})"
    rounded = tuple(biased(x, b, exact=False) for x, b in zip((q, k, v), biases))
    exact = tuple(biased(x, b, exact=True) for x, b in zip((q, k, v), biases))
    assert_within_2x_torch(out, *rounded, attn_mask, key_lengths, attrs.get("scale"), attrs.get("is_causal", 0),
                           attrs.get("softcap", 0.0), what=f"{what} (seed {seed})", exact=exact)
    return out


def size_cases():
    for dtype, ident in zip(DTYPES, DTYPE_IDS):
        for d in [40, 64, 80, 96, 128, 256]:
            for sq, sk in [(1, 1), (97, 97), (1025, 1025), (1, 1025), (7, 300)]:
                yield pytest.param(dtype, d, sq, sk, id=f"{ident}-d{d}-{sq}x{sk}")


@pytest.mark.parametrize("dtype,d,sq,sk", list(size_cases()))
def test_sizes(dtype, d, sq, sk):
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, 2, 4, 2, sq, sk, d, d)
    check_biased(q, k, v, random_biases(rng, dtype, 4, 2, d, d), seed=seed, what=f"D={d} Sq={sq} Sk={sk}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("d", [64, 128])
def test_biases_far_larger_than_the_projections(dtype, d):
    """100x biases: K's becomes a per-row constant far above the scores' spread, which the Hopper
    kernel leaves out and the reference keeps (scale small enough that softmax is not one-hot)."""
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, 2, 4, 4, 300, 300, d, d)
    check_biased(q, k, v, random_biases(rng, dtype, 4, 4, d, d, scale=100.0), scale=1.0 / (100.0 * d), seed=seed,
                 what=f"100x biases D={d}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("which", ["q", "k", "v", "qv"])
def test_each_bias_alone(dtype, which):
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, 1, 4, 2, 200, 200, 64, 64)
    check_biased(q, k, v, random_biases(rng, dtype, 4, 2, 64, 64, which=which), seed=seed, what=f"only {which}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", ["padding_bool", "padding_additive", "full_additive", "causal1", "causal2",
                                  "key_lengths", "softcap_k_bias", "softcap_no_k_bias"])
def test_features(dtype, case):
    rng, seed = fresh_rng()
    b, hq, hkv, s, d = 3, 4, 2, 300, 64
    q, k, v = random_inputs(rng, dtype, b, hq, hkv, s, s, d, d)
    biases = random_biases(rng, dtype, hq, hkv, d, d, which="qv" if case == "softcap_no_k_bias" else "qkv")
    kw = {}
    if case.startswith("padding"):
        visible = np.arange(s)[None, None, None, :] < np.array([s, 200, 0])[:, None, None, None]
        kw["attn_mask"] = visible if case == "padding_bool" else np.where(visible, 0.0, -np.inf).astype(dtype)
    elif case == "full_additive":
        mask = rng.standard_normal((b, 1, s, s))
        mask[rng.random(mask.shape) < 0.2] = -np.inf
        kw["attn_mask"] = mask.astype(dtype)
    elif case.startswith("causal"):
        kw["is_causal"] = int(case[-1])
    elif case == "key_lengths":
        kw["key_lengths"] = np.array([s, 123, 0], dtype=np.int64)
    else:
        kw["softcap"] = 5.0
    out = check_biased(q, k, v, biases, seed=seed, what=case, **kw)
    if case in ("padding_bool", "padding_additive", "key_lengths"):
        # batch 2 has no visible key: zeros, not V's bias
        assert not np.any(out[2].astype(np.float32)), f"{case}: a fully masked row is not 0 (seed {seed})"


HOPPER_SCHEDULES = {
    # name: (environment, B, Hq, Hkv, S, D)
    "persistent_static": ({"OPSFUSE_CUDA_HOPPER_PERSISTENT": "1", "OPSFUSE_CUDA_HOPPER_DYNAMIC": "0"}, 2, 8, 2, 2100, 64),
    "persistent_dynamic": ({"OPSFUSE_CUDA_HOPPER_PERSISTENT": "1", "OPSFUSE_CUDA_HOPPER_DYNAMIC": "1"}, 2, 8, 2, 2100, 128),
    "stream_k": ({"OPSFUSE_CUDA_HOPPER_STREAM_K": "1"}, 3, 5, 5, 1100, 64),
    "key_splits": ({"OPSFUSE_CUDA_HOPPER_SPLITS": "3"}, 1, 2, 1, 1500, 128),
    "tail_split": ({"OPSFUSE_CUDA_HOPPER_TAIL_SPLIT": "1", "OPSFUSE_CUDA_HOPPER_PERSISTENT": "1"}, 1, 12, 12, 2048, 64),
    "registers_store": ({"OPSFUSE_CUDA_HOPPER_TMA_STORE": "0"}, 2, 4, 2, 700, 128),
    "portable_copies": ({"OPSFUSE_CUDA_DISABLE_HOPPER": "1"}, 2, 4, 2, 700, 128),
    # a small grid: the mma.sync kernel splits the keys and combines the partials
    "portable_splits": ({"OPSFUSE_CUDA_DISABLE_HOPPER": "1"}, 1, 2, 1, 1500, 128),
}


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
@pytest.mark.parametrize("case", sorted(HOPPER_SCHEDULES))
def test_hopper_schedules(dtype, case, monkeypatch):
    env, b, hq, hkv, s, d = HOPPER_SCHEDULES[case]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, b, hq, hkv, s, s, d, d)
    check_biased(q, k, v, random_biases(rng, dtype, hq, hkv, d, d), seed=seed, what=case)


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
@pytest.mark.parametrize("d", [64, 128])
def test_biases_off_16_byte_boundaries(dtype, d):
    """Biases 2 bytes past a 16-byte boundary (a view one element into a buffer), as a graph's
    initializer slice may hand them over: the same 2x rule on every path."""
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, 2, 4, 2, 300, 300, d, d)
    check_biased(q, k, v, random_biases(rng, dtype, 4, 2, d, d), seed=seed, what=f"misaligned D={d}", misaligned=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("disable_hopper", ["0", "1"])
def test_zero_biases_change_no_bit(dtype, disable_hopper, monkeypatch):
    """Both implementations add exactly nothing for zero biases: the same bits as without them."""
    monkeypatch.setenv("OPSFUSE_CUDA_DISABLE_HOPPER", disable_hopper)
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, 2, 4, 2, 333, 333, 80, 80)
    zeros = tuple(np.zeros(n, dtype=dtype) for n in (4 * 80, 2 * 80, 2 * 80))
    with_zeros = run_biased(q, k, v, zeros, is_causal=1)
    without = run_biased(q, k, v, (None, None, None), is_causal=1)
    np.testing.assert_array_equal(with_zeros.view(np.uint8), without.view(np.uint8),
                                  err_msg=f"zero biases changed the output (seed {seed})")


@pytest.mark.parametrize("bad,expected", [
    (dict(q_bias=np.zeros(4 * 64 - 1, np.float16)), "q_bias must have shape (256,)"),
    (dict(k_bias=np.zeros((2, 64), np.float16)), "k_bias must have shape (128,)"),
    (dict(v_bias=np.zeros(2 * 64, np.float32)), "v_bias must have the element type of Q"),
])
def test_bad_biases_are_value_errors(bad, expected):
    cuda = require_cuda_module()
    rng, _ = fresh_rng()
    q, k, v = random_inputs(rng, np.float16, 1, 4, 2, 9, 9, 64, 64)
    kw = {n: to_device(b) for n, b in bad.items()}
    with pytest.raises(ValueError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        cuda.fused_attention(to_device(q), to_device(k), to_device(v), **kw)
