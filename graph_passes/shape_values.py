"""Reshape targets read from other values' shapes, where the shape inference lost them.

The dynamo exporter's decomposed SDPA builds K^T as Reshape(Transpose(Reshape(K, [-1, S, D])),
Concat(Slice(Shape(K), :-2), Slice(Shape(K), -1:), Slice(Shape(K), -2:-1))): the target is K's own
(B, H) with D and S swapped, but ONNX Runtime's symbolic inference gives the result made-up dims
(``unk__N``), and the rules cannot prove that K has Q's number of heads (session 41: X-MOD and SEW
left alone). This pass evaluates such small integer tensors as lists of dims -- ints, the shape
map's own symbols, or None -- through Shape, Slice, Gather, Concat, Unsqueeze, Squeeze, Cast and
Identity, sets each Reshape's output to the target it reads, and carries the result through the
elementwise ops that keep a shape (a scale multiplied in). A dim is only ever filled in where the
map had none or a made-up one: a known dim is never replaced. A target's -1 is the input's size
over the other dims where they cancel to integers (SEW's TorchScript views, session 42).
Transposes carry a refined shape, permuted, and MatMuls give their inputs' batch broadcast and
(rows, columns); elementwise ops after a refined value take the broadcast of their inputs where
it is provable (equal dims, or a 1 against the other), so that a mask added to refined scores is
seen not to grow them.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from .ir_utils import const_array, is_default_domain, transpose_perm
from .shape_info import Shape, ShapeMap, weak_dim

_MAX_ELEMENTS = 16  # a shape tensor, not data
_VALUE_OPS = {"Shape", "Cast", "Identity", "Concat", "Slice", "Gather", "Unsqueeze", "Squeeze"}
_SAME_SHAPE_UNARY = {"Cast", "Identity", "Neg"}
_ELEMENTWISE = _SAME_SHAPE_UNARY | {"Mul", "Div", "Add", "Sub"}


def _merge(old: Shape | None, new: Shape) -> Shape | None:
    """`old` with its unknown or made-up dims taken from `new`; None when nothing changes."""
    if old is None or len(old) != len(new):
        return new if old is None else None
    merged = tuple(n if weak_dim(o) and not weak_dim(n) else o for o, n in zip(old, new))
    return merged if merged != old else None


def _constant(value: ir.Value) -> list | None:
    """A small constant integer tensor (an initializer that is not a graph input, or a Constant
    node) as a list, read through ir_utils.const_array once its size is known to be small: a
    weight's bytes are never read."""
    tensor, producer = value.const_value, value.producer()
    if tensor is None and producer is not None and producer.op_type == "Constant":
        attr = producer.attributes.get("value")
        tensor = attr.as_tensor() if attr is not None and attr.type == ir.AttributeType.TENSOR else None
    if tensor is not None:
        dims = tensor.shape.dims if tensor.shape is not None else None
        if not tensor.dtype.is_integer() or dims is None or len(dims) > 1 or int(np.prod(dims)) > _MAX_ELEMENTS:
            return None
    elif producer is None or producer.op_type != "Constant":
        return None  # (a Constant's value_int / value_ints form: small by construction)
    arr = const_array(value)
    if arr is None or arr.dtype.kind not in "iu" or arr.ndim > 1 or arr.size > _MAX_ELEMENTS:
        return None
    return [int(x) for x in arr.reshape(-1)]


def _attr(node: ir.Node, name: str, default=None):
    attr = node.attributes.get(name)
    return default if attr is None else attr.value


class _Values:
    """Integer tensors of the graph as lists of dims, evaluated on demand."""

    def __init__(self, shapes: ShapeMap):
        self.shapes = shapes
        self.known: dict[str, list] = {}

    def of(self, value: ir.Value | None) -> list | None:
        if value is None:
            return None
        if value.name in self.known:
            return self.known[value.name]
        return _constant(value)

    def evaluate(self, node: ir.Node) -> list | None:
        op = node.op_type
        if op not in _VALUE_OPS or not is_default_domain(node):
            return None
        ins = list(node.inputs)
        if op == "Shape":
            s = self.shapes.get(ins[0].name) if ins[0] is not None else None
            if s is None:
                return None
            return list(s)[_attr(node, "start", 0):_attr(node, "end", None)]
        if op in ("Cast", "Identity"):
            return self.of(ins[0])
        if op == "Concat" and _attr(node, "axis", 0) in (0, -1):
            parts = [self.of(v) for v in ins]
            return None if any(p is None for p in parts) else [d for p in parts for d in p]
        if op == "Slice":
            data, starts, ends = self.of(ins[0]), self.of(ins[1]), self.of(ins[2])
            axes = self.of(ins[3]) if len(ins) > 3 and ins[3] is not None else [0]
            steps = self.of(ins[4]) if len(ins) > 4 and ins[4] is not None else [1]
            if data is None or starts is None or ends is None or len(starts) != 1 or len(ends) != 1:
                return None
            if axes not in ([0], [-1]) or steps != [1]:
                return None
            return data[starts[0]:ends[0]]
        if op == "Gather" and _attr(node, "axis", 0) == 0:
            data, idx = self.of(ins[0]), self.of(ins[1])
            if data is None or idx is None or any(not -len(data) <= i < len(data) for i in idx):
                return None
            return [data[i] for i in idx]
        if op in ("Unsqueeze", "Squeeze"):  # of a scalar or a 1-element list: the same single dim
            data = self.of(ins[0])
            return data if data is not None and len(data) == 1 else None
        return None


def _reshape_target(node: ir.Node, values: _Values, shapes: ShapeMap) -> Shape | None:
    data, target = node.inputs[0], values.of(node.inputs[1])
    if target is None:
        return None
    in_shape = shapes.get(data.name) if data is not None else None
    allowzero = _attr(node, "allowzero", 0)
    dims = []
    for i, d in enumerate(target):
        if d == 0 and not allowzero:
            d = in_shape[i] if in_shape is not None and i < len(in_shape) else None
        dims.append(d)
    if dims.count(-1) == 1 and in_shape is not None:
        dims[dims.index(-1)] = _inferred_dim(in_shape, [d for d in dims if d != -1])
    return tuple(None if d == -1 else d for d in dims)


def _inferred_dim(in_shape: Shape, others: list):
    """A Reshape target's -1: the input's size over the other target dims, where the two agree on
    every dim but integers (a symbol cancels against the same symbol, as same_dim takes them to be
    equal); None where something else is left (an unknown dim, or a symbol on one side only)."""
    left, right = list(in_shape), list(others)
    for d in list(right):
        if isinstance(d, str) and d in left:
            left.remove(d)
            right.remove(d)
    if not all(isinstance(d, int) and d > 0 for d in left + right):
        return None
    num, den = int(np.prod(left, dtype=np.int64)), int(np.prod(right, dtype=np.int64))
    return num // den if den > 0 and num % den == 0 else None


def _broadcast_dim(a, b):
    """The broadcast of two dims where it is provable: equal ones, or a 1 against the other."""
    if a == 1:
        return b
    if b == 1:
        return a
    return a if a == b and not weak_dim(a) else None


def _elementwise_shape(node: ir.Node, shapes: ShapeMap) -> Shape | None:
    """The output shape of an elementwise op: its input's (unary), or the two inputs' broadcast
    (binary; a dim neither provably equal nor against a 1 stays unknown)."""
    ins = [shapes.get(v.name) if v is not None else None for v in node.inputs]
    if node.op_type in _SAME_SHAPE_UNARY:
        return ins[0] if ins else None
    if len(ins) != 2 or ins[0] is None or ins[1] is None:
        return None
    return _broadcast_shape(tuple(ins[0]), tuple(ins[1]))


def _broadcast_shape(a: Shape, b: Shape) -> Shape:
    """Numpy-style broadcast of two shapes, dim by dim where provable (else None)."""
    rank = max(len(a), len(b))
    a, b = (1,) * (rank - len(a)) + a, (1,) * (rank - len(b)) + b
    return tuple(_broadcast_dim(x, y) for x, y in zip(a, b))


def _transposed_shape(node: ir.Node, shapes: ShapeMap) -> Shape | None:
    """A Transpose's output shape: its input's, permuted (perm absent: reversed)."""
    s = shapes.get(node.inputs[0].name) if node.inputs and node.inputs[0] is not None else None
    if s is None:
        return None
    perm = transpose_perm(node, len(s))
    if sorted(perm) != list(range(len(s))):
        return None
    return tuple(s[p] for p in perm)


def _matmul_shape(node: ir.Node, shapes: ShapeMap) -> Shape | None:
    """A MatMul's output shape for inputs of rank >= 2: the provable broadcast of the batch dims,
    then (rows of A, columns of B)."""
    a, b = (shapes.get(v.name) if v is not None else None for v in node.inputs[:2])
    if a is None or b is None or len(a) < 2 or len(b) < 2:
        return None
    batch = _broadcast_shape(tuple(a[:-2]), tuple(b[:-2]))
    return batch + (a[-2], b[-1])


def refine_reshapes(model: ir.Model, shapes: ShapeMap) -> int:
    """Fills in the dims of Reshape outputs (and of the shape-keeping ops after them) that the
    map lacks, from the targets the graph computes; returns how many values changed."""
    values = _Values(shapes)
    changed = 0
    for node in model.graph:
        if not node.outputs:
            continue
        out = node.outputs[0]
        result = values.evaluate(node)
        if result is not None and len(result) <= _MAX_ELEMENTS:
            values.known[out.name] = result
        new = None
        if node.op_type == "Reshape" and is_default_domain(node):
            new = _reshape_target(node, values, shapes)
        elif node.op_type in _ELEMENTWISE and is_default_domain(node):
            new = _elementwise_shape(node, shapes)
        elif node.op_type == "Transpose" and is_default_domain(node):
            new = _transposed_shape(node, shapes)
        elif node.op_type == "MatMul" and is_default_domain(node):
            new = _matmul_shape(node, shapes)
        if new is None:
            continue
        merged = _merge(shapes.get(out.name), new)
        if merged is not None:
            shapes[out.name] = merged
            changed += 1
    return changed
