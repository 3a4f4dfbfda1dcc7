"""Shared helpers for the graph-pass tests: fuse, find the fused nodes, compare in ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from opsfuse.graph_passes import fuse_attention, model_io


def fuse(model: onnx.ModelProto):
    out, report = fuse_attention(model)
    return out, report


def fused_nodes(model: onnx.ModelProto) -> list:
    return [n for n in model.graph.node if n.op_type == "FusedAttention" and n.domain == "com.opsfuse"]


def attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def validate(model: onnx.ModelProto) -> None:
    import onnx_ir as ir

    model_io.validate(ir.serde.deserialize_model(model))


def original_outputs(model: onnx.ModelProto, feeds: dict) -> list:
    """The original model's outputs: ONNX Runtime, or onnx's reference evaluator (the arbiter of the
    ONNX semantics) where ORT cannot run the model."""
    import onnxruntime as ort

    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return sess.run(None, feeds)
    except Exception:  # e.g. ORT rejects ONNX Attention masks shorter than the keys
        from onnx.reference import ReferenceEvaluator

        return ReferenceEvaluator(model).run(None, feeds)


def fused_outputs(model: onnx.ModelProto, feeds: dict) -> list:
    from opsfuse import LibraryNotBuiltError
    from opsfuse.ort_session import make_session

    try:
        sess = make_session(model)
    except LibraryNotBuiltError as exc:
        pytest.skip(f"opsfuse ORT library not built: {exc}")
    return sess.run(None, feeds)


def assert_same_outputs(original: onnx.ModelProto, rewritten: onnx.ModelProto, feeds: dict,
                        rtol: float = 1e-4, atol: float = 1e-5) -> None:
    expected = original_outputs(original, feeds)
    actual = fused_outputs(rewritten, feeds)
    assert len(expected) == len(actual)
    for e, a in zip(expected, actual):
        assert e.shape == a.shape and e.dtype == a.dtype
        assert not np.isnan(a).any(), "the rewritten model produced NaN"
        np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol)
