"""The opt-in ``pack_qkv`` rewrite (graph_passes/pack_qkv.py): a 3-D FusedAttention whose Q, K and V
are MatMul(X, W) [+ b] projections of one X gets one MatMul on [Wq | Wk | Wv], reads it with
packed_qkv = 1, and takes [bq | bk | bv] as its qkv_bias input (no Add). Anything else stays unpacked
with a reason. Not bit-exact (a GEMM of another shape), so the numeric checks use a tolerance, on
random data: in ONNX Runtime with the opsfuse library, and with the float64 reference computing the
FusedAttention nodes (so the graph's meaning is checked without the C++ library)."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from attention_graphs import F16, projected_model, random_feeds
from onnx import TensorProto, helper, numpy_helper
from rewrite_helpers import assert_same_outputs, attrs, fused_nodes, original_outputs, validate

from opsfuse import contract
from opsfuse.graph_passes import fuse_attention
from opsfuse.reference import attention_reference


def projection_model(*, B=2, S=5, hidden=10, Hq=3, Hkv=None, D=4, bias=("q", "k", "v"), swap=(), dtype=TensorProto.FLOAT,
                     extra=None, mask="pad", seed=0) -> onnx.ModelProto:
    """projected_model's attention layer with xq, xk, xv computed as MatMul(x, W) [+ b] of one input
    x (B, S, hidden); random weights and biases. `bias`: which projections have a bias Add; `swap`:
    which Adds read (bias, matmul) rather than (matmul, bias). `extra`: a variant that must not pack:
    q_add_output (Q's Add output is also a graph output), k_matmul_reader (K's MatMul output is also
    read by another node), v_weight_input (Wv is a graph input), v_other_x (V projects another
    tensor), q_bias_rows (bq of shape (S, Hq*D): broadcast over more than the last axis)."""
    Hkv = Hkv or Hq
    np_t = np.float16 if dtype == F16 else np.float32
    m = projected_model(B=B, S=S, Sk=S, Hq=Hq, Hkv=Hkv, D=D, mask=mask, dtype=dtype, repeat_kv=Hkv not in (1, Hq))
    g = m.graph
    rng = np.random.default_rng(seed)
    keep = [i for i in g.input if i.name not in ("xq", "xk", "xv")]
    del g.input[:]
    g.input.extend([helper.make_tensor_value_info("x", dtype, [B, S, hidden])] + keep)
    nodes = []
    for role, width in (("q", Hq * D), ("k", Hkv * D), ("v", Hkv * D)):
        w = (rng.standard_normal((hidden, width)) / np.sqrt(hidden)).astype(np_t)
        x = "x"
        if extra == "v_other_x" and role == "v":
            g.input.append(helper.make_tensor_value_info("x2", dtype, [B, S, hidden]))
            x = "x2"
        if extra == "v_weight_input" and role == "v":
            g.input.append(helper.make_tensor_value_info(f"w{role}", dtype, list(w.shape)))
        else:
            g.initializer.append(numpy_helper.from_array(w, f"w{role}"))
        mm_out = f"x{role}" if role not in bias else f"mm_{role}"
        nodes.append(helper.make_node("MatMul", [x, f"w{role}"], [mm_out], name=f"/attn/{role}_proj/MatMul"))
        if role in bias:
            shape = (S, width) if (extra == "q_bias_rows" and role == "q") else (width,)
            b = (0.5 * rng.standard_normal(shape)).astype(np_t)
            g.initializer.append(numpy_helper.from_array(b, f"b{role}"))
            ins = [f"b{role}", mm_out] if role in swap else [mm_out, f"b{role}"]
            nodes.append(helper.make_node("Add", ins, [f"x{role}"], name=f"/attn/{role}_proj/Add"))
    if extra == "q_add_output":
        g.output.append(helper.make_tensor_value_info("xq", dtype, [B, S, Hq * D]))
    if extra == "k_matmul_reader":
        nodes.append(helper.make_node("Relu", ["mm_k"], ["k_relu"], name="/other/Relu"))
        g.output.append(helper.make_tensor_value_info("k_relu", dtype, [B, S, Hkv * D]))
    rest = list(g.node)
    del g.node[:]
    g.node.extend(nodes + rest)
    onnx.checker.check_model(m)
    return m


def _feeds(model):
    feeds = random_feeds(model, seed=7)
    if "pad" in feeds:
        pad = np.where(np.random.default_rng(1).random(feeds["pad"].shape) < 0.4, np.finfo(feeds["pad"].dtype).min, 0)
        pad[..., 0] = 0
        feeds["pad"] = pad.astype(feeds["pad"].dtype)
    return feeds


def _ops(model) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


def _init_bytes(model) -> int:
    return sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)


def _packed(model, **kw):
    out, report = fuse_attention(model, pack_qkv=True, **kw)
    validate(out)
    return out, report


def _reference_outputs(model, feeds) -> list:
    """The model's outputs with every FusedAttention node computed by the float64 reference (rounded
    to the node's type) and the rest of the graph by ONNX Runtime, through the golden runner's
    staging."""
    from opsfuse.golden import _StagedOrtRunner, node_attributes

    def compute(node, args):
        args = list(args) + [None] * (contract.NUM_INPUTS - len(args))
        q, k, v, mask, lengths, bias = args
        y = attention_reference(q, k, v, mask, lengths, qkv_bias=bias, **node_attributes(node))
        return y.astype(q.dtype)

    return list(_StagedOrtRunner(model).run(feeds, compute).values())


def assert_reference_matches(original, rewritten, feeds, rtol=1e-4, atol=1e-5) -> None:
    expected = original_outputs(original, feeds)
    actual = _reference_outputs(rewritten, feeds)
    assert len(expected) == len(actual)
    for e, a in zip(expected, actual):
        assert e.shape == a.shape and e.dtype == a.dtype
        np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol)


def _bias_input(model, node) -> np.ndarray | None:
    """The node's qkv_bias initializer, or None when it has no qkv_bias input."""
    if len(node.input) <= contract.INPUT_QKV_BIAS or not node.input[contract.INPUT_QKV_BIAS]:
        return None
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return inits[node.input[contract.INPUT_QKV_BIAS]]


@pytest.mark.parametrize("bias,swap", [(("q", "k", "v"), ()), (("q", "k", "v"), ("q", "v")), ((), ()),
                                       (("q", "v"), ("v",))])
def test_three_projections_become_one(bias, swap):
    model = projection_model(bias=bias, swap=swap)
    plain, _ = fuse_attention(model)
    out, report = _packed(model)
    assert report.counts["pack_qkv"] == 1, report.format()
    cand = report.candidates[0]
    assert cand.details["packed_qkv"] is True and cand.details["packed_qkv_why_not"] == ""
    node = fused_nodes(out)[0]
    a = attrs(node)
    assert a["packed_qkv"] == 1 and (a["q_num_heads"], a["kv_num_heads"]) == (3, 3)
    assert node.input[0] == node.input[1] == node.input[2]
    ops, before = _ops(out), _ops(plain)
    # The bias Adds are gone, none replaces them: the biases are the node's qkv_bias input.
    assert ops["MatMul"] == 1 and ops["Add"] == 0
    assert before["MatMul"] - ops["MatMul"] == 2 and before["Add"] == len(bias)
    # The packed weight is [Wq | Wk | Wv]; the old weights and biases are gone.
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    assert not {"wq", "wk", "wv", "bq", "bk", "bv"} & set(inits)
    orig = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    producer = {o: n for n in out.graph.node for o in n.output}
    mm = producer[node.input[0]]
    assert mm.op_type == "MatMul" and mm.input[0] == "x"
    np.testing.assert_array_equal(inits[mm.input[1]], np.concatenate([orig["wq"], orig["wk"], orig["wv"]], axis=1))
    assert cand.details["qkv_bias_absorbed"] is bool(bias)
    if bias:
        # Q, K, V, the mask, an empty key_lengths, then qkv_bias = [bq | bk | bv] (zeros for a missing one).
        assert len(node.input) == contract.NUM_INPUTS and node.input[contract.INPUT_KEY_LENGTHS] == ""
        assert node.input[contract.INPUT_MASK] != ""
        want = np.concatenate([orig.get(f"b{r}", np.zeros(12, np.float32)) for r in "qkv"])
        np.testing.assert_array_equal(_bias_input(out, node), want)
        assert "1 with its bias absorbed as the node's qkv_bias input (no Add)" in report.format()
    else:
        assert len(node.input) <= contract.INPUT_QKV_BIAS and _bias_input(out, node) is None
        assert "0 with its bias absorbed" in report.format()
    # The same weights as the exact rewrite's, plus the zeros that stand for a missing bias.
    assert _init_bytes(out) == _init_bytes(plain) + (12 * 4 * (3 - len(bias)) if bias else 0)
    feeds = _feeds(model)
    assert_reference_matches(model, out, feeds)
    assert_same_outputs(model, out, feeds)


@pytest.mark.parametrize("bias_scale", [0.5, 100.0], ids=["small_bias", "bias_100x"])
def test_absorbed_bias_numerics_without_a_mask(bias_scale):
    # No mask: the node's inputs 3 and 4 are both empty before qkv_bias. Biases ~100x the
    # projections' scale dominate Q, K and V: a bias added in the wrong window or twice shows.
    model = projection_model(mask=None, Hq=4, Hkv=2, D=6, hidden=14, S=7, seed=3)
    for init in model.graph.initializer:
        if init.name in ("bq", "bk", "bv"):
            arr = numpy_helper.to_array(init) * (bias_scale / 0.5)
            init.CopyFrom(numpy_helper.from_array(arr.astype(np.float32), init.name))
    out, report = _packed(model)
    node = fused_nodes(out)[0]
    assert list(node.input[contract.INPUT_MASK:contract.INPUT_QKV_BIAS]) == ["", ""]
    assert np.abs(_bias_input(out, node)).max() > 0.5 * bias_scale
    assert report.candidates[0].details["qkv_bias_absorbed"] is True
    feeds = _feeds(model)
    assert_reference_matches(model, out, feeds, rtol=1e-4, atol=1e-4 * bias_scale)
    assert_same_outputs(model, out, feeds, rtol=1e-4, atol=1e-4 * bias_scale)


def test_off_by_default_and_exact_then():
    model = projection_model()
    out, report = fuse_attention(model)
    assert "pack_qkv" not in report.counts
    node = fused_nodes(out)[0]
    assert "packed_qkv" not in attrs(node) and "packed_qkv" not in report.candidates[0].details
    assert _ops(out)["MatMul"] == 3


@pytest.mark.parametrize("hq,hkv", [(4, 2), (6, 1), (4, 4)])
def test_gqa_packs_narrower_k_and_v(hq, hkv):
    model = projection_model(Hq=hq, Hkv=hkv, D=6, hidden=14, S=7)
    out, report = _packed(model)
    assert report.counts["pack_qkv"] == 1, report.format()
    node = fused_nodes(out)[0]
    a = attrs(node)
    assert a["packed_qkv"] == 1 and (a["q_num_heads"], a["kv_num_heads"]) == (hq, hkv)
    assert report.candidates[0].details["packed_width"] == (hq + 2 * hkv) * 6
    assert _bias_input(out, node).shape == ((hq + 2 * hkv) * 6,)
    feeds = _feeds(model)
    assert_reference_matches(model, out, feeds)
    assert_same_outputs(model, out, feeds)


def test_float16():
    model = projection_model(dtype=F16, Hq=2, D=8, hidden=12)
    out, report = _packed(model)
    assert report.counts["pack_qkv"] == 1, report.format()
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    assert {a.dtype for a in inits.values() if a.dtype.kind == "f"} == {np.dtype(np.float16)}
    assert _bias_input(out, fused_nodes(out)[0]).dtype == np.float16  # qkv_bias is of type T
    feeds = _feeds(model)
    assert_reference_matches(model, out, feeds, rtol=1e-2, atol=1e-2)
    assert_same_outputs(model, out, feeds, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("extra,why", [
    ("q_add_output", "Q (xq) has other consumers: it is a graph output"),
    ("k_matmul_reader", "K's MatMul output (mm_k) has other consumers: /other/Relu"),
    ("v_weight_input", "the weight of V's MatMul /attn/v_proj/MatMul (wv) is not a constant initializer"),
    ("v_other_x", "Q, K and V project different tensors (x, x, x2)"),
    ("q_bias_rows", "Q's bias has shape (5, 12): not a (12,) vector broadcast over the last axis"),
])
def test_not_packed_with_reason(extra, why):
    model = projection_model(extra=extra)
    plain, _ = fuse_attention(model)
    out, report = _packed(model)
    assert report.fused == 1 and report.counts["pack_qkv"] == 0
    details = report.candidates[0].details
    assert details["packed_qkv"] is False and details["packed_qkv_why_not"] == why
    assert f"Q/K/V not packed [{report.candidates[0].fused_node}]: {why}" in report.format()
    assert "packed_qkv" not in attrs(fused_nodes(out)[0])
    assert _ops(out) == _ops(plain), "an unpacked node leaves the graph as the exact rewrite wrote it"
    assert_same_outputs(model, out, _feeds(model))


def test_four_d_form_is_not_packed():
    model = projected_model(shape_style="input")  # a Reshape target from a graph input: the 4-D form
    out, report = _packed(model)
    assert report.fused == 1 and report.counts["pack_qkv"] == 0
    assert "not the 3-D form" in report.candidates[0].details["packed_qkv_why_not"]


# --- a tiny BERT exported with random weights and biases ---------------------------------------

@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    pytest.importorskip("torch", reason="torch is needed to export the BERT model")
    pytest.importorskip("transformers", reason="transformers is needed to build the BERT model")
    import sys
    from pathlib import Path

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))
    import export_models

    torch.manual_seed(0)
    module, inputs, dyn = export_models.SPECS["bert"].build("eager")
    with torch.no_grad():  # random biases too (BERT's are initialized to zero)
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.5)
    path = tmp_path_factory.mktemp("pack_bert") / "bert.onnx"
    names = list(inputs)
    with torch.no_grad():
        torch.onnx.export(module, tuple(inputs[n] for n in names), str(path), input_names=names,
                          output_names=["out"], dynamic_axes=dyn, opset_version=17, dynamo=False)
    return onnx.load(str(path))


def test_tiny_bert(tiny_bert, tmp_path):
    from opsfuse.graph_passes import model_io

    layers = 2
    plain, _ = fuse_attention(tiny_bert)
    out, report = _packed(tiny_bert)
    assert report.fused == layers and report.counts["pack_qkv"] == layers, report.format()
    details = {c.fused_node: c.details for c in report.candidates if c.fused}
    for node in fused_nodes(out):
        a = attrs(node)
        assert a["packed_qkv"] == 1 and (a["q_num_heads"], a["kv_num_heads"]) == (4, 4)
        assert node.input[0] == node.input[1] == node.input[2]
        assert details[node.name]["qkv_bias_absorbed"] is True
        assert len(node.input) == contract.NUM_INPUTS
        assert _bias_input(out, node).shape == (details[node.name]["packed_width"],)
    before, after = _ops(plain), _ops(out)
    assert before["MatMul"] - after["MatMul"] == 2 * layers
    # All three bias Adds of each layer leave: the kernel adds the bias as it loads Q, K, V.
    assert before["Add"] - after["Add"] == 3 * layers
    assert len(plain.graph.node) - len(out.graph.node) >= 5 * layers
    # The old projection weights are dropped: the initializers do not grow.
    assert _init_bytes(out) <= _init_bytes(tiny_bert)
    # Written and read back the way the CLI does.
    import onnx_ir as ir

    dst = tmp_path / "packed.onnx"
    model_io.save(ir.serde.deserialize_model(out), dst)
    assert dst.stat().st_size < 1.05 * len(tiny_bert.SerializeToString())
    rng = np.random.default_rng(3)
    feeds = {"input_ids": rng.integers(0, 100, (3, 11)).astype(np.int64),
             "attention_mask": np.ones((3, 11), np.int64)}
    feeds["attention_mask"][1, 7:] = 0
    written = onnx.load(str(dst))
    validate(written)
    assert_reference_matches(tiny_bert, written, feeds, rtol=1e-4, atol=1e-4)
    assert_same_outputs(tiny_bert, written, feeds, rtol=1e-4, atol=1e-4)

