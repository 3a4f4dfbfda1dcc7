"""The FusedAttention schema for the ``onnx`` package, so that ``onnx.checker`` and
``onnx.shape_inference`` accept models that use the op and infer its output (B, Hq, Sq, Dv).

Call :func:`register` once per process; it is idempotent.
"""

from __future__ import annotations

import threading

import onnx
from onnx import defs

from . import contract

# TensorRT's ONNX parser finds the plugin by op type, plugin_version and plugin_namespace; the
# rewrite writes both attributes on every node, so the schema declares them.
ATTR_PLUGIN_VERSION = "plugin_version"
ATTR_PLUGIN_NAMESPACE = "plugin_namespace"

_lock = threading.Lock()
_registered = False

_VALUE_TYPES = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"]


def _infer(ctx) -> None:
    """Y = (B, Hq, Sq) of Q and Dv of V, with Q's element type."""
    q_type = ctx.get_input_type(contract.INPUT_Q)
    if q_type is None or not q_type.HasField("tensor_type"):
        return
    out = onnx.TypeProto()
    out.tensor_type.elem_type = q_type.tensor_type.elem_type
    q_shape = q_type.tensor_type.shape if q_type.tensor_type.HasField("shape") else None
    v_type = ctx.get_input_type(contract.INPUT_V) if ctx.get_num_inputs() > contract.INPUT_V else None
    v_shape = (
        v_type.tensor_type.shape
        if v_type is not None and v_type.HasField("tensor_type") and v_type.tensor_type.HasField("shape")
        else None
    )
    if q_shape is not None and len(q_shape.dim) == contract.TENSOR_RANK:
        dims = out.tensor_type.shape.dim
        for i in range(3):
            dims.add().CopyFrom(q_shape.dim[i])
        last = dims.add()
        if v_shape is not None and len(v_shape.dim) == contract.TENSOR_RANK:
            last.CopyFrom(v_shape.dim[3])
    ctx.set_output_type(contract.OUTPUT_Y, out)


def build_schema() -> defs.OpSchema:
    P = defs.OpSchema.FormalParameter
    opt = defs.OpSchema.FormalParameterOption.Optional
    A = defs.OpSchema.Attribute
    AT = defs.OpSchema.AttrType
    schema = defs.OpSchema(
        contract.OP_NAME,
        contract.DOMAIN,
        contract.OP_VERSION,
        "Scaled dot-product attention with online softmax; see opsfuse's ARCHITECTURE.md for the contract.",
        inputs=[
            P("Q", "T", "(B, Hq, Sq, D)"),
            P("K", "T", "(B, Hkv, Sk, D)"),
            P("V", "T", "(B, Hkv, Sk, Dv)"),
            P("attn_mask", "M", "broadcastable to (B, Hq, Sq, Sk); bool (True = attend) or T (added)", param_option=opt),
            P("key_lengths", "L", "(B,); keys at positions >= key_lengths[b] are masked", param_option=opt),
        ],
        outputs=[P("Y", "T", "(B, Hq, Sq, Dv)")],
        type_constraints=[
            ("T", _VALUE_TYPES, "Q, K, V and Y"),
            ("M", ["tensor(bool)"] + _VALUE_TYPES, "bool, or the type of Q"),
            ("L", ["tensor(int32)", "tensor(int64)"], "key lengths"),
        ],
        attributes=[
            A(contract.ATTR_SCALE, AT.FLOAT, "multiplies Q.K^T; default 1/sqrt(D)", required=False),
            A(contract.ATTR_IS_CAUSAL, AT.INT, "0 none, 1 upper-left, 2 lower-right", required=False),
            A(contract.ATTR_SOFTCAP, AT.FLOAT, "if > 0: s = softcap*tanh(s/softcap) before the mask", required=False),
            A(ATTR_PLUGIN_VERSION, AT.STRING, "TensorRT plugin version", required=False),
            A(ATTR_PLUGIN_NAMESPACE, AT.STRING, "TensorRT plugin namespace", required=False),
        ],
    )
    schema.set_type_and_shape_inference_function(_infer)
    return schema


def register() -> None:
    """Registers the schema with the ``onnx`` package (once per process)."""
    global _registered
    with _lock:
        if _registered:
            return
        try:
            defs.get_schema(contract.OP_NAME, contract.OP_VERSION, contract.DOMAIN)
        except defs.SchemaError:
            defs.register_schema(build_schema())
        _registered = True
