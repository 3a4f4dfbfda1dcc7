"""Attention written as Einsum: its products lowered to MatMuls for the MatMul rule, fused where that
rule proves it, and put back exactly where it does not (graph_passes/einsum_form.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from attention_graphs import F32, G, random_feeds
from rewrite_helpers import assert_same_outputs, attrs, fuse, fused_nodes, validate

from opsfuse.graph_passes.einsum_form import matmul_perms


@pytest.mark.parametrize("equation, perms", [
    ("bhqd,bhkd->bhqk", ((0, 1, 2, 3), (0, 1, 3, 2), (0, 1, 2, 3), False)),
    ("bind,bjnd->bnij", ((0, 2, 1, 3), (0, 2, 3, 1), (0, 1, 2, 3), False)),
    ("bhij,bhjd->bhid", ((0, 1, 2, 3), (0, 1, 2, 3), (0, 1, 2, 3), False)),
    ("bnij,bjnd->bind", ((0, 1, 2, 3), (0, 2, 1, 3), (0, 2, 1, 3), False)),
    (" b h i d , b h j d -> b h i j ", ((0, 1, 2, 3), (0, 1, 3, 2), (0, 1, 2, 3), False)),
    ("bhkd,bhqd->bhqk", ((0, 1, 2, 3), (0, 1, 3, 2), (0, 1, 2, 3), True)),  # K first: MatMul(Q, K^T)
    ("bhjd,bhij->bhid", ((0, 1, 2, 3), (0, 1, 2, 3), (0, 1, 2, 3), True)),  # V first: MatMul(P, V)
])
def test_batched_matrix_product_equations(equation, perms):
    assert matmul_perms(equation) == perms


@pytest.mark.parametrize("equation", [
    "...id,...jd->...ij",           # an ellipsis
    "bhd,bhkd->bhk",                # rank 3
    "bnlqd,bnlkd->bnlqk",           # rank 5 (LongT5's blocks)
    "bhqd,bhkd,bhkd->bhqk",         # three operands
    "bhqq,bhkd->bhqk",              # a repeated label
    "bhqd,bhqd->bhqd",              # nothing contracted
    "bhqd,bhkd",                    # implicit output
])
def test_other_equations_are_not_lowered(equation):
    assert matmul_perms(equation) is None


def test_batch_labels_after_the_free_ones_take_a_transpose_after_the_product():
    assert matmul_perms("bhqd,bhkd->qbhk") == ((0, 1, 2, 3), (0, 1, 3, 2), (2, 0, 1, 3), False)


def _einsum_model(*, qk="bind,bjnd->bnij", pv="bnij,bjnd->bind", bsnh=True, mask=False, extra_reader=False,
                  pv_swapped=False):
    """Research-code attention: q, k, v (B, S, N, D) [or (B, N, S, D)], scores einsum * scale
    [+ mask (B, 1, 1, S)], softmax, einsum with v."""
    B, N, S, D = 2, 3, 5, 8
    shape = [B, S, N, D] if bsnh else [B, N, S, D]
    g = G(17)
    q, k, v = (g.inp(x, F32, shape) for x in "qkv")
    s = g.op("Einsum", *((k, q) if qk.startswith("bhkd") else (q, k)), equation=qk, name="/attn/Einsum_qk")
    s = g.op("Mul", s, g.const(D ** -0.5), name="/attn/Mul_scale")
    if mask:
        s = g.op("Add", s, g.inp("mask", F32, [B, 1, 1, S]), name="/attn/Add_mask")
    p = g.op("Softmax", s, axis=-1, name="/attn/Softmax")
    y = g.op("Einsum", *((v, p) if pv_swapped else (p, v)), equation=pv, name="/attn/Einsum_pv")
    g.op("Identity", y, name="/attn/out")
    g.nodes[-1].output[0] = "y"
    g.out("y", F32, shape)
    if extra_reader:  # the probabilities also leave the graph: the MatMul rule must refuse
        g.op("Identity", p, name="/attn/probs_out")
        g.nodes[-1].output[0] = "probs"
        g.out("probs", F32, [B, N, S, S])
    return g.model()


@pytest.mark.parametrize("form", ["bsnh", "bnsh", "operands_swapped"])
def test_einsum_attention_is_fused(form):
    model = {"bsnh": lambda: _einsum_model(mask=True),
             "bnsh": lambda: _einsum_model(qk="bhqd,bhkd->bhqk", pv="bhqk,bhkd->bhqd", bsnh=False, mask=True),
             "operands_swapped": lambda: _einsum_model(qk="bhkd,bhqd->bhqk", pv="bhkd,bhqk->bhqd", bsnh=False,
                                                       mask=True, pv_swapped=True)}[form]()
    out, report = fuse(model)
    assert report.found == 1 and report.fused == 1, report.format()
    (node,) = fused_nodes(out)
    assert attrs(node)["scale"] == pytest.approx(8 ** -0.5)
    assert not [n for n in out.graph.node if n.op_type in ("Einsum", "Softmax", "MatMul")]
    validate(out)
    feeds = random_feeds(model)
    feeds["mask"] = np.where(np.arange(5) < 4, 0.0, -np.inf).astype(np.float32)[None, None, None, :].repeat(2, 0)
    assert_same_outputs(model, out, feeds)


def test_rejected_einsum_attention_is_put_back_as_it_was():
    model = _einsum_model(extra_reader=True)
    out, report = fuse(model)
    assert report.found == 1 and report.fused == 0
    assert "other consumers" in report.left[0].reason  # the MatMul rule's own reason
    assert [(n.op_type, n.name, list(n.input), list(n.output)) for n in out.graph.node] == \
           [(n.op_type, n.name, list(n.input), list(n.output)) for n in model.graph.node]
    assert [o.name for o in out.graph.output] == ["y", "probs"]
    onnx.checker.check_model(out)


def test_blocked_einsum_attention_is_left_alone_with_the_reason():
    """LongT5-style blocks (rank 5) are no batched matrix product of rank-4 operands: left alone."""
    g = G(17)
    q, k, v = (g.inp(x, F32, [1, 2, 3, 4, 8]) for x in "qkv")
    s = g.op("Einsum", q, k, equation="bnlqd,bnlkd->bnlqk", name="/attn/Einsum_qk")
    p = g.op("Softmax", g.op("Mul", s, g.const(0.35)), axis=-1, name="/attn/Softmax")
    g.op("Einsum", p, v, equation="bnlqk,bnlkd->bnlqd", name="/attn/Einsum_pv")
    g.nodes[-1].output[0] = "y"
    g.out("y", F32, [1, 2, 3, 4, 8])
    model = g.model()
    out, report = fuse(model)
    assert report.found == 1 and report.fused == 0
    assert report.left[0].nodes == ["/attn/Softmax"]
    assert "not batched matrix products of rank-4 operands" in report.left[0].reason
    assert report.other_softmax == []
    assert [n.op_type for n in out.graph.node] == [n.op_type for n in model.graph.node]


def _two_products_model(scores_op):
    """Scores built from Einsum products by `scores_op` (g, e1, e2) -> scores, then softmax, P.V."""
    g = G(17)
    q, k, r, v = (g.inp(x, F32, [1, 2, 4, 8]) for x in "qkrv")
    s = scores_op(g, g.op("Einsum", q, k, equation="bhqd,bhkd->bhqk"), g.op("Einsum", q, r, equation="bhqd,bhkd->bhqk"))
    p = g.op("Softmax", s, axis=-1, name="/attn/Softmax")
    g.op("Einsum", p, v, equation="bhqk,bhkd->bhqd", name="/attn/Einsum_pv")
    g.nodes[-1].output[0] = "y"
    g.out("y", F32, [1, 2, 4, 8])
    return g.model()


@pytest.mark.parametrize("scores_op, reason", [
    # XLNet-like: content and position products added, then scaled: lowered, and the MatMul rule's own
    # reason (a bias added before the scale would round differently in the fused op)
    (lambda g, e1, e2: g.op("Mul", g.op("Add", e1, e2), g.const(0.35)), "added before the scale"),
    # an op no score passes through (XLNet's relative shift is a Reshape / Slice chain): not lowered
    (lambda g, e1, e2: g.op("Abs", e1), "do not come from one two-operand Einsum"),
])
def test_other_scores_are_left_alone_as_they_were(scores_op, reason):
    model = _two_products_model(scores_op)
    out, report = fuse(model)
    assert report.found == 1 and report.fused == 0
    assert reason in report.left[0].reason
    assert [(n.op_type, list(n.input), list(n.output)) for n in out.graph.node] == \
           [(n.op_type, list(n.input), list(n.output)) for n in model.graph.node]


class _EinsumAttention:
    """A research-code self-attention layer (torch.einsum, (B, S, N, D) heads, a padding mask)."""

    @staticmethod
    def module():
        import torch

        class Layer(torch.nn.Module):
            def __init__(self, hidden=32, heads=4):
                super().__init__()
                self.heads, self.dim = heads, hidden // heads
                self.qkv = torch.nn.Linear(hidden, 3 * hidden)
                self.out = torch.nn.Linear(hidden, hidden)

            def forward(self, x, mask):
                b, s, _ = x.shape
                q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.dim).unbind(2)
                scores = torch.einsum("bind,bjnd->bnij", q, k) * self.dim ** -0.5
                scores = scores + (1.0 - mask[:, None, None, :]) * torch.finfo(scores.dtype).min
                probs = scores.softmax(-1)
                y = torch.einsum("bnij,bjnd->bind", probs, v).reshape(b, s, -1)
                return self.out(y)

        return Layer()


def test_torch_exported_einsum_attention(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is needed to export the einsum model")
    torch.manual_seed(0)
    module = _EinsumAttention.module().eval()
    x = torch.randn(2, 7, 32)
    mask = torch.ones(2, 7)
    mask[1, 5:] = 0.0
    path = tmp_path / "einsum_attention.onnx"
    with torch.no_grad():
        torch.onnx.export(module, (x, mask), str(path), input_names=["x", "mask"], output_names=["out"],
                          dynamic_axes={"x": {0: "batch", 1: "seq"}, "mask": {0: "batch", 1: "seq"}},
                          opset_version=17, dynamo=False)
    model = onnx.load(str(path))
    assert [n.op_type for n in model.graph.node].count("Einsum") == 2
    out, report = fuse(model)
    assert report.fused == 1, report.format()
    assert not [n for n in out.graph.node if n.op_type in ("Einsum", "Softmax")]
    assert_same_outputs(model, out, {"x": x.numpy(), "mask": mask.numpy()})
