"""FusedAttention through ONNX Runtime on the CPU against the float64 reference (2x rule), with
fresh random data for every case and odd sizes."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import onnx
import pytest

from accuracy import assert_within_2x_torch, random_inputs, random_mask
from ort_helpers import FusedAttentionRunner, fused_attention_model
from opsfuse.reference import attention_reference

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]
HEAD_DIMS = [32, 40, 64, 80, 96, 128, 256]
SEQ_PAIRS = [(1, 1), (1, 1025), (7, 97), (97, 7), (97, 97), (1025, 97), (7, 1025)]


@pytest.fixture(scope="module")
def run():
    return FusedAttentionRunner()



@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_sizes_and_head_dims(run, dtype, d):
    rng = np.random.default_rng()
    # Every head size meets several odd sequence pairs; Dv differs from D in some.
    for i, (sq, sk) in enumerate(SEQ_PAIRS[(d % 5):] + SEQ_PAIRS[: (d % 5)]):
        if i >= 3:
            break
        dv = d if i != 1 else max(8, (d * 3) // 4)
        b, hq, hkv = [(1, 2, 2), (2, 4, 1), (1, 6, 3)][i]
        q, k, v = random_inputs(rng, dtype, b, hq, hkv, sq, sk, d, dv)
        out = run(q, k, v)
        assert_within_2x_torch(out, q, k, v, what=f"D={d} Dv={dv} Sq={sq} Sk={sk}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("sq,sk", [(1, 1025), (1025, 1025), (97, 1025)])
def test_long_sequences(run, dtype, sq, sk):
    rng = np.random.default_rng()
    q, k, v = random_inputs(rng, dtype, 1, 2, 1, sq, sk, 64, 64)
    out = run(q, k, v, is_causal=2)
    assert_within_2x_torch(out, q, k, v, is_causal=2, what=f"Sq={sq} Sk={sk}")


MASK_SHAPES = [
    (2, (7, 13)),
    (3, (1, 7, 13)),
    (3, (4, 1, 13)),
    (4, (2, 1, 7, 13)),
    (4, (1, 4, 7, 13)),
    (4, (2, 4, 1, 1)),
    (2, (7, 1)),
    (4, (2, 1, 1, 13)),  # padding mask: one value per key for every head and row
    (2, (1, 13)),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("rank,shape", MASK_SHAPES, ids=[str(s) for _, s in MASK_SHAPES])
def test_masks_broadcast(run, dtype, kind, rank, shape):
    rng = np.random.default_rng()
    q, k, v = random_inputs(rng, dtype, 2, 4, 2, 7, 13, 40, 24)
    mask = random_mask(rng, kind, shape, dtype)
    out = run(q, k, v, attn_mask=mask)
    assert_within_2x_torch(out, q, k, v, attn_mask=mask, what=f"{kind} mask {shape}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("is_causal", [0, 1, 2])
@pytest.mark.parametrize("sq,sk", [(5, 17), (17, 5), (33, 33), (1, 40)])
def test_causal_modes(run, dtype, is_causal, sq, sk):
    rng = np.random.default_rng()
    q, k, v = random_inputs(rng, dtype, 2, 2, 2, sq, sk, 64, 64)
    out = run(q, k, v, is_causal=is_causal)
    assert_within_2x_torch(out, q, k, v, is_causal=is_causal, what=f"causal={is_causal}")
    if is_causal == 1 and sq > sk:
        assert np.all(np.isfinite(out.astype(np.float64)))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kl_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("with_mask", [False, True])
def test_key_lengths(run, dtype, kl_dtype, with_mask):
    rng = np.random.default_rng()
    q, k, v = random_inputs(rng, dtype, 3, 4, 2, 9, 21, 64, 32)
    lengths = np.array([21, 0, 5], dtype=kl_dtype)  # full, none (row of zeros), partial
    mask = (rng.random((9, 21)) < 0.8) if with_mask else None
    out = run(q, k, v, attn_mask=mask, key_lengths=lengths, is_causal=2)
    assert_within_2x_torch(out, q, k, v, attn_mask=mask, key_lengths=lengths, is_causal=2, what="key_lengths")
    assert np.all(out[1].astype(np.float64) == 0.0), "key_lengths = 0 must give zeros"


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_fully_masked_rows_are_zero(run, dtype):
    rng = np.random.default_rng()
    q, k, v = random_inputs(rng, dtype, 1, 2, 2, 6, 10, 32, 32)
    bool_mask = rng.random((6, 10)) < 0.6
    bool_mask[2] = False
    add_mask = np.zeros((6, 10), dtype=dtype)
    add_mask[4] = -np.inf
    for mask in (bool_mask, add_mask):
        out = run(q, k, v, attn_mask=mask).astype(np.float64)
        assert not np.any(np.isnan(out))
        row = 2 if mask.dtype == np.bool_ else 4
        assert np.all(out[:, :, row] == 0.0)
        assert_within_2x_torch(out.astype(dtype), q, k, v, attn_mask=mask, what="fully masked rows")
    # Causal upper-left with Sq > Sk still sees key 0 on every row; lower-right masks the first rows.
    q2, k2, v2 = random_inputs(rng, dtype, 1, 1, 1, 8, 3, 16, 16)
    out = run(q2, k2, v2, is_causal=2).astype(np.float64)
    assert np.all(out[0, 0, :5] == 0.0) and np.all(np.abs(out[0, 0, 5:]) > 0)


def test_finite_large_negative_mask_is_not_masked(run):
    """A finite fill (HF's finfo.min) is an ordinary score: a row filled with it attends uniformly."""
    rng = np.random.default_rng()
    q, k, v = random_inputs(rng, np.float32, 1, 1, 1, 3, 8, 16, 16)
    mask = np.zeros((3, 8), dtype=np.float32)
    mask[1] = np.finfo(np.float32).min
    out = run(q, k, v, attn_mask=mask)
    np.testing.assert_allclose(out[0, 0, 1], v[0, 0].mean(axis=0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("hq,hkv", [(8, 1), (8, 2), (8, 8), (6, 3)])
def test_gqa_mqa(run, dtype, hq, hkv):
    rng = np.random.default_rng()
    q, k, v = random_inputs(rng, dtype, 2, hq, hkv, 11, 19, 80, 80)
    out = run(q, k, v, is_causal=1)
    assert_within_2x_torch(out, q, k, v, is_causal=1, what=f"Hq={hq} Hkv={hkv}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("softcap,scale", [(0.0, 0.3), (5.0, None), (2.0, 1.5), (30.0, -0.2)])
def test_softcap_and_scale(run, dtype, softcap, scale):
    rng = np.random.default_rng()
    q, k, v = random_inputs(rng, dtype, 1, 4, 2, 13, 29, 96, 96)
    mask = rng.standard_normal((13, 29)).astype(dtype)
    attrs = {"softcap": softcap} if softcap else {}
    if scale is not None:
        attrs["scale"] = scale
    out = run(q, k, v, attn_mask=mask, **attrs)
    assert_within_2x_torch(out, q, k, v, attn_mask=mask, scale=scale, softcap=softcap, what="softcap/scale")


# Items with at most half a vector of rows (MHA decoding: Sq = 1 with Hq = Hkv, or Sq = 3) go
# through the kernel's row formulation (dot products along D, attention_cpu_impl.h), which has
# its own code for every part of the contract; these cases keep Hq = Hkv so every item is small.
ROW_MASK_SHAPES = [(1, 77), (2, 1, 1, 77), (2, 3, 1, 77), (1, 3, 1, 77), (3, 1, 77), (2, 3, 1, 1)]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("shape", ROW_MASK_SHAPES, ids=[str(s) for s in ROW_MASK_SHAPES])
def test_decode_rows_masks(run, dtype, kind, shape):
    rng = np.random.default_rng()
    q, k, v = random_inputs(rng, dtype, 2, 3, 3, 1, 77, 64, 64)
    mask = random_mask(rng, kind, shape, dtype)
    out = run(q, k, v, attn_mask=mask)
    assert_within_2x_torch(out, q, k, v, attn_mask=mask, what=f"decode {kind} mask {shape}")
    assert not np.any(np.isnan(out.astype(np.float64)))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("sq", [1, 3])
@pytest.mark.parametrize("d,dv", [(7, 7), (59, 59), (256, 256), (64, 130), (17, 5), (1, 1), (200, 24)])
@pytest.mark.parametrize("is_causal", [0, 1, 2])
def test_decode_rows_sizes_and_causal(run, dtype, sq, d, dv, is_causal):
    rng = np.random.default_rng()
    q, k, v = random_inputs(rng, dtype, 1, 4, 4, sq, 131, d, dv)
    out = run(q, k, v, is_causal=is_causal)
    assert_within_2x_torch(out, q, k, v, is_causal=is_causal, what=f"decode Sq={sq} D={d} Dv={dv} causal={is_causal}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("sq", [1, 3])
def test_decode_rows_key_lengths_softcap_and_empty_rows(run, dtype, sq):
    rng = np.random.default_rng()
    q, k, v = random_inputs(rng, dtype, 3, 2, 2, sq, 200, 40, 72)
    lengths = np.array([200, 0, 67], dtype=np.int64)  # full, none (zeros), partial over a tile edge
    mask = rng.random((3, 2, sq, 200)) < 0.8
    mask[0, 1] = False  # every key of (batch 0, head 1) masked: zeros, never NaN
    out = run(q, k, v, attn_mask=mask, key_lengths=lengths, is_causal=2, softcap=6.0, scale=0.3)
    assert_within_2x_torch(out, q, k, v, attn_mask=mask, key_lengths=lengths, is_causal=2, softcap=6.0, scale=0.3,
                           what=f"decode key_lengths Sq={sq}")
    out64 = out.astype(np.float64)
    assert not np.any(np.isnan(out64))
    assert np.all(out64[1] == 0.0) and np.all(out64[0, 1] == 0.0)


def test_every_feature_at_once(run):
    rng = np.random.default_rng()
    for dtype, (sq, sk, d, dv) in itertools.product(DTYPES, [(1, 97, 40, 72), (97, 97, 128, 64)]):
        q, k, v = random_inputs(rng, dtype, 2, 6, 2, sq, sk, d, dv)
        mask = rng.standard_normal((2, 1, sq, sk)).astype(dtype)
        lengths = np.array([sk, sk // 2], dtype=np.int64)
        out = run(q, k, v, attn_mask=mask, key_lengths=lengths, is_causal=2, softcap=8.0, scale=0.2)
        assert_within_2x_torch(out, q, k, v, attn_mask=mask, key_lengths=lengths, is_causal=2, softcap=8.0,
                               scale=0.2, what=f"all features {np.dtype(dtype)}")


def test_empty_key_sequence_gives_zeros(run):
    rng = np.random.default_rng()
    q, k, v = random_inputs(rng, np.float32, 1, 2, 2, 4, 0, 16, 8)
    out = run(q, k, v)
    assert out.shape == (1, 2, 4, 8) and np.all(out == 0.0)


def test_thread_count_does_not_change_results():
    rng = np.random.default_rng()
    q, k, v = random_inputs(rng, np.float32, 2, 4, 2, 130, 300, 64, 64)
    one = FusedAttentionRunner(intra_op_threads=1)(q, k, v, is_causal=1)
    two = FusedAttentionRunner(intra_op_threads=2)(q, k, v, is_causal=1)
    np.testing.assert_array_equal(one, two)


def test_output_poison_is_overwritten(run):
    """ORT allocates Y; the kernel must write every element (a NaN-filled run would show)."""
    rng = np.random.default_rng()
    for _ in range(3):
        q, k, v = random_inputs(rng, np.float16, 1, 3, 1, 33, 65, 80, 48)
        out = run(q, k, v)
        assert np.all(np.isfinite(out.astype(np.float64)))
        ref = attention_reference(q, k, v)
        assert np.max(np.abs(out.astype(np.float64) - ref)) < 5e-3


def test_ort_and_onnx_shape_inference_keep_shapes():
    import onnxruntime as ort  # noqa: F401
    from onnx import TensorProto, helper

    from opsfuse import schema
    from opsfuse.ort_session import make_session

    schema.register()
    q = helper.make_tensor_value_info("Q", TensorProto.FLOAT16, ["batch", 8, "seq", 64])
    k = helper.make_tensor_value_info("K", TensorProto.FLOAT16, ["batch", 2, "kv", 64])
    v = helper.make_tensor_value_info("V", TensorProto.FLOAT16, ["batch", 2, "kv", 32])
    nodes = [
        helper.make_node("FusedAttention", ["Q", "K", "V"], ["Y"], domain="com.opsfuse", is_causal=1),
        helper.make_node("Transpose", ["Y"], ["T"], perm=[0, 2, 1, 3]),
        helper.make_node("Shape", ["T"], ["S"]),
    ]
    graph = helper.make_graph(nodes, "g", [q, k, v], [helper.make_tensor_value_info("T", TensorProto.FLOAT16, None),
                                                       helper.make_tensor_value_info("S", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.opsfuse", 1)])
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(inferred, full_check=True)
    y_info = {vi.name: vi for vi in inferred.graph.value_info}["Y"]
    dims = [d.dim_param or d.dim_value for d in y_info.type.tensor_type.shape.dim]
    assert dims == ["batch", 8, "seq", 32]
    assert y_info.type.tensor_type.elem_type == TensorProto.FLOAT16

    session = make_session(model)
    out = {o.name: o for o in session.get_outputs()}
    assert out["T"].shape == ["batch", "seq", 8, 32] and out["T"].type == "tensor(float16)"
    rng = np.random.default_rng()
    feeds = {"Q": rng.standard_normal((3, 8, 5, 64)).astype(np.float16),
             "K": rng.standard_normal((3, 2, 7, 64)).astype(np.float16),
             "V": rng.standard_normal((3, 2, 7, 32)).astype(np.float16)}
    t, s = session.run(None, feeds)
    assert list(s) == [3, 5, 8, 32]


def test_model_with_fused_attention_passes_checker():
    from opsfuse import schema

    schema.register()
    model = fused_attention_model(np.float32, np.bool_, 2, np.int64, is_causal=2, softcap=3.0, scale=0.5)
    onnx.checker.check_model(model, full_check=True)
    bad = fused_attention_model(np.float32)
    bad.graph.node[0].attribute.append(onnx.helper.make_attribute("no_such_attribute", 1))
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(bad, full_check=True)
