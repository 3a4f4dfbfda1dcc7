"""Rule sdpa_subgraph: one test per exporter variant (structure, attributes, count, numerics in
ORT) and the negative cases with their stated reasons."""

from __future__ import annotations

import numpy as np
import pytest
from attention_graphs import F16, F32, classifier_softmax_model, random_feeds, sdpa_model
from rewrite_helpers import assert_same_outputs, attrs, fuse, fused_nodes, validate

D = 8


def _fused_one(model):
    out, report = fuse(model)
    assert report.found == 1, report.format()
    assert report.fused == 1, report.format()
    assert report.counts["sdpa_subgraph"] == 1
    nodes = fused_nodes(out)
    assert len(nodes) == 1
    assert not [n for n in out.graph.node if n.op_type == "Softmax"], "the Softmax should be gone"
    validate(out)
    return out, nodes[0], report


@pytest.mark.parametrize("scale", ["scores_mul", "scores_div", "q", "k", "split_sqrt", "none"])
def test_scale_placements(scale):
    model = sdpa_model(scale=scale)
    out, node, _ = _fused_one(model)
    expected = 1.0 if scale == "none" else 1.0 / np.sqrt(D)
    assert attrs(node)["scale"] == pytest.approx(expected, rel=1e-6)
    assert attrs(node)["is_causal"] == 0
    assert node.input[0] == "q" and node.input[2] == "v"
    assert_same_outputs(model, out, random_feeds(model))


@pytest.mark.parametrize("chain", ["cast", "sqrt"])
def test_scale_constant_through_cast_and_sqrt(chain):
    model = sdpa_model(scale="scores_mul", scale_chain=chain)
    out, node, _ = _fused_one(model)
    assert attrs(node)["scale"] == pytest.approx(1.0 / np.sqrt(D), rel=1e-6)
    assert_same_outputs(model, out, random_feeds(model))


def test_float16_scale_keeps_its_rounding():
    value = 0.1  # not representable in float16: the fused scale must be the float16 value
    model = sdpa_model(dtype=F16, scale="scores_mul", scale_value=value)
    out, node, _ = _fused_one(model)
    assert attrs(node)["scale"] == pytest.approx(float(np.float16(value)), rel=1e-7)
    assert attrs(node)["scale"] != pytest.approx(value, rel=1e-5)
    assert_same_outputs(model, out, random_feeds(model), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("layout", ["bnhd", "bsnh", "rtr", "pre"])
def test_k_layouts(layout):
    model = sdpa_model(k_layout=layout, scale="k" if layout in ("bnhd", "bsnh") else "scores_mul")
    out, node, _ = _fused_one(model)
    if layout == "bnhd":
        assert node.input[1] == "k", "Transpose(0,1,3,2) of BNSH K must be absorbed"
    assert_same_outputs(model, out, random_feeds(model))


@pytest.mark.parametrize("masks,first", [(("bias",), False), (("bias",), True), (("pad",), False),
                                         (("bias", "pad"), False), (("where",), False)])
def test_masks(masks, first):
    model = sdpa_model(masks=masks, mask_first=first)
    out, node, report = _fused_one(model)
    assert len(node.input) >= 4 and node.input[3]
    if masks == ("where",):
        assert node.input[3] == "bool_mask", "a -inf Where mask becomes the bool mask input"
    if masks == ("bias",):
        assert node.input[3] == "bias"
    if len(masks) == 2:
        producer = {o: n for n in out.graph.node for o in n.output}[node.input[3]]
        assert producer.op_type == "Add", "two additive masks fold into one input"
    assert_same_outputs(model, out, random_feeds(model))


def test_where_with_finfo_min_fill_stays_exact_for_fully_masked_rows():
    fill = float(np.finfo(np.float32).min)
    model = sdpa_model(masks=("where",), where_fill=fill)
    out, node, report = _fused_one(model)
    assert report.candidates[0].details["masks"] == [f"where-fill {fill:g}"]
    feeds = random_feeds(model)
    feeds["bool_mask"][0, 0, 1, :] = False  # a fully masked row: uniform attention in the original
    assert_same_outputs(model, out, feeds)


def test_where_bool_mask_with_nan_guard_fully_masked_row_is_zero():
    model = sdpa_model(masks=("where",), nan_guard=True)
    out, node, report = _fused_one(model)
    assert report.candidates[0].details["nan_guard"] is True
    feeds = random_feeds(model)
    feeds["bool_mask"][1, 0, 2, :] = False  # the guard turns this row's NaN into 0, as the op does
    assert_same_outputs(model, out, feeds)


def test_where_with_small_finite_fill_is_left_with_reason():
    model = sdpa_model(masks=("where",), where_fill=-1e9)
    out, report = fuse(model)
    assert report.found == 1 and report.fused == 0
    assert "fills with -1e+09" in report.left[0].reason and "uniform attention" in report.left[0].reason
    assert not fused_nodes(out)


def test_dropout_and_nan_guard_are_absorbed():
    model = sdpa_model(masks=("pad",), dropout=True, nan_guard=True)
    out, node, _ = _fused_one(model)
    assert not [n for n in out.graph.node if n.op_type in ("Dropout", "IsNaN")]
    assert_same_outputs(model, out, random_feeds(model))


def test_half_precision_model_with_float32_softmax():
    model = sdpa_model(dtype=F16, masks=("bias",), softmax_f32=True)
    out, node, _ = _fused_one(model)
    assert not [n for n in out.graph.node if n.op_type == "Cast"]
    assert_same_outputs(model, out, random_feeds(model), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("repeat_op", ["Expand", "Tile"])
def test_gqa_repeat_kv_is_absorbed(repeat_op):
    model = sdpa_model(H=4, Hkv=2, repeat_kv=True, masks=("pad",), repeat_op=repeat_op)
    out, node, report = _fused_one(model)
    assert node.input[1] == "k" and node.input[2] == "v", "FusedAttention must read the un-repeated K and V"
    assert report.candidates[0].details["gqa_repeat_absorbed"] == 2
    assert not [n for n in out.graph.node if n.op_type in ("Expand", "Tile")]
    assert_same_outputs(model, out, random_feeds(model))


def test_mqa_broadcast_by_matmul():
    model = sdpa_model(H=4, Hkv=1)
    out, node, _ = _fused_one(model)
    assert_same_outputs(model, out, random_feeds(model))


def test_cross_attention_different_lengths():
    model = sdpa_model(S=3, Sk=7, masks=("pad",))
    out, node, _ = _fused_one(model)
    assert_same_outputs(model, out, random_feeds(model))


def test_opset11_softmax_on_last_axis_is_fused():
    model = sdpa_model(opset=11, softmax_axis=3)
    out, node, _ = _fused_one(model)
    assert_same_outputs(model, out, random_feeds(model))


@pytest.mark.parametrize("opset,axis", [(11, None), (13, 1), (17, 2)])
def test_softmax_not_on_key_axis_is_left(opset, axis):
    model = sdpa_model(opset=opset, softmax_axis=axis)
    out, report = fuse(model)
    assert report.fused == 0 and report.found == 1
    assert "Softmax axis" in report.left[0].reason
    assert not fused_nodes(out)


def test_probabilities_as_graph_output_are_left():
    model = sdpa_model(prob_output=True)
    out, report = fuse(model)
    assert report.fused == 0
    assert "graph output" in report.left[0].reason
    assert report.left[0].nodes == ["/attn/MatMul_qk", "/attn/Softmax"]


def test_scale_after_additive_mask_is_left():
    model = sdpa_model(scale="after_mask", masks=("bias",))
    out, report = fuse(model)
    assert report.fused == 0
    assert "before the scale" in report.left[0].reason


def test_classifier_softmax_is_not_touched():
    model = classifier_softmax_model()
    out, report = fuse(model)
    assert report.found == 0 and report.fused == 0
    assert report.other_softmax == ["/attn/Softmax_3"]
    assert [n.op_type for n in out.graph.node] == [n.op_type for n in model.graph.node]
    assert not [o for o in out.opset_import if o.domain == "com.opsfuse"]


def test_model_properties_are_kept():
    model = sdpa_model(masks=("pad",))
    out, node, _ = _fused_one(model)
    assert out.producer_name == "opsfuse-tests"
    assert {p.key: p.value for p in out.metadata_props} == {"origin": "attention_graphs"}
    opsets = {o.domain: o.version for o in out.opset_import}
    assert opsets[""] == 17 and opsets["com.opsfuse"] == 1
    assert [o.name for o in out.graph.output] == ["y"]
    assert [i.name for i in out.graph.input] == [i.name for i in model.graph.input]
    assert node.name == "/attn/FusedAttention"
    assert attrs(node)["plugin_namespace"] == b"com.opsfuse" or attrs(node)["plugin_namespace"] == "com.opsfuse"


def test_every_fused_rewrite_is_checker_valid_and_runs_twice_idempotently():
    model = sdpa_model(masks=("bias", "pad"))
    out, _ = fuse(model)
    again, report = fuse(out)
    assert report.found == 0 and len(fused_nodes(again)) == 1


def test_ir_model_input_is_rewritten_in_place():
    import onnx_ir as ir

    from opsfuse.graph_passes import fuse_attention

    model = ir.serde.deserialize_model(sdpa_model())
    result, report = fuse_attention(model)
    assert result is model and report.fused == 1
    assert any(n.op_type == "FusedAttention" for n in model.graph)


def test_fuse_attention_rejects_other_types():
    from opsfuse.graph_passes import fuse_attention

    with pytest.raises(TypeError, match="ModelProto"):
        fuse_attention("model.onnx")


def test_pipeline_returns_counts():
    import onnx_ir as ir

    from opsfuse.graph_passes import run_pipeline

    model = ir.serde.deserialize_model(sdpa_model())
    assert run_pipeline(model) == {"onnx_attention": 0, "sdpa_subgraph": 1}


def test_dtype_mismatch_float32_mask_on_float16_model_is_left():
    from attention_graphs import G

    g = G(17)
    q, k, v = (g.inp(n, F16, [1, 2, 3, 4]) for n in "qkv")
    m = g.inp("m", F32, [1, 1, 3, 3])
    s = g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2]))
    s = g.op("Cast", s, to=F32)
    s = g.op("Add", s, m)
    p = g.op("Cast", g.op("Softmax", s, axis=-1), to=F16)
    g.op("MatMul", p, v)
    g.nodes[-1].output[0] = "y"
    g.out("y", F16, [1, 2, 3, 4])
    out, report = fuse(g.model())
    assert report.fused == 0
    assert "FLOAT" in report.left[0].reason and "mask" in report.left[0].reason


def test_where_with_fill_first_uses_the_negated_condition():
    model = sdpa_model(masks=("where",), where_negated=True, nan_guard=True)
    out, node, _ = _fused_one(model)
    producer = {o: n for n in out.graph.node for o in n.output}[node.input[3]]
    assert producer.op_type == "Not"
    assert_same_outputs(model, out, random_feeds(model))


def test_softcap_before_the_mask():
    model = sdpa_model(softcap=2.0, masks=("pad",))
    out, node, _ = _fused_one(model)
    assert attrs(node)["softcap"] == pytest.approx(2.0)
    assert not [n for n in out.graph.node if n.op_type == "Tanh"]
    assert_same_outputs(model, out, random_feeds(model))


def test_scale_after_softcap_is_left():
    model = sdpa_model(softcap=2.0, scale="after_mask")
    out, report = fuse(model)
    assert report.fused == 0
    assert "after the softcap" in report.left[0].reason


@pytest.mark.parametrize("opset", [11, 17])
def test_batched_matmul_three_d_form(opset):
    """Older exporters run attention as bmm on (B*H, S, D): lifted to (1, B*H, S, D) exactly."""
    from attention_graphs import G

    g = G(opset)
    q, k, v = (g.inp(n, F32, [6, 5, D]) for n in "qkv")
    m = g.inp("m", F32, [6, 5, 5])
    s = g.op("MatMul", q, g.op("Transpose", k, perm=[0, 2, 1]), name="/attn/MatMul_qk")
    s = g.op("Add", g.op("Mul", s, g.const(0.3)), m)
    p = g.op("Softmax", s, axis=2 if opset < 13 else -1, name="/attn/Softmax")
    g.op("MatMul", p, v, name="/attn/MatMul_pv")
    g.nodes[-1].output[0] = "y"
    g.out("y", F32, [6, 5, D])
    model = g.model()
    out, node, report = _fused_one(model)
    assert report.candidates[0].details["batched_matmul_3d"] is True
    assert attrs(node)["scale"] == pytest.approx(0.3)
    assert_same_outputs(model, out, random_feeds(model))


def _custom_graph(kind):
    from attention_graphs import G

    g = G(17)
    q, k, v = (g.inp(n, F32, [1, 2, 3, 4]) for n in "qkv")
    perm = [0, 1, 3, 2]
    if kind == "mixed_rank":  # GPT-NeoX-Japanese: Q, K viewed to (B*H, S, D), the scores viewed back to 4-D
        q = g.op("Reshape", q, g.const(np.array([2, 3, 4], np.int64)))
        k = g.op("Reshape", k, g.const(np.array([2, 3, 4], np.int64)))
        perm = [0, 2, 1]
    if kind == "unknown_rank":  # Q from an op no shape inference knows
        g.nodes.append(__import__("onnx").helper.make_node("Mystery", [q], ["q2"], domain="x.custom", name="/m"))
        q = "q2"
    s = g.op("MatMul", q, g.op("Transpose", k, perm=perm), name="/attn/MatMul_qk")
    if kind == "mixed_rank":
        s = g.op("Reshape", s, g.const(np.array([1, 2, 3, 3], np.int64)))
    if kind == "scores_used":
        g.out(s, F32, [1, 2, 3, 3])
    p = g.op("Softmax", s, axis=-1, name="/attn/Softmax")
    if kind == "dropout_training":
        p = g.op("Dropout", p, g.const(0.1), g.const(True, np.bool_))
    g.op("MatMul", p, v, name="/attn/MatMul_pv")
    g.nodes[-1].output[0] = "y"
    g.out("y", F32, [1, 2, 3, 4])
    extra = [__import__("onnx").helper.make_opsetid("x.custom", 1)] if kind == "unknown_rank" else []
    return g.model(extra)


@pytest.mark.parametrize("kind,reason", [
    ("unknown_rank", "cannot prove the rank of Q"),
    ("mixed_rank", "and Q rank 3; FusedAttention needs Q, K^T, V and the scores all rank 4"),
    ("scores_used", "graph output"),
    ("dropout_training", "training mode"),
])
def test_unprovable_candidates_are_left_with_reason(kind, reason):
    _left_with_reason(_custom_graph(kind), reason)


def _left_with_reason(model, reason):
    out, report = fuse(model)
    assert report.found == 1 and report.fused == 0, report.format()
    assert reason in report.left[0].reason
    assert not fused_nodes(out)


def test_shape_inference_leaves_nothing_in_the_working_directory(tmp_path, monkeypatch):
    """ORT's symbolic shape inference saves sym_shape_infer_temp.onnx and uuid-named .data files
    into the working directory for ops it hands to ONNX (here an op of an unknown domain): the pass
    must leave the user's folder as it found it."""
    monkeypatch.chdir(tmp_path)
    out, report = fuse(_custom_graph("unknown_rank"))
    assert report.found == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_float16_qk_with_float32_softmax_and_v():
    """TorchScript's SDPA export of a float16 model: Q.K^T in float16, then Cast to float32, a
    float32 mask, softmax and P.V in float32 on a widened V: fused in float32 on widened Q, K."""
    from attention_graphs import G

    g = G(17)
    q, k, v16 = (g.inp(n, F16, [2, 4, 5, D]) for n in "qkv")
    m = g.inp("m", F32, [2, 1, 5, 5])
    c = g.const(np.float16(np.sqrt(1 / np.sqrt(D))), np.float16)
    s = g.op("MatMul", g.op("Mul", q, c), g.op("Mul", g.op("Transpose", k, perm=[0, 1, 3, 2]), c))
    s = g.op("Add", g.op("Cast", s, to=F32), m)
    p = g.op("Softmax", s, axis=-1)
    g.op("MatMul", p, g.op("Cast", v16, to=F32))
    g.nodes[-1].output[0] = "y"
    g.out("y", F32, [2, 4, 5, D])
    model = g.model()
    out, node, report = _fused_one(model)
    assert report.candidates[0].details["qk_widened_to"] == "FLOAT"
    producers = {o: n for n in out.graph.node for o in n.output}
    assert producers[node.input[0]].op_type == "Cast" and producers[node.input[1]].op_type == "Cast"
    assert_same_outputs(model, out, random_feeds(model), rtol=1e-2, atol=1e-2)


def _head_view_graph(kind="deberta", B=2, H=3, S=5, Sk=6):
    """DeBERTa's form: scores as bmm on (B*H, S, D) plus a position term in that frame, viewed as
    (B, H, S, Sk) for the padding mask and the Softmax, back to (B*H, S, Sk) for P V; the view
    targets computed from Shape reads of the chain, as TorchScript exports them."""
    from attention_graphs import G

    g = G(17)
    n = B * H
    q = g.inp("q", F32, [n, S, D])
    k, v = g.inp("k", F32, [n, Sk, D]), g.inp("v", F32, [n, Sk, D])
    rel = g.inp("rel", F32, [n, S, Sk])
    pad = g.inp("pad", F32, [B, 1, 1, Sk]) if kind == "pad_add" else None
    visible = g.inp("visible", __import__("onnx").TensorProto.BOOL, [B, 1, S, Sk])
    s = g.op("MatMul", q, g.op("Transpose", k, perm=[0, 2, 1]), name="/attn/MatMul_qk")
    s = g.op("Add", g.op("Mul", s, g.const(0.3)), rel)

    def tail_dims(x, start, end):
        return g.op("Slice", g.op("Shape", x), g.const([start], np.int64), g.const([end], np.int64),
                    g.const([0], np.int64))

    if kind in ("variable_lead", "computed_batch"):  # B read from a shape, then -1 or BLOOM's constant H
        batch = g.op("Slice", g.op("Shape", visible), g.const([0], np.int64), g.const([1], np.int64),
                     g.const([0], np.int64))
        heads = g.const([-1 if kind == "variable_lead" else H], np.int64)
        target = g.op("Concat", batch, heads, tail_dims(s, 1, 3), axis=0)
    elif kind == "bad_view":  # folds Sk into the heads: not a view of the bmm scores
        target = g.const([B, H * Sk, S, 1], np.int64)
    else:
        target = g.op("Concat", g.const([-1, H], np.int64), tail_dims(s, 1, 3), axis=0)
    s4 = g.op("Reshape", s, target, name="/attn/Reshape_view")
    if kind == "pad_add":
        s4 = g.op("Add", s4, pad)
    s4 = g.op("Where", g.op("Not", visible), g.const(np.finfo(np.float32).min), s4)
    p = g.op("Softmax", s4, axis=-1, name="/attn/Softmax")
    p3 = g.op("Reshape", p, g.op("Concat", g.const([-1], np.int64), tail_dims(p, 2, 4), axis=0),
              name="/attn/Reshape_unview")
    g.op("MatMul", p3, v, name="/attn/MatMul_pv")
    g.nodes[-1].output[0] = "y"
    g.out("y", F32, [n, S, D])
    return g.model()


@pytest.mark.parametrize("kind", ["deberta", "pad_add", "computed_batch"])
def test_bmm_scores_viewed_as_heads_around_the_softmax(kind):
    """DeBERTa / BLOOM: a position term (or ALiBi) in the bmm frame, the masks in the (B, H, S, Sk)
    view."""
    model = _head_view_graph(kind)
    out, node, report = _fused_one(model)
    details = report.candidates[0].details
    assert details["batched_matmul_3d"] is True and details["bmm_head_view"] is True
    assert attrs(node)["scale"] == pytest.approx(0.3)
    assert not [n for n in out.graph.node if n.op_type == "Shape" and n.input[0].startswith("softmax")]
    feeds = random_feeds(model)
    feeds["visible"][1, 0, 2, :] = False  # a fully masked row (finfo.min fill: uniform attention)
    assert_same_outputs(model, out, feeds)


@pytest.mark.parametrize("kind,reason", [
    ("variable_lead", "does not split the batch-head axis by constant sizes"),
    ("bad_view", "only view the (B*H, Sq, Sk) scores"),
])
def test_head_views_that_are_not_provable_are_left(kind, reason):
    _left_with_reason(_head_view_graph(kind), reason)


def _softmax_in_bmm_graph(kind="xglm", B=2, H=3, S=5, Sk=6):
    """fairseq-style code (XGLM; older BART, OPT and M2M100 exports): bmm scores viewed as
    (B, H, S, Sk) for the padding mask, clamped at finfo.min, viewed back to (B*H, S, Sk) for the
    Softmax, and the probabilities viewed as (B, H, S, Sk) and back before P V."""
    from attention_graphs import G

    g = G(17)
    n = B * H
    q = g.inp("q", F32, [n, S, D])
    k, v = g.inp("k", F32, [n, Sk, D]), g.inp("v", F32, [n, Sk, D])
    mask = g.inp("mask", F32, [B, 1, S, Sk])
    rel = g.inp("rel", F32, [n, S, Sk]) if kind == "bmm_term_after" else None
    s = g.op("MatMul", g.op("Mul", q, g.const(0.3)), g.op("Transpose", k, perm=[0, 2, 1]), name="/attn/MatMul_qk")
    s4 = g.op("Reshape", s, g.const([B, H, S, Sk], np.int64), name="/attn/Reshape_view")
    s4 = g.op("Add", s4, mask)
    if kind != "no_clamp":
        bound = {"small_clamp": -1e4}.get(kind, np.finfo(np.float32).min)
        s4 = g.op("Max", s4, g.constant_node(bound), name="/attn/Max_clamp")
    s3 = s4 if kind == "softmax_in_view" else g.op("Reshape", s4, g.const([n, S, Sk], np.int64), name="/attn/Reshape_back")
    if kind == "bmm_term_after":
        s3 = g.op("Add", s3, rel)
    p = g.op("Softmax", s3, axis=-1, name="/attn/Softmax")
    if kind == "one_post_reshape":  # viewed back before the Softmax, and a (no-op) Reshape after it
        p = g.op("Reshape", p, g.const([n, S, Sk], np.int64))
    elif kind == "softmax_in_view":  # the Softmax in the view, then two Reshapes back
        p = g.op("Reshape", g.op("Reshape", p, g.const([n, S, Sk], np.int64)), g.const([n, S, Sk], np.int64))
    elif kind != "no_post_pair":
        p = g.op("Reshape", p, g.const([B, H, S, Sk], np.int64))
        p = g.op("Reshape", p, g.const([n, S, Sk], np.int64))
    g.op("MatMul", p, v, name="/attn/MatMul_pv")
    g.nodes[-1].output[0] = "y"
    g.out("y", F32, [n, S, D])
    return g.model()


@pytest.mark.parametrize("kind", ["xglm", "no_post_pair", "no_clamp", "bmm_term_after"])
def test_softmax_in_the_bmm_frame_between_head_views(kind):
    """The mask in the (B, H, S, Sk) view, the Softmax back in the (B*H, S, Sk) frame. The clamp
    Max(s + m, finfo.min) becomes the mask's own clamp Max(m, finfo.min): a row whose mask is -inf
    at every key attends uniformly in the original (all finfo.min after the clamp), and must in
    the fused model too, where an unclamped -inf row would give zeros."""
    model = _softmax_in_bmm_graph(kind)
    out, node, report = _fused_one(model)
    details = report.candidates[0].details
    assert details["batched_matmul_3d"] is True and details["bmm_head_view"] is True
    assert ("clamp -3.40282e+38" in details["masks"]) == (kind != "no_clamp")
    assert attrs(node)["scale"] == pytest.approx(0.3)
    assert not [n for n in out.graph.node if n.op_type == "Max" and n.name == "/attn/Max_clamp"]
    feeds = random_feeds(model)
    fmin = np.finfo(np.float32).min
    feeds["mask"] = np.where(np.random.default_rng(1).random(feeds["mask"].shape) < 0.3, fmin, 0.0).astype(np.float32)
    feeds["mask"][0, 0, 1, :] = fmin  # fully masked by finfo.min: uniform in both
    feeds["mask"][0, 0, 2, 3] = -np.inf  # one key at -inf
    if kind != "no_clamp":
        feeds["mask"][1, 0, 3, :] = -np.inf  # fully masked by -inf: uniform through the clamp
    assert_same_outputs(model, out, feeds)


@pytest.mark.parametrize("kind,reason", [
    ("small_clamp", "clamped below at -10000"),
    ("one_post_reshape", "reshaped back before the Softmax and again after it"),
    ("softmax_in_view", "two Reshapes between the Softmax and the MatMul with V"),
])
def test_clamps_that_do_not_fold_are_left(kind, reason):
    _left_with_reason(_softmax_in_bmm_graph(kind), reason)


def test_a_clamp_without_a_mask_is_left():
    from attention_graphs import G

    g = G(17)
    q, k, v = (g.inp(x, F32, [2, 4, 5, D]) for x in "qkv")
    s = g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2]))
    s = g.op("Max", s, g.const(np.finfo(np.float32).min))
    g.op("MatMul", g.op("Softmax", s, axis=-1), v)
    g.nodes[-1].output[0] = "y"
    g.out("y", F32, [2, 4, 5, D])
    _left_with_reason(g.model(), "no mask before the clamp")


def test_additive_padding_under_a_finfo_min_where_keeps_fully_masked_rows():
    """An additive finfo.min padding term and a Where filling finfo.min on the same keys: the
    original's Where replaces the padded scores, so a row the Where masks entirely attends
    uniformly to every key. Summing the two terms would overflow to -inf at padded keys and
    leave them out of that row."""
    from attention_graphs import G

    g = G(17)
    q, k, v = (g.inp(n, F32, [2, 3, 5, D]) for n in "qkv")
    pad = g.inp("pad", F32, [2, 1, 1, 5])
    visible = g.inp("visible", __import__("onnx").TensorProto.BOOL, [2, 1, 5, 5])
    s = g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2]), name="/attn/MatMul_qk")
    s = g.op("Add", g.op("Mul", s, g.const(0.3)), pad)
    s = g.op("Where", g.op("Not", visible), g.const(np.finfo(np.float32).min), s)
    p = g.op("Softmax", s, axis=-1, name="/attn/Softmax")
    g.op("MatMul", p, v, name="/attn/MatMul_pv")
    g.nodes[-1].output[0] = "y"
    g.out("y", F32, [2, 3, 5, D])
    model = g.model()
    out, _, _ = _fused_one(model)
    feeds = random_feeds(model)
    feeds["pad"][...] = 0.0
    feeds["pad"][1, 0, 0, 3:] = np.finfo(np.float32).min  # batch 1 pads its last two keys
    feeds["visible"][1, 0, 2, :] = False  # and masks row 2 entirely
    assert_same_outputs(model, out, feeds)


def test_a_reshape_on_one_side_of_the_softmax_is_left():
    from attention_graphs import G

    g = G(17)
    q, k, v = (g.inp(n, F32, [6, 5, D]) for n in "qkv")
    s = g.op("MatMul", q, g.op("Transpose", k, perm=[0, 2, 1]), name="/attn/MatMul_qk")
    p = g.op("Softmax", s, axis=-1, name="/attn/Softmax")
    p = g.op("Reshape", p, g.const([6, 5, 5], np.int64))
    g.op("MatMul", p, v, name="/attn/MatMul_pv")
    g.nodes[-1].output[0] = "y"
    g.out("y", F32, [6, 5, D])
    _left_with_reason(g.model(), "reshaped on one side of the Softmax only")


def test_shape_inference_sees_through_integer_constant_arithmetic():
    """TorchScript computes reshape targets with Mod / Add of constants; the shape pass folds them
    so that the shapes after such a Reshape stay known (here: x (b, 6) -> (b, 2, 3))."""
    import onnx_ir as ir
    from attention_graphs import G

    from opsfuse.graph_passes.shape_info import infer_shapes

    g = G(17)
    x = g.inp("x", F32, ["b", 6])
    axis = g.op("Add", g.op("Mod", g.constant_node(-1, np.int64), g.constant_node(2, np.int64)),
                g.constant_node(1, np.int64))  # (-1 % 2) + 1 = 2
    batch = g.op("Slice", g.op("Shape", x), g.const([0], np.int64), g.const([1], np.int64), g.const([0], np.int64))
    target = g.op("Concat", batch, g.op("Unsqueeze", axis, g.const([0], np.int64)), g.const([3], np.int64), axis=0)
    y = g.op("Reshape", x, target)
    g.out(y, F32)
    shapes = infer_shapes(ir.serde.deserialize_model(g.model()))
    assert shapes[y] == ("b", 2, 3)
