"""A mask expanded to the scores' own shape, Expand(m, Shape(scores)) -> Cast (XLM's TorchScript
export, `mask.expand_as(scores)`): fused reading m, where m provably broadcasts into the scores
(graph_passes/mask_expand.py)."""

from __future__ import annotations

import numpy as np
import pytest
from attention_graphs import F32, G
from onnx import TensorProto
from rewrite_helpers import assert_same_outputs, fuse, fused_nodes, validate

B, H, S, D = 2, 4, 5, 8


def _expanded_mask_model(mask_shape=(B, 1, 1, S), extra_reader=False):
    g = G(17)
    q, k, v = (g.inp(x, F32, [B, H, S, D]) for x in "qkv")
    pad = g.inp("pad", TensorProto.BOOL, list(mask_shape))  # True: the key is masked
    s = g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2], name="/attn/Transpose_k"), name="/attn/MatMul")
    s = g.op("Mul", s, g.const(D ** -0.5), name="/attn/Mul_scale")
    shape = g.op("Shape", s, name="/attn/Shape_scores")
    expanded = g.op("Expand", pad, shape, name="/attn/Expand_mask")
    cond = g.op("Cast", expanded, to=TensorProto.BOOL, name="/attn/Cast_mask")
    w = g.op("Where", cond, g.const(-np.inf), s, name="/attn/Where_mask")
    p = g.op("Softmax", w, axis=-1, name="/attn/Softmax")
    g.op("MatMul", p, v, name="/attn/MatMul_pv")
    g.nodes[-1].output[0] = "y"
    g.out("y", F32, [B, H, S, D])
    if extra_reader:  # the expanded mask also leaves the graph
        g.op("Identity", expanded, name="/attn/mask_out")
        g.nodes[-1].output[0] = "mask_out"
        g.out("mask_out", TensorProto.BOOL, [B, H, S, S])
    return g.model()


def _feeds(model, mask_shape=(B, 1, 1, S)):
    rng = np.random.default_rng(0)
    feeds = {x: rng.standard_normal((B, H, S, D)).astype(np.float32) for x in "qkv"}
    pad = np.zeros(mask_shape, dtype=bool)
    pad[0, ..., 3:] = True  # the first sequence is padded after 3 keys; no row is fully masked
    feeds["pad"] = pad
    return feeds


@pytest.mark.parametrize("mask_shape", [(B, 1, 1, S), (1, S), (B, 1, S, S)])
def test_mask_expanded_to_the_scores_is_read_unexpanded(mask_shape):
    model = _expanded_mask_model(mask_shape)
    out, report = fuse(model)
    assert report.fused == 1, report.format()
    (node,) = fused_nodes(out)
    assert not [n for n in out.graph.node if n.op_type in ("Expand", "Shape", "MatMul", "Softmax")]
    validate(out)
    producer = {n.output[0]: n for n in out.graph.node}
    visible = producer[node.input[3]]  # Where(masked, -inf, s): the fused node reads Not(the condition)
    assert visible.op_type == "Not"
    cast = producer[visible.input[0]]
    assert cast.op_type == "Cast" and cast.input[0] == "pad"  # the small mask, cast as before
    assert_same_outputs(model, out, _feeds(model, mask_shape))


def test_mask_the_fused_node_cannot_take_is_not_read_unexpanded():
    """A rank-1 mask (FusedAttention takes rank 2 to 4): the Shape of the scores stays a reader
    outside the attention, and the subgraph is left alone."""
    model = _expanded_mask_model((S,))
    out, report = fuse(model)
    assert report.fused == 0
    assert "has other consumers" in report.left[0].reason


def test_expanded_mask_read_elsewhere_is_left_alone():
    model = _expanded_mask_model(extra_reader=True)
    out, report = fuse(model)
    assert report.fused == 0
    assert "has other consumers" in report.left[0].reason
    assert [n.op_type for n in out.graph.node] == [n.op_type for n in model.graph.node]
