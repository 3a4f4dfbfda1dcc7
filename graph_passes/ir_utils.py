"""Small helpers over onnx-ir shared by the fusion rules: constants, consumers, dtypes, permutations."""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

# Element types FusedAttention accepts for Q, K, V and Y.
VALUE_DTYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)

# How many bits of mantissa each float type keeps: a Cast to a type with at least as many bits
# (and as much range) as the source loses nothing.
_FLOAT_RANK = {ir.DataType.BFLOAT16: 1, ir.DataType.FLOAT16: 1, ir.DataType.FLOAT: 2, ir.DataType.DOUBLE: 3}

# Ops whose output is a pure function of constant inputs that `const_array` folds.
_MAX_FOLD_DEPTH = 8


def is_default_domain(node: ir.Node) -> bool:
    return node.domain in ("", "ai.onnx")


def op(value: ir.Value | None, *op_types: str) -> ir.Node | None:
    """The producer of `value` if it is a default-domain node of one of `op_types`."""
    if value is None:
        return None
    node = value.producer()
    if node is None or not is_default_domain(node) or node.op_type not in op_types:
        return None
    return node


def consumers(value: ir.Value) -> list[ir.Node]:
    """Distinct consuming nodes, in graph order of first use."""
    seen: list[ir.Node] = []
    for node in value.consumers():
        if node not in seen:
            seen.append(node)
    return seen


def only_consumer(value: ir.Value) -> ir.Node | None:
    """The one node that reads `value` (once), or None when it has none, several, or is a graph output."""
    uses = list(value.uses())
    if len(uses) != 1 or value.is_graph_output():
        return None
    return uses[0].node


def const_array(value: ir.Value | None, depth: int = 0) -> np.ndarray | None:
    """The value as a numpy array when it is a constant: an initializer that is not a graph input,
    a Constant node, or Identity / Cast / Sqrt / Reciprocal / Neg / Mul / Div / Reshape /
    Unsqueeze / Squeeze of constants. None otherwise."""
    if value is None or depth > _MAX_FOLD_DEPTH:
        return None
    if value.is_graph_input():
        return None  # overridable at run time
    if value.const_value is not None:
        try:
            return np.asarray(value.const_value.numpy())
        except Exception:  # a tensor type numpy cannot hold
            return None
    node = value.producer()
    if node is None or not is_default_domain(node):
        return None
    kind = node.op_type
    if kind == "Constant":
        attr = node.attributes.get("value")
        if attr is not None and attr.type == ir.AttributeType.TENSOR:
            return np.asarray(attr.as_tensor().numpy())
        for name, cast in (("value_float", np.float32), ("value_int", np.int64)):
            a = node.attributes.get(name)
            if a is not None:
                return np.asarray(a.value, dtype=cast)
        for name, cast in (("value_floats", np.float32), ("value_ints", np.int64)):
            a = node.attributes.get(name)
            if a is not None:
                return np.asarray(list(a.value), dtype=cast)
        return None
    args = [const_array(v, depth + 1) if v is not None else None for v in node.inputs]
    if not args or args[0] is None:
        return None
    x = args[0]
    with np.errstate(all="ignore"):
        if kind == "Identity":
            return x
        if kind == "Cast":
            to = ir.DataType(node.attributes.get_int("to"))
            try:
                return x.astype(to.numpy())
            except Exception:
                return None
        if kind == "Sqrt":
            return np.sqrt(x).astype(x.dtype)
        if kind == "Reciprocal":
            return (np.ones((), x.dtype) / x).astype(x.dtype)
        if kind == "Neg":
            return -x
        if kind in ("Mul", "Div", "Add", "Sub") and len(args) == 2 and args[1] is not None:
            y = args[1]
            fn = {"Mul": np.multiply, "Div": np.divide, "Add": np.add, "Sub": np.subtract}[kind]
            return fn(x, y).astype(np.result_type(x, y))
        if kind in ("Reshape", "Unsqueeze", "Squeeze") and x.size == 1:
            shape_like = {"Reshape": None}.get(kind, ())
            if kind == "Reshape" and len(args) > 1 and args[1] is not None:
                shape_like = tuple(int(d) if d != -1 else 1 for d in args[1])
            elif kind == "Unsqueeze":
                axes = args[1] if len(args) > 1 and args[1] is not None else node.attributes.get_ints("axes", ())
                shape_like = (1,) * (x.ndim + len(axes))
            elif kind == "Squeeze":
                shape_like = ()
            return x.reshape(shape_like) if shape_like is not None else None
    return None


def scalar_const(value: ir.Value | None, max_rank: int = 4) -> float | None:
    """The constant's value as a Python float when it holds one element and has rank <= `max_rank`
    (so multiplying by it cannot broadcast a rank-`max_rank` tensor to a larger shape)."""
    arr = const_array(value)
    if arr is None or arr.size != 1 or arr.ndim > max_rank:
        return None
    if not (np.issubdtype(arr.dtype, np.floating) or arr.dtype.name == "bfloat16"):
        return None
    return float(arr.astype(np.float64).reshape(()))


def dtype_of(value: ir.Value | None, shapes=None) -> ir.DataType | None:
    """The element type of `value`: from the IR, else from the inferred map (shape_info.ShapeMap)."""
    if value is None:
        return None
    if shapes is not None and value.name in getattr(shapes, "dtypes", {}):
        return shapes.dtypes[value.name]
    if value.type is not None:
        try:
            return value.dtype
        except Exception:
            return None
    if value.const_value is not None:
        return value.const_value.dtype
    return None


def widening_or_same(src: ir.DataType | None, dst: ir.DataType | None) -> bool:
    """True when a Cast from `src` to `dst` keeps every value of `src` exactly."""
    if src is None or dst is None:
        return False
    if src == dst:
        return True
    if src == ir.DataType.BFLOAT16 and dst == ir.DataType.FLOAT16:
        return False  # fp16 has less range than bf16
    return src in _FLOAT_RANK and dst in _FLOAT_RANK and _FLOAT_RANK[dst] > _FLOAT_RANK[src]


def compose_perm(outer: tuple[int, ...], inner: tuple[int, ...]) -> tuple[int, ...]:
    """The single permutation equal to Transpose(Transpose(x, inner), outer)."""
    return tuple(inner[i] for i in outer)


def is_identity_perm(perm: tuple[int, ...]) -> bool:
    return all(i == p for i, p in enumerate(perm))


def transpose_perm(node: ir.Node, rank: int | None) -> tuple[int, ...] | None:
    """The Transpose node's permutation (the default reverses the axes)."""
    perm = node.attributes.get_ints("perm", None)
    if perm is None:
        return tuple(reversed(range(rank))) if rank is not None else None
    return tuple(int(p) for p in perm)


def float_repr(x: float) -> str:
    if math.isinf(x):
        return "-inf" if x < 0 else "inf"
    return f"{x:.6g}"
