"""After mask_broadcast: the padding mask's index arithmetic becomes one Unsqueeze.

transformers' mask functions read the padding mask as ``attention_mask[batch_idx, kv_idx]`` over
index vectors, and the TorchScript export writes that gather as arithmetic on a flattened copy:

    m    = (B, S) tensor (normally Cast(attention_mask, BOOL))
    flat = Flatten(m, axis=2)                                   # (B*S, 1): flat[b*S + j, 0] = m[b, j]
    I    = Unsqueeze...(Range(0, B, 1))                          # b along axis p of rank R, 1 elsewhere
    J    = Unsqueeze...(Range(0, S, 1))                          # j along axis q of rank R, 1 elsewhere
    idx  = Add(J, Mul(I, S))                                     # idx[.. b .. j ..] = b*S + j
    g    = Gather(flat, idx, axis=0)                             # shape idx.shape + (1,)
    v    = Reshape(Reshape(g, [-1]), Shape(idx))                 # (Concat of one input allowed)

so ``v[.. b .. j ..] = m[b, j]``: v is ``Unsqueeze(m, every axis but p and q)`` when p < q. The rule
replaces v by that Unsqueeze only when every piece is proven: Range's start is the constant 0 and
its step the constant 1 (int64); J's limit and the multiplier are m's row length S, read by
``[Cast to int64](Gather(Shape(X), k))`` with dim k of X provably dim 1 of m, or a constant equal to
m's static dim; the Flatten axis is 2 of a rank-2 m, the Gather axis 0, and the final shape
``Shape(idx)``. "Provably the same dim" is decided from the graph (``_dim_token``): the same tensor
up to Cast/Not, a graph-input dim with the same dim_param (ONNX: a dimension variable denotes one
value across the whole graph) or static size carried through shape-keeping ops, broadcasting,
Gather, Slice and Reshape targets built from Shape -- never from the shape inference's auto_merge,
which equates dims that meet in a broadcast even where one of them is 1. Each index b*S + j with
b < B, j < S is exactly the row-major offset of m[b, j]: the values are the same elements, nothing
is computed, the result is bit-identical. A Cast of the new value to m's own type (the export's
Cast(bool -> bool)) is dropped as the identity.

The batch Range's limit L often comes from the hidden state's Shape, whose dim 0 the graph ties to
attention_mask's only through ops the tokens do not follow (transformers' token-type buffer
Expand). Then the rule emits ``Unsqueeze(Slice(m, 0, L, axis 0))``: for L <= B these are exactly
the rows the original gathers (the report's ``mask_index_sliced`` says why the Slice stayed); for
L > B the original's Gather is out of bounds and fails.

Anything else not proven keeps its nodes; the reason goes into the fused nodes' report details
(``mask_index_why_not``). Not covered: a zero-size batch or sequence (the original's Reshape with
allowzero=0 reads a 0 in Shape(idx) as "copy the input's dim"; the Unsqueeze gives the empty
tensor), i.e. the rewrite may run an input the original rejects; no output of a run the original
completes changes.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from .. import contract
from .ir_utils import const_array, dtype_of, is_default_domain, op

NAME = "mask_index"
_MAX_DEPTH = 16  # producer levels searched above a fused node's mask


class _NotProven(Exception):
    pass


def _int_attr(node: ir.Node, name: str, default: int | None) -> int | None:
    a = node.attributes.get(name)
    return default if a is None else int(a.value)


def _const_int(value: ir.Value | None) -> int | None:
    """The single integer a constant holds (any rank with one element), else None."""
    arr = const_array(value)
    if arr is None or arr.size != 1 or arr.dtype.kind not in "iu":
        return None
    return int(arr.reshape(()))


def _dtype(value: ir.Value, shapes) -> ir.DataType | None:
    """dtype_of(), and for a Constant node's output the dtype of its value."""
    known = dtype_of(value, shapes)
    if known is not None:
        return known
    arr = const_array(value)
    return None if arr is None else ir.DataType.from_numpy(arr.dtype)


def _root(value: ir.Value) -> ir.Value:
    """The tensor `value` has the shape of: through elementwise one-input ops (Cast, Not, Identity)."""
    for _ in range(8):
        node = op(value, "Cast", "Not", "Identity")
        if node is None or not node.inputs or node.inputs[0] is None:
            return value
        value = node.inputs[0]
    return value


def _dim_source(value: ir.Value) -> tuple:
    """What the integer tensor `value` (one element) holds: ("const", c) or ("dim", X, axis) for
    ``[Cast to int64](Gather(Shape(X), k))``; raises _NotProven."""
    c = _const_int(value)
    if c is not None:
        return ("const", c)
    cast = op(value, "Cast")
    if cast is not None:
        if ir.DataType(cast.attributes.get_int("to")) != ir.DataType.INT64:
            raise _NotProven(f"{cast.name}: an index size is Cast to a type other than int64")
        value = cast.inputs[0]
    gather = op(value, "Gather")
    if gather is None:
        raise _NotProven(f"{value.name}: an index size is not Gather(Shape(x), k) or a constant")
    k = const_array(gather.inputs[1])
    if k is None or k.size != 1 or k.ndim > 1 or _int_attr(gather, "axis", 0) != 0:
        raise _NotProven(f"{gather.name}: not one constant index into a shape")
    shape = op(gather.inputs[0], "Shape")
    if shape is None:
        raise _NotProven(f"{gather.name}: gathers from something other than a Shape")
    return ("dim", shape.inputs[0], int(k.reshape(())), shape)


def _rank(value: ir.Value, shapes) -> int | None:
    dims = shapes.get(value.name)
    if dims is not None:
        return len(dims)
    arr = const_array(value)
    return None if arr is None else arr.ndim


def _axis_of(source: tuple, shapes) -> int | None:
    """The axis of X a ("dim", X, k, Shape node) source reads, normalized (None: unknown)."""
    _, x, k, shape_node = source
    dims = shapes.get(x.name)
    if dims is None:
        return None
    axes = list(range(len(dims)))
    start, end = _int_attr(shape_node, "start", 0), _int_attr(shape_node, "end", None)
    axes = axes[start:end]  # Shape's start/end clamp like Python slices
    if not -len(axes) <= k < len(axes):
        return None
    return axes[k]


_SAME_SHAPE = {"Cast", "Not", "Identity", "LayerNormalization", "Relu", "Gelu", "Erf", "Tanh", "Sigmoid",
               "Softmax", "Dropout"}
_BROADCAST = {"Add", "Sub", "Mul", "Div", "Where", "And", "Or", "Equal", "Less", "Greater", "Pow", "Max", "Min"}


def _dim_token(value: ir.Value, axis: int, shapes, depth: int = 0):
    """A token for the size of `value` along `axis` (normalized): two equal tokens are provably the
    same size. Built from the graph itself -- a declared graph-input dim (a dim_param names one
    value across the whole graph, ONNX IR), a static size, or the dim carried through shape-keeping
    ops, broadcasting (an operand's static 1 drops out), Gather and Reshape targets built from
    Shape -- not from the shape inference (its auto_merge equates dims that meet in a broadcast,
    wrong where one is 1). Anything else is ("at", id(value), axis): equal only to itself."""
    opaque = ("at", id(value), axis)
    if value is None or depth > 24:
        return opaque
    if value.is_graph_input():
        shape = value.shape
        if shape is None or axis >= len(shape):
            return opaque
        d = shape[axis]
        if isinstance(d, int):
            return ("int", d)
        name = getattr(d, "value", None)
        return ("param", name) if isinstance(name, str) and name else opaque
    arr = const_array(value)
    if arr is not None:
        return ("int", int(arr.shape[axis])) if axis < arr.ndim else opaque
    node = value.producer()
    if node is None or not is_default_domain(node) or node.outputs[0] is not value:
        return opaque
    kind = node.op_type
    rank = _rank(value, shapes)
    if kind in _SAME_SHAPE and node.inputs and node.inputs[0] is not None:
        return _dim_token(node.inputs[0], axis, shapes, depth + 1)
    if kind in _BROADCAST and rank is not None:
        tokens = set()
        for x in node.inputs:
            rx = _rank(x, shapes) if x is not None else None
            if rx is None:
                return opaque
            ax = axis - (rank - rx)
            if ax < 0:
                continue
            t = _dim_token(x, ax, shapes, depth + 1)
            if t != ("int", 1):
                tokens.add(t)
        return tokens.pop() if len(tokens) == 1 else (("int", 1) if not tokens else opaque)
    if kind == "Gather":
        r_data, r_idx = _rank(node.inputs[0], shapes), _rank(node.inputs[1], shapes)
        g = _int_attr(node, "axis", 0)
        if r_data is None or r_idx is None:
            return opaque
        g = g + r_data if g < 0 else g
        if axis < g:
            return _dim_token(node.inputs[0], axis, shapes, depth + 1)
        if axis < g + r_idx:
            return _dim_token(node.inputs[1], axis - g, shapes, depth + 1)
        return _dim_token(node.inputs[0], axis - r_idx + 1, shapes, depth + 1)
    if kind == "Slice" and len(node.inputs) >= 4 and node.inputs[3] is not None and rank is not None:
        axes = const_array(node.inputs[3])  # an axis the Slice does not cut keeps its size
        if axes is not None and axis not in {int(a) + rank if a < 0 else int(a) for a in axes.reshape(-1)}:
            return _dim_token(node.inputs[0], axis, shapes, depth + 1)
        return opaque
    if kind == "Reshape":
        part = _target_element(node.inputs[1], axis)
        if part is None:
            return opaque
        if part[0] == "const":
            c = part[1]
            if c > 0:
                return ("int", c)
            if c == 0 and not _int_attr(node, "allowzero", 0):
                return _dim_token(node.inputs[0], axis, shapes, depth + 1)
            return opaque
        k = _axis_of(part[1], shapes)
        return opaque if k is None else _dim_token(part[1][1], k, shapes, depth + 1)
    return opaque


def _target_element(target: ir.Value, axis: int):
    """Element `axis` of a Reshape target: ("const", c) or ("dim", X, k) for Shape(X)[k]."""
    arr = const_array(target)
    if arr is not None:
        return ("const", int(arr.reshape(-1)[axis])) if axis < arr.size else None
    cat = op(target, "Concat")
    if cat is None:
        return None
    offset = 0
    for x in cat.inputs:
        arr = const_array(x)
        if arr is not None:
            if axis < offset + arr.size:
                return ("const", int(arr.reshape(-1)[axis - offset]))
            offset += arr.size
            continue
        unsq = op(x, "Unsqueeze")  # one scalar made 1-D
        if unsq is None:
            return None
        if axis == offset:
            try:
                src = _dim_source(unsq.inputs[0])
            except _NotProven:
                return None
            if src[0] == "const":
                return ("const", src[1])
            return ("shape", src)
        offset += 1
    return None


def _same_size(source: tuple, m: ir.Value, axis: int, shapes) -> str:
    """'' when `source` provably holds m's size along `axis`; else why not."""
    want = _dim_token(m, axis, shapes)
    if source[0] == "const":
        if want == ("int", source[1]):
            return ""
        return f"the constant {source[1]} is not provably m's dim {axis}"
    x = source[1]
    k = _axis_of(source, shapes)
    if k is None:
        return f"{source[3].name}: the axis of {x.name} it reads is unknown"
    if _root(x) is _root(m) and k == axis:
        return ""
    if _dim_token(x, k, shapes) == want:
        return ""
    return (f"{source[3].name}: dim {k} of {x.name} is not provably dim {axis} of {m.name} (the graph "
            "does not tie them to one declared or static size)")


def _unsqueezed_range(value: ir.Value) -> tuple[ir.Node, int, int]:
    """value = Unsqueeze(...(Range(...))): (the Range, rank, axis the range runs along)."""
    chain = []
    v = value
    while (node := op(v, "Unsqueeze")) is not None:
        if len(node.inputs) > 1 and node.inputs[1] is not None:
            axes = const_array(node.inputs[1])
            if axes is None:
                raise _NotProven(f"{node.name}: Unsqueeze axes are not constant")
            axes = [int(a) for a in axes.reshape(-1)]
        else:
            axes = [int(a) for a in node.attributes.get_ints("axes", ())]
        chain.append((node, axes))
        v = node.inputs[0]
    rng = op(v, "Range")
    if rng is None:
        raise _NotProven(f"{v.name}: an index is not an Unsqueezed Range")
    rank, axis = 1, 0
    for node, axes in reversed(chain):
        out_rank = rank + len(axes)
        norm = sorted(a + out_rank if a < 0 else a for a in axes)
        if len(set(norm)) != len(norm) or not all(0 <= a < out_rank for a in norm):
            raise _NotProven(f"{node.name}: bad Unsqueeze axes {axes}")
        kept = [i for i in range(out_rank) if i not in norm]  # old axes, in order
        axis = kept[axis]
        rank = out_rank
    return rng, rank, axis


def _check_range(rng: ir.Node, m: ir.Value, axis: int, shapes, soft: bool = False):
    """Checks Range(0, m's dim `axis`, 1). soft: a limit read from some tensor's Shape but not proven
    m's dim is returned as (source, why) instead of raised (the caller slices m to it)."""
    start, delta = const_array(rng.inputs[0]), const_array(rng.inputs[2])
    for name, arr, want in (("start", start, 0), ("step", delta, 1)):
        if arr is None or arr.size != 1 or arr.dtype != np.int64 or int(arr.reshape(())) != want:
            raise _NotProven(f"{rng.name}: {name} is not the int64 constant {want}")
    source = _dim_source(rng.inputs[1])
    why = _same_size(source, m, axis, shapes)
    if why and not (soft and source[0] == "dim" and _axis_of(source, shapes) is not None):
        raise _NotProven(f"{rng.name}: its limit is not m's dim {axis}: {why}")
    return (source, why) if why else None


def _shape_of(value: ir.Value) -> ir.Value | None:
    """X when `value` is Shape(X) (whole shape), optionally through a Concat of that one input."""
    cat = op(value, "Concat")
    if cat is not None:
        if len(cat.inputs) != 1:
            return None
        value = cat.inputs[0]
    shape = op(value, "Shape")
    if shape is None or _int_attr(shape, "start", 0) != 0 or _int_attr(shape, "end", None) is not None:
        return None
    return shape.inputs[0]


def _gathered_back(gather: ir.Node, idx: ir.Value) -> ir.Value:
    """The value Reshape([Reshape(g, [-1])], Shape(idx)) that drops g's trailing 1."""
    frontier = [gather.outputs[0]]
    for _ in range(3):
        nxt = []
        for v in frontier:
            for use in v.uses():
                r = use.node
                if not (is_default_domain(r) and r.op_type == "Reshape" and use.idx == 0):
                    continue
                if _shape_of(r.inputs[1]) is idx:
                    return r.outputs[0]
                flat = const_array(r.inputs[1])
                if flat is not None and flat.size == 1 and int(flat.reshape(-1)[0]) == -1:
                    nxt.append(r.outputs[0])
        frontier = nxt
    raise _NotProven(f"{gather.name}: its output is not reshaped back to Shape(indices)")


def _match(gather: ir.Node, shapes):
    """(value to replace, m, Unsqueeze axes, batch slice) for a Gather over Flatten(m); raises
    _NotProven. batch slice: None when the batch index provably covers m's rows, else (the dim
    source of its length, why unproven)."""
    flatten = op(gather.inputs[0], "Flatten")
    m = flatten.inputs[0]
    dims_m = shapes.get(m.name)
    if dims_m is None or len(dims_m) != 2:
        raise _NotProven(f"{flatten.name}: its input {m.name} is not provably rank 2 ({dims_m})")
    if _int_attr(flatten, "axis", 1) != 2:
        raise _NotProven(f"{flatten.name}: axis is not 2 (the (B*S, 1) flattening)")
    if _int_attr(gather, "axis", 0) != 0:
        raise _NotProven(f"{gather.name}: not a Gather along axis 0")
    idx = gather.inputs[1]
    add = op(idx, "Add")
    if add is None:
        raise _NotProven(f"{gather.name}: the indices are not Add(kv index, batch index * S)")
    why = []
    for j_val, mul_val in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        mul = op(mul_val, "Mul")
        if mul is None:
            continue
        for i_val, s_val in ((mul.inputs[0], mul.inputs[1]), (mul.inputs[1], mul.inputs[0])):
            try:
                j_rng, j_rank, q = _unsqueezed_range(j_val)
                i_rng, i_rank, p = _unsqueezed_range(i_val)
                if i_rank != j_rank:
                    raise _NotProven(f"{add.name}: the batch and kv index ranks differ ({i_rank}, {j_rank})")
                if not p < q:
                    raise _NotProven(f"{add.name}: the batch index axis {p} is not before the kv axis {q}")
                batch_slice = _check_range(i_rng, m, 0, shapes, soft=True)
                _check_range(j_rng, m, 1, shapes)
                s_src = _dim_source(s_val)
                s_rank = _rank(s_val, shapes)
                if s_rank is None or s_rank > i_rank:
                    raise _NotProven(f"{mul.name}: the multiplier's rank ({s_rank}) is not provably <= {i_rank}")
                bad = _same_size(s_src, m, 1, shapes)
                if bad:
                    raise _NotProven(f"{mul.name}: the multiplier is not m's row length: {bad}")
                for v in (i_rng.inputs[0], j_rng.inputs[0], s_val):
                    dt = _dtype(v, shapes)
                    if dt is not None and dt != ir.DataType.INT64:
                        raise _NotProven(f"{mul.name}: index arithmetic in {dt}, not int64")
                top = _gathered_back(gather, idx)
                axes = [a for a in range(i_rank) if a not in (p, q)]
                return top, m, axes, batch_slice
            except _NotProven as exc:
                why.append(str(exc))
    raise _NotProven(why[0] if why else f"{add.name}: no operand is Mul(batch index, S)")


def _candidates(masks: list[ir.Value]) -> list[ir.Node]:
    """Gather(Flatten(.), .) nodes among the masks' producers (bounded depth), in first-seen order."""
    found, seen = [], set()
    work = [(m, 0) for m in masks]
    while work:
        v, depth = work.pop()
        node = v.producer() if v is not None else None
        if node is None or id(node) in seen or depth > _MAX_DEPTH or not is_default_domain(node):
            continue
        seen.add(id(node))
        if node.op_type == "Gather" and op(node.inputs[0], "Flatten") is not None:
            found.append(node)
            continue
        work.extend((x, depth + 1) for x in node.inputs if x is not None)
    return found


def _unsqueeze(m: ir.Value, axes: list[int], opset: int, name: str) -> list[ir.Node]:
    if opset >= 13:
        const = ir.Node("", "Constant", [], [ir.Attr("value", ir.AttributeType.TENSOR,
                                                     ir.tensor(np.array(axes, np.int64), name=f"{name}_axes"))],
                        name=f"{name}_axes")
        const.outputs[0].name = f"{name}_axes_output"
        node = ir.Node("", "Unsqueeze", [m, const.outputs[0]], name=name)
        nodes = [const, node]
    else:
        node = ir.Node("", "Unsqueeze", [m], [ir.Attr("axes", ir.AttributeType.INTS, axes)], name=name)
        nodes = [node]
    node.outputs[0].name = f"{name}_output"
    return nodes


def _slice_rows(nodes: list, m: ir.Value, source: tuple, shapes, opset: int, base: str) -> ir.Value:
    """m[:L] along axis 0, L = the dim the batch Range reads (Slice clamps: for L <= rows these are
    exactly the rows the original gathers; L > rows makes the original's Gather fail)."""
    _, x, _, _ = source
    k = _axis_of(source, shapes)

    def const(name, arr):
        c = ir.Node("", "Constant", [], [ir.Attr("value", ir.AttributeType.TENSOR,
                                                 ir.tensor(np.array(arr, np.int64), name=f"{base}_{name}"))],
                    name=f"{base}_{name}")
        c.outputs[0].name = f"{base}_{name}_output"
        nodes.append(c)
        return c.outputs[0]

    if opset >= 15:
        shape = ir.Node("", "Shape", [x], [ir.Attr("start", ir.AttributeType.INT, k),
                                          ir.Attr("end", ir.AttributeType.INT, k + 1)], name=f"{base}_rows")
        nodes.append(shape)
        length = shape.outputs[0]
    else:
        full = ir.Node("", "Shape", [x], name=f"{base}_shape")
        full.outputs[0].name = f"{base}_shape_output"
        nodes.append(full)
        gather = ir.Node("", "Gather", [full.outputs[0], const("rows_axis", [k])],
                         [ir.Attr("axis", ir.AttributeType.INT, 0)], name=f"{base}_rows")
        nodes.append(gather)
        length = gather.outputs[0]
    length.name = f"{base}_rows_output"
    sl = ir.Node("", "Slice", [m, const("starts", [0]), length, const("slice_axes", [0])], name=f"{base}_slice")
    sl.outputs[0].name = f"{base}_slice_output"
    sl.outputs[0].type = m.type
    nodes.append(sl)
    return sl.outputs[0]


def _mask_input(node: ir.Node) -> ir.Value | None:
    return node.inputs[contract.INPUT_MASK] if len(node.inputs) > contract.INPUT_MASK else None


def run(graph: ir.Graph, fused: list[ir.Node], shapes, opset: int) -> dict[str, dict]:
    """Replaces each proven padding-mask gather above the fused nodes' masks by one Unsqueeze.
    Returns {fused node name: {"mask_index": new value name or "", "mask_index_why_not": reason}}."""
    from . import emit

    masks = {}
    for n in fused:
        mask = _mask_input(n)
        if n.graph is graph and mask is not None:
            masks.setdefault(id(mask), mask)
    done: dict[int, str] = {}  # id(gather) -> new value name
    why: dict[int, str] = {}
    sliced: dict[int, str] = {}
    dead: list[ir.Node] = []
    per_mask: dict[int, list[int]] = {}
    gathers: dict[int, ir.Node] = {}
    for key, mask in masks.items():  # all before any change: masks may share one gather
        found = _candidates([mask])
        per_mask[key] = [id(g) for g in found]
        gathers.update((id(g), g) for g in found)
    for g in gathers.values():
        try:
            top, m, axes, batch_slice = _match(g, shapes)
        except _NotProven as exc:
            why[id(g)] = str(exc)
            continue
        if top.is_graph_output():
            why[id(g)] = f"{top.name} is a graph output"
            continue
        reshape = top.producer()
        base = f"{emit.base_name(g)}/mask_index" + (f"_{len(done)}" if done else "")
        nodes = []
        if batch_slice is not None:
            m = _slice_rows(nodes, m, batch_slice[0], shapes, opset, base)
            sliced[id(g)] = batch_slice[1]
        nodes += _unsqueeze(m, axes, opset, base)
        new = nodes[-1].outputs[0]
        new.type = m.type
        graph.insert_before(reshape, nodes)
        top.replace_all_uses_with(new)
        dead.append(reshape)
        m_type = _dtype(m, shapes)
        for use in list(new.uses()):  # Cast(new, to=m's type) is the identity
            c = use.node
            if (is_default_domain(c) and c.op_type == "Cast" and m_type is not None
                    and ir.DataType(c.attributes.get_int("to")) == m_type and not c.outputs[0].is_graph_output()):
                c.outputs[0].replace_all_uses_with(new)
                dead.append(c)
        done[id(g)] = new.name
    emit.remove_dead(graph, dead)
    out: dict[str, dict] = {}
    for n in fused:
        mask = _mask_input(n)
        if n.graph is not graph or mask is None:
            continue
        ids = per_mask.get(id(mask), [])
        out[n.name] = {"mask_index": ", ".join(done[i] for i in ids if i in done),
                       "mask_index_why_not": "; ".join(why[i] for i in ids if i in why),
                       "mask_index_sliced": "; ".join(sliced[i] for i in ids if i in sliced)}
    return out
