"""The rewrite's 3-D form (docs/notes/contract_3d_form.md) and mask broadcast elision.

When Q, K and V are (B, S, H*D) projections split into heads by Reshape + Transpose(0, 2, 1, 3)
and the output is merged back the same way, the fused node reads the projections and its
(B, S, Hq*Dv) output replaces the final Reshape's: every Reshape, Transpose and shape computation
around the attention core leaves the graph. Anything not provably that layout keeps the 4-D form,
with the reason in the report's details. Masks that the export Expanded to the scores' size are
read un-expanded (mask_broadcast.py)."""

from __future__ import annotations

import numpy as np
import pytest
from attention_graphs import F16, projected_model, random_feeds
from rewrite_helpers import assert_same_outputs, attrs, fuse, fused_nodes, validate

LAYOUT_OPS = ("Reshape", "Transpose", "Shape", "Gather", "Concat", "Unsqueeze")


def _fused_one(model):
    out, report = fuse(model)
    assert report.found == 1 and report.fused == 1, report.format()
    nodes = fused_nodes(out)
    assert len(nodes) == 1
    validate(out)
    return out, nodes[0], report.candidates[0].details


def _feeds(model, dims=None):
    feeds = random_feeds(model, seed=3, dims=dims)
    if "pad" in feeds:  # a padding-style additive mask: finfo.min on some keys, key 0 visible
        rng = np.random.default_rng(1)
        pad = np.where(rng.random(feeds["pad"].shape) < 0.4, np.finfo(feeds["pad"].dtype).min, 0)
        pad[..., 0] = 0
        feeds["pad"] = pad.astype(feeds["pad"].dtype)
    return feeds


def _ops(model) -> list[str]:
    return [n.op_type for n in model.graph.node]


@pytest.mark.parametrize("shape_style", ["const", "minus1", "shape_of", "static"])
@pytest.mark.parametrize("k_style", ["direct", "two"])
def test_projections_are_read_directly(shape_style, k_style):
    model = projected_model(shape_style=shape_style, k_style=k_style, mask="pad", Hq=3, D=8, S=5, Sk=7)
    out, node, details = _fused_one(model)
    assert details["three_d"] is True and details["three_d_why_not"] == ""
    assert list(node.input[:3]) == ["xq", "xk", "xv"]
    a = attrs(node)
    assert (a["q_num_heads"], a["kv_num_heads"]) == (3, 3)
    assert a["scale"] == pytest.approx(1 / np.sqrt(8), rel=1e-6)
    assert node.output[0] == "y", "the fused output takes the final Reshape's name"
    left = [op for op in _ops(out) if op in LAYOUT_OPS]
    assert left == [], f"layout ops left around the fused node: {left}"
    assert _ops(out) == ["FusedAttention"]
    assert_same_outputs(model, out, _feeds(model))


def test_dynamic_batch_and_sequence_through_shape_arithmetic():
    model = projected_model(shape_style="shape_of", dynamic=True, mask=None, Hq=2, D=16)
    out, node, details = _fused_one(model)
    assert details["three_d"] is True
    assert _ops(out) == ["FusedAttention"]
    # The fused output keeps the export's (batch, seq, Hq*Dv) type.
    y = next(o for o in out.graph.output if o.name == "y")
    dims = [d.dim_param or d.dim_value for d in y.type.tensor_type.shape.dim]
    assert dims[2] == 32
    assert_same_outputs(model, out, _feeds(model, {"batch": 3, "seq": 6, "kv_seq": 6}))


@pytest.mark.parametrize("hq,hkv,repeat", [(4, 2, True), (4, 1, False), (6, 2, True)])
def test_gqa_and_mqa_give_kv_num_heads(hq, hkv, repeat):
    model = projected_model(Hq=hq, Hkv=hkv, repeat_kv=repeat, mask="pad", D=4, S=3, Sk=5)
    out, node, details = _fused_one(model)
    assert details["three_d"] is True, details
    a = attrs(node)
    assert (a["q_num_heads"], a["kv_num_heads"]) == (hq, hkv)
    assert list(node.input[:3]) == ["xq", "xk", "xv"]
    assert not [op for op in _ops(out) if op in ("Expand", "Reshape", "Transpose")]
    assert_same_outputs(model, out, _feeds(model))


def test_value_head_size_may_differ():
    model = projected_model(Hq=2, D=8, Dv=4, mask="pad")
    out, node, details = _fused_one(model)
    assert details["three_d"] is True
    assert_same_outputs(model, out, _feeds(model))


def test_float16():
    model = projected_model(dtype=F16, mask="expand_where", Hq=2, D=8, S=6)
    out, node, details = _fused_one(model)
    assert details["three_d"] is True and details["mask_unbroadcast"]
    assert_same_outputs(model, out, _feeds(model), rtol=1e-2, atol=1e-2)


def test_a_split_tensor_with_other_consumers_is_kept():
    """Q's (B, S, H, D) tensor is also a graph output: the fused node still reads xq; the Reshape stays
    for the other consumer."""
    model = projected_model(q_reshape_used=True)
    out, node, details = _fused_one(model)
    assert details["three_d"] is True and node.input[0] == "xq"
    assert _ops(out).count("Reshape") == 1 and "Transpose" not in _ops(out)
    assert_same_outputs(model, out, _feeds(model))


def test_output_target_from_the_transposed_shape():
    """GPT-2 computes the merged shape from Shape(transposed output): those Shapes go with the Reshape."""
    model = projected_model(out_reshape="shape_of", shape_style="shape_of", dynamic=True, mask=None)
    out, node, details = _fused_one(model)
    assert details["three_d"] is True and node.output[0] == "y"
    assert _ops(out) == ["FusedAttention"]
    assert_same_outputs(model, out, _feeds(model, {"batch": 2, "seq": 4, "kv_seq": 4}))


@pytest.mark.parametrize("kw,why", [
    ({"out_reshape": "shape_of_used"}, "does not feed one Reshape only"),
    ({"out_consumer": "graph_output"}, "does not feed one Reshape only"),
    ({"out_reshape": "wrong"}, "merge"),
    ({"shape_style": "input"}, "Q is not a (B, S, H*D) tensor"),
])
def test_other_layouts_keep_the_four_d_form_with_reason(kw, why):
    model = projected_model(**kw)
    out, node, details = _fused_one(model)
    assert details["three_d"] is False
    assert why in details["three_d_why_not"], details["three_d_why_not"]
    a = attrs(node)
    assert "q_num_heads" not in a and "kv_num_heads" not in a
    feeds = _feeds(model)
    if "split_shape" in feeds:
        feeds["split_shape"] = np.array([0, 0, 3, 8], np.int64)
    assert_same_outputs(model, out, feeds)


# --- mask broadcast elision ---------------------------------------------------------------------

@pytest.mark.parametrize("mask", ["expand", "expand_where", "and_range"])
def test_expanded_masks_are_read_unexpanded(mask):
    model = projected_model(mask=mask, S=6, Sk=6)
    out, node, details = _fused_one(model)
    assert "Expand" not in _ops(out)
    producers = {o: n for n in out.graph.node for o in n.output}
    if mask == "expand":
        assert node.input[3] == "pad", "the fused node must read the (B, 1, 1, Sk) mask itself"
    else:
        where = producers[node.input[3]]
        assert where.op_type == "Where" and where.input[0] == "visible", \
            "Where(Expand(visible), 0, min) becomes Where(visible, 0, min)"
        assert not [op for op in _ops(out) if op in ("And", "Range", "GreaterOrEqual", "ConstantOfShape")]
    assert details["mask_unbroadcast"] == node.input[3]
    feeds = _feeds(model)
    if "visible" in feeds:
        feeds["visible"][1, 0, 0, :] = False  # a fully padded row: uniform attention in both
    assert_same_outputs(model, out, feeds)


def test_an_and_term_not_provably_true_is_kept():
    """(query index >= 2) is False for the first rows: the mask really varies along Sq, so it keeps its
    (B, 1, Sq, Sk) And; only the Expand, which adds nothing to that shape, goes."""
    model = projected_model(mask="and_unknown", S=6, Sk=6)
    out, node, details = _fused_one(model)
    producers = {o: n for n in out.graph.node for o in n.output}
    where = producers[node.input[3]]
    assert where.op_type == "Where" and producers[where.input[0]].op_type == "And"
    assert "GreaterOrEqual" in _ops(out)
    assert_same_outputs(model, out, _feeds(model))


def test_a_shared_mask_is_reduced_once():
    """Two layers reading one Expanded mask: one un-expanded Where, read by both fused nodes."""
    import onnx

    one = projected_model(mask="expand_where", S=4, Sk=4)
    g = one.graph
    # Second layer: the same ops with renamed values, reading the same mask and inputs.
    mask_name = next(n.output[0] for n in g.node if n.op_type == "Where")
    layer = [n for n in g.node if n.op_type not in ("Expand", "Where")]
    extra = []
    for n in layer:
        m = onnx.NodeProto()
        m.CopyFrom(n)
        m.name = n.name.replace("/attn/", "/layer2/")
        m.input[:] = [i if i in ("xq", "xk", "xv", mask_name) or i.startswith("c") else i + "_L2" for i in n.input]
        m.output[:] = [o + "_L2" for o in n.output]
        extra.append(m)
    g.node.extend(extra)
    g.output.append(onnx.helper.make_tensor_value_info("y_L2", onnx.TensorProto.FLOAT, [2, 4, 24]))
    out, report = fuse(one)
    assert report.fused == 2, report.format()
    nodes = fused_nodes(out)
    assert nodes[0].input[3] == nodes[1].input[3]
    assert _ops(out).count("Where") == 1 and "Expand" not in _ops(out)
    validate(out)
    assert_same_outputs(one, out, _feeds(one))
