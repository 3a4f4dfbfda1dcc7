"""After the rules: give each fused node the smallest mask that broadcasts to the same values.

Exporters often materialize a mask at the full (B, 1, Sq, Sk) before it is added to the scores --
transformers' mask builders ``Expand`` a (B, 1, 1, Sk) padding mask, or ``And`` it with a (1, 1,
Sq, 1) tensor that is all True. FusedAttention broadcasts its mask itself, so it can read the small
tensor: the kernel then reads one row per batch instead of a value per score, and the Expand and its
shape arithmetic leave the graph.

The reduction R(v) keeps the invariant ``broadcast_to(R(v), shape(v)) == v`` (ONNX broadcasting,
right-aligned), built from three facts:

- ``Expand(x, shape)`` is x broadcast to its output shape: R = R(x).
- An elementwise op with multidirectional broadcasting (Where, And, Add, Cast, Not, ...) commutes
  with broadcasting: f(R(a), R(b), ...) broadcast to the output's shape is f(a, b, ...). Each R(a)
  has, per axis, a's dim or 1, so the new operands still broadcast against each other.
- ``And(t, y)`` with t provably all True is y broadcast to the output: R = R(y) (``Or`` with an all
  False operand likewise). "Provably all True": constants, ConstantOfShape(True), And/Or of such,
  shape-only ops over them, and ``x >= c`` / ``x > c`` where x is a ``Range`` with a constant start
  and a positive constant step (every element >= start) and start >= c (or > c) -- the query-index
  term transformers' mask functions AND in.

Since R(mask) broadcasts to the mask, which broadcasts to the scores (the rules proved it), it
broadcasts to the scores with the same values: the fused node's result is bit-identical. Nothing
is changed when the reduced mask's rank is not provably 2 to 4 (FusedAttention's mask ranks).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from .. import contract
from . import emit
from .ir_utils import const_array, is_default_domain

NAME = "mask_broadcast"
_MAX_DEPTH = 24

# Elementwise ops with ONNX multidirectional broadcasting (all inputs) or one input.
_BROADCASTING = {"Add", "Sub", "Mul", "Div", "And", "Or", "Xor", "Equal", "Less", "Greater", "LessOrEqual",
                 "GreaterOrEqual", "Where", "Max", "Min"}
_UNARY = {"Cast", "Not", "Neg", "Abs", "IsNaN", "IsInf", "Sign", "Reciprocal"}
_SHAPE_ONLY = {"Unsqueeze", "Reshape", "Expand", "Identity", "Squeeze", "Flatten"}


def _lower_bound(value: ir.Value, depth: int = 0) -> float | None:
    """A number every element of `value` is provably >= to (None: unknown)."""
    if value is None or depth > 8:
        return None
    arr = const_array(value)
    if arr is not None:
        if arr.size == 0 or arr.dtype.kind not in "iuf":
            return None
        return float(arr.min())
    node = value.producer()
    if node is None or not is_default_domain(node):
        return None
    if node.op_type == "Range":
        start, delta = const_array(node.inputs[0]), const_array(node.inputs[2])
        if start is None or delta is None or start.size != 1 or delta.size != 1 or float(delta.reshape(())) <= 0:
            return None
        return float(start.reshape(()))  # start + i*delta, i >= 0
    if node.op_type in ("Unsqueeze", "Reshape", "Expand", "Identity", "Squeeze", "Flatten"):
        return _lower_bound(node.inputs[0], depth + 1)
    if node.op_type == "Cast" and ir.DataType(node.attributes.get_int("to")).numpy().kind in "iuf":
        src = _lower_bound(node.inputs[0], depth + 1)
        # A Cast between int and float types keeps the order; below 2**24 in magnitude the
        # rounding of an integer bound is exact, and truncation of floats stays above floor(src).
        return None if src is None or abs(src) > 2**24 else float(np.floor(src))
    return None


def _all(value: ir.Value, truth: bool, depth: int = 0) -> bool:
    """True when every element of the bool tensor `value` is provably `truth`."""
    if value is None or depth > 12:
        return False
    arr = const_array(value)
    if arr is not None:
        return arr.dtype == np.bool_ and bool(np.all(arr == truth))
    node = value.producer()
    if node is None or not is_default_domain(node):
        return False
    kind = node.op_type
    if kind == "ConstantOfShape":
        attr = node.attributes.get("value")
        if attr is None:
            return False  # float 0 by default: not a bool tensor
        v = attr.as_tensor().numpy()
        return v.dtype == np.bool_ and bool(np.all(v == truth))
    if kind in _SHAPE_ONLY:
        return _all(node.inputs[0], truth, depth + 1)
    if kind == "Cast":
        return (ir.DataType(node.attributes.get_int("to")) == ir.DataType.BOOL
                and _all(node.inputs[0], truth, depth + 1))
    if kind == "Not":
        return _all(node.inputs[0], not truth, depth + 1)
    if kind in ("And", "Or"):
        a, b = (_all(x, truth, depth + 1) for x in node.inputs[:2])
        both = (kind == "And") == truth  # And all True / Or all False need both operands
        return (a and b) if both else (a or b)
    if kind in ("GreaterOrEqual", "Greater") and truth:
        lb = _lower_bound(node.inputs[0])
        c = const_array(node.inputs[1])
        if lb is None or c is None or c.size == 0 or c.dtype.kind not in "iuf":
            return False
        bound = float(c.max())
        return lb >= bound if kind == "GreaterOrEqual" else lb > bound
    return False


class _Reducer:
    def __init__(self, shapes: dict):
        self.shapes = shapes
        self.new_nodes: list[ir.Node] = []
        self.ranks: dict[int, int | None] = {}  # id(new value) -> rank
        self.memo: dict[int, ir.Value] = {}

    def rank(self, value: ir.Value) -> int | None:
        if id(value) in self.ranks:
            return self.ranks[id(value)]
        s = self.shapes.get(value.name)
        return None if s is None else len(s)

    def reduce(self, value: ir.Value, depth: int = 0) -> ir.Value:
        if id(value) in self.memo:
            return self.memo[id(value)]
        out = self._reduce(value, depth)
        self.memo[id(value)] = out
        return out

    def _reduce(self, value: ir.Value, depth: int) -> ir.Value:
        node = value.producer()
        if node is None or depth > _MAX_DEPTH or not is_default_domain(node) or len(node.outputs) != 1:
            return value
        kind = node.op_type
        if kind == "Expand":
            return self.reduce(node.inputs[0], depth + 1)
        if kind == "Identity":
            return self.reduce(node.inputs[0], depth + 1)
        if kind in ("And", "Or") and len(node.inputs) == 2:
            neutral = kind == "And"  # And(True, y) = y; Or(False, y) = y (broadcast)
            for i in (0, 1):
                if _all(node.inputs[i], neutral):
                    return self.reduce(node.inputs[1 - i], depth + 1)
        if kind in _UNARY or kind in _BROADCASTING:
            if any(x is None for x in node.inputs) or (kind in _UNARY and len(node.inputs) != 1):
                return value
            args = [self.reduce(x, depth + 1) for x in node.inputs]
            if all(a is x for a, x in zip(args, node.inputs)):
                return value
            ranks = [self.rank(a) for a in args]
            attrs = [ir.Attr(a.name, a.type, a.value) for a in node.attributes.values()]
            new = ir.Node("", kind, args, attrs,
                          name=f"{node.name or kind}_unbroadcast")
            new.outputs[0].name = f"{value.name}_unbroadcast"
            if value.type is not None:
                new.outputs[0].type = value.type
            self.new_nodes.append(new)
            self.ranks[id(new.outputs[0])] = None if None in ranks else max(ranks)
            return new.outputs[0]
        return value


def _mask_input(node: ir.Node) -> ir.Value | None:
    return node.inputs[contract.INPUT_MASK] if len(node.inputs) > contract.INPUT_MASK else None


def run(graph: ir.Graph, fused: list[ir.Node], shapes: dict) -> dict[str, str]:
    """Gives the fused nodes (those this rewrite made) their masks' un-broadcast forms; returns
    {fused node name: mask value now read} for those it changed. Each distinct mask is reduced once
    (a mask shared by every layer stays shared)."""
    changed: dict[str, str] = {}
    by_mask: dict[int, list[ir.Node]] = {}
    masks: dict[int, ir.Value] = {}
    for n in fused:
        m = _mask_input(n)
        if m is not None and n.graph is graph:
            by_mask.setdefault(id(m), []).append(n)
            masks[id(m)] = m
    reducer = _Reducer(shapes)  # one for all masks: a subtree two masks share is rebuilt once
    dead = []
    for key, nodes in by_mask.items():
        mask = masks[key]
        small = reducer.reduce(mask)
        r = reducer.rank(small)
        if small is mask or r is None or not contract.MIN_MASK_RANK <= r <= contract.MAX_MASK_RANK:
            continue
        for n in nodes:
            n.replace_input_with(contract.INPUT_MASK, small)
            changed[n.name] = small.name
        if mask.producer() is not None:
            dead.append(mask.producer())
    if reducer.new_nodes:
        graph.extend(reducer.new_nodes)
        graph.sort()  # the new nodes read values from anywhere in the masks' subgraphs
        dead += reducer.new_nodes  # those no mask ended up reading
    emit.remove_dead(graph, dead)
    return changed

