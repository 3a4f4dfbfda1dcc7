"""The optional qkv_bias input (docs/notes/contract_qkv_bias.md) in the float64 reference and in the
onnx schema: Q, K and V are the column windows of (P + qkv_bias), the bias broadcast over batch and
sequence; the input is allowed only with packed_qkv = 1, of type T and shape ((Hq + 2*Hkv)*D,)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from opsfuse import contract, schema
from opsfuse.reference import attention_reference


def heads_by_hand(p: np.ndarray, bias: np.ndarray, hq: int, hkv: int):
    """(B, S, (Hq + 2*Hkv)*D) plus bias -> 4-D Q (B, Hq, S, D), K, V (B, Hkv, S, D) in float64, by
    explicit per-head column slices (independent of the reference's window code)."""
    b, s, width = p.shape
    d = width // (hq + 2 * hkv)
    full = p.astype(np.float64) + bias.astype(np.float64)[None, None, :]
    q = np.stack([full[:, :, h * d:(h + 1) * d] for h in range(hq)], axis=1)
    k = np.stack([full[:, :, (hq + h) * d:(hq + h + 1) * d] for h in range(hkv)], axis=1)
    v = np.stack([full[:, :, (hq + hkv + h) * d:(hq + hkv + h + 1) * d] for h in range(hkv)], axis=1)
    return q, k, v


def merge(y4: np.ndarray) -> np.ndarray:
    b, h, s, d = y4.shape
    return y4.transpose(0, 2, 1, 3).reshape(b, s, h * d)


# --- the float64 reference ----------------------------------------------------------------------


@pytest.mark.parametrize("bias_scale", [0.1, 100.0], ids=["small", "100x"])
@pytest.mark.parametrize("hq,hkv,d", [(2, 2, 8), (6, 2, 5), (4, 1, 16)])
@pytest.mark.parametrize("softcap", [0.0, 30.0])
def test_reference_reads_windows_of_p_plus_bias(bias_scale, hq, hkv, d, softcap):
    rng = np.random.default_rng(hq * 100 + hkv * 10 + d)
    width = (hq + 2 * hkv) * d
    p = rng.standard_normal((2, 7, width))
    bias = bias_scale * rng.standard_normal(width)
    mask = rng.standard_normal((2, 1, 7, 7))
    y = attention_reference(p, p, p, mask, np.array([7, 4]), scale=0.2, is_causal=1, softcap=softcap,
                            q_num_heads=hq, kv_num_heads=hkv, packed_qkv=1, qkv_bias=bias)
    assert y.shape == (2, 7, hq * d) and y.dtype == np.float64
    q, k, v = heads_by_hand(p, bias, hq, hkv)
    want = merge(attention_reference(q, k, v, mask, np.array([7, 4]), scale=0.2, is_causal=1, softcap=softcap))
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12 * bias_scale)
    # The bias changes the result (it is not silently dropped).
    y0 = attention_reference(p, p, p, mask, np.array([7, 4]), scale=0.2, is_causal=1, softcap=softcap,
                             q_num_heads=hq, kv_num_heads=hkv, packed_qkv=1)
    assert np.abs(y - y0).max() > 1e-3 * bias_scale


def test_reference_k_bias_cancels_only_without_softcap():
    # K's bias adds scale * q . b_k to every score of a row: the softmax removes it exactly unless a
    # softcap bends the scores first (the note's reason kernels may leave it out without softcap).
    rng = np.random.default_rng(4)
    hq, hkv, d = 4, 2, 8
    width = (hq + 2 * hkv) * d
    p = rng.standard_normal((1, 6, width))
    k_only = np.zeros(width)
    k_only[hq * d:(hq + hkv) * d] = 10.0 * rng.standard_normal(hkv * d)
    kw = dict(q_num_heads=hq, kv_num_heads=hkv, packed_qkv=1)
    plain = attention_reference(p, p, p, **kw)
    np.testing.assert_allclose(attention_reference(p, p, p, qkv_bias=k_only, **kw), plain, rtol=1e-10, atol=1e-10)
    capped = attention_reference(p, p, p, softcap=2.0, **kw)
    assert np.abs(attention_reference(p, p, p, softcap=2.0, qkv_bias=k_only, **kw) - capped).max() > 1e-3


def test_reference_fully_masked_rows_are_zero_not_v_bias():
    rng = np.random.default_rng(5)
    hq, hkv, d = 4, 2, 6
    width = (hq + 2 * hkv) * d
    p = rng.standard_normal((3, 5, width))
    bias = 100.0 * rng.standard_normal(width)
    allowed = rng.random((3, 1, 5, 5)) < 0.7
    allowed[0, 0, 2] = False  # row 2 of batch 0: every key masked
    lengths = np.array([5, 0, 3])  # batch 1: no key at all
    y = attention_reference(p, p, p, allowed, lengths, q_num_heads=hq, kv_num_heads=hkv, packed_qkv=1,
                            qkv_bias=bias)
    assert (y[0, 2] == 0).all() and (y[1] == 0).all()
    assert np.abs(y[2]).min() > 0  # rows with visible keys do carry V's bias


def test_reference_sums_16_bit_inputs_exactly():
    # The contract's float64 reference takes P + bias exactly, not rounded to T.
    rng = np.random.default_rng(6)
    hq, hkv, d = 2, 1, 8
    width = (hq + 2 * hkv) * d
    for t in (np.float16, ml_dtypes.bfloat16):
        p = rng.standard_normal((1, 4, width)).astype(t)
        bias = (50.0 * rng.standard_normal(width)).astype(t)
        y = attention_reference(p, p, p, q_num_heads=hq, kv_num_heads=hkv, packed_qkv=1, qkv_bias=bias)
        exact = p.astype(np.float64) + bias.astype(np.float64)
        want = attention_reference(exact, exact, exact, q_num_heads=hq, kv_num_heads=hkv, packed_qkv=1)
        np.testing.assert_array_equal(y, want)
        rounded = (p.astype(np.float32) + bias.astype(np.float32)).astype(t).astype(np.float64)
        assert not np.array_equal(rounded, exact), "the case must tell the exact sum from the rounded one"


@pytest.mark.parametrize("kwargs,match", [
    (dict(packed_qkv=0, q_num_heads=2, kv_num_heads=1), "only allowed with packed_qkv = 1"),
    (dict(bias_len=31), r"qkv_bias must have shape .* = \(32,\), got \(31,\)"),
    (dict(bias_shape=(1, 32)), r"qkv_bias must have shape .* got \(1, 32\)"),
])
def test_reference_rejects_bad_bias(kwargs, match):
    p = np.zeros((1, 3, 32))
    bias = np.zeros(kwargs.pop("bias_shape", (kwargs.pop("bias_len", 32),)))
    kw = dict(q_num_heads=2, kv_num_heads=1, packed_qkv=1)
    kw.update(kwargs)
    with pytest.raises(ValueError, match=match):
        attention_reference(p, p, p, qkv_bias=bias, **kw)


# --- the onnx schema ------------------------------------------------------------------------------


def bias_model(*, width=400, bias_shape=(400,), bias_type=TensorProto.FLOAT, packed=1, as_initializer=False,
               key_lengths=False) -> onnx.ModelProto:
    """One FusedAttention node 'attn' on a packed P (2, 5, width) with Hq=6, Hkv=2 and qkv_bias at
    input 5 (mask empty; key_lengths empty unless asked for); the bias a graph input or an
    initializer."""
    inputs = [helper.make_tensor_value_info("P", TensorProto.FLOAT, [2, 5, width])]
    inits = []
    if as_initializer:
        arr = np.linspace(-1.0, 1.0, int(np.prod(bias_shape))).reshape(bias_shape)
        inits.append(numpy_helper.from_array(arr.astype(helper.tensor_dtype_to_np_dtype(bias_type)), "b"))
    else:
        inputs.append(helper.make_tensor_value_info("b", bias_type, list(bias_shape)))
    if key_lengths:
        inputs.append(helper.make_tensor_value_info("kl", TensorProto.INT64, [2]))
    node = helper.make_node("FusedAttention", ["P", "P", "P", "", "kl" if key_lengths else "", "b"], ["Y"],
                            domain=contract.DOMAIN, name="attn", q_num_heads=6, kv_num_heads=2, packed_qkv=packed)
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 5, 6 * 40])
    graph = helper.make_graph([node], "g", inputs, [y], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(contract.DOMAIN, contract.OP_VERSION)])


@pytest.mark.parametrize("as_initializer,key_lengths", [(False, False), (True, False), (True, True)])
def test_schema_accepts_qkv_bias_and_infers_y(as_initializer, key_lengths):
    schema.register()
    inferred = onnx.shape_inference.infer_shapes(bias_model(as_initializer=as_initializer, key_lengths=key_lengths),
                                                 check_type=True, strict_mode=True)
    onnx.checker.check_model(inferred, full_check=True)
    y = inferred.graph.output[0].type.tensor_type
    assert [d.dim_value for d in y.shape.dim] == [2, 5, 6 * 40] and y.elem_type == TensorProto.FLOAT


BAD_BIAS = [
    (dict(packed=0), "input qkv_bias (the packed projection's bias) is only allowed with attribute packed_qkv = 1"),
    (dict(bias_shape=(399,)), "input qkv_bias has 399 elements; it must have one per packed column, the packed "
                              "last dimension 400"),
    (dict(bias_shape=(1, 400)), "input qkv_bias must be 1-D ((q_num_heads + 2*kv_num_heads)*D,), got rank 2"),
    (dict(bias_type=TensorProto.FLOAT16), "input qkv_bias has element type FLOAT16, Q FLOAT: they must be the "
                                          "same type T"),
    (dict(bias_type=TensorProto.INT64, as_initializer=True), "input qkv_bias has element type INT64, Q FLOAT"),
]


@pytest.mark.parametrize("kwargs,expected", BAD_BIAS, ids=[e[:40] for _, e in BAD_BIAS])
def test_schema_rejects_bad_qkv_bias_naming_the_node(kwargs, expected):
    schema.register()
    with pytest.raises(onnx.shape_inference.InferenceError) as err:
        onnx.shape_inference.infer_shapes(bias_model(**kwargs), check_type=True, strict_mode=True)
    text = str(err.value)
    assert "FusedAttention" in text and "(attn)" in text and expected in text, text


def test_rewrite_validation_rejects_bad_qkv_bias():
    # The check the rewrite runs before it writes a model (onnx.checker + strict shape inference).
    import onnx_ir as ir

    from opsfuse.graph_passes import model_io

    model_io.validate(ir.serde.deserialize_model(bias_model(as_initializer=True)))
    with pytest.raises(model_io.InvalidModelError, match="only allowed with attribute packed_qkv = 1"):
        model_io.validate(ir.serde.deserialize_model(bias_model(as_initializer=True, packed=0)))
