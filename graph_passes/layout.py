"""Head-layout helpers: the repeat-kv subgraph of GQA / MQA models.

Hugging Face's ``repeat_kv`` turns K of shape (B, Hkv, S, D) into (B, Hkv*R, S, D) with
``Unsqueeze(axis 2) -> Expand (B, Hkv, R, S, D) -> Reshape``: query head h then reads kv head
h // R, which is exactly FusedAttention's GQA mapping, so the fused node can read the un-repeated
tensor. ``Tile`` with repeats (1, 1, R, 1, 1) after the Unsqueeze is the same thing. The proof
uses the inferred shapes; when it cannot be made, the repeated tensor is used (still exact).
"""

from __future__ import annotations

import onnx_ir as ir

from .ir_utils import const_array, op
from .shape_info import same_dim


def _unsqueeze_axes(node: ir.Node) -> tuple[int, ...] | None:
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        arr = const_array(node.inputs[1])
        return None if arr is None else tuple(int(a) for a in arr.reshape(-1))
    axes = node.attributes.get_ints("axes", None)
    return None if axes is None else tuple(int(a) for a in axes)


def unrepeat_kv(value: ir.Value, shapes: dict) -> tuple[ir.Value, int] | None:
    """(un-repeated value of shape (B, Hkv, S, D), R) when `value` is repeat-kv of it, else None."""
    reshape = op(value, "Reshape")
    if reshape is None:
        return None
    rep = op(reshape.inputs[0], "Expand", "Tile")
    if rep is None:
        return None
    unsq = op(rep.inputs[0], "Unsqueeze")
    if unsq is None or _unsqueeze_axes(unsq) not in ((2,), (-3,)):
        return None
    base = unsq.inputs[0]
    sb = shapes.get(base.name)
    se = shapes.get(rep.outputs[0].name)
    sr = shapes.get(value.name)
    if sb is None or se is None or sr is None or (len(sb), len(se), len(sr)) != (4, 5, 4):
        return None
    if rep.op_type == "Tile":
        reps = const_array(rep.inputs[1]) if len(rep.inputs) > 1 else None
        reps = None if reps is None else [int(r) for r in reps.reshape(-1)]
        if reps is None or len(reps) != 5 or reps[:2] + reps[3:] != [1, 1, 1, 1]:
            return None  # Tile must repeat only the new axis 2
    # The repeat only fills the new axis 2; every other axis keeps the base's size.
    if not (same_dim(se[0], sb[0]) and same_dim(se[1], sb[1]) and same_dim(se[3], sb[2]) and same_dim(se[4], sb[3])):
        return None
    n_rep = se[2]
    if not isinstance(n_rep, int) or not isinstance(sb[1], int) or n_rep < 1:
        return None
    # The Reshape merges axes 1 and 2 (head h = kv_head * R + r) and keeps the rest.
    if not (same_dim(sr[0], sb[0]) and same_dim(sr[2], sb[2]) and same_dim(sr[3], sb[3]) and sr[1] == sb[1] * n_rep):
        return None
    return base, n_rep
