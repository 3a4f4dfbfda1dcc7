"""The 3-D form of FusedAttention (docs/notes/contract_3d_form.md) through ONNX Runtime on the CPU:
Q (B, Sq, Hq*D), K (B, Sk, Hkv*D), V (B, Sk, Hkv*Dv) -> Y (B, Sq, Hq*Dv) with q_num_heads /
kv_num_heads. Checked against the float64 reference (2x rule, fresh random data, odd sizes),
against the 4-D form on the same data (the kernels read both layouts through strides, so the
results must be bitwise equal), and against the ONNX reference `Attention` (opset 23) 3-D form."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from accuracy import assert_within_2x_torch, random_mask
from onnx_attention_reference import OVERLAP_CASES, TOLERANCE, case_attributes, case_id, case_mask, onnx_attention
from ort_helpers import (assert_onnx_shape_inference_rejects, call_kwargs, FusedAttentionRunner, fused_attention_model,
                         reference_kwargs)
from opsfuse import contract, schema
from opsfuse.ort_session import make_session
from opsfuse.reference import attention_reference, merge_heads, split_heads

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]
SEQS = [1, 7, 97]


@pytest.fixture(scope="module")
def run():
    return FusedAttentionRunner()


def random_3d(rng, dtype, b, hq, hkv, sq, sk, d, dv):
    """Fresh standard-normal Q, K, V of the 3-D form (never zeros) in `dtype`."""
    return (rng.standard_normal((b, sq, hq * d)).astype(dtype),
            rng.standard_normal((b, sk, hkv * d)).astype(dtype),
            rng.standard_normal((b, sk, hkv * dv)).astype(dtype))


def check_3d(run, q, k, v, hq, hkv, what, **kwargs):
    """Runs the 3-D form; asserts its shape, the 2x rule against the float64 reference (on the
    4-D views of the same data) and bitwise equality with the 4-D form on the same data."""
    b, sq, _ = q.shape
    dv = v.shape[2] // hkv
    call = call_kwargs(kwargs, hq, hkv)
    out3 = run(q, k, v, **call)
    assert out3.shape == (b, sq, hq * dv), f"{what}: Y has shape {out3.shape}"
    assert out3.dtype == q.dtype
    q4, k4, v4 = split_heads(q, hq), split_heads(k, hkv), split_heads(v, hkv)
    out4_view = split_heads(out3, hq)
    assert_within_2x_torch(out4_view, q4, k4, v4, **reference_kwargs(kwargs), what=what)
    without_heads = {n: x for n, x in call.items() if n not in (contract.ATTR_Q_NUM_HEADS, contract.ATTR_KV_NUM_HEADS)}
    out4 = run(np.ascontiguousarray(q4), np.ascontiguousarray(k4), np.ascontiguousarray(v4), **without_heads)
    np.testing.assert_array_equal(out3.view(np.uint8), merge_heads(out4).view(np.uint8),
                                  err_msg=f"{what}: 3-D and 4-D forms differ on the same data")
    return out3


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("d", [40, 64, 80])
@pytest.mark.parametrize("hq,hkv", [(6, 2), (4, 1), (3, 3)], ids=["gqa", "mqa", "mha"])
def test_sizes_heads_and_dtypes(run, dtype, d, hq, hkv):
    rng = np.random.default_rng()
    dv = {40: 24, 64: 64, 80: 72}[d]  # Dv != D for two of the three
    for sq in SEQS:
        for sk in SEQS:
            q, k, v = random_3d(rng, dtype, 2, hq, hkv, sq, sk, d, dv)
            check_3d(run, q, k, v, hq, hkv, f"3-D D={d} Dv={dv} Hq={hq} Hkv={hkv} Sq={sq} Sk={sk}")


MASK_SHAPES = [(7, 13), (1, 7, 13), (6, 1, 13), (2, 1, 7, 13), (1, 6, 7, 13), (2, 6, 1, 1), (7, 1),
               (2, 1, 1, 13), (1, 13)]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("shape", MASK_SHAPES, ids=[str(s) for s in MASK_SHAPES])
def test_masks_broadcast_to_b_hq_sq_sk(run, dtype, kind, shape):
    """The mask keeps its 4-D meaning (broadcast to (B, Hq, Sq, Sk)) with 3-D Q, K, V."""
    rng = np.random.default_rng()
    q, k, v = random_3d(rng, dtype, 2, 6, 2, 7, 13, 40, 24)
    mask = random_mask(rng, kind, shape, dtype)
    check_3d(run, q, k, v, 6, 2, f"3-D {kind} mask {shape}", attn_mask=mask)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kl_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("with_mask", [False, True])
def test_key_lengths(run, dtype, kl_dtype, with_mask):
    rng = np.random.default_rng()
    q, k, v = random_3d(rng, dtype, 3, 6, 2, 9, 21, 64, 40)
    lengths = np.array([21, 0, 5], dtype=kl_dtype)  # full, none (zeros), partial
    mask = (rng.random((9, 21)) < 0.8) if with_mask else None
    out = check_3d(run, q, k, v, 6, 2, "3-D key_lengths", attn_mask=mask, key_lengths=lengths, is_causal=2)
    assert np.all(out[1].astype(np.float64) == 0.0), "key_lengths = 0 must give zeros"


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("is_causal", [1, 2])
@pytest.mark.parametrize("sq,sk", [(7, 97), (97, 7), (97, 97), (1, 97)])
def test_causal_modes(run, dtype, is_causal, sq, sk):
    rng = np.random.default_rng()
    q, k, v = random_3d(rng, dtype, 2, 4, 1, sq, sk, 80, 80)
    check_3d(run, q, k, v, 4, 1, f"3-D causal={is_causal} Sq={sq} Sk={sk}", is_causal=is_causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("softcap,scale", [(5.0, None), (2.0, 1.5), (0.0, 0.3)])
def test_softcap_and_scale(run, dtype, softcap, scale):
    rng = np.random.default_rng()
    q, k, v = random_3d(rng, dtype, 1, 6, 3, 13, 29, 64, 48)
    mask = rng.standard_normal((13, 29)).astype(dtype)
    check_3d(run, q, k, v, 6, 3, "3-D softcap/scale", attn_mask=mask, scale=scale, softcap=softcap or None)


def test_default_scale_uses_the_head_size_not_the_hidden_size(run):
    """Default scale 1/sqrt(D) with D = hidden / Hq: a kernel that took 1/sqrt(hidden) fails here."""
    rng = np.random.default_rng()
    hq, d = 8, 40
    q, k, v = random_3d(rng, np.float32, 1, hq, hq, 5, 11, d, d)
    out = run(q, k, v, q_num_heads=hq, kv_num_heads=hq)
    good = attention_reference(q, k, v, q_num_heads=hq, kv_num_heads=hq)
    wrong = attention_reference(q, k, v, scale=1.0 / np.sqrt(hq * d), q_num_heads=hq, kv_num_heads=hq)
    assert np.max(np.abs(out - good)) < 1e-5
    assert np.max(np.abs(good - wrong)) > 1e-2


def test_every_feature_at_once(run):
    rng = np.random.default_rng()
    for dtype in DTYPES:
        q, k, v = random_3d(rng, dtype, 2, 6, 2, 97, 97, 80, 40)
        mask = rng.standard_normal((2, 1, 97, 97)).astype(dtype)
        lengths = np.array([97, 50], dtype=np.int64)
        check_3d(run, q, k, v, 6, 2, f"3-D all features {np.dtype(dtype)}", attn_mask=mask, key_lengths=lengths,
                 is_causal=2, softcap=8.0, scale=0.2)


def test_empty_key_sequence_gives_zeros(run):
    rng = np.random.default_rng()
    q, k, v = random_3d(rng, np.float32, 1, 2, 2, 4, 0, 16, 8)
    out = run(q, k, v, q_num_heads=2, kv_num_heads=2)
    assert out.shape == (1, 4, 16) and np.all(out == 0.0)


def test_4d_inputs_may_repeat_the_head_counts(run):
    rng = np.random.default_rng()
    q = rng.standard_normal((2, 6, 7, 40)).astype(np.float32)
    k = rng.standard_normal((2, 2, 9, 40)).astype(np.float32)
    v = rng.standard_normal((2, 2, 9, 24)).astype(np.float32)
    with_heads = run(q, k, v, q_num_heads=6, kv_num_heads=2)
    np.testing.assert_array_equal(with_heads, run(q, k, v))
    assert with_heads.shape == (2, 6, 7, 24)


# ---------------------------------------------------------------------------------------------
# The ONNX reference Attention (opset 23), 3-D form, on the overlapping cases.

@pytest.mark.parametrize("case", OVERLAP_CASES, ids=case_id)
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
def test_matches_onnx_reference_attention_3d(run, case, dtype):
    rng = np.random.default_rng()
    c = dict(case)
    q, k, v = random_3d(rng, dtype, c["b"], c["hq"], c["hkv"], c["sq"], c["sk"], c["d"], c["dv"])
    mask = case_mask(rng, c, dtype)
    attrs = case_attributes(c)
    heads = dict(q_num_heads=c["hq"], kv_num_heads=c["hkv"])
    expected = onnx_attention(q, k, v, mask, **attrs, **heads).astype(np.float64)
    assert expected.shape == (c["b"], c["sq"], c["hq"] * c["dv"])
    got = run(q, k, v, attn_mask=mask, **attrs, **heads).astype(np.float64)
    tol = TOLERANCE[np.dtype(dtype)]
    np.testing.assert_allclose(got, expected, atol=tol, rtol=tol)


# ---------------------------------------------------------------------------------------------
# Shape inference: ORT's (the custom op's callback) and onnx's (opsfuse.schema).

def _downstream_model(v_last, hq, hkv, dv_out=32):
    """FusedAttention (3-D) -> MatMul (Hq*Dv, 32) -> Y2, plus Shape(Y2): a node after the op keeps
    its shape only if the op's output shape was inferred."""
    elem = TensorProto.FLOAT
    q = helper.make_tensor_value_info("Q", elem, ["batch", "seq", hq * 40])
    k = helper.make_tensor_value_info("K", elem, ["batch", "kv", hkv * 40])
    v = helper.make_tensor_value_info("V", elem, ["batch", "kv", v_last])
    nodes = [
        helper.make_node("FusedAttention", ["Q", "K", "V"], ["Y"], domain="com.opsfuse", name="attn3d",
                         q_num_heads=hq, kv_num_heads=hkv),
        helper.make_node("Relu", ["Y"], ["R"]),
        helper.make_node("Shape", ["R"], ["S"]),
    ]
    graph = helper.make_graph(nodes, "g", [q, k, v], [helper.make_tensor_value_info("R", elem, None),
                                                       helper.make_tensor_value_info("S", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.opsfuse", 1)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("v_last,hq,hkv,expected_last", [(2 * 24, 6, 2, 6 * 24), (6 * 24, 6, 6, 6 * 24),
                                                          ("hidden_v", 6, 6, "hidden_v")])
def test_ort_and_onnx_shape_inference_give_the_3d_output(v_last, hq, hkv, expected_last):
    schema.register()
    model = _downstream_model(v_last, hq, hkv)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(inferred, full_check=True)
    infos = {vi.name: vi for vi in inferred.graph.value_info}
    dims = [d.dim_param or d.dim_value for d in infos["Y"].type.tensor_type.shape.dim]
    assert dims == ["batch", "seq", expected_last]
    assert infos["Y"].type.tensor_type.elem_type == TensorProto.FLOAT

    session = make_session(model)
    out = {o.name: o for o in session.get_outputs()}
    assert out["R"].shape == ["batch", "seq", expected_last]
    rng = np.random.default_rng()
    vl = v_last if isinstance(v_last, int) else hkv * 24
    feeds = {"Q": rng.standard_normal((3, 5, hq * 40)).astype(np.float32),
             "K": rng.standard_normal((3, 7, hkv * 40)).astype(np.float32),
             "V": rng.standard_normal((3, 7, vl)).astype(np.float32)}
    r, s = session.run(None, feeds)
    assert list(s) == [3, 5, hq * (vl // hkv)]
    ref = attention_reference(feeds["Q"], feeds["K"], feeds["V"], q_num_heads=hq, kv_num_heads=hkv)
    np.testing.assert_allclose(r, np.maximum(ref, 0.0), atol=1e-5, rtol=1e-5)


def test_model_with_3d_fused_attention_passes_checker():
    schema.register()
    model = fused_attention_model(np.float16, np.bool_, 4, np.int64, rank=3, is_causal=2, softcap=3.0, scale=0.5,
                                  q_num_heads=6, kv_num_heads=2)
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    y = inferred.graph.output[0]
    assert len(y.type.tensor_type.shape.dim) == 3


BAD_NODES = [
    # (Q dims, K dims, V dims, attributes, expected message part)
    ((2, 5, 770), (2, 7, 768), (2, 7, 768), dict(q_num_heads=12, kv_num_heads=12),
     "Q's last dimension 770 is not a multiple of q_num_heads 12"),
    ((2, 5, 768), (2, 7, 768), (2, 7, 769), dict(q_num_heads=12, kv_num_heads=12),
     "V's last dimension 769 is not a multiple of kv_num_heads 12"),
    ((2, 5, 768), (2, 7, 768), (2, 7, 768), dict(kv_num_heads=12), "attribute q_num_heads is required"),
    ((2, 5, 768), (2, 7, 768), (2, 7, 768), dict(q_num_heads=12), "attribute kv_num_heads is required"),
    ((2, 5, 768), (2, 12, 7, 64), (2, 12, 7, 64), dict(q_num_heads=12, kv_num_heads=12), "all rank 3"),
    ((2, 12, 5, 64), (2, 4, 7, 64), (2, 4, 7, 64), dict(q_num_heads=12, kv_num_heads=2),
     "kv_num_heads = 2 does not match K's head dimension 4"),
    ((2, 12, 5, 64), (2, 4, 7, 64), (2, 4, 7, 64), dict(q_num_heads=-12), "'q_num_heads' must be a positive int"),
    ((2, 5, 768), (2, 7, 256), (2, 7, 256), dict(q_num_heads=12, kv_num_heads=5), "must be a multiple of"),
]


@pytest.mark.parametrize("qd,kd,vd,attrs,expected", BAD_NODES, ids=[b[-1][:40] for b in BAD_NODES])
def test_onnx_shape_inference_rejects_bad_3d_nodes(qd, kd, vd, attrs, expected):
    assert_onnx_shape_inference_rejects(qd, kd, vd, attrs, expected)


def test_reference_3d_matches_4d_and_rejects_mixed_ranks():
    rng = np.random.default_rng()
    q, k, v = random_3d(rng, np.float64, 2, 6, 3, 5, 9, 16, 8)
    out = attention_reference(q, k, v, q_num_heads=6, kv_num_heads=3, is_causal=2)
    four = attention_reference(split_heads(q, 6), split_heads(k, 3), split_heads(v, 3), is_causal=2)
    np.testing.assert_array_equal(out, merge_heads(four))
    with pytest.raises(ValueError):
        attention_reference(q, split_heads(k, 3), split_heads(v, 3), q_num_heads=6, kv_num_heads=3)
    with pytest.raises(ValueError):
        attention_reference(q, k, v, q_num_heads=6)
