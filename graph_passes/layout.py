"""Head-layout helpers: the repeat-kv subgraph of GQA / MQA models, and the (B, S, H*D)
projections the 3-D form of FusedAttention reads (below).

Hugging Face's ``repeat_kv`` turns K of shape (B, Hkv, S, D) into (B, Hkv*R, S, D) with
``Unsqueeze(axis 2) -> Expand (B, Hkv, R, S, D) -> Reshape``: query head h then reads kv head
h // R, which is exactly FusedAttention's GQA mapping, so the fused node can read the un-repeated
tensor. ``Tile`` with repeats (1, 1, R, 1, 1) after the Unsqueeze is the same thing. The proof
uses the inferred shapes; when it cannot be made, the repeated tensor is used (still exact).
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from .ir_utils import const_array, only_consumer, op, transpose_perm
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


# --------------------------------------------------------------------------------------------
# The projections' layout: (B, S, H*D) -> Reshape (B, S, H, D) -> Transpose (0, 2, 1, 3).
#
# FusedAttention's 3-D form reads (B, S, H*D) directly (element (b, s, h*D + d) is element
# (b, h, s, d) of the 4-D form), so when an export splits heads exactly this way the fused node can
# read the Reshape's input and the Reshape / Transpose / shape arithmetic become dead. A row-major
# Reshape of (B, S, X) to (B, S, H, D) with the first two dims kept and X = H*D puts element
# (b, s, h*D + d) at (b, s, h, d): that is the whole proof, made from the shape tensor's entries
# (constants, 0 = copy, -1 = the rest, Shape/Gather of a tensor whose dims are known) or, where the
# shape tensor is opaque, from the inferred symbolic shapes of the Reshape's input and output.

BSHD_TO_BHSD = (0, 2, 1, 3)
_COPY = "copy"  # a 0 entry of a Reshape shape without allowzero: keeps the input's dim


@dataclasses.dataclass
class HeadSplit:
    """``Transpose(Reshape(x, (B, S, heads, head_dim)), (0, 2, 1, 3))``, proven."""

    x: ir.Value  # (B, S, heads * head_dim)
    heads: int
    head_dim: int


def _scalar_entry(value: ir.Value, shapes: dict, depth: int = 0):
    """A scalar shape entry: ('const', k), ('dim', d) or None."""
    if value is None or depth > 6:
        return None
    arr = const_array(value)
    if arr is not None:
        return ("const", int(arr.reshape(-1)[0])) if arr.size == 1 and arr.dtype.kind in "iu" else None
    node = op(value, "Cast", "Identity", "Squeeze", "Unsqueeze", "Reshape", "Gather")
    if node is None:
        return None
    if node.op_type != "Gather":
        return _scalar_entry(node.inputs[0], shapes, depth + 1)
    entries = shape_entries(node.inputs[0], shapes, depth + 1)
    idx = const_array(node.inputs[1])
    if entries is None or idx is None or idx.size != 1 or node.attributes.get_int("axis", 0) != 0:
        return None
    i = int(idx.reshape(-1)[0])
    i = i + len(entries) if i < 0 else i
    return entries[i] if 0 <= i < len(entries) else None


def shape_entries(value: ir.Value, shapes: dict, depth: int = 0) -> list | None:
    """The entries of a 1-D int64 shape tensor, each ('const', k), ('dim', d) (a dim of some tensor,
    as inferred: int or symbol) or None (unknown); None when the tensor's length is unknown."""
    if value is None or depth > 6:
        return None
    arr = const_array(value)
    if arr is not None:
        return [("const", int(a)) for a in arr.reshape(-1)] if arr.ndim <= 1 and arr.dtype.kind in "iu" else None
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx"):
        return None
    kind = node.op_type
    if kind == "Shape":
        s = shapes.get(node.inputs[0].name)
        if s is None:
            return None
        n = len(s)
        start = node.attributes.get_int("start", 0)
        end = node.attributes.get_int("end", n)
        start, end = (max(0, min(n, i + n if i < 0 else i)) for i in (start, end))
        return [None if d is None else ("dim", d) for d in s[start:end]]
    if kind == "Concat":
        if node.attributes.get_int("axis", 0) not in (0, -1):
            return None
        out = []
        for part in node.inputs:
            e = shape_entries(part, shapes, depth + 1)
            if e is None:
                return None
            out += e
        return out
    if kind in ("Cast", "Identity"):
        return shape_entries(node.inputs[0], shapes, depth + 1)
    if kind in ("Unsqueeze", "Reshape"):
        s = shapes.get(node.outputs[0].name)
        if s == (1,):  # a scalar made a 1-element vector
            e = _scalar_entry(node.inputs[0], shapes, depth + 1)
            return [e]
        return None
    if kind == "Gather":
        entries = shape_entries(node.inputs[0], shapes, depth + 1)
        idx = const_array(node.inputs[1])
        if entries is None or idx is None or idx.ndim != 1 or node.attributes.get_int("axis", 0) != 0:
            return None
        n = len(entries)
        picked = [int(i) + n if int(i) < 0 else int(i) for i in idx]
        return [entries[i] if 0 <= i < n else None for i in picked] if all(0 <= i < n for i in picked) else None
    return None


def reshape_target(reshape: ir.Node, shapes: dict) -> list | None:
    """The Reshape's target, one item per output dim: an int, a dim symbol, _COPY (a 0 entry that
    keeps the input's dim), -1, or None (unknown). None when its length is unknown."""
    entries = shape_entries(reshape.inputs[1], shapes) if len(reshape.inputs) > 1 else None
    if entries is None:
        return None
    allowzero = reshape.attributes.get_int("allowzero", 0)
    out = []
    for e in entries:
        if e is None:
            out.append(None)
        elif e[0] == "dim":
            out.append(e[1])
        elif e[1] == 0 and not allowzero:
            out.append(_COPY)
        else:
            out.append(e[1])
    return out


def _keeps_dim(entry, in_dim, axis_in_range: bool) -> bool:
    """A target entry that provably reproduces the input's dim at the same axis."""
    if entry == _COPY:
        return axis_in_range
    return entry is not None and entry != -1 and same_dim(entry, in_dim)


def _split_last(reshape: ir.Node, shapes: dict) -> tuple[int, int] | None:
    """(H, D) when the Reshape provably maps (B, S, H*D) to (B, S, H, D); else None."""
    x, y = reshape.inputs[0], reshape.outputs[0]
    sx, sy = shapes.get(x.name), shapes.get(y.name)
    if sx is None or sy is None or len(sx) != 3 or len(sy) != 4:
        return None
    h, d, hd = sy[2], sy[3], sx[2]
    if not all(isinstance(v, int) and v > 0 for v in (h, d, hd)) or h * d != hd:
        return None
    target = reshape_target(reshape, shapes)
    if target is not None and len(target) == 4 and None not in target:
        if not (_keeps_dim(target[0], sx[0], True) and _keeps_dim(target[1], sx[1], True)):
            return None
        last = target[2:]
        if last.count(-1) > 1 or any(t not in (-1,) and t != v for t, v in zip(last, (h, d))):
            return None  # (-1 with the other entry given resolves to the same split: X = H*D)
        return h, d
    # Opaque shape tensor: the inferred shapes say the leading dims are kept.
    if same_dim(sy[0], sx[0]) and same_dim(sy[1], sx[1]):
        return h, d
    return None


def split_heads(value: ir.Value, perm: tuple | None, shapes: dict) -> HeadSplit | None:
    """A (B, H, S, D) operand -- `value`, or Transpose(value, perm) when `perm` is given -- that is
    exactly Transpose(Reshape(x, (B, S, H, D)), (0, 2, 1, 3)) of a (B, S, H*D) tensor x."""
    if perm is not None and tuple(perm) != (0, 1, 2, 3):
        if tuple(perm) != BSHD_TO_BHSD:
            return None
        reshape = op(value, "Reshape")
    else:
        t = op(value, "Transpose")
        if t is None or transpose_perm(t, 4) != BSHD_TO_BHSD:
            return None
        reshape = op(t.inputs[0], "Reshape")
    if reshape is None:
        return None
    hd = _split_last(reshape, shapes)
    if hd is None:
        return None
    return HeadSplit(reshape.inputs[0], hd[0], hd[1])


def merge_heads(y: ir.Value, shapes: dict) -> tuple[ir.Node, str] | tuple[None, str]:
    """For the attention output y (B, H, S, Dv): the Reshape of ``Reshape(Transpose(y, (0, 2, 1, 3)),
    (B, S, H*Dv))`` when that is all y feeds (then its output is FusedAttention's 3-D output);
    else (None, why not)."""
    t = only_consumer(y)
    if t is None or t.op_type != "Transpose" or t.domain not in ("", "ai.onnx"):
        return None, "the attention output does not feed one Transpose only"
    if transpose_perm(t, 4) != BSHD_TO_BHSD:
        return None, f"the attention output is transposed with perm {transpose_perm(t, 4)}, not (0, 2, 1, 3)"
    reshape = _merging_reshape(t.outputs[0])
    if reshape is None:
        return None, "the transposed attention output does not feed one Reshape only"
    st, so = shapes.get(t.outputs[0].name), shapes.get(reshape.outputs[0].name)
    if st is None or so is None or len(st) != 4 or len(so) != 3:
        return None, "cannot prove the output Reshape merges (B, S, H, Dv) into (B, S, H*Dv)"
    h, dv = st[2], st[3]
    if not (isinstance(h, int) and isinstance(dv, int) and so[2] == h * dv):
        return None, "cannot prove the output Reshape merges the heads (H*Dv)"
    target = reshape_target(reshape, shapes)
    if target is not None and len(target) == 3 and None not in target:
        ok = (_keeps_dim(target[0], st[0], True) and _keeps_dim(target[1], st[1], True)
              and target[2] in (-1, h * dv))
    else:
        ok = same_dim(so[0], st[0]) and same_dim(so[1], st[1])
    if not ok:
        return None, "cannot prove the output Reshape keeps the batch and sequence dims"
    return reshape, ""


def _merging_reshape(value: ir.Value) -> ir.Node | None:
    """The one Reshape that reads `value` as its data, when everything else reading `value` is a
    Shape whose results only feed that Reshape's target (GPT-2's ``x.size()[:-2] + (H*D,)``): once
    the Reshape goes, so do they. None otherwise."""
    if value.is_graph_output():
        return None
    users = {id(u.node): u.node for u in value.uses()}
    reshapes = [n for n in users.values() if n.op_type == "Reshape" and n.domain in ("", "ai.onnx")
                and n.inputs[0] is value and sum(1 for x in n.inputs if x is value) == 1]
    if len(reshapes) != 1:
        return None
    reshape = reshapes[0]
    shapes_of = [n for n in users.values() if n is not reshape]
    if not shapes_of:
        return reshape
    if any(n.op_type != "Shape" or n.domain not in ("", "ai.onnx") for n in shapes_of):
        return None
    # Ancestors of the Reshape's target (bounded): the Shapes' results may flow only into these.
    ancestors, frontier = set(), [reshape.inputs[1]] if len(reshape.inputs) > 1 else []
    while frontier and len(ancestors) < 64:
        v = frontier.pop()
        p = v.producer() if v is not None else None
        if p is None or id(p) in ancestors:
            continue
        ancestors.add(id(p))
        if p.op_type != "Shape":  # what a Shape reads is no part of the target's arithmetic
            frontier.extend(p.inputs)
    work, seen = list(shapes_of), set()
    while work:
        n = work.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if id(n) not in ancestors or len(seen) > 64:
            return None
        for out in n.outputs:
            if out.is_graph_output():
                return None
            for u in out.uses():
                if u.node is not reshape:
                    work.append(u.node)
                elif u.idx == 0:
                    return None
    return reshape
