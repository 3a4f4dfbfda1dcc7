"""The `onnx` package's reference implementation of the standard `Attention` operator (opset 23),
the semantic arbiter of FusedAttention, and the random cases on which the two overlap. Shared by the
4-D conformance tests and the 3-D form's tests."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

# Cases both operators express: GQA/MQA, causal, bool and additive masks of several ranks, scale,
# softcap, Dv != D, Sq = 1.
OVERLAP_CASES = [
    dict(b=2, hq=4, hkv=4, sq=6, sk=6, d=16, dv=16),
    dict(b=1, hq=6, hkv=2, sq=5, sk=9, d=32, dv=24, is_causal=1),
    dict(b=2, hq=4, hkv=1, sq=9, sk=5, d=8, dv=8, is_causal=1),
    dict(b=2, hq=4, hkv=2, sq=7, sk=11, d=16, dv=16, mask="bool4"),
    dict(b=2, hq=4, hkv=2, sq=7, sk=11, d=16, dv=16, mask="float2", scale=0.37),
    dict(b=1, hq=2, hkv=2, sq=4, sk=8, d=16, dv=16, mask="float3", softcap=3.0),
    dict(b=1, hq=2, hkv=1, sq=1, sk=33, d=64, dv=64, is_causal=1),
]

# The onnx reference computes in the inputs' precision: float16 cases need a looser tolerance.
TOLERANCE = {np.dtype(np.float32): 2e-5, np.dtype(np.float16): 4e-3}


def case_id(case: dict) -> str:
    return "-".join(f"{k}{v}" for k, v in case.items())


def case_mask(rng, case: dict, dtype):
    """The case's attention mask (None, or fresh random values), never fully masking a row."""
    kind = case.get("mask")
    if kind == "bool4":
        mask = rng.random((case["b"], 1, case["sq"], case["sk"])) < 0.7
        mask[..., 0] = True
        return mask
    if kind == "float2":
        return rng.standard_normal((case["sq"], case["sk"])).astype(dtype)
    if kind == "float3":
        return rng.standard_normal((1, case["sq"], case["sk"])).astype(dtype)
    return None


def case_attributes(case: dict) -> dict:
    return {name: case[name] for name in ("is_causal", "scale", "softcap") if name in case}


def onnx_attention(q, k, v, attn_mask=None, opset=23, **attrs):
    """Y of one standard `Attention` node evaluated by onnx's ReferenceEvaluator."""
    elem = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16}[q.dtype]
    names = ["Q", "K", "V"] + (["attn_mask"] if attn_mask is not None else [])
    inputs = [helper.make_tensor_value_info(n, elem, None) for n in ("Q", "K", "V")]
    feeds = {"Q": q, "K": k, "V": v}
    if attn_mask is not None:
        mtype = TensorProto.BOOL if attn_mask.dtype == np.bool_ else elem
        inputs.append(helper.make_tensor_value_info("attn_mask", mtype, None))
        feeds["attn_mask"] = attn_mask
    node = helper.make_node("Attention", names, ["Y"], **attrs)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("Y", elem, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return ReferenceEvaluator(model).run(None, feeds)[0]
