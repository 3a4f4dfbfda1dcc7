"""Masks an export expands to the scores' own shape, Expand(m, Shape(scores)) [-> Cast] (XLM and
FlauBERT's TorchScript exports: `mask.expand_as(scores)`). The Shape reads the scores, which then
have a reader outside the attention, and the fused node could not take their place. Where m
provably broadcasts into the scores' shape, the Where / Add that applies the mask broadcasts m to
the same elements the Expand wrote, so the fused node reads m (through the same Cast) and the
Shape, Expand and Cast die with the subgraph: the same values, without the scores."""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from .. import contract
from .ir_utils import op
from .shape_info import same_dim, same_shape


@dataclasses.dataclass
class Unexpanded:
    small: ir.Value  # the mask before its Expand
    cast: ir.Node | None  # the Cast between the Expand and the mask term, read again on the small mask
    shape_reader: ir.Node  # the Shape of the scores that fed the Expand


def _only_reader(value: ir.Value, node: ir.Node) -> bool:
    return not value.is_graph_output() and all(u.node is node for u in value.uses())


def unexpanded_terms(masks, scores: ir.Value, chain: tuple, shapes: dict) -> dict[int, Unexpanded]:
    """{mask term index: how to read it unexpanded} for the terms of `masks` (MaskTerm) whose value
    is Expand(m, Shape(x)) or Cast of it, x the scores or a value of their chain to the Softmax
    (`chain`) of the scores' proven shape, each value on that path read only by the next node, and m
    of rank 2 to that of the scores with every dim 1 or the scores' own (right-aligned)."""
    out: dict[int, Unexpanded] = {}
    s_shape = shapes.get(scores.name)
    if s_shape is None:
        return out
    same_shaped = {id(v) for v in (scores, *chain) if same_shape(shapes.get(v.name), s_shape)}
    for i, term in enumerate(masks):
        if term.kind not in ("add", "bool"):
            continue
        cast = op(term.value, "Cast")
        expand = op(cast.inputs[0] if cast is not None else term.value, "Expand")
        reader = op(expand.inputs[1], "Shape") if expand is not None else None
        if (reader is None or id(reader.inputs[0]) not in same_shaped or "start" in reader.attributes
                or "end" in reader.attributes):
            continue
        if not (_only_reader(reader.outputs[0], expand) and _only_reader(expand.outputs[0], cast or term.node)
                and (cast is None or _only_reader(cast.outputs[0], term.node))):
            continue
        small = expand.inputs[0]
        m_shape = shapes.get(small.name)
        if m_shape is None or not contract.MIN_MASK_RANK <= len(m_shape) <= len(s_shape):
            continue
        if all(d == 1 or same_dim(d, s) for d, s in zip(reversed(m_shape), reversed(s_shape))):
            out[i] = Unexpanded(small, cast, reader)
    return out
