"""Packed Q/K/V (attribute packed_qkv = 1, docs/notes/contract_3d_form.md second section) through
ONNX Runtime on the CPU: Q, K, V are each a (B, S, (Hq + 2*Hkv)*D) tensor; the op reads Q, K and V
as the column windows [0, Hq*D) of Q, [Hq*D, (Hq+Hkv)*D) of K, [(Hq+Hkv)*D, (Hq+2*Hkv)*D) of V.
Checked against the float64 reference (2x rule, fresh random data, odd sizes) and bitwise against
the unpacked 3-D form run on contiguous copies of the same windows (the kernels read both through
strides, so the numbers must not change). Both with one graph input given three times and with
three different inputs of one shape (each window must come from its own input)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from accuracy import assert_within_2x_torch, biased_sums, random_mask
from ort_helpers import (assert_onnx_shape_inference_rejects, call_kwargs, ONNX_TYPE, FusedAttentionRunner,
                         reference_kwargs, run_session)
from opsfuse import contract, schema
from opsfuse.ort_session import make_session
from opsfuse.reference import attention_reference, packed_qkv_windows, split_heads

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]
SEQS = [1, 7, 97]


def packed_model(dtype, shared: bool, mask_dtype=None, mask_rank: int = 0, key_lengths_dtype=None,
                 node_name: str = "packed0", bias_dtype=None, **attrs) -> onnx.ModelProto:
    """One FusedAttention node with packed_qkv = 1. shared: one graph input "P" feeds Q, K and V
    (the rewrite's form); else three graph inputs "Q", "K", "V" of one symbolic shape. bias_dtype:
    a graph input "qkv_bias" of that type as input 5."""
    elem = ONNX_TYPE[np.dtype(dtype)]
    packed = ["b", "s", "w"]
    names = ["P", "P", "P"] if shared else ["Q", "K", "V"]
    inputs = [helper.make_tensor_value_info(n, elem, packed) for n in dict.fromkeys(names)]
    if mask_dtype is not None:
        inputs.append(helper.make_tensor_value_info("attn_mask", ONNX_TYPE[np.dtype(mask_dtype)],
                                                    [f"m{i}" for i in range(mask_rank)]))
        names.append("attn_mask")
    if key_lengths_dtype is not None:
        if mask_dtype is None:
            names.append("")
        inputs.append(helper.make_tensor_value_info("key_lengths", ONNX_TYPE[np.dtype(key_lengths_dtype)], ["b"]))
        names.append("key_lengths")
    if bias_dtype is not None:
        names += [""] * (contract.INPUT_QKV_BIAS - len(names))
        inputs.append(helper.make_tensor_value_info("qkv_bias", ONNX_TYPE[np.dtype(bias_dtype)], ["w"]))
        names.append("qkv_bias")
    node = helper.make_node(contract.OP_NAME, names, ["Y"], domain=contract.DOMAIN, name=node_name,
                            **{contract.ATTR_PACKED_QKV: 1}, **attrs)
    graph = helper.make_graph([node], "packed", inputs, [helper.make_tensor_value_info("Y", elem, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(contract.DOMAIN, contract.OP_VERSION)])
    model.ir_version = 10
    return model


class PackedRunner:
    """Runs packed FusedAttention nodes, one cached session per signature."""

    def __init__(self):
        self._sessions: dict = {}

    def __call__(self, q, k=None, v=None, attn_mask=None, key_lengths=None, qkv_bias=None, **attrs):
        shared = k is None
        mask_dtype = None if attn_mask is None else np.asarray(attn_mask).dtype
        mask_rank = 0 if attn_mask is None else np.asarray(attn_mask).ndim
        kl_dtype = None if key_lengths is None else np.asarray(key_lengths).dtype
        bias_dtype = None if qkv_bias is None else qkv_bias.dtype
        key = (q.dtype, shared, mask_dtype, mask_rank, kl_dtype, bias_dtype, tuple(sorted(attrs.items())))
        if key not in self._sessions:
            self._sessions[key] = make_session(packed_model(q.dtype, shared, mask_dtype, mask_rank, kl_dtype,
                                                            bias_dtype=bias_dtype, **attrs))
        feeds = {"P": q} if shared else {"Q": q, "K": k, "V": v}
        if attn_mask is not None:
            feeds["attn_mask"] = attn_mask
        if key_lengths is not None:
            feeds["key_lengths"] = key_lengths
        if qkv_bias is not None:
            feeds["qkv_bias"] = qkv_bias
        return run_session(self._sessions[key], feeds, q.dtype)


@pytest.fixture(scope="module")
def packed():
    return PackedRunner()


@pytest.fixture(scope="module")
def unpacked():
    return FusedAttentionRunner()


def random_packed(rng, dtype, b, s, hq, hkv, d):
    """A fresh standard-normal packed (B, S, (Hq + 2*Hkv)*D) tensor (never zeros) in `dtype`."""
    return rng.standard_normal((b, s, (hq + 2 * hkv) * d)).astype(dtype)


def check_packed(packed, unpacked, p, hq, hkv, what, k=None, v=None, **kwargs):
    """Runs the packed form on P (given three times) or on (P, k, v); asserts Y's shape, the 2x
    rule against the float64 reference on the windows, and bitwise equality with the unpacked 3-D
    form on contiguous copies of the windows."""
    b, s, width = p.shape
    d = width // (hq + 2 * hkv)
    call = call_kwargs(kwargs, hq, hkv)
    out = packed(p, k, v, **call)
    assert out.shape == (b, s, hq * d), f"{what}: Y has shape {out.shape}"
    assert out.dtype == p.dtype
    qw, kw, vw = packed_qkv_windows(p, p if k is None else k, p if v is None else v, hq, hkv)
    assert_within_2x_torch(split_heads(out, hq), split_heads(qw, hq), split_heads(kw, hkv), split_heads(vw, hkv),
                           **reference_kwargs(kwargs), what=what)
    out3 = unpacked(np.ascontiguousarray(qw), np.ascontiguousarray(kw), np.ascontiguousarray(vw), **call)
    np.testing.assert_array_equal(out.view(np.uint8), out3.view(np.uint8),
                                  err_msg=f"{what}: packed and unpacked 3-D forms differ on the same windows")
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("d", [40, 64, 80])
@pytest.mark.parametrize("hq,hkv", [(6, 2), (4, 1), (3, 3)], ids=["gqa", "mqa", "mha"])
def test_sizes_heads_and_dtypes(packed, unpacked, dtype, d, hq, hkv):
    rng = np.random.default_rng()
    for s in SEQS:
        p = random_packed(rng, dtype, 2, s, hq, hkv, d)
        check_packed(packed, unpacked, p, hq, hkv, f"packed D={d} Hq={hq} Hkv={hkv} S={s}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("hq,hkv", [(6, 2), (4, 1)], ids=["gqa", "mqa"])
def test_three_different_inputs_each_give_their_own_window(packed, unpacked, dtype, hq, hkv):
    """Q, K, V of one shape but different data: Q's window must come from Q, K's from K, V's
    from V (a kernel reading every window from the first input fails the comparisons)."""
    rng = np.random.default_rng()
    for s in (7, 97):
        p, k, v = (random_packed(rng, dtype, 2, s, hq, hkv, 40) for _ in range(3))
        out = check_packed(packed, unpacked, p, hq, hkv, f"packed three inputs S={s}", k=k, v=v)
        same = packed(p, **{contract.ATTR_Q_NUM_HEADS: hq, contract.ATTR_KV_NUM_HEADS: hkv})
        assert not np.array_equal(out.view(np.uint8), same.view(np.uint8)), "K and V were read from Q"


MASK_SHAPES = [(13, 13), (1, 13, 13), (6, 1, 13), (2, 1, 13, 13), (1, 6, 13, 13), (2, 6, 1, 1), (13, 1),
               (2, 1, 1, 13), (1, 13)]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("shape", MASK_SHAPES, ids=[str(s) for s in MASK_SHAPES])
def test_masks_broadcast_to_b_hq_s_s(packed, unpacked, dtype, kind, shape):
    rng = np.random.default_rng()
    p = random_packed(rng, dtype, 2, 13, 6, 2, 40)
    mask = random_mask(rng, kind, shape, dtype)
    check_packed(packed, unpacked, p, 6, 2, f"packed {kind} mask {shape}", attn_mask=mask)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kl_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("with_mask", [False, True])
def test_key_lengths(packed, unpacked, dtype, kl_dtype, with_mask):
    rng = np.random.default_rng()
    p = random_packed(rng, dtype, 3, 21, 6, 2, 64)
    lengths = np.array([21, 0, 5], dtype=kl_dtype)  # full, none (zeros), partial
    mask = (rng.random((21, 21)) < 0.8) if with_mask else None
    out = check_packed(packed, unpacked, p, 6, 2, "packed key_lengths", attn_mask=mask, key_lengths=lengths)
    assert np.all(out[1].astype(np.float64) == 0.0), "key_lengths = 0 must give zeros"


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("is_causal", [1, 2])
@pytest.mark.parametrize("s", SEQS)
def test_causal_modes(packed, unpacked, dtype, is_causal, s):
    rng = np.random.default_rng()
    p = random_packed(rng, dtype, 2, s, 4, 1, 80)
    check_packed(packed, unpacked, p, 4, 1, f"packed causal={is_causal} S={s}", is_causal=is_causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("softcap,scale", [(5.0, None), (2.0, 1.5), (0.0, 0.3)])
def test_softcap_and_scale(packed, unpacked, dtype, softcap, scale):
    rng = np.random.default_rng()
    p = random_packed(rng, dtype, 1, 29, 6, 3, 64)
    mask = rng.standard_normal((29, 29)).astype(dtype)
    check_packed(packed, unpacked, p, 6, 3, "packed softcap/scale", attn_mask=mask, scale=scale,
                 softcap=softcap or None)


def test_default_scale_uses_the_head_size(packed):
    """Default scale 1/sqrt(D) with D = W / (Hq + 2*Hkv): neither the packed width nor Hq*D."""
    rng = np.random.default_rng()
    hq, hkv, d = 6, 2, 40
    p = random_packed(rng, np.float32, 1, 11, hq, hkv, d)
    out = packed(p, q_num_heads=hq, kv_num_heads=hkv)
    good = attention_reference(p, p, p, q_num_heads=hq, kv_num_heads=hkv, packed_qkv=1)
    wrong = attention_reference(p, p, p, q_num_heads=hq, kv_num_heads=hkv, packed_qkv=1, scale=1.0 / np.sqrt(hq * d))
    assert np.max(np.abs(out - good)) < 1e-5
    assert np.max(np.abs(good - wrong)) > 1e-2


def test_every_feature_at_once(packed, unpacked):
    rng = np.random.default_rng()
    for dtype in DTYPES:
        p = random_packed(rng, dtype, 2, 97, 6, 2, 80)
        mask = rng.standard_normal((2, 1, 97, 97)).astype(dtype)
        lengths = np.array([97, 50], dtype=np.int64)
        check_packed(packed, unpacked, p, 6, 2, f"packed all features {np.dtype(dtype)}", attn_mask=mask,
                     key_lengths=lengths, is_causal=2, softcap=8.0, scale=0.2)


# ---------------------------------------------------------------------------------------------
# qkv_bias (input 5, docs/notes/contract_qkv_bias.md): the CPU kernel reads copies of the windows
# with the bias added in float32 and rounded to T, as the graph's Add did; so it must equal, bit for
# bit, the unpacked form on those rounded sums, and meet the 2x rule against the exact sums.

def biased_windows(p, bias, hq, hkv):
    """(rounded, exact): the Q, K, V windows of p + bias rounded to p's dtype (float32 sums, the
    graph's Add), and the same sums in float64."""
    rounded, exact = biased_sums(p, bias)
    return packed_qkv_windows(rounded, rounded, rounded, hq, hkv), packed_qkv_windows(exact, exact, exact, hq, hkv)


def check_biased(packed, unpacked, p, bias, hq, hkv, what, **kwargs):
    b, s, width = p.shape
    d = width // (hq + 2 * hkv)
    call = call_kwargs(kwargs, hq, hkv)
    out = packed(p, qkv_bias=bias, **call)
    assert out.shape == (b, s, hq * d), f"{what}: Y has shape {out.shape}"
    rounded, exact = biased_windows(p, bias, hq, hkv)
    heads = (hq, hkv, hkv)
    assert_within_2x_torch(split_heads(out, hq), *(split_heads(w, h) for w, h in zip(rounded, heads)),
                           **reference_kwargs(kwargs), what=what,
                           exact=tuple(split_heads(w, h) for w, h in zip(exact, heads)))
    out3 = unpacked(*(np.ascontiguousarray(w) for w in rounded), **call)
    np.testing.assert_array_equal(out.view(np.uint8), out3.view(np.uint8),
                                  err_msg=f"{what}: differs from the unpacked form on the rounded biased windows")
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("hq,hkv,d", [(6, 2, 40), (3, 3, 64), (4, 1, 80)], ids=["gqa", "mha", "mqa"])
@pytest.mark.parametrize("bias_scale", [0.5, 100.0], ids=["small", "100x"])
def test_qkv_bias(packed, unpacked, dtype, hq, hkv, d, bias_scale):
    rng = np.random.default_rng()
    for s in SEQS:
        p = random_packed(rng, dtype, 2, s, hq, hkv, d)
        bias = (bias_scale * rng.standard_normal((hq + 2 * hkv) * d)).astype(dtype)
        # 100x biases make every score huge: a scale that keeps the softmax from being one-hot.
        scale = 1.0 / (d * bias_scale) if bias_scale > 1 else None
        check_biased(packed, unpacked, p, bias, hq, hkv, f"qkv_bias x{bias_scale} D={d} Hq={hq} Hkv={hkv} S={s}",
                     scale=scale)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_qkv_bias_with_every_feature_and_fully_masked_rows(packed, unpacked, dtype):
    rng = np.random.default_rng()
    p = random_packed(rng, dtype, 3, 97, 6, 2, 80)
    bias = rng.standard_normal(10 * 80).astype(dtype)
    mask = rng.standard_normal((3, 1, 97, 97)).astype(dtype)
    lengths = np.array([97, 50, 0], dtype=np.int64)  # batch 2: every key masked -> zeros, not V's bias
    out = check_biased(packed, unpacked, p, bias, 6, 2, f"qkv_bias all features {np.dtype(dtype)}", attn_mask=mask,
                       key_lengths=lengths, is_causal=2, softcap=8.0, scale=0.2)
    assert not np.any(out[2].astype(np.float32)), "fully masked rows must be zeros"


@pytest.mark.parametrize("case,expected", [
    ("unpacked", "packed_qkv is not 1"),
    ("length", "qkv_bias must have shape ((q_num_heads + 2*kv_num_heads)*D,) = (400,)"),
    ("rank", "qkv_bias must have shape"),
    ("dtype", "qkv_bias has element type float16; it must be the type of Q (float32)"),
])
def test_qkv_bias_errors_name_the_node(case, expected):
    rng = np.random.default_rng()
    p = rng.standard_normal((2, 5, 400)).astype(np.float32)
    bias = rng.standard_normal(400).astype(np.float32)
    attrs = {contract.ATTR_Q_NUM_HEADS: 6, contract.ATTR_KV_NUM_HEADS: 2}
    if case == "unpacked":
        model = packed_model(np.float32, True, node_name="biased", bias_dtype=np.float32, **attrs)
        node = model.graph.node[0]
        del node.attribute[:]
        node.attribute.extend([helper.make_attribute(contract.ATTR_Q_NUM_HEADS, 10),
                               helper.make_attribute(contract.ATTR_KV_NUM_HEADS, 10)])  # 3-D, not packed
        feeds = {"P": p, "qkv_bias": bias}
    else:
        bias = {"length": bias[:-40], "rank": bias.reshape(4, 100), "dtype": bias.astype(np.float16)}[case]
        model = packed_model(np.float32, True, node_name="biased", bias_dtype=bias.dtype, **attrs)
        if case == "rank":
            model.graph.input[-1].type.tensor_type.shape.dim.add().dim_param = "w2"
        feeds = {"P": p, "qkv_bias": bias}
    with pytest.raises(Exception) as info:
        make_session(model).run(None, feeds)
    assert "FusedAttention node 'biased'" in str(info.value) and expected in str(info.value), str(info.value)


def test_reference_packed_equals_the_unpacked_windows():
    rng = np.random.default_rng()
    p = rng.standard_normal((2, 9, (6 + 2 * 3) * 16))
    k, v = rng.standard_normal(p.shape), rng.standard_normal(p.shape)
    out = attention_reference(p, k, v, q_num_heads=6, kv_num_heads=3, packed_qkv=1, is_causal=1)
    expected = attention_reference(p[..., :96], k[..., 96:144], v[..., 144:], q_num_heads=6, kv_num_heads=3,
                                   is_causal=1)
    np.testing.assert_array_equal(out, expected)
    with pytest.raises(ValueError):
        attention_reference(p, p[:, :, :-12], p, q_num_heads=6, kv_num_heads=3, packed_qkv=1)
    with pytest.raises(ValueError):
        attention_reference(p[..., :-1], p[..., :-1], p[..., :-1], q_num_heads=6, kv_num_heads=3, packed_qkv=1)


# ---------------------------------------------------------------------------------------------
# Shape inference: ORT's (the custom op's callback) and onnx's (opsfuse.schema).

def _downstream_model(width, hq, hkv):
    """P -> FusedAttention (packed) -> Relu -> R, plus Shape(R): R keeps a shape only if the op's
    output shape was inferred."""
    elem = TensorProto.FLOAT
    p = helper.make_tensor_value_info("P", elem, ["batch", "seq", width])
    nodes = [
        helper.make_node("FusedAttention", ["P", "P", "P"], ["Y"], domain="com.opsfuse", name="packed_attn",
                         q_num_heads=hq, kv_num_heads=hkv, packed_qkv=1),
        helper.make_node("Relu", ["Y"], ["R"]),
        helper.make_node("Shape", ["R"], ["S"]),
    ]
    graph = helper.make_graph(nodes, "g", [p], [helper.make_tensor_value_info("R", elem, None),
                                                helper.make_tensor_value_info("S", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.opsfuse", 1)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("hq,hkv,d", [(6, 2, 40), (12, 12, 64), (4, 1, 80)])
def test_ort_and_onnx_shape_inference_give_b_s_hq_d(hq, hkv, d):
    schema.register()
    width = (hq + 2 * hkv) * d
    model = _downstream_model(width, hq, hkv)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(inferred, full_check=True)
    infos = {vi.name: vi for vi in inferred.graph.value_info}
    dims = [x.dim_param or x.dim_value for x in infos["Y"].type.tensor_type.shape.dim]
    assert dims == ["batch", "seq", hq * d]
    assert infos["Y"].type.tensor_type.elem_type == TensorProto.FLOAT

    session = make_session(model)
    out = {o.name: o for o in session.get_outputs()}
    assert out["R"].shape == ["batch", "seq", hq * d]
    rng = np.random.default_rng()
    feeds = {"P": rng.standard_normal((3, 5, width)).astype(np.float32)}
    r, s = session.run(None, feeds)
    assert list(s) == [3, 5, hq * d]
    ref = attention_reference(feeds["P"], feeds["P"], feeds["P"], q_num_heads=hq, kv_num_heads=hkv, packed_qkv=1)
    np.testing.assert_allclose(r, np.maximum(ref, 0.0), atol=1e-5, rtol=1e-5)


def test_symbolic_width_leaves_the_last_dimension_unknown():
    schema.register()
    model = _downstream_model("w", 6, 2)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    y = {vi.name: vi for vi in inferred.graph.value_info}["Y"].type.tensor_type.shape.dim
    assert [x.dim_param for x in y[:2]] == ["batch", "seq"] and not y[2].HasField("dim_value")
    session = make_session(model)
    rng = np.random.default_rng()
    p = rng.standard_normal((2, 3, 10 * 8)).astype(np.float32)
    r, s = session.run(None, {"P": p})
    assert list(s) == [2, 3, 6 * 8]


BAD_NODES = [
    # (Q dims, K dims, V dims, attributes, expected message part)
    ((2, 5, 400), (2, 5, 400), (2, 5, 400), dict(q_num_heads=6, kv_num_heads=2, packed_qkv=2),
     "'packed_qkv' must be 0 or 1"),
    ((2, 6, 5, 40), (2, 2, 5, 40), (2, 2, 5, 40), dict(q_num_heads=6, kv_num_heads=2, packed_qkv=1),
     "packed_qkv = 1 needs the 3-D form"),
    ((2, 5, 400), (2, 5, 400), (2, 5, 399), dict(q_num_heads=6, kv_num_heads=2, packed_qkv=1),
     "must have the same shape"),
    ((2, 5, 401), (2, 5, 401), (2, 5, 401), dict(q_num_heads=6, kv_num_heads=2, packed_qkv=1),
     "must be a multiple of q_num_heads + 2*kv_num_heads = 10"),
    ((2, 5, 400), (2, 5, 400), (2, 5, 400), dict(q_num_heads=6, packed_qkv=1), "requires attributes q_num_heads"),
]


@pytest.mark.parametrize("qd,kd,vd,attrs,expected", BAD_NODES, ids=[b[-1][:40] for b in BAD_NODES])
def test_onnx_shape_inference_rejects_bad_packed_nodes(qd, kd, vd, attrs, expected):
    assert_onnx_shape_inference_rejects(qd, kd, vd, attrs, expected)