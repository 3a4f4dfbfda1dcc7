"""Building blocks the rules use to emit nodes: the FusedAttention node, folded masks, output
replacement that keeps the original value name, and removal of nodes made dead by a rewrite."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from .. import contract

PLUGIN_VERSION_ATTR = "plugin_version"
PLUGIN_NAMESPACE_ATTR = "plugin_namespace"


def base_name(*nodes: ir.Node) -> str:
    """A name prefix for new nodes: the scope of the first named node (``/m/layer.0/attn``)."""
    for n in nodes:
        if n.name:
            head, sep, _ = n.name.rpartition("/")
            return head if sep and head else n.name
    return "opsfuse"


def _attr(name: str, value) -> ir.Attr:
    if isinstance(value, bool) or isinstance(value, int):
        return ir.Attr(name, ir.AttributeType.INT, int(value))
    if isinstance(value, float):
        return ir.Attr(name, ir.AttributeType.FLOAT, float(value))
    if isinstance(value, str):
        return ir.Attr(name, ir.AttributeType.STRING, value)
    if isinstance(value, (list, tuple)):
        return ir.Attr(name, ir.AttributeType.INTS, [int(v) for v in value])
    if isinstance(value, ir.TensorProtocol):
        return ir.Attr(name, ir.AttributeType.TENSOR, value)
    raise TypeError(f"attribute {name}: unsupported value {value!r}")


def node(new_nodes: list, op_type: str, inputs, attrs: dict | None = None, name: str = "",
         domain: str = "") -> ir.Value:
    """Appends a one-output node to `new_nodes` and returns its output."""
    n = ir.Node(domain, op_type, list(inputs), [_attr(k, v) for k, v in (attrs or {}).items()], name=name or None)
    if name:
        n.outputs[0].name = f"{name}_output"
    new_nodes.append(n)
    return n.outputs[0]


def constant(new_nodes: list, value: float, dtype: ir.DataType, name: str) -> ir.Value:
    """A scalar Constant of `dtype` holding `value` (rounded to `dtype` as the original would)."""
    arr = np.array(value, dtype=dtype.numpy())
    return node(new_nodes, "Constant", [], {"value": ir.tensor(arr, name=name)}, name)


def _axes0(new_nodes: list, op_type: str, x: ir.Value, opset: int, name: str) -> ir.Value:
    if opset >= 13:
        axes = node(new_nodes, "Constant", [], {"value": ir.tensor(np.array([0], np.int64), name=f"{name}_axes")},
                    f"{name}_axes")
        return node(new_nodes, op_type, [x, axes], name=name)
    return node(new_nodes, op_type, [x], {"axes": [0]}, name)


def unsqueeze0(new_nodes: list, x: ir.Value, opset: int, name: str) -> ir.Value:
    """(N, S, D) -> (1, N, S, D), with the Unsqueeze form of the model's opset."""
    return _axes0(new_nodes, "Unsqueeze", x, opset, name)


def squeeze0(new_nodes: list, x: ir.Value, opset: int, name: str) -> ir.Value:
    return _axes0(new_nodes, "Squeeze", x, opset, name)


def _dims(new_nodes: list, x: ir.Value, start: int, end: int, name: str) -> ir.Value:
    """Shape(x)[start:end] as an int64 tensor (Slice with inputs: opset >= 10)."""
    shape = node(new_nodes, "Shape", [x], name=f"{name}_shape")
    ints = {k: node(new_nodes, "Constant", [], {"value": ir.tensor(np.array([v], np.int64), name=f"{name}_{k}")},
                    f"{name}_{k}") for k, v in (("start", start), ("end", end), ("axis", 0))}
    return node(new_nodes, "Slice", [shape, ints["start"], ints["end"], ints["axis"]], name=f"{name}_dims")


def _reshape(new_nodes: list, x: ir.Value, lead: list[int], tail: ir.Value, opset: int, name: str) -> ir.Value:
    head = node(new_nodes, "Constant", [], {"value": ir.tensor(np.array(lead, np.int64), name=f"{name}_lead")},
                f"{name}_lead")
    shape = node(new_nodes, "Concat", [head, tail], {"axis": 0}, f"{name}_target")
    # allowzero: a 0-length dim taken from Shape stays 0 instead of copying the input's dim
    return node(new_nodes, "Reshape", [x, shape], {"allowzero": 1} if opset >= 14 else None, name)


def split_leading(new_nodes: list, x: ir.Value, dims: tuple[int, int], opset: int, name: str) -> ir.Value:
    """(N, A, B) -> (d0, d1, A, B): the leading axis split by the constant `dims` (one may be -1,
    inferred from N), x's last two dims kept. Data movement only."""
    return _reshape(new_nodes, x, list(dims), _dims(new_nodes, x, 1, 3, name), opset, name)


def merge_leading(new_nodes: list, y: ir.Value, opset: int, name: str) -> ir.Value:
    """(d0, d1, A, B) -> (d0 * d1, A, B), split_leading's inverse."""
    return _reshape(new_nodes, y, [-1], _dims(new_nodes, y, 2, 4, name), opset, name)


def combine_masks(new_nodes: list, terms, dtype: ir.DataType, base: str) -> ir.Value | None:
    """One attn_mask input from the matched mask terms (see sdpa_subgraph.MaskTerm), applied in the
    original order, nearest the scores first.

    A single bool term stays bool. Otherwise the mask is additive: an additive term is added to what
    came before it; a Where term replaces it at masked keys, as the original's Where replaces the
    scores there: Where(masked, fill, so_far) with fill -inf for a bool term or the Where's finite
    fill (the original's value at masked keys, see sdpa_subgraph's docstring). Replacing rather
    than adding keeps two huge terms from summing to -inf: an additive finfo.min padding term under
    a finfo.min Where gives finfo.min at a key both mask, as the original does. A clamp term
    bounds what came before it from below, Max(so_far, c), as the original's Max bounds the
    masked scores."""
    if not terms:
        return None
    if len(terms) == 1 and terms[0].kind == "bool" and terms[0].fill is None:
        t = terms[0]
        if t.negate:
            return node(new_nodes, "Not", [t.value], name=f"{base}/mask_not")
        return t.value
    total = None
    for i, t in enumerate(terms):
        if t.kind == "add":
            total = t.value if total is None else node(new_nodes, "Add", [total, t.value], name=f"{base}/mask{i}_add")
            continue
        if t.kind == "clamp":  # the original's Max(s + m, c) as s + Max(m, c) (sdpa_subgraph checks c)
            bound = constant(new_nodes, t.fill, dtype, f"{base}/mask{i}_bound")
            total = node(new_nodes, "Max", [total, bound], name=f"{base}/mask{i}_clamp")
            continue
        fill = constant(new_nodes, -np.inf if t.fill is None else t.fill, dtype, f"{base}/mask{i}_fill")
        kept = total if total is not None else constant(new_nodes, 0.0, dtype, f"{base}/mask{i}_zero")
        a, b = (fill, kept) if t.negate else (kept, fill)  # t.value true: masked when negated, else visible
        total = node(new_nodes, "Where", [t.value, a, b], name=f"{base}/mask{i}_where")
    return total


def fused_attention(new_nodes: list, q, k, v, mask, key_lengths, *, scale: float | None, is_causal: int,
                    softcap: float, name: str, like: ir.Value | None = None,
                    heads: tuple[int, int] | None = None) -> ir.Node:
    """Appends the com.opsfuse::FusedAttention node; its output copies `like`'s type and shape.
    `heads` = (Hq, Hkv) for the 3-D form (Q, K, V given as (B, S, H*D))."""
    inputs = [q, k, v, mask, key_lengths]
    while inputs and inputs[-1] is None:
        inputs.pop()
    attrs = []
    if scale is not None:
        attrs.append(_attr(contract.ATTR_SCALE, float(np.float32(scale))))
    attrs.append(_attr(contract.ATTR_IS_CAUSAL, int(is_causal)))
    attrs.append(_attr(contract.ATTR_SOFTCAP, float(softcap)))
    if heads is not None:
        attrs.append(_attr(contract.ATTR_Q_NUM_HEADS, int(heads[0])))
        attrs.append(_attr(contract.ATTR_KV_NUM_HEADS, int(heads[1])))
    attrs.append(_attr(PLUGIN_VERSION_ATTR, contract.TRT_PLUGIN_VERSION))
    attrs.append(_attr(PLUGIN_NAMESPACE_ATTR, contract.TRT_PLUGIN_NAMESPACE))
    n = ir.Node(contract.DOMAIN, contract.OP_NAME, inputs, attrs, name=name)
    out = n.outputs[0]
    if like is not None:
        out.type = like.type
        out.shape = like.shape
    new_nodes.append(n)
    return n


def replace_output(graph: ir.Graph, old: ir.Value, new: ir.Value) -> None:
    """Every use of `old` (graph outputs included) reads `new`, which takes `old`'s name."""
    name = old.name
    old.replace_all_uses_with(new, replace_graph_outputs=True)
    old.name = f"{name}__opsfuse_replaced"
    new.name = name
    if new.type is None and old.type is not None:
        new.type = old.type
    if new.shape is None and old.shape is not None:
        new.shape = old.shape


def remove_dead(graph: ir.Graph, start: list[ir.Node]) -> int:
    """Removes `start` and, transitively, the producers that nothing reads any more (only nodes
    made dead by the rewrite are considered; graph outputs are kept). Returns how many."""
    removed = 0
    work = list(start)
    seen: set[int] = set()
    while work:
        n = work.pop()
        if id(n) in seen or n.graph is not graph:
            continue
        if any(out.uses() or out.is_graph_output() for out in n.outputs):
            continue
        seen.add(id(n))
        inputs = [v for v in n.inputs if v is not None]
        graph.remove(n, safe=True)
        removed += 1
        for v in inputs:
            if v.producer() is not None:
                work.append(v.producer())
            elif (v.is_initializer() and not v.uses() and not v.is_graph_input() and not v.is_graph_output()
                  and graph.initializers.get(v.name) is v):
                graph.initializers.pop(v.name)  # a weight or constant only the removed nodes read
    return removed
