"""The FusedAttention schema for the ``onnx`` package, so that ``onnx.checker`` and
``onnx.shape_inference`` accept models that use the op and infer its output: (B, Hq, Sq, Dv), or
(B, Sq, Hq*Dv) for the 3-D form, (B, S, Hq*D) for packed Q/K/V (``packed_qkv`` = 1). A node that
breaks the contract in a way its input types, shapes and attributes already show (mixed ranks, a
missing head count, a hidden size that is not a multiple of it, a ``qkv_bias`` without
``packed_qkv`` = 1 or of the wrong shape or type) fails shape inference with an ``InferenceError``
naming the node and the problem.

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


def _input_shape(ctx, index: int):
    """The TensorShapeProto of input `index`, or None when absent or of unknown rank."""
    if ctx.get_num_inputs() <= index or not ctx.has_input(index):
        return None
    t = ctx.get_input_type(index)
    if t is None or not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    return t.tensor_type.shape


def _int_attr(ctx, name: str) -> int:
    attr = ctx.get_attribute(name)
    return contract.DEFAULT_NUM_HEADS if attr is None else int(attr.i)


def _fail(ctx, what: str) -> None:
    try:
        node = ctx.get_display_name()  # "node FusedAttention[com.opsfuse] (name)"
    except Exception:  # noqa: BLE001 - only the message's wording depends on it
        node = ""
    raise onnx.shape_inference.InferenceError(f"{node or contract.OP_NAME}: {what}")


def _known(dim) -> int | None:
    return dim.dim_value if dim.HasField("dim_value") else None


def _check_qkv_bias(ctx, packed_qkv: int, q_type, q_shape) -> None:
    """The optional qkv_bias (docs/notes/contract_qkv_bias.md): only with packed_qkv = 1, of Q's
    element type, shape ((Hq + 2*Hkv)*D,) = (the packed last dimension,)."""
    if ctx.get_num_inputs() <= contract.INPUT_QKV_BIAS or not ctx.has_input(contract.INPUT_QKV_BIAS):
        return
    if packed_qkv != 1:
        _fail(ctx, "input qkv_bias (the packed projection's bias) is only allowed with attribute packed_qkv = 1")
    bias_type = ctx.get_input_type(contract.INPUT_QKV_BIAS)
    if bias_type is None or not bias_type.HasField("tensor_type"):
        return
    elem, q_elem = bias_type.tensor_type.elem_type, q_type.tensor_type.elem_type
    if elem and q_elem and elem != q_elem:
        _fail(ctx, f"input qkv_bias has element type {onnx.TensorProto.DataType.Name(elem)}, Q "
                   f"{onnx.TensorProto.DataType.Name(q_elem)}: they must be the same type T")
    bias_shape = _input_shape(ctx, contract.INPUT_QKV_BIAS)
    if bias_shape is None:
        return
    if len(bias_shape.dim) != 1:
        _fail(ctx, f"input qkv_bias must be 1-D ((q_num_heads + 2*kv_num_heads)*D,), got rank {len(bias_shape.dim)}")
    width = _known(bias_shape.dim[0])
    hidden = None if q_shape is None or len(q_shape.dim) != contract.PACKED_TENSOR_RANK else _known(q_shape.dim[2])
    if width is not None and hidden is not None and width != hidden:
        _fail(ctx, f"input qkv_bias has {width} elements; it must have one per packed column, the packed last "
                   f"dimension {hidden}")


def _infer_packed_qkv(ctx, out, rank, shapes, hq: int, hkv: int) -> None:
    """packed_qkv = 1: Q, K, V each the packed (B, S, (Hq + 2*Hkv)*D) tensor; Y = (B, S, Hq*D)."""
    if rank == contract.TENSOR_RANK:
        _fail(ctx, "attribute packed_qkv = 1 needs the 3-D form (Q, K, V each the packed (B, S, "
                   "(q_num_heads + 2*kv_num_heads)*D) tensor), got rank-4 inputs")
    if hq <= 0 or hkv <= 0:
        _fail(ctx, "attribute packed_qkv = 1 requires attributes q_num_heads and kv_num_heads")
    columns = hq + 2 * hkv
    known_shapes = [[_known(d) for d in s.dim] for s in shapes if s is not None]
    for axis in range(contract.PACKED_TENSOR_RANK):
        values = {dims[axis] for dims in known_shapes if dims[axis] is not None}
        if len(values) > 1:
            _fail(ctx, f"with packed_qkv = 1, Q, K and V must have the same shape, got dimension {axis} "
                       f"sizes {sorted(values)}")
    q_shape = shapes[0]
    if q_shape is None:
        return
    hidden = _known(q_shape.dim[2])
    if hidden is not None and hidden % columns:
        _fail(ctx, f"with packed_qkv = 1, the packed last dimension {hidden} must be a multiple of "
                   f"q_num_heads + 2*kv_num_heads = {columns}")
    dims = out.tensor_type.shape.dim
    dims.add().CopyFrom(q_shape.dim[0])
    dims.add().CopyFrom(q_shape.dim[1])
    last = dims.add()
    if hidden is not None:
        last.dim_value = hq * (hidden // columns)


def _infer(ctx) -> None:
    """Y = (B, Hq, Sq) of Q and Dv of V (4-D form), or (B, Sq) of Q and q_num_heads * (V's last
    dimension / kv_num_heads) (3-D form), with Q's element type."""
    q_type = ctx.get_input_type(contract.INPUT_Q)
    if q_type is None or not q_type.HasField("tensor_type"):
        return
    out = onnx.TypeProto()
    out.tensor_type.elem_type = q_type.tensor_type.elem_type
    q_shape, k_shape, v_shape = (_input_shape(ctx, i) for i in (contract.INPUT_Q, contract.INPUT_K, contract.INPUT_V))
    hq, hkv = _int_attr(ctx, contract.ATTR_Q_NUM_HEADS), _int_attr(ctx, contract.ATTR_KV_NUM_HEADS)
    for name, value in ((contract.ATTR_Q_NUM_HEADS, hq), (contract.ATTR_KV_NUM_HEADS, hkv)):
        if value < 0:
            _fail(ctx, f"attribute '{name}' must be a positive int, got {value}")
    if hq > 0 and hkv > 0 and hq % hkv:
        _fail(ctx, f"attribute 'q_num_heads' ({hq}) must be a multiple of attribute 'kv_num_heads' ({hkv})")
    ranks = [None if s is None else len(s.dim) for s in (q_shape, k_shape, v_shape)]
    known = {r for r in ranks if r is not None}
    if len(known) > 1:
        _fail(ctx, "Q, K and V must all have rank 4 (B, H, S, D) or all rank 3 (B, S, H*D), got ranks "
                   + ", ".join("?" if r is None else str(r) for r in ranks))
    rank = known.pop() if known else None
    packed_qkv = _int_attr(ctx, contract.ATTR_PACKED_QKV)
    if packed_qkv not in (0, 1):
        _fail(ctx, f"attribute 'packed_qkv' must be 0 or 1, got {packed_qkv}")
    _check_qkv_bias(ctx, packed_qkv, q_type, q_shape)
    if packed_qkv == 1:
        _infer_packed_qkv(ctx, out, rank, (q_shape, k_shape, v_shape), hq, hkv)
        ctx.set_output_type(contract.OUTPUT_Y, out)
        return
    if rank == contract.PACKED_TENSOR_RANK:
        for name, shape, attr, heads in (("Q", q_shape, contract.ATTR_Q_NUM_HEADS, hq),
                                         ("K", k_shape, contract.ATTR_KV_NUM_HEADS, hkv),
                                         ("V", v_shape, contract.ATTR_KV_NUM_HEADS, hkv)):
            if heads <= 0:
                _fail(ctx, f"{name} is rank 3 (B, S, H*D), so attribute {attr} is required")
            hidden = None if shape is None else _known(shape.dim[2])
            if hidden is not None and hidden % heads:
                _fail(ctx, f"{name}'s last dimension {hidden} is not a multiple of {attr} {heads}")
        dims = out.tensor_type.shape.dim
        if q_shape is not None:
            dims.add().CopyFrom(q_shape.dim[0])
            dims.add().CopyFrom(q_shape.dim[1])
            last = dims.add()
            if v_shape is not None:
                if hq == hkv:
                    last.CopyFrom(v_shape.dim[2])  # Hq * Dv is V's last dimension, known or symbolic
                elif _known(v_shape.dim[2]) is not None:
                    last.dim_value = hq * (_known(v_shape.dim[2]) // hkv)
    elif rank == contract.TENSOR_RANK:
        for name, shape, attr, value in (("Q", q_shape, contract.ATTR_Q_NUM_HEADS, hq),
                                         ("K", k_shape, contract.ATTR_KV_NUM_HEADS, hkv)):
            heads = None if shape is None else _known(shape.dim[1])
            if value > 0 and heads is not None and heads != value:
                _fail(ctx, f"attribute {attr} = {value} does not match {name}'s head dimension {heads} "
                           f"(with 4-D inputs it may only repeat it)")
        if q_shape is not None:
            dims = out.tensor_type.shape.dim
            for i in range(3):
                dims.add().CopyFrom(q_shape.dim[i])
            last = dims.add()
            if v_shape is not None:
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
            P("Q", "T", "(B, Hq, Sq, D), or (B, Sq, Hq*D) with q_num_heads"),
            P("K", "T", "(B, Hkv, Sk, D), or (B, Sk, Hkv*D) with kv_num_heads"),
            P("V", "T", "(B, Hkv, Sk, Dv), or (B, Sk, Hkv*Dv) with kv_num_heads"),
            P("attn_mask", "M", "broadcastable to (B, Hq, Sq, Sk); bool (True = attend) or T (added)", param_option=opt),
            P("key_lengths", "L", "(B,); keys at positions >= key_lengths[b] are masked", param_option=opt),
            P("qkv_bias", "T", "((Hq + 2*Hkv)*D,); added to every packed row before Q, K, V are read; only "
              "with packed_qkv = 1", param_option=opt),
        ],
        outputs=[P("Y", "T", "(B, Hq, Sq, Dv), or (B, Sq, Hq*Dv) for 3-D inputs, (B, S, Hq*D) packed")],
        type_constraints=[
            ("T", _VALUE_TYPES, "Q, K, V and Y"),
            ("M", ["tensor(bool)"] + _VALUE_TYPES, "bool, or the type of Q"),
            ("L", ["tensor(int32)", "tensor(int64)"], "key lengths"),
        ],
        attributes=[
            A(contract.ATTR_SCALE, AT.FLOAT, "multiplies Q.K^T; default 1/sqrt(D)", required=False),
            A(contract.ATTR_IS_CAUSAL, AT.INT, "0 none, 1 upper-left, 2 lower-right", required=False),
            A(contract.ATTR_SOFTCAP, AT.FLOAT, "if > 0: s = softcap*tanh(s/softcap) before the mask", required=False),
            A(contract.ATTR_Q_NUM_HEADS, AT.INT, "Hq; required with 3-D inputs, else equal to Q's dim 1",
              required=False),
            A(contract.ATTR_KV_NUM_HEADS, AT.INT, "Hkv; required with 3-D inputs, else equal to K's dim 1",
              required=False),
            A(contract.ATTR_PACKED_QKV, AT.INT, "1: Q, K, V are each the packed (B, S, (Hq+2*Hkv)*D) projection, "
              "read as column windows (3-D form only)", required=False),
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
