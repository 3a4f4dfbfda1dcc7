"""Rule ``pack_qkv`` (opt-in): one projection GEMM for Q, K and V of a 3-D FusedAttention.

After the attention rules, a fused node in the 3-D form often reads three projections of one
hidden state X (every BERT / GPT-2 / Llama layer)::

    Q = MatMul(X, Wq) [+ bq]     K = MatMul(X, Wk) [+ bk]     V = MatMul(X, Wv) [+ bv]

With ``packed_qkv`` = 1 (docs/notes/contract_3d_form.md, "Packed Q/K/V") the op reads Q, K and V as
column windows of one (B, S, (Hq + 2*Hkv)*D) tensor, so the three MatMuls become one
``MatMul(X, [Wq | Wk | Wv])`` and the node takes that tensor as Q, K and V. The biases, when any
projection has one, become the node's optional input ``qkv_bias`` = [bq | bk | bv] (input 5,
docs/notes/contract_qkv_bias.md; a missing bias is zeros there: x + 0 == x), which the kernels add
as they load Q, K and V: no ``Add`` is emitted. Why: a separate broadcast Add reads and writes the
whole packed (B, S, (Hq + 2*Hkv)*D) tensor once more; in BERT-base at B=8, S=512 on an H200 it cost
~170 us per run (14 us per layer), more than the rewritten model's whole gap to ORT's optimized
model (130 us). The candidate's details say when the bias was absorbed (``qkv_bias_absorbed``). The
old weights and biases leave the model when nothing else reads them.

**Not bit-exact**: every output column is the same dot product as before, but one GEMM of another
shape may block and accumulate it differently (and so round differently); and a kernel takes P + b
in float32 and need not round it to the model's type as the graph's Add did. That is why the rewrite
does this only when asked (``fuse_attention(model, pack_qkv=True)``, ``rewrite --pack-qkv``).

Left unpacked, with the reason in the candidate's details (``packed_qkv_why_not``): a node not in
the 3-D form; Q, K or V not ``MatMul(X, W)`` or ``Add`` of that and a bias; projections of different
tensors; weights or biases that are not initializers (or are graph inputs, which can be overridden
at run time); weights that are not 2-D of one element type with the same number of rows; widths
that are not Hq*D, Hkv*D, Hkv*D with one D; a bias that broadcasts over more than the last axis or
has another element type than the weights; and a projection (the MatMul's or the Add's output) that
anything else reads.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from .. import contract
from . import emit
from .ir_utils import is_default_domain
from .sdpa_subgraph import Reject

NAME = "pack_qkv"
_ROLES = ("Q", "K", "V")


@dataclasses.dataclass
class Projection:
    """One of Q / K / V: ``matmul``'s output, plus ``bias`` when ``add`` is given."""

    value: ir.Value  # what the fused node reads
    matmul: ir.Node
    add: ir.Node | None
    bias: ir.Value | None

    @property
    def x(self) -> ir.Value:
        return self.matmul.inputs[0]

    @property
    def weight(self) -> ir.Value:
        return self.matmul.inputs[1]


@dataclasses.dataclass
class Match:
    node: ir.Node
    projections: list  # Projection for Q, K, V

    @property
    def where(self) -> list[str]:
        return [self.node.name or contract.OP_NAME]


@dataclasses.dataclass
class Plan:
    weight: np.ndarray  # (hidden, (Hq + 2*Hkv) * D)
    bias: np.ndarray | None  # ((Hq + 2*Hkv) * D,) or None when no projection has one
    q_heads: int
    kv_heads: int
    head_dim: int


def _int_attr(node: ir.Node, name: str) -> int:
    a = node.attributes.get(name)
    return 0 if a is None else int(a.value)


def is_candidate(node: ir.Node) -> bool:
    return node.op_type == contract.OP_NAME and node.domain == contract.DOMAIN


def _initializer(value: ir.Value | None, depth: int = 0) -> np.ndarray | None:
    """The initializer's array, through Identity nodes (the TorchScript exporter reads equal weights,
    e.g. BERT's all-zero initial biases, through Identities of one initializer); None when `value` is
    no initializer or is a graph input (which can be overridden at run time)."""
    if value is None or depth > 8 or value.is_graph_input():
        return None
    p = value.producer()
    if p is not None:
        if is_default_domain(p) and p.op_type == "Identity":
            return _initializer(p.inputs[0], depth + 1)
        return None
    if not value.is_initializer() or value.const_value is None:
        return None
    try:
        return np.asarray(value.const_value.numpy())
    except Exception:  # a tensor type numpy cannot hold
        return None


def _sole_use(value: ir.Value, reader: ir.Node) -> bool:
    """True when `reader` is the only thing that reads `value`, once, and it is no graph output."""
    uses = list(value.uses())
    return len(uses) == 1 and uses[0].node is reader and not value.is_graph_output()


def _projection(role: str, value: ir.Value | None, node: ir.Node) -> Projection:
    if value is None:
        raise Reject(f"{role} is absent")
    p = value.producer()
    if p is None:
        raise Reject(f"{role} ({value.name}) is a graph input or initializer, not a MatMul projection")
    add = bias = None
    mm = p
    if is_default_domain(p) and p.op_type == "Add" and len(p.inputs) == 2:
        add = p
        sides = [x.producer() if x is not None else None for x in p.inputs]
        picks = [i for i, s in enumerate(sides) if s is not None and is_default_domain(s) and s.op_type == "MatMul"
                 and _initializer(p.inputs[1 - i]) is not None]
        if not picks:
            if any(s is not None and is_default_domain(s) and s.op_type == "MatMul" for s in sides):
                raise Reject(f"the bias of {role}'s Add {p.name} is not a constant initializer")
            raise Reject(f"{role} ({value.name}) is an Add that does not add a bias to a MatMul")
        mm, bias = sides[picks[0]], p.inputs[1 - picks[0]]
    if not (is_default_domain(mm) and mm.op_type == "MatMul"):
        raise Reject(f"{role} ({value.name}) is produced by {mm.op_type}, not a MatMul(X, W) projection")
    if _initializer(mm.inputs[1]) is None:
        raise Reject(f"the weight of {role}'s MatMul {mm.name} ({mm.inputs[1].name}) is not a constant initializer")
    # Nothing else may read the projection: it is about to be replaced by a window of the packed one.
    for v, reader, what in ((value, node, role), (mm.outputs[0], add, f"{role}'s MatMul output")):
        if reader is None:
            continue
        if not _sole_use(v, reader):
            others = sorted({u.node.name or u.node.op_type for u in v.uses() if u.node is not reader})
            if not others and sum(u.node is reader for u in v.uses()) > 1:
                others = [f"{reader.name or reader.op_type} (twice)"]
            parts = ([", ".join(others)] if others else []) + (["it is a graph output"] if v.is_graph_output() else [])
            raise Reject(f"{what} ({v.name}) has other consumers: " + "; ".join(parts))
    return Projection(value, mm, add, bias)


def pattern(node: ir.Node) -> Match:
    if _int_attr(node, contract.ATTR_PACKED_QKV):
        raise Reject("already packed")
    if _int_attr(node, contract.ATTR_Q_NUM_HEADS) <= 0 or _int_attr(node, contract.ATTR_KV_NUM_HEADS) <= 0:
        raise Reject("not the 3-D form (no q_num_heads / kv_num_heads): the packed form needs (B, S, H*D) inputs")
    ins = list(node.inputs[:3])
    if len(ins) < 3 or len({id(v) for v in ins}) != 3:
        raise Reject("Q, K and V are not three separate tensors")
    return Match(node, [_projection(role, v, node) for role, v in zip(_ROLES, ins)])


def _bias_vector(role: str, arr: np.ndarray, width: int, dtype) -> np.ndarray:
    """The bias as a (width,) vector when it broadcasts over the last axis of (B, S, width) only."""
    if arr.dtype != dtype:
        raise Reject(f"{role}'s bias is {arr.dtype}, its weight {dtype}")
    if arr.ndim < 1 or arr.ndim > 3 or arr.shape[-1] != width or any(d != 1 for d in arr.shape[:-1]):
        raise Reject(f"{role}'s bias has shape {tuple(arr.shape)}: not a ({width},) vector broadcast over the last axis")
    return arr.reshape(width)


def check(match: Match, shapes: dict, opset: int) -> Plan:
    q, k, v = match.projections
    if not (q.x is k.x and q.x is v.x):
        raise Reject(f"Q, K and V project different tensors ({q.x.name}, {k.x.name}, {v.x.name})")
    x_shape = shapes.get(q.x.name)
    if x_shape is None or len(x_shape) != 3:
        raise Reject(f"cannot prove the projected tensor {q.x.name} is (B, S, hidden): shape {x_shape}")
    ws = [_initializer(p.weight) for p in match.projections]
    for role, w in zip(_ROLES, ws):
        if w.ndim != 2:
            raise Reject(f"{role}'s weight has shape {tuple(w.shape)}, not (hidden, H*D)")
        if w.dtype != ws[0].dtype:
            raise Reject(f"the weights have different element types ({ws[0].dtype}, {role}: {w.dtype})")
        if w.shape[0] != ws[0].shape[0] or (isinstance(x_shape[2], int) and w.shape[0] != x_shape[2]):
            raise Reject(f"the weights' rows differ: {[tuple(a.shape) for a in ws]} for X's last dim {x_shape[2]}")
    hq = _int_attr(match.node, contract.ATTR_Q_NUM_HEADS)
    hkv = _int_attr(match.node, contract.ATTR_KV_NUM_HEADS)
    nq, nk, nv = (w.shape[1] for w in ws)
    d = nq // hq
    if nq % hq or nk != hkv * d or nv != hkv * d:
        raise Reject(f"the projections' widths {nq}, {nk}, {nv} are not Hq*D, Hkv*D, Hkv*D with one head size "
                     f"(Hq={hq}, Hkv={hkv})")
    bias = None
    if any(p.bias is not None for p in match.projections):
        parts = []
        for role, p, n in zip(_ROLES, match.projections, (nq, nk, nv)):
            if p.bias is None:
                parts.append(np.zeros(n, ws[0].dtype))  # x + 0 == x: the projection without a bias
            else:
                parts.append(_bias_vector(role, _initializer(p.bias), n, ws[0].dtype))
        bias = np.concatenate(parts)
    return Plan(np.concatenate(ws, axis=1), bias, hq, hkv, d)


def _new_initializer(graph: ir.Graph, name: str, arr: np.ndarray) -> ir.Value:
    unique, i = name, 1
    while unique in graph.initializers:
        i += 1
        unique = f"{name}_{i}"
    value = ir.Value(name=unique, const_value=ir.tensor(arr, name=unique))
    value.type = ir.TensorType(value.const_value.dtype)
    value.shape = ir.Shape(arr.shape)
    graph.register_initializer(value)
    return value


def rewrite(graph: ir.Graph, match: Match, plan: Plan, shapes: dict) -> ir.Node:
    """One MatMul on the packed weights, read by the node as Q, K and V; the packed bias, if any, is
    the node's qkv_bias input."""
    node = match.node
    q = match.projections[0]
    base = emit.base_name(node, q.matmul)  # the attention's scope: .../attention/self/packed_qkv_weight
    weight = _new_initializer(graph, f"{base}/packed_qkv_weight", plan.weight)
    new_nodes: list[ir.Node] = []
    packed = emit.node(new_nodes, "MatMul", [q.x, weight], name=f"{base}/packed_qkv_MatMul")
    packed.type = q.value.type
    if q.value.shape is not None and len(q.value.shape) == 3:
        packed.shape = ir.Shape([q.value.shape[0], q.value.shape[1], plan.weight.shape[1]])
    graph.insert_before(node, new_nodes)
    for i in range(3):
        node.replace_input_with(i, packed)
    if plan.bias is not None:
        bias = _new_initializer(graph, f"{base}/packed_qkv_bias", plan.bias)
        # Absent attn_mask / key_lengths stay absent: resize pads them as empty inputs.
        node.resize_inputs(max(len(node.inputs), contract.INPUT_QKV_BIAS + 1))
        node.replace_input_with(contract.INPUT_QKV_BIAS, bias)
    node.attributes[contract.ATTR_PACKED_QKV] = ir.Attr(contract.ATTR_PACKED_QKV, ir.AttributeType.INT, 1)
    emit.remove_dead(graph, [p.add or p.matmul for p in match.projections])
    return node


def details(match: Match, plan: Plan) -> dict:
    return {"packed_width": int(plan.weight.shape[1]), "qkv_bias_absorbed": plan.bias is not None}


def run(graph: ir.Graph, fused: list[ir.Node], shapes: dict, opset: int) -> dict[str, dict]:
    """Packs every fused node it can; returns {fused node name: details}, with ``packed_qkv`` (bool),
    ``packed_qkv_why_not`` (the reason, or "") and, when packed, ``packed_width`` and
    ``qkv_bias_absorbed`` (the biases are the node's qkv_bias input, no Add)."""
    out: dict[str, dict] = {}
    for node in fused:
        if node.graph is not graph or not is_candidate(node):
            continue
        try:
            match = pattern(node)
            plan = check(match, shapes, opset)
            rewrite(graph, match, plan, shapes)
        except Reject as exc:
            out[node.name] = {"packed_qkv": False, "packed_qkv_why_not": str(exc)}
            continue
        out[node.name] = {"packed_qkv": True, "packed_qkv_why_not": "", **details(match, plan)}
    return out
