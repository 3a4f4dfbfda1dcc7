"""Attention written as Einsum (research code; some exporters keep torch.einsum as one node): its two
products lowered to Transpose + MatMul [+ Transpose], so that the MatMul rule (sdpa_subgraph) can
prove and fuse it, and put back exactly as they were where that rule rejects it.

A two-operand Einsum of rank-4 operands without an ellipsis or repeated labels is a batched matrix
product when its labels split as: two batch labels (in both operands and the output), one
contracted label (in both operands, not the output) and one free label in each operand (and the
output). Its result is MatMul(A as (batch, free_A, contracted), B as (batch, contracted, free_B)),
whose labels are (batch in the output's order, free_A, free_B), transposed to the equation's
output order where that differs: the same sums of the same products. Anything else (LongT5's rank-5
local blocks) is left as it is, and so is every Einsum that is not one of an attention's products."""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from . import emit
from .ir_utils import is_default_domain
from .sdpa_subgraph import probability_uses

# Ops a score may pass through between its Einsum and the Softmax (scale, mask, softcap, casts).
_SCORE_OPS = ("Mul", "Div", "Add", "Sub", "Cast", "Where", "Identity", "Tanh")
_SCORE_DEPTH = 6


@dataclass
class Lowered:
    """The Einsum nodes of one attention and the values their MatMul forms produce."""

    einsums: list[ir.Node]  # out of the graph while lowered, their operands kept here
    operands: list[list[ir.Value]]
    replaced: list[tuple[ir.Value, ir.Value]]  # (an Einsum's output, its MatMul form's output)
    new_nodes: list[list[ir.Node]]  # each Einsum's MatMul form


def matmul_perms(equation: str) -> tuple[tuple, tuple, tuple, bool] | None:
    """(perm of A, perm of B, perm of the MatMul's output, swapped) for a batched-matrix-product
    equation, e.g. "bind,bjnd->bnij" -> ((0, 2, 1, 3), (0, 2, 3, 1), (0, 1, 2, 3), False); None for
    any other. A is the operand whose free label comes first in the output (the second operand where
    `swapped`: "bhkd,bhqd->bhqk" is MatMul(Q, K^T)), so that the product needs no Transpose after it
    wherever the output keeps the batch labels first."""
    eq = equation.replace(" ", "")
    if eq.count("->") != 1 or "." in eq:
        return None
    lhs, out = eq.split("->")
    operands = lhs.split(",")
    if len(operands) != 2:
        return None
    a, b = operands
    if any(len(x) != 4 or len(set(x)) != 4 or not x.isalpha() for x in (a, b, out)):
        return None
    batch = [lab for lab in out if lab in a and lab in b]
    free_a = [lab for lab in a if lab in out and lab not in b]
    free_b = [lab for lab in b if lab in out and lab not in a]
    contracted = [lab for lab in a if lab in b and lab not in out]
    if (len(batch), len(free_a), len(free_b), len(contracted)) != (2, 1, 1, 1):
        return None
    swapped = out.index(free_a[0]) > out.index(free_b[0])
    if swapped:
        a, b, free_a, free_b = b, a, free_b, free_a
    product = batch + free_a + free_b
    perm_a = tuple(a.index(lab) for lab in batch + free_a + contracted)
    perm_b = tuple(b.index(lab) for lab in batch + contracted + free_b)
    perm_out = tuple(product.index(lab) for lab in out)
    return perm_a, perm_b, perm_out, swapped


def _identity(perm: tuple) -> bool:
    return perm == tuple(range(len(perm)))


def _as_matmul(node: ir.Node) -> tuple[list[ir.Node], ir.Value] | None:
    """The nodes computing `node`'s Einsum as Transpose + MatMul [+ Transpose], and their output."""
    if node.op_type != "Einsum" or not is_default_domain(node) or len(node.inputs) != 2 or None in node.inputs:
        return None
    attr = node.attributes.get("equation")
    perms = matmul_perms(attr.value) if attr is not None else None
    if perms is None:
        return None
    base = f"{node.name or 'Einsum'}_as_MatMul"
    new_nodes: list[ir.Node] = []
    a, b = node.inputs[::-1] if perms[3] else node.inputs
    if not _identity(perms[0]):
        a = emit.node(new_nodes, "Transpose", [a], {"perm": list(perms[0])}, f"{base}/A_transpose")
    if not _identity(perms[1]):
        b = emit.node(new_nodes, "Transpose", [b], {"perm": list(perms[1])}, f"{base}/B_transpose")
    y = emit.node(new_nodes, "MatMul", [a, b], name=f"{base}/MatMul")
    if not _identity(perms[2]):
        y = emit.node(new_nodes, "Transpose", [y], {"perm": list(perms[2])}, f"{base}/Y_transpose")
    return new_nodes, y


def _scores_einsum(softmax: ir.Node) -> ir.Node | None:
    """The nearest two-operand Einsum the Softmax's scores come from (breadth first, through the ops
    a score passes between its product and the Softmax)."""
    frontier = [softmax.inputs[0]]
    for _ in range(_SCORE_DEPTH):
        nxt = []
        for v in frontier:
            node = v.producer() if v is not None else None
            if node is None or not is_default_domain(node):
                continue
            if node.op_type == "Einsum":
                return node if len(node.inputs) == 2 else None
            if node.op_type in _SCORE_OPS:
                nxt.extend(node.inputs)
        frontier = nxt
    return None


def lower(graph: ir.Graph, softmax: ir.Node) -> Lowered | str:
    """Writes the attention around `softmax` with MatMuls where both its products are batched-matrix-
    product Einsums (the scores' and every one its probabilities feed). The Einsum nodes leave the
    graph (no rule may see them as other readers of Q, K, V or P) and are kept for restore(). Where
    it cannot, nothing is changed and the reason is returned, for the report."""
    qk = _scores_einsum(softmax)
    pvs = [u.node for users in probability_uses(softmax) for u in users
           if u.node.op_type == "Einsum" and is_default_domain(u.node)]
    if qk is None:
        return ("its probabilities feed an Einsum, but its scores do not come from one two-operand Einsum "
                "through scale, mask, softcap and Cast ops only: not supported")
    forms = [_as_matmul(n) for n in (qk, *pvs)]
    if not pvs or any(f is None for f in forms):
        return ("its products are Einsums that are not batched matrix products of rank-4 operands "
                "(e.g. blocked local attention): not supported")
    lowered = Lowered(einsums=[qk, *pvs], operands=[], replaced=[], new_nodes=[])
    for einsum, (new_nodes, y) in zip(lowered.einsums, forms):
        graph.insert_before(einsum, new_nodes)
        y.type, y.shape = einsum.outputs[0].type, einsum.outputs[0].shape
        _swap(einsum.outputs[0], y)
        lowered.operands.append(list(einsum.inputs))
        lowered.replaced.append((einsum.outputs[0], y))
        lowered.new_nodes.append(new_nodes)
        graph.remove(einsum, safe=True)
    return lowered


def _swap(old: ir.Value, new: ir.Value) -> None:
    """Every use of `old`, a graph output too, reads `new`, which takes `old`'s name."""
    name = old.name
    old.replace_all_uses_with(new, replace_graph_outputs=True)
    old.name, new.name = new.name, None
    new.name = name


def restore(graph: ir.Graph, lowered: Lowered) -> None:
    """Where no rule fused the attention: the Einsums back in their places, read as before, and
    their MatMul forms removed. (After a fusion there is nothing to do: the Einsums are out.)"""
    for einsum, operands, (old, new), new_nodes in zip(lowered.einsums, lowered.operands, lowered.replaced,
                                                       lowered.new_nodes):
        for i, v in enumerate(operands):
            einsum.replace_input_with(i, v)
        graph.insert_before(new_nodes[0], einsum)
        _swap(new, old)
        graph.remove(list(new_nodes), safe=True)
