"""Bad-input cases for the FusedAttention ORT op, one per process (run by test_ort_op_errors.py):
    python bad_input_cases.py CASE
Each case feeds an invalid input (or builds an invalid node), expects an ORT error whose message
names FusedAttention and the problem, then runs a valid input in the same session. Prints one
JSON line: {"error": <message>, "recovered": <bool>}."""

from __future__ import annotations

import json
import sys

import numpy as np

from ort_helpers import FusedAttentionRunner

rng = np.random.default_rng()


def qkv(b=2, hq=4, hkv=2, sq=5, sk=7, d=16, dv=16, dtype=np.float32):
    return (rng.standard_normal((b, hq, sq, d)).astype(dtype),
            rng.standard_normal((b, hkv, sk, d)).astype(dtype),
            rng.standard_normal((b, hkv, sk, dv)).astype(dtype))


def _rank3():
    q, k, v = qkv()
    return dict(q=q[0], k=k, v=v)


def _batch():
    q, k, v = qkv()
    return dict(q=q, k=k[:1], v=v[:1])


def _heads_not_multiple():
    q, k, v = qkv(hq=5, hkv=2)
    return dict(q=q, k=k, v=v)


def _kv_heads_differ():
    q, k, v = qkv()
    return dict(q=q, k=k, v=np.concatenate([v, v], axis=1))


def _kv_seq_differ():
    q, k, v = qkv()
    return dict(q=q, k=k, v=v[:, :, :3])


def _head_size_mismatch():
    q, k, v = qkv()
    return dict(q=q, k=k[..., :8], v=v)


def _head_size_too_large():
    q, k, v = qkv(d=320, dv=16)
    return dict(q=q, k=k, v=v)


def _mask_not_broadcastable():
    q, k, v = qkv()
    return dict(q=q, k=k, v=v, attn_mask=np.ones((5, 6), dtype=bool))


def _mask_rank_5():
    q, k, v = qkv()
    return dict(q=q, k=k, v=v, attn_mask=np.ones((1, 2, 4, 5, 7), dtype=bool))


def _mask_wrong_type():
    q, k, v = qkv()
    return dict(q=q, k=k, v=v, attn_mask=np.zeros((5, 7), dtype=np.float16))


def _key_lengths_negative():
    q, k, v = qkv()
    return dict(q=q, k=k, v=v, key_lengths=np.array([3, -1], dtype=np.int64))


def _key_lengths_too_large():
    q, k, v = qkv()
    return dict(q=q, k=k, v=v, key_lengths=np.array([8, 1], dtype=np.int32))


def _key_lengths_wrong_shape():
    q, k, v = qkv()
    return dict(q=q, k=k, v=v, key_lengths=np.array([3, 1, 2], dtype=np.int64))


# The 3-D form (B, S, H*D): the attributes travel with the feeds (the runner puts them on the node).
HEADS = {"q_num_heads": 4, "kv_num_heads": 2}


def qkv3(b=2, hq=4, hkv=2, sq=5, sk=7, d=16, dv=16, dtype=np.float32):
    return (rng.standard_normal((b, sq, hq * d)).astype(dtype),
            rng.standard_normal((b, sk, hkv * d)).astype(dtype),
            rng.standard_normal((b, sk, hkv * dv)).astype(dtype))


def _3d_missing_q_num_heads():
    q, k, v = qkv3()
    return dict(q=q, k=k, v=v, kv_num_heads=2)


def _3d_missing_kv_num_heads():
    q, k, v = qkv3()
    return dict(q=q, k=k, v=v, q_num_heads=4)


def _3d_q_not_divisible():
    q, k, v = qkv3()
    return dict(q=q[..., :-2], k=k, v=v, **HEADS)


def _3d_v_not_divisible():
    q, k, v = qkv3()
    return dict(q=q, k=k, v=v[..., :-1], **HEADS)


def _3d_head_size_mismatch():
    q, k, v = qkv3()
    return dict(q=q[..., :4 * 8], k=k, v=v, **HEADS)  # D = 8 for Q, 16 for K


def _3d_mixed_ranks():
    q, _, _ = qkv3()
    _, k, v = qkv()
    return dict(q=q, k=k, v=v, **HEADS)


def _4d_q_num_heads_mismatch():
    q, k, v = qkv()  # Hq = 4
    return dict(q=q, k=k, v=v, q_num_heads=2)


def _4d_kv_num_heads_mismatch():
    q, k, v = qkv()  # Hkv = 2
    return dict(q=q, k=k, v=v, kv_num_heads=4)


# Packed Q/K/V (packed_qkv = 1): each input is (B, S, (Hq + 2*Hkv)*D) = (2, 5, 128) here.
PACKED = dict(HEADS, packed_qkv=1)


def packed_qkv(b=2, s=5, hq=4, hkv=2, d=16, dtype=np.float32):
    p = rng.standard_normal((b, s, (hq + 2 * hkv) * d)).astype(dtype)
    return dict(q=p, k=p, v=p)


def _packed_4d():
    q, k, v = qkv()
    return dict(q=q, k=k, v=v, **PACKED)


def _packed_shapes_differ():
    feeds = packed_qkv()
    feeds["v"] = feeds["v"][..., :-8]
    return dict(feeds, **PACKED)


def _packed_seq_differ():
    feeds = packed_qkv()
    feeds["k"] = feeds["k"][:, :3]
    return dict(feeds, **PACKED)


def _packed_not_divisible():
    p = packed_qkv()["q"][..., :-1]
    return dict(q=p, k=p, v=p, **PACKED)


# The valid input each 3-D / head-count case runs afterwards in the same session (same attributes).
GOOD = {
    "3d_missing_q_num_heads": lambda: dict(zip("qkv", qkv()), kv_num_heads=2),
    "3d_missing_kv_num_heads": lambda: dict(zip("qkv", qkv()), q_num_heads=4),
    "3d_q_not_divisible": lambda: dict(zip("qkv", qkv3()), **HEADS),
    "3d_v_not_divisible": lambda: dict(zip("qkv", qkv3()), **HEADS),
    "3d_head_size_mismatch": lambda: dict(zip("qkv", qkv3()), **HEADS),
    "3d_mixed_ranks": lambda: dict(zip("qkv", qkv3()), **HEADS),
    "4d_q_num_heads_mismatch": lambda: dict(zip("qkv", qkv(hq=2, hkv=2)), q_num_heads=2),
    "4d_kv_num_heads_mismatch": lambda: dict(zip("qkv", qkv(hq=4, hkv=4)), kv_num_heads=4),
    "packed_4d": lambda: dict(packed_qkv(), **PACKED),
    "packed_shapes_differ": lambda: dict(packed_qkv(), **PACKED),
    "packed_seq_differ": lambda: dict(packed_qkv(), **PACKED),
    "packed_not_divisible": lambda: dict(packed_qkv(), **PACKED),
}


CASES = {
    "rank": (_rank3, "rank 4"),
    "3d_missing_q_num_heads": (_3d_missing_q_num_heads, "Q is rank 3 (B, S, H*D), so attribute q_num_heads is required"),
    "3d_missing_kv_num_heads": (_3d_missing_kv_num_heads, "K is rank 3 (B, S, H*D), so attribute kv_num_heads is required"),
    "3d_q_not_divisible": (_3d_q_not_divisible, "Q's last dimension 62 is not a multiple of q_num_heads 4"),
    "3d_v_not_divisible": (_3d_v_not_divisible, "V's last dimension 31 is not a multiple of kv_num_heads 2"),
    "3d_head_size_mismatch": (_3d_head_size_mismatch, "head sizes 8 and 16"),
    "3d_mixed_ranks": (_3d_mixed_ranks, "must all have rank 4 (B, H, S, D) or all rank 3 (B, S, H*D)"),
    "4d_q_num_heads_mismatch": (_4d_q_num_heads_mismatch, "q_num_heads = 2 does not match Q's head dimension 4"),
    "4d_kv_num_heads_mismatch": (_4d_kv_num_heads_mismatch, "kv_num_heads = 4 does not match K's head dimension 2"),
    "packed_4d": (_packed_4d, "packed_qkv = 1 needs the 3-D form"),
    "packed_shapes_differ": (_packed_shapes_differ, "with packed_qkv = 1, Q, K and V must have the same shape"),
    "packed_seq_differ": (_packed_seq_differ, "with packed_qkv = 1, Q, K and V must have the same shape"),
    "packed_not_divisible": (_packed_not_divisible,
                             "packed last dimension 127 must be a multiple of q_num_heads + 2*kv_num_heads = 4 + 2*2 = 8"),
    "batch": (_batch, "batch sizes differ"),
    "heads_not_multiple": (_heads_not_multiple, "multiple of the number of key/value heads"),
    "kv_heads_differ": (_kv_heads_differ, "same number of heads"),
    "kv_seq_differ": (_kv_seq_differ, "same sequence length"),
    "head_size_mismatch": (_head_size_mismatch, "same head size"),
    "head_size_too_large": (_head_size_too_large, "unsupported head size"),
    "mask_not_broadcastable": (_mask_not_broadcastable, "does not broadcast"),
    "mask_rank_5": (_mask_rank_5, "rank 2 to 4"),
    "mask_wrong_type": (_mask_wrong_type, "must be bool or the type of Q"),
    "key_lengths_negative": (_key_lengths_negative, "key_lengths[1] = -1"),
    "key_lengths_too_large": (_key_lengths_too_large, "key_lengths[0] = 8"),
    "key_lengths_wrong_shape": (_key_lengths_wrong_shape, "key_lengths must have shape"),
}

# Attribute errors surface when the session creates the kernel.
ATTRIBUTE_CASES = {
    "is_causal_3": ({"is_causal": 3}, "'is_causal' must be 0, 1 or 2"),
    "softcap_negative": ({"softcap": -1.0}, "'softcap' must be a finite float >= 0"),
    "scale_nan": ({"scale": float("nan")}, "'scale' must be a finite"),
    "scale_int": ({"scale": 2}, "'scale' must be a float"),
    "q_num_heads_negative": ({"q_num_heads": -4}, "'q_num_heads' must be a positive int"),
    "kv_num_heads_negative": ({"kv_num_heads": -1}, "'kv_num_heads' must be a positive int"),
    "num_heads_not_multiple": ({"q_num_heads": 6, "kv_num_heads": 4},
                               "'q_num_heads' (6) must be a multiple of attribute 'kv_num_heads' (4)"),
    "q_num_heads_float": ({"q_num_heads": 4.0}, "'q_num_heads' must be an int"),
    "packed_qkv_2": ({"packed_qkv": 2, "q_num_heads": 4, "kv_num_heads": 2}, "'packed_qkv' must be 0 or 1, got 2"),
    "packed_qkv_without_heads": ({"packed_qkv": 1, "q_num_heads": 4},
                                 "packed_qkv = 1 requires attributes q_num_heads and kv_num_heads"),
    "packed_qkv_float": ({"packed_qkv": 1.0}, "'packed_qkv' must be an int"),
}


def run_case(name: str) -> dict:
    if name in ATTRIBUTE_CASES:
        from opsfuse.ort_session import make_session

        from ort_helpers import fused_attention_model

        attrs, _ = ATTRIBUTE_CASES[name]
        try:
            make_session(fused_attention_model(np.float32, **attrs)).run(None, dict(zip("QKV", qkv())))
        except Exception as e:  # noqa: BLE001 - the message is what the test checks
            return {"error": str(e), "recovered": True}
        return {"error": None, "recovered": True}
    make, _ = CASES[name]
    run = FusedAttentionRunner(declare_shapes=False)  # the op itself must catch every bad shape
    feeds = make()
    error = None
    try:
        run(feeds.pop("q"), feeds.pop("k"), feeds.pop("v"), **feeds)
    except Exception as e:  # noqa: BLE001 - the message is what the test checks
        error = str(e)
    # Then a valid input with the same model signature (same session) where one exists.
    q, k, v = qkv()
    good = {"q": q, "k": k, "v": v}
    if name in GOOD:
        good = GOOD[name]()
    elif name == "mask_not_broadcastable":
        good["attn_mask"] = np.ones((5, 7), dtype=bool)
    elif name.startswith("key_lengths"):
        kl_dtype = np.int32 if name == "key_lengths_too_large" else np.int64
        good["key_lengths"] = np.array([7, 2], dtype=kl_dtype)
    out = run(good.pop("q"), good.pop("k"), good.pop("v"), **good)
    return {"error": error, "recovered": bool(np.all(np.isfinite(out)))}


if __name__ == "__main__":
    print(json.dumps(run_case(sys.argv[1])))
