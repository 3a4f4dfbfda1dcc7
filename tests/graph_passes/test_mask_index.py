"""mask_index.py: transformers' exported padding-mask gather (attention_mask[batch_idx, kv_idx] as
Flatten / Range / Gather index arithmetic) becomes one Unsqueeze of the mask -- only where every
index is proven the identity -- and the outputs stay bit-identical.

The hand-built graphs copy the TorchScript export node for node (see the module docstring); the
HF tests export tiny BERT and GPT-2 models and compare the rewrite with and without this rule
bit for bit, on masks padded at the end, the start, the middle, at random and fully, for several
batch and sequence sizes (dynamic axes)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from attention_graphs import F32, G
from rewrite_helpers import fuse, fused_nodes, fused_outputs, validate
from onnx import TensorProto

from opsfuse.graph_passes import pipeline

INDEX_OPS = ("Flatten", "Range")
MIN = float(np.finfo(np.float32).min)


def _index_mask(g: G, m: str, *, batch_src: str, kv_src: str = "shape_m", mul_axis: int = 1,
                unsqueeze: str = "chain", back: str = "reshape") -> str:
    """The export's pad = m[batch_idx, kv_idx] (B, 1, 1, S) from the (B, S) bool tensor m."""
    flat = g.op("Flatten", m, axis=2)

    def dim(src, axis):
        x = {"shape_m": m, "q": "q", "other": "other"}[src]
        d = g.op("Gather", g.op("Shape", x), g.const(axis, np.int64), axis=0)
        return g.op("Cast", d, to=TensorProto.INT64)

    def unsq(x, axes):
        if unsqueeze == "single":
            return g.op("Unsqueeze", x, g.const(axes, np.int64))
        for a in axes:
            x = g.op("Unsqueeze", x, g.const([a], np.int64))
        return x

    zero, one = g.const(0, np.int64), g.const(1, np.int64)
    kv = unsq(g.op("Range", zero, dim(kv_src, 1), one), [0, 1, 2])  # (1, 1, 1, S)
    b = unsq(g.op("Range", zero, dim(batch_src, 0), one), [1, 2, 3])  # (B, 1, 1, 1)
    row = g.op("Gather", g.op("Shape", m), g.const([mul_axis], np.int64), axis=0)
    idx = g.op("Add", kv, g.op("Mul", b, row))
    gathered = g.op("Gather", flat, idx, axis=0)  # (B, 1, 1, S, 1)
    if back == "reshape":
        v = g.op("Reshape", g.op("Reshape", gathered, g.const([-1], np.int64)),
                 g.op("Concat", g.op("Shape", idx), axis=0))
    else:  # the same values, but not the form the rule proves
        v = g.op("Squeeze", gathered, g.const([4], np.int64))
    return g.op("Cast", v, to=TensorProto.BOOL)


def index_model(*, H=2, D=8, opset=17, **kw) -> onnx.ModelProto:
    """Attention over q, k, v (batch, H, seq, D) with the export's padding mask; outputs y and the
    additive mask itself (so the mask can be compared exactly)."""
    g = G(opset)
    for name in ("q", "k", "v"):
        g.inp(name, F32, ["batch", H, "seq", D])
    g.inp("attention_mask", TensorProto.INT64, ["batch", "seq"])
    if kw.get("batch_src") == "other":
        g.inp("other", F32, ["other_batch", 3])
    m = g.op("Cast", "attention_mask", to=TensorProto.BOOL)
    pad = _index_mask(g, m, **kw)
    add_mask = g.op("Where", pad, g.const(0.0), g.const(MIN))
    scores = g.op("Mul", g.op("MatMul", "q", g.op("Transpose", "k", perm=[0, 1, 3, 2])), g.const(1 / np.sqrt(D)))
    probs = g.op("Softmax", g.op("Add", scores, add_mask), axis=-1)
    y = g.op("MatMul", probs, "v")
    g.nodes.append(onnx.helper.make_node("Identity", [y], ["y"], name="out_y"))
    g.nodes.append(onnx.helper.make_node("Identity", [add_mask], ["mask_out"], name="out_mask"))
    g.out("y", F32, ["batch", H, "seq", D])
    g.out("mask_out", F32, ["batch", 1, 1, "seq"])
    return g.model()


def masks(batch: int, seq: int, seed: int) -> list[np.ndarray]:
    """Padding at the end, the start, the middle, at random, and a fully padded row."""
    rng = np.random.default_rng(seed)
    out = []
    end = np.ones((batch, seq), np.int64)
    for b in range(batch):
        end[b, seq - b * seq // (2 * batch):] = 0
    out.append(end)
    out.append(end[:, ::-1].copy())  # at the start
    mid = np.ones((batch, seq), np.int64)
    mid[:, seq // 3: seq // 3 + max(1, seq // 4)] = 0
    out.append(mid)
    rand = (rng.random((batch, seq)) < 0.6).astype(np.int64)
    rand[:, 0] = 1
    out.append(rand)
    full = end.copy()
    full[-1] = 0
    out.append(full)
    return out


def _feeds(model, batch, seq, mask, seed, D=8, H=2):
    rng = np.random.default_rng(seed)
    feeds = {n: rng.standard_normal((batch, H, seq, D)).astype(np.float32) for n in ("q", "k", "v")}
    feeds["attention_mask"] = mask
    if any(i.name == "other" for i in model.graph.input):
        feeds["other"] = np.zeros((batch, 3), np.float32)
    return feeds


def _original(model, feeds):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _without_rule(model, monkeypatch):
    """The same rewrite with mask_index switched off (the reference the rule must match bit for bit)."""
    with monkeypatch.context() as mp:
        mp.setattr(pipeline.mask_index, "run", lambda *a, **k: {})
        out, _ = fuse(model)
    return out


def _ops(model):
    return [n.op_type for n in model.graph.node]


@pytest.mark.parametrize("batch_src", ["shape_m", "q"])
@pytest.mark.parametrize("unsqueeze", ["chain", "single"])
def test_index_gather_becomes_one_unsqueeze(batch_src, unsqueeze, monkeypatch):
    model = index_model(batch_src=batch_src, unsqueeze=unsqueeze)
    out, report = fuse(model)
    assert report.fused == 1, report.format()
    validate(out)
    details = report.candidates[0].details
    assert details["mask_index"] and details["mask_index_why_not"] == "", details
    ops = _ops(out)
    assert not [o for o in ops if o in INDEX_OPS], ops
    assert "Gather" not in ops and "Reshape" not in ops and "Mul" not in ops, ops
    # Cast(attention_mask) -> Unsqueeze -> Where -> FusedAttention (+ the two output Identities and the
    # Unsqueeze's axes): the export's Cast(bool -> bool) went as the identity.
    producers = {o: n for n in out.graph.node for o in n.output}
    where = producers[fused_nodes(out)[0].input[3]]
    unsq = producers[where.input[0]]
    assert where.op_type == "Where" and unsq.op_type == "Unsqueeze"
    assert producers[unsq.input[0]].op_type == "Cast" and producers[unsq.input[0]].input[0] == "attention_mask"
    assert ops.count("Cast") == 1
    reference = _without_rule(model, monkeypatch)
    for batch, seq in ((2, 5), (3, 16), (1, 7), (5, 33)):
        for i, mask in enumerate(masks(batch, seq, seed=batch * 100 + seq)):
            feeds = _feeds(model, batch, seq, mask, seed=i)
            want_mask = _original(model, feeds)[1]
            got = fused_outputs(out, feeds)
            ref = fused_outputs(reference, feeds)
            assert np.array_equal(got[1], want_mask), "the mask must be the same bits"
            assert np.array_equal(got[0], ref[0]), f"y differs from the rewrite without mask_index ({batch}, {seq}, {i})"
            np.testing.assert_allclose(got[0], _original(model, feeds)[0], rtol=1e-4, atol=1e-5)


def test_opset_12_unsqueeze_takes_axes_attribute(monkeypatch):
    model = index_model(batch_src="shape_m", opset=12, unsqueeze="single")
    # opset 12 Unsqueeze takes axes as an attribute: rebuild those nodes the old way
    for n in model.graph.node:
        if n.op_type == "Unsqueeze":
            init = next(i for i in model.graph.initializer if i.name == n.input[1])
            axes = onnx.numpy_helper.to_array(init).tolist()
            del n.input[1]
            n.attribute.append(onnx.helper.make_attribute("axes", axes))
    out, report = fuse(model)
    assert report.fused == 1, report.format()
    validate(out)
    assert report.candidates[0].details["mask_index"], report.candidates[0].details
    unsq = [n for n in out.graph.node if n.op_type == "Unsqueeze"]
    assert len(unsq) == 1 and len(unsq[0].input) == 1
    assert [a.ints for a in unsq[0].attribute if a.name == "axes"] == [[1, 2]]
    feeds = _feeds(model, 3, 6, masks(3, 6, 0)[3], seed=1)
    assert np.array_equal(fused_outputs(out, feeds)[1], _original(model, feeds)[1])
    assert np.array_equal(fused_outputs(out, feeds)[0], fused_outputs(_without_rule(model, monkeypatch), feeds)[0])


@pytest.mark.parametrize("kw,why", [
    ({"batch_src": "shape_m", "mul_axis": 0}, "the multiplier is not m's row length"),
    ({"batch_src": "shape_m", "back": "squeeze"}, "not reshaped back to Shape(indices)"),
])
def test_unproven_index_arithmetic_is_kept_with_reason(kw, why, monkeypatch):
    model = index_model(**kw)
    out, report = fuse(model)
    assert report.fused == 1, report.format()
    details = report.candidates[0].details
    assert details["mask_index"] == ""
    assert why in details["mask_index_why_not"], details["mask_index_why_not"]
    assert "Flatten" in _ops(out) and "Range" in _ops(out)
    batch, seq = 3, 8  # batch < seq: the wrong multiplier still indexes inside the mask
    for i, mask in enumerate(masks(batch, seq, seed=5)):
        feeds = _feeds(model, batch, seq, mask, seed=i)
        want = _original(model, feeds)
        got = fused_outputs(out, feeds)
        assert np.array_equal(got[1], want[1])
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("opset", [17, 14])
def test_batch_length_from_an_unrelated_tensor_is_sliced(opset, monkeypatch):
    """The batch Range reads dim 0 of `other`, which the graph does not tie to the mask's rows: the
    rule keeps exactly the rows the original gathers, Slice(m, 0, that length) -- also when `other`
    has fewer rows (1 here: the original's one-row mask broadcasts over the batch)."""
    model = index_model(batch_src="other", opset=opset)
    out, report = fuse(model)
    assert report.fused == 1, report.format()
    validate(out)
    details = report.candidates[0].details
    assert details["mask_index"] and "not provably dim 0" in details["mask_index_sliced"], details
    ops = _ops(out)
    assert "Slice" in ops and "Flatten" not in ops and "Range" not in ops, ops
    reference = _without_rule(model, monkeypatch)
    for batch, seq, rows in ((3, 8, 3), (3, 8, 1), (4, 5, 2)):
        if rows not in (1, batch):
            continue  # the original's mask would not broadcast against the scores
        for i, mask in enumerate(masks(batch, seq, seed=rows)):
            feeds = _feeds(model, batch, seq, mask, seed=i)
            feeds["other"] = np.zeros((rows, 3), np.float32)
            want = _original(model, feeds)
            got = fused_outputs(out, feeds)
            assert got[1].shape == want[1].shape and np.array_equal(got[1], want[1])
            assert np.array_equal(got[0], fused_outputs(reference, feeds)[0])


# --- exported Hugging Face models -------------------------------------------------------------------

HF = [("bert", "eager", 17), ("bert", "eager", 14), ("bert", "sdpa", 17), ("gpt2", "eager", 17),
      ("gpt2", "sdpa", 14)]


@pytest.fixture(scope="module")
def hf_export(tmp_path_factory):
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
        pytest.skip("torch and transformers are needed to export the test models")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))
    import export_models

    out_dir = tmp_path_factory.mktemp("mask_index_models")
    cache = {}

    def get(model, attn, opset):
        key = (model, attn, opset)
        if key not in cache:
            cache[key] = export_models.export(model, attn, "torchscript", opset, out_dir)
        return onnx.load(str(cache[key]))

    return get


@pytest.mark.parametrize("model,attn,opset", HF, ids=[f"{m}-{a}-torchscript{o}" for m, a, o in HF])
def test_hf_exports_bit_exact(hf_export, model, attn, opset, monkeypatch):
    original = hf_export(model, attn, opset)
    out, report = fuse(original)
    assert report.fused == 2, report.format()
    validate(out)
    for cand in report.candidates:
        assert cand.details["mask_index"] and not cand.details["mask_index_why_not"], cand.details
    # GPT-2's batch index length is proven (the Reshape of input_ids both read); export_models' BERT
    # has no token_type_ids input and derives the batch through an Expand of the token-type buffer
    # that the rule does not follow: it keeps a Slice of the mask's rows.
    sliced = [c.details["mask_index_sliced"] for c in report.candidates]
    assert all(sliced) if model == "bert" else not any(sliced), sliced
    ops = _ops(out)
    assert "Flatten" not in ops
    if model == "bert":
        assert "Range" not in ops, "BERT's only Ranges were the mask's indices"
    reference = _without_rule(original, monkeypatch)
    assert len(reference.graph.node) > len(out.graph.node)
    rng = np.random.default_rng(7)
    for batch, seq in ((2, 16), (3, 9), (1, 23)):
        for i, mask in enumerate(masks(batch, seq, seed=seq)):
            feeds = {"input_ids": rng.integers(3, 100, (batch, seq), dtype=np.int64), "attention_mask": mask}
            got, ref = fused_outputs(out, feeds)[0], fused_outputs(reference, feeds)[0]
            assert np.array_equal(got, ref), f"{model}: output differs from the rewrite without mask_index"
            if i < 2:
                want = _original(original, feeds)[0]
                np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
