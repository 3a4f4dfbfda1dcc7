"""FusedAttention against the ONNX standard `Attention` operator, its semantic arbiter:
(1) the `onnx` package's reference implementation on random overlapping cases, and (2) the ONNX
backend test cases for `Attention` that the `onnx` package generates, each converted to a
FusedAttention node. Cases that cannot be expressed are listed with the reason in
`NOT_CONVERTIBLE_REASONS` below; a test checks that every generated case is either run or explained."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import onnx
import onnx.numpy_helper
import pytest
from onnx import TensorProto, helper

from onnx_attention_reference import OVERLAP_CASES, TOLERANCE, case_attributes, case_id, case_mask, onnx_attention
from ort_helpers import FusedAttentionRunner, run_session
from opsfuse import contract
from opsfuse.ort_session import make_session


@pytest.fixture(scope="module")
def run():
    return FusedAttentionRunner()


@pytest.mark.parametrize("case", OVERLAP_CASES, ids=case_id)
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
def test_matches_onnx_reference_attention(run, case, dtype):
    rng = np.random.default_rng()
    c = dict(case)
    q = rng.standard_normal((c["b"], c["hq"], c["sq"], c["d"])).astype(dtype)
    k = rng.standard_normal((c["b"], c["hkv"], c["sk"], c["d"])).astype(dtype)
    v = rng.standard_normal((c["b"], c["hkv"], c["sk"], c["dv"])).astype(dtype)
    mask = case_mask(rng, c, dtype)
    attrs = case_attributes(c)
    expected = onnx_attention(q, k, v, mask, **attrs).astype(np.float64)
    got = run(q, k, v, attn_mask=mask, **attrs).astype(np.float64)
    tol = TOLERANCE[np.dtype(dtype)]
    np.testing.assert_allclose(got, expected, atol=tol, rtol=tol)


# ---------------------------------------------------------------------------------------------
# The ONNX backend test cases for Attention.

NOT_CONVERTIBLE_REASONS = {
    "past": "past_key/past_value and present outputs (KV cache concatenation) are outside the contract",
    "qk_output": "qk_matmul_output is an extra output: FusedAttention never materializes the score matrix",
    "window": "sliding-window attributes are outside the contract",
    "nonpad_causal": "is_causal with nonpad_kv_seqlen aligns the causal frontier to each batch's length "
                     "(j <= i + nonpad[b] - Sq); the contract's causal modes align to Sq and Sk",
    "expanded": "the _expanded variants are the same case written as the function body",
    "other_op": "the model's node is not a single Attention node",
}


def _why_not_convertible(case) -> str | None:
    if case.name.endswith("_expanded") or "_expanded_" in case.name:
        return "expanded"
    nodes = case.model.graph.node
    if len(nodes) != 1 or nodes[0].op_type != "Attention":
        return "other_op"
    node = nodes[0]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if any(name in attrs for name in ("left_window_size", "right_window_size", "window_size")):
        return "window"
    inputs = list(node.input) + [""] * (7 - len(node.input))
    if inputs[4] or inputs[5]:
        return "past"
    outputs = [o for o in list(node.output)[1:] if o]
    if len(outputs) == 1 and len(node.output) == 4 and node.output[3]:
        return "qk_output"
    if outputs:
        return "past" if (len(node.output) > 1 and node.output[1]) else "qk_output"
    if inputs[6] and attrs.get("is_causal", 0):
        return "nonpad_causal"
    return None


@functools.lru_cache(maxsize=1)
def _backend_cases():
    from onnx.backend.test.case.node import collect_testcases

    with np.errstate(all="ignore"):
        return tuple(collect_testcases("Attention"))


def _to_fused(case):
    node = case.model.graph.node[0]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    fused_attrs = {}
    if "scale" in attrs:
        fused_attrs["scale"] = float(attrs["scale"])
    if attrs.get("is_causal", 0):
        fused_attrs["is_causal"] = contract.CAUSAL_UPPER_LEFT
    if attrs.get("softcap", 0.0):
        fused_attrs["softcap"] = float(attrs["softcap"])
    for name in (contract.ATTR_Q_NUM_HEADS, contract.ATTR_KV_NUM_HEADS):  # the 3-D form
        if attrs.get(name):
            fused_attrs[name] = int(attrs[name])
    inputs = list(node.input) + [""] * (7 - len(node.input))
    fused_inputs = inputs[:3] + [inputs[3], inputs[6]]
    while fused_inputs and not fused_inputs[-1]:
        fused_inputs.pop()
    nodes, initializers = [], []
    feeds = dict(zip([i.name for i in case.model.graph.input], case.data_sets[0][0]))
    if inputs[3]:
        # ONNX Attention pads a mask shorter than the key sequence with masked positions.
        mask, sk = np.asarray(feeds[inputs[3]]), np.asarray(feeds[inputs[1]]).shape[-2]  # K: (.., Sk, D)
        if mask.shape[-1] < sk:
            pads = [0] * mask.ndim + [0] * (mask.ndim - 1) + [sk - mask.shape[-1]]
            fill = np.array(False) if mask.dtype == np.bool_ else np.array(-np.inf, dtype=mask.dtype)
            initializers += [helper.make_tensor("pads", TensorProto.INT64, [len(pads)], pads),
                             onnx.numpy_helper.from_array(fill, "pad_value")]
            nodes.append(helper.make_node("Pad", [inputs[3], "pads", "pad_value"], ["padded_mask"]))
            fused_inputs[3] = "padded_mask"
    fused = helper.make_node(contract.OP_NAME, fused_inputs, [node.output[0]], domain=contract.DOMAIN,
                             name=case.name, **fused_attrs)
    graph = helper.make_graph(nodes + [fused], case.name, list(case.model.graph.input),
                              list(case.model.graph.output), initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                   helper.make_opsetid(contract.DOMAIN, contract.OP_VERSION)])


def _case_names():
    return [c.name for c in _backend_cases()]


def test_every_backend_case_is_run_or_explained():
    cases = _backend_cases()
    assert len(cases) > 50, "the onnx package generated suspiciously few Attention cases"
    runnable = [c.name for c in cases if _why_not_convertible(c) is None]
    assert len(runnable) >= 25, runnable
    for c in cases:
        reason = _why_not_convertible(c)
        assert reason is None or reason in NOT_CONVERTIBLE_REASONS


@pytest.mark.parametrize("name", [c.name for c in _backend_cases() if _why_not_convertible(c) is None])
def test_onnx_backend_case(name):
    case = next(c for c in _backend_cases() if c.name == name)
    model = _to_fused(case)
    session = make_session(model)
    for inputs, outputs in case.data_sets:
        feed_names = [i.name for i in case.model.graph.input]
        feeds = dict(zip(feed_names, inputs))
        out_dtype = np.asarray(outputs[0]).dtype
        got = run_session(session, feeds, out_dtype).astype(np.float64)
        expected = np.asarray(outputs[0]).astype(np.float64)
        if out_dtype == np.float32:
            tol = 1e-5
        elif out_dtype == np.dtype(ml_dtypes.bfloat16):
            tol = 2e-2
        else:
            tol = 3e-3
        assert not np.any(np.isnan(got))
        np.testing.assert_allclose(got, expected, rtol=tol, atol=tol, err_msg=name)


def test_backend_case_list_is_documented():
    """docs/onnx_backend_attention_cases.md lists the cases that run and why the others do not."""
    from pathlib import Path

    doc = Path(__file__).resolve().parents[1] / "docs" / "onnx_backend_attention_cases.md"
    text = doc.read_text()
    for c in _backend_cases():
        assert f"`{c.name}`" in text, f"{c.name} missing from {doc.name}; regenerate with scripts/list_onnx_attention_cases.py"
