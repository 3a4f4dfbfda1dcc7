"""Rule ``sdpa_subgraph``: MatMul(Q, K^T) -> [scale] -> [softcap] -> [masks] -> Softmax -> MatMul(P, V).

The form every exporter produces for eager attention, and TorchScript exports of
``scaled_dot_product_attention``. Variants covered (any combination):

- scale: Mul or Div by a scalar constant on the scores, on Q, on K, or split as sqrt(scale) on
  both (torch's SDPA export), or absent (1.0); constants through Cast / Sqrt / Reciprocal chains.
  The fused ``scale`` is the product of the constants' exact values (a float16 constant keeps
  its float16 rounding).
- K layout: any chain of Transposes and scalar Muls over a rank-4 tensor (``[0,1,3,2]`` on
  BNSH, ``[0,2,3,1]`` on BSNH); any other rank-4 K^T (e.g. Reshape/Transpose/Reshape) gets one
  explicit Transpose(0,1,3,2): data movement only, so exact.
- masks: additive ``Add`` (either operand order, any broadcast shape that does not grow the
  scores; several Adds are folded into one mask input), ``Where(cond, scores, fill)`` or
  ``Where(cond, fill, scores)`` bool masks, the clamp ``Max(s + m, c)`` of a masked score at a
  huge negative constant (folded as ``Max(m, c)``), and the softcap ``c*tanh(s/c)``.
- after Softmax: the NaN guard ``Where(IsNaN(p), 0, p)``, inference ``Dropout``, ``Identity``
  and ``Cast`` chains (half-precision models that run softmax in float32).
- GQA / MQA: repeat-kv before the MatMuls is absorbed (see ``layout.py``); a K/V with one head
  broadcast by MatMul is MQA.
- Batched matmuls on (B*H, S, D) (older exporters, DeBERTa): lifted to (1, B*H, S, D) around the
  fused node; where the scores are viewed as (B, H, Sq, Sk) for the masks and the Softmax and back
  as (B*H, Sq, Sk) for the P V product (DeBERTa's disentangled attention: its position terms are
  added in the bmm frame, the padding mask in the 4-D one), Q, K, V and the bmm-frame terms are
  reshaped to (B, H, ...) with the view's own leading dims instead, and the output back: data
  movement only, so exact. The same where the scores are viewed back before the Softmax (the
  mask alone in the 4-D view: fairseq-style code such as XGLM and older BART / OPT exports), and
  a view of the probabilities and its inverse after it are dropped once their shapes cancel.
  ``Shape`` reads of the chain's values that only compute the views' target shapes go with the
  chain.
- Layout: when Q, K and V are (B, S, H*D) projections split by Reshape + Transpose(0, 2, 1, 3) and
  the output is merged back by Transpose(0, 2, 1, 3) + Reshape (B, S, H*Dv), the fused node takes
  FusedAttention's 3-D form: it reads the projections, its output replaces the final Reshape's, and
  the layout ops with their shape arithmetic leave the graph (``layout.split_heads``,
  ``layout.merge_heads``). Otherwise the 4-D form, with the reason in the details.

Exactness decisions (each rejection below is a stated reason in the report):

- Fully masked rows. An additive mask is passed through unchanged, so a row masked with a large
  finite value (Hugging Face's ``finfo.min``) still gives the same uniform attention as the
  original, because the op adds the mask in float32 exactly as the float32 original does. A
  row that is entirely -inf gives NaN in the original (or 0 behind a NaN guard) and 0 in the
  fused op: NaN is the only value that changes.
- ``Where(cond, scores, fill)`` with fill = -inf becomes a bool mask (same rows; a fully
  masked row: NaN or guarded 0 before, 0 after). With a finite fill, a fully masked row gives
  uniform attention in the original while a bool mask would give zeros, so the mask is emitted
  as the additive ``Where(cond, 0, fill)`` instead -- exact when ``s + fill`` rounds to ``fill``
  for every plausible score, i.e. |fill| >= 1e30 in float32 (``finfo(float32).min``). Smaller
  fills (-1e9, -10000, float16's -65504) are left alone with a reason: no single fused node can
  reproduce their fully masked rows.
- Half precision (float16 / bfloat16 models): the op computes scores, mask addition and softmax
  in float32 where the original rounds them to the half type; partially masked rows agree to the
  type's rounding, but a row whose every key is masked by a *finite* additive value (e.g. float16's
  -65504) is decided by that rounding in the original and can differ after fusion. Float32 models
  with ``finfo(float32).min`` masks are exact, fully masked rows included.
- ``Max(s + m, c)`` with ``c <= -1e30`` (``finfo(float32).min``) equals ``s + Max(m, c)`` wherever
  ``s + c`` rounds to ``c`` (the bound above); the clamp keeps a row masked by -inf at every key
  uniform, as the original does. Smaller bounds (float16's -65504) are left alone with a reason.
- A scale applied after an additive mask (``(s + m) * c``) would scale the mask: left alone.
- Casts before the Softmax must be widening (or no-ops); casts after it may not pass through a
  type narrower than Q's; the additive mask must have Q's type. One mixed form is accepted: Q and K
  in half precision with the scores widened to float32 before the Softmax and V and the output in
  float32 (TorchScript's SDPA export of float16 models) -- the fused node reads Cast(Q), Cast(K)
  (exact) and computes in float32, at least as precisely as the original.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import onnx_ir as ir

from .. import contract
from . import emit
from .ir_utils import (
    VALUE_DTYPES,
    compose_perm,
    const_array,
    dtype_of,
    float_repr,
    is_default_domain,
    is_identity_perm,
    op,
    scalar_const,
    transpose_perm,
    widening_or_same,
)
from .layout import merge_heads, split_heads, unrepeat_kv
from .mask_expand import unexpanded_terms
from .shape_info import rank, same_dim, same_shape

NAME = "sdpa_subgraph"

# |fill| at or above which s + fill == fill in float32 for any |s| < ~1e22 (ulp(1e30) ~ 7.6e22).
HUGE_FILL = 1e30
SWAP_LAST = (0, 1, 3, 2)
_MAX_DEPTH = 24


class Reject(Exception):
    """The candidate cannot be fused; the message is the reason shown to the user. `nodes`, when
    set, names where the candidate is (for the report)."""

    def __init__(self, reason: str, nodes: list[str] | None = None):
        super().__init__(reason)
        self.nodes = nodes


def check_head_sizes(sizes) -> None:
    """Rejects a known head size outside FusedAttention's range; `sizes` is (("D", D), ("Dv", Dv)),
    each an int where the shapes give it. Every rule that emits FusedAttention checks through here."""
    for name, d in sizes:
        if isinstance(d, int) and not 1 <= d <= contract.MAX_HEAD_DIM:
            raise Reject(f"head size {name}={d} is outside FusedAttention's 1..{contract.MAX_HEAD_DIM}")


@dataclasses.dataclass
class MaskTerm:
    kind: str  # "add": value is added to the scores; "bool": value (bool) says where keys are visible;
    # "clamp": Max(scores, fill) with the huge negative constant fill (value, a scalar)
    value: ir.Value
    node: ir.Node  # the Add or Where node
    scores_in: ir.Value  # that node's scores-side input
    negate: bool = False  # bool: visible = Not(value)
    fill: float | None = None  # bool from Where with a finite fill: emitted as Where(cond, 0, fill); clamp's bound
    in_bmm: bool = False  # applied in the (B*H, Sq, Sk) frame, before the scores' head view


@dataclasses.dataclass
class Match:
    softmax: ir.Node
    qk: ir.Node
    pv: ir.Node
    q: ir.Value
    k_base: ir.Value  # K^T = Transpose(k_base, k_perm) (times scale constants)
    k_perm: tuple
    v: ir.Value
    scale: float
    softcap: float
    masks: list  # MaskTerm, nearest to the MatMul first
    pre_casts: list  # Cast nodes between the QK MatMul and the Softmax
    post_casts: list  # Cast nodes between the Softmax and the PV MatMul
    internal: list  # values between qk and pv that must feed nothing else
    nan_guard: bool = False
    view: ir.Node | None = None  # Reshape (B*H, Sq, Sk) -> (B, H, Sq, Sk) before the Softmax
    unview: ir.Node | None = None  # Reshape back to (B*H, Sq, Sk) after it (or before it: softmax_in_bmm)
    softmax_in_bmm: bool = False  # the scores are viewed back before the Softmax (fairseq-style code)
    post_views: tuple = ()  # with softmax_in_bmm: a Reshape pair after the Softmax whose shapes cancel

    @property
    def where(self) -> list[str]:
        return [n.name or n.op_type for n in (self.qk, self.softmax, self.pv)]


@dataclasses.dataclass
class Plan:
    """What check() proved, for rewrite(): the tensors the fused node reads."""

    k: ir.Value
    k_perm: tuple | None  # None: use k as is; else Transpose(k, perm)
    v: ir.Value
    n_rep: int  # 1 or the absorbed repeat-kv factor
    dtype: ir.DataType
    rank3: bool = False  # bmm form (N, S, D): lifted to (1, N, S, D) around the fused node
    view_dims: tuple[int, int] | None = None  # bmm form with a head view: (N, S, D) -> (d0, d1, S, D)
    lift_masks: tuple = ()  # indices of bmm-frame mask terms of shape (N, ., .) to view the same way
    opset: int = 17
    upcast_qk: bool = False  # Q and K are read through Cast(to=dtype)
    three_d: ThreeD | None = None  # the 3-D form applies: read the (B, S, H*D) projections
    three_d_why_not: str = ""  # else why the 4-D form is emitted
    unexpanded: dict = dataclasses.field(default_factory=dict)  # mask term index -> mask_expand.Unexpanded


@dataclasses.dataclass
class ThreeD:
    """FusedAttention's 3-D form: Q (B, Sq, Hq*D), K (B, Sk, Hkv*D), V (B, Sk, Hkv*Dv), and its
    output (B, Sq, Hq*Dv) replaces `out_reshape`'s output."""

    q: ir.Value
    k: ir.Value
    v: ir.Value
    q_heads: int
    kv_heads: int
    out_reshape: ir.Node


# --------------------------------------------------------------------------------------------
# pattern


def probability_uses(softmax: ir.Node):
    """The uses of a Softmax's probabilities and of the allowed post-softmax ops after it (Cast,
    Dropout, Identity, Where, Reshape; the first of them at each level, 8 levels at most), level by
    level: where an attention rule looks for the P V product."""
    value = softmax.outputs[0]
    for _ in range(8):
        users = list(value.uses())
        yield users
        nexts = [u.node for u in users if u.node.op_type in ("Cast", "Dropout", "Identity", "Where", "Reshape")]
        if not nexts:
            return
        value = nexts[0].outputs[0]


def is_candidate(softmax: ir.Node) -> bool:
    """A Softmax whose probabilities (through the allowed post-softmax ops) feed a MatMul as its
    first input: the shape of attention. Other softmaxes (classifier heads, routers) are not
    candidates and are never touched."""
    if softmax.op_type != "Softmax" or not is_default_domain(softmax):
        return False
    return any(u.node.op_type == "MatMul" and is_default_domain(u.node) and u.idx == 0
               for users in probability_uses(softmax) for u in users)


def einsum_attention(softmax: ir.Node) -> bool:
    """A Softmax whose probabilities (through the same post-softmax ops) feed a two-input Einsum:
    attention written as Einsum. The pipeline lowers its products to MatMuls (einsum_form) where they
    are batched matrix products; the report lists the others (Funnel, LongT5's local attention) as
    left alone, not as softmaxes that are not attention."""
    if softmax.op_type != "Softmax" or not is_default_domain(softmax):
        return False
    return any(u.node.op_type == "Einsum" and is_default_domain(u.node) and len(u.node.inputs) == 2
               for users in probability_uses(softmax) for u in users)


def _strip_scale(value: ir.Value) -> tuple[ir.Value, float]:
    """Walks back through Mul / Div by scalar constants; returns (base, product of factors)."""
    scale = 1.0
    for _ in range(_MAX_DEPTH):
        node = op(value, "Mul", "Div", "Identity")
        if node is None:
            break
        if node.op_type == "Identity":
            value = node.inputs[0]
            continue
        c1 = scalar_const(node.inputs[1])
        if c1 is not None:
            scale = scale * c1 if node.op_type == "Mul" else scale / c1
            value = node.inputs[0]
            continue
        if node.op_type == "Mul":
            c0 = scalar_const(node.inputs[0])
            if c0 is not None:
                scale *= c0
                value = node.inputs[1]
                continue
        break
    return value, scale


def _strip_k(value: ir.Value) -> tuple[ir.Value, tuple, float]:
    """Walks back through Transposes (rank 4) and scalar Mul / Div; returns (base, perm, scale)
    with K^T == Transpose(base, perm) * scale."""
    perm = (0, 1, 2, 3)
    scale = 1.0
    for _ in range(_MAX_DEPTH):
        value, s = _strip_scale(value)
        scale *= s
        node = op(value, "Transpose")
        if node is None:
            break
        p = transpose_perm(node, 4)
        if p is None or len(p) != 4:
            break
        perm = compose_perm(perm, p)
        value = node.inputs[0]
    return value, perm, scale


@dataclasses.dataclass
class _Scores:
    qk: ir.Node
    scale: float = 1.0
    softcap: float = 0.0
    masks: tuple = ()
    casts: tuple = ()
    internal: tuple = ()
    view: ir.Node | None = None
    unview: ir.Node | None = None  # a second Reshape, nearer the Softmax: the view back to (B*H, Sq, Sk)


def _softcap_of(node: ir.Node) -> tuple[float, ir.Value] | None:
    """Mul(Tanh(s / c), c) (either Mul operand order; s * (1/c) too) -> (c, s)."""
    if node.op_type != "Mul":
        return None
    for i in (0, 1):
        cap = scalar_const(node.inputs[1 - i])
        tanh = op(node.inputs[i], "Tanh")
        if cap is None or tanh is None or cap <= 0:
            continue
        inner = op(tanh.inputs[0], "Div", "Mul")
        if inner is None:
            continue
        c = scalar_const(inner.inputs[1])
        if c is None:
            continue
        div = c if inner.op_type == "Div" else (1.0 / c if c else math.inf)
        if math.isclose(div, cap, rel_tol=1e-6):
            return cap, inner.inputs[0]
    return None


def _parse_scores(value: ir.Value, depth: int, above: frozenset) -> _Scores:
    """Parses the scores chain backwards from the Softmax input. `above` holds what was already
    seen nearer the Softmax: 'scale' and/or 'softcap' (to enforce scale -> softcap -> mask)."""
    if depth > _MAX_DEPTH:
        raise Reject("the scores chain before the Softmax is too long to analyse")
    node = value.producer()
    if node is None or not is_default_domain(node):
        raise Reject("the Softmax input is not computed from a MatMul of Q and K")
    kind = node.op_type
    if kind == "MatMul":
        return _Scores(qk=node)
    if kind in ("Cast", "Identity"):
        inner = _parse_scores(node.inputs[0], depth + 1, above)
        casts = inner.casts + ((node,) if kind == "Cast" else ())
        return dataclasses.replace(inner, casts=casts, internal=inner.internal + (node.inputs[0],))
    if kind in ("Mul", "Div"):
        cap = _softcap_of(node) if kind == "Mul" else None
        if cap is not None:
            if "scale" in above:
                raise Reject("a scale is applied after the softcap; FusedAttention scales before it")
            inner = _parse_scores(cap[1], depth + 1, above | {"softcap"})
            if inner.softcap:
                raise Reject("two softcaps on the scores")
            return dataclasses.replace(inner, softcap=cap[0], internal=inner.internal + (cap[1],))
        c = scalar_const(node.inputs[1])
        src = node.inputs[0]
        if c is None and kind == "Mul":
            c, src = scalar_const(node.inputs[0]), node.inputs[1]
        if c is None:
            raise Reject(f"the scores are multiplied by a non-constant or non-scalar ({node.name or kind})")
        if c == 0 or not math.isfinite(c):
            raise Reject(f"scale constant {float_repr(c)} is not a finite non-zero number")
        inner = _parse_scores(src, depth + 1, above | {"scale"})
        factor = c if kind == "Mul" else 1.0 / c
        return dataclasses.replace(inner, scale=inner.scale * factor, internal=inner.internal + (src,))
    if kind == "Add":
        errors = []
        for i in (0, 1):
            try:
                inner = _parse_scores(node.inputs[i], depth + 1, above)
            except Reject as exc:
                errors.append(str(exc))
                continue
            if "scale" in above or "softcap" in above:
                raise Reject("an additive mask is added before the scale or softcap is applied "
                             "(FusedAttention adds the mask last)")
            term = MaskTerm("add", node.inputs[1 - i], node, node.inputs[i], in_bmm=inner.unview is not None)
            return dataclasses.replace(inner, masks=inner.masks + (term,),
                                       internal=inner.internal + (node.inputs[i],))
        raise Reject(errors[0] if errors else "Add before the Softmax has no scores operand")
    if kind == "Where":
        cond, a, b = node.inputs
        fa, fb = scalar_const(a), scalar_const(b)
        if fb is not None and fa is None:
            scores, fill, negate = a, fb, False
        elif fa is not None and fb is None:
            scores, fill, negate = b, fa, True
        else:
            raise Reject("a Where before the Softmax does not select between the scores and a constant")
        if not (fill < 0 and (math.isinf(fill) or abs(fill) >= HUGE_FILL)):
            raise Reject(
                f"Where mask fills with {float_repr(fill)}: a fully masked row gives uniform attention in the "
                "original, which FusedAttention reproduces only for -inf or |fill| >= 1e30"
            )
        if ("scale" in above or "softcap" in above) and not math.isinf(fill):
            raise Reject("a finite Where mask is applied before the scale or softcap")
        inner = _parse_scores(scores, depth + 1, above)
        term = MaskTerm("bool", cond, node, scores, negate=negate, fill=None if math.isinf(fill) else fill,
                        in_bmm=inner.unview is not None)
        return dataclasses.replace(inner, masks=inner.masks + (term,), internal=inner.internal + (scores,))
    if kind == "Max":
        # Max(s + m, c), a masked score clamped at a huge negative c (older Hugging Face and
        # fairseq code: torch.max(w, finfo.min)): equal to s + Max(m, c) wherever s + c rounds to
        # c, the same bound as a finite Where fill (|s| < ~1e22 for |c| >= 1e30). It keeps an
        # all -inf row uniform as the original does.
        consts = [scalar_const(x) for x in node.inputs]
        if len(node.inputs) != 2 or (consts[0] is None) == (consts[1] is None):
            raise Reject(f"a Max before the Softmax ({node.name}) does not clamp the scores by a constant")
        i = 0 if consts[1] is not None else 1
        bound = consts[1 - i]
        if not (math.isfinite(bound) and bound <= -HUGE_FILL):
            raise Reject(f"the scores are clamped below at {float_repr(bound)} ({node.name}): only a clamp at a huge "
                         "negative bound (<= -1e30, e.g. finfo(float32).min) folds exactly into the mask")
        if "scale" in above or "softcap" in above:
            raise Reject("the scores are clamped before the scale or softcap is applied")
        inner = _parse_scores(node.inputs[i], depth + 1, above)
        if not inner.masks:
            raise Reject(f"the scores are clamped below ({node.name}) with no mask before the clamp")
        term = MaskTerm("clamp", node.inputs[1 - i], node, node.inputs[i], fill=bound, in_bmm=inner.unview is not None)
        return dataclasses.replace(inner, masks=inner.masks + (term,), internal=inner.internal + (node.inputs[i],))
    if kind == "Reshape":
        # One Reshape: the head view (the Softmax in the (B, H, Sq, Sk) frame). Two: the view and,
        # nearer the Softmax, the view back to (B*H, Sq, Sk) (the Softmax in the bmm frame).
        if "unview" in above:
            raise Reject("three Reshapes between the QK MatMul and the Softmax")
        inner = _parse_scores(node.inputs[0], depth + 1, above | {"unview" if "view" in above else "view"})
        if inner.view is not None:
            return dataclasses.replace(inner, unview=node, internal=inner.internal + (node.inputs[0],))
        masks = tuple(dataclasses.replace(term, in_bmm=True) for term in inner.masks)
        return dataclasses.replace(inner, view=node, masks=masks, internal=inner.internal + (node.inputs[0],))
    raise Reject(f"unsupported op {kind} ({node.name}) between the QK MatMul and the Softmax")


def _walk_after_softmax(softmax: ir.Node) -> tuple[ir.Node, list, list, bool, tuple]:
    """Softmax output -> [NaN guard | Cast | Dropout | Identity | Reshape]* -> MatMul input 0.
    Returns (pv MatMul, casts, internal values, nan_guard, the Reshapes, at most two). Shape nodes
    that read a value on the way are passed over here; check() allows them only into the views'
    target shapes."""
    value = softmax.outputs[0]
    casts, internal, guard, reshapes = [], [], False, []
    for _ in range(_MAX_DEPTH):
        if value.is_graph_output():
            raise Reject("the attention probabilities are a graph output")
        users = list(value.uses())
        readers = [u.node for u in users if u.node.op_type == "Shape" and is_default_domain(u.node)]
        if readers and len(readers) < len({id(u.node) for u in users}):
            users = [u for u in users if u.node not in readers]
        nodes = {id(u.node): u.node for u in users}
        if len(nodes) == 2:
            # The NaN guard: IsNaN(p) and Where(IsNaN(p), 0, p).
            isnan = next((n for n in nodes.values() if n.op_type == "IsNaN"), None)
            where = next((n for n in nodes.values() if n.op_type == "Where"), None)
            if (isnan is not None and where is not None and len(users) == 2
                    and where.inputs[0] is isnan.outputs[0] and where.inputs[2] is value
                    and len(list(isnan.outputs[0].uses())) == 1 and not isnan.outputs[0].is_graph_output()
                    and scalar_const(where.inputs[1]) == 0.0):
                internal += [value, isnan.outputs[0]]
                value = where.outputs[0]
                guard = True
                continue
            raise Reject("the attention probabilities have other consumers: "
                         + ", ".join(sorted(n.name or n.op_type for n in nodes.values())))
        node = users[0].node if len(users) == 1 else None  # the Shape readers set aside
        if node is None:
            if not users:
                raise Reject("the Softmax output is unused")
            raise Reject("the attention probabilities have other consumers: "
                         + ", ".join(sorted({u.node.name or u.node.op_type for u in users})))
        if not is_default_domain(node):
            raise Reject(f"the probabilities feed {node.domain}::{node.op_type}, not a MatMul")
        internal.append(value)
        if node.op_type == "MatMul":
            if node.inputs[0] is not value:
                raise Reject("the probabilities are the second MatMul input (P must multiply V from the left)")
            return node, casts, internal, guard, tuple(reshapes)
        if node.op_type == "Cast":
            casts.append(node)
        elif node.op_type == "Reshape":
            if len(reshapes) == 2:
                raise Reject("three Reshapes between the Softmax and the MatMul with V")
            reshapes.append(node)
        elif node.op_type == "Dropout":
            if node.attributes.get_int("is_test", 1) == 0:  # opset <= 6: is_test=0 is training mode
                raise Reject("Dropout after the Softmax runs in training mode (is_test=0)")
            training = node.inputs[2] if len(node.inputs) > 2 else None
            if training is not None:
                t = const_array(training)
                if t is None or bool(t.reshape(-1)[0]):
                    raise Reject("Dropout after the Softmax may be in training mode")
            if len(node.outputs) > 1 and node.outputs[1].uses():
                raise Reject("the Dropout mask output is used")
        elif node.op_type != "Identity":
            raise Reject(f"the probabilities go through {node.op_type} ({node.name}) before the MatMul with V")
        value = node.outputs[0]
    raise Reject("the chain after the Softmax is too long to analyse")


def _names(*nodes) -> list[str]:
    return [n.name or n.op_type for n in nodes if n is not None]


def _nearest_matmul(value: ir.Value, depth: int = 6) -> ir.Node | None:
    """For the report only: the first MatMul found walking back from `value` (breadth first)."""
    frontier = [value]
    for _ in range(depth):
        nxt = []
        for v in frontier:
            node = v.producer() if v is not None else None
            if node is None:
                continue
            if node.op_type == "MatMul":
                return node
            nxt.extend(node.inputs)
        frontier = nxt
    return None


def _place_views(scores: _Scores, post_views: tuple) -> tuple[ir.Node | None, tuple]:
    """Where the scores are reshaped: once before the Softmax and once after it (the head view), or
    twice before it (viewed and back) with nothing or a pair that cancels after it. Returns (the
    Reshape back to (B*H, Sq, Sk), the cancelling pair after the Softmax)."""
    if scores.unview is None:
        if len(post_views) == 2:
            raise Reject("two Reshapes between the Softmax and the MatMul with V")
        return (post_views[0] if post_views else None), ()
    if len(post_views) == 1:
        raise Reject("the scores are reshaped back before the Softmax and again after it")
    return scores.unview, post_views


def pattern(softmax: ir.Node) -> Match:
    """The attention subgraph around `softmax`, structurally. Raises Reject with a reason."""
    try:
        pv, post_casts, post_internal, guard, post_views = _walk_after_softmax(softmax)
    except Reject as exc:
        exc.nodes = _names(_nearest_matmul(softmax.inputs[0]), softmax)
        raise
    try:
        scores = _parse_scores(softmax.inputs[0], 0, frozenset())
        unview, cancelling = _place_views(scores, post_views)
    except Reject as exc:
        exc.nodes = _names(_nearest_matmul(softmax.inputs[0]), softmax, pv)
        raise
    qk = scores.qk
    q, q_scale = _strip_scale(qk.inputs[0])
    k_base, k_perm, k_scale = _strip_k(qk.inputs[1])
    scale = scores.scale * q_scale * k_scale
    return Match(
        softmax=softmax, qk=qk, pv=pv, q=q, k_base=k_base, k_perm=k_perm, v=pv.inputs[1],
        scale=scale, softcap=scores.softcap, masks=list(scores.masks), pre_casts=list(scores.casts),
        post_casts=post_casts, internal=[qk.outputs[0], *scores.internal, softmax.inputs[0], *post_internal],
        nan_guard=guard, view=scores.view, unview=unview, softmax_in_bmm=scores.unview is not None,
        post_views=cancelling,
    )


# --------------------------------------------------------------------------------------------
# check


def _softmax_axis_ok(node: ir.Node, scores_rank: int, opset: int) -> bool:
    if opset >= 13:
        axis = node.attributes.get_int("axis", -1)
    else:
        # Opsets < 13 coerce the input to 2-D at `axis`: equal to a last-axis softmax only
        # when axis is the last axis.
        axis = node.attributes.get_int("axis", 1)
    return axis in (-1, scores_rank - 1)


def _shape_str(shapes, value) -> str:
    s = shapes.get(value.name) if value is not None else None
    return "unknown" if s is None else "(" + ", ".join("?" if d is None else str(d) for d in s) + ")"


# Ops that compute shapes: a Shape read of a chain value may feed them on its way to a view's target.
_SHAPE_ARITHMETIC = {"Shape", "Gather", "Slice", "Squeeze", "Unsqueeze", "Concat", "Cast", "Identity", "Mul", "Div",
                     "Add", "Sub", "Reshape", "Equal", "Where", "ConstantOfShape", "Range"}


def _feeds_only(reader: ir.Node, views: tuple) -> bool:
    """Whether all `reader` (a Shape of a chain value) computes ends in the target shapes of the
    Reshapes `views` and in nothing else, so that it dies with them (remove_dead then reaches it
    from their targets)."""
    targets = {id(v.inputs[1]) for v in views}
    if any(u.node not in views for v in views for u in v.inputs[1].uses()):
        return False  # a target read elsewhere too: the reader would outlive the chain
    work, seen = [reader], set()
    while work:
        n = work.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if len(seen) > 64 or not is_default_domain(n) or n.op_type not in _SHAPE_ARITHMETIC:
            return False
        for out in n.outputs:
            if out.is_graph_output():
                return False
            if id(out) not in targets:
                work.extend(u.node for u in out.uses())
    return True


def _leading_target(shape: ir.Value, shapes: dict) -> tuple[int | None, int | None]:
    """The first two entries of a Reshape's target shape, each an int where it is a constant (in a
    constant tensor, or a constant piece of a Concat), else None."""
    entries: list[int | None] = []
    arr = const_array(shape)
    node = shape.producer()
    if arr is not None:
        entries = [int(x) for x in arr.reshape(-1)]
    elif node is not None and node.op_type == "Concat" and is_default_domain(node):
        for piece in node.inputs:
            a = const_array(piece)
            if a is not None:
                entries += [int(x) for x in a.reshape(-1)]
            else:  # a computed piece: unknown entries, and so is what follows unless its length is known
                s = shapes.get(piece.name)
                if s is None or len(s) != 1 or not isinstance(s[0], int):
                    break
                entries += [None] * s[0]
            if len(entries) >= 2:
                break
    entries += [None, None]
    return entries[0], entries[1]


def _head_view(m: Match, shapes: dict, opset: int) -> tuple[int, int]:
    """Proves that the Reshape before the Softmax views the bmm frame's (N, Sq, Sk) scores as
    (d0, d1, Sq, Sk) and the one after it back as (N, Sq, Sk): a split of N and its inverse, data
    movement only. Returns the view's constant leading dims (d0, d1)."""
    if (m.view is None) != (m.unview is None):
        raise Reject("the scores are reshaped on one side of the Softmax only")
    if opset < 10:
        raise Reject(f"a head view of bmm scores needs opset 10 or later to rebuild (opset {opset})")
    s3, s4 = shapes.get(m.view.inputs[0].name), shapes.get(m.view.outputs[0].name)
    p4, p3 = shapes.get(m.unview.inputs[0].name), shapes.get(m.unview.outputs[0].name)
    ranks = tuple(None if s is None else len(s) for s in (s3, s4, p4, p3))
    if ranks != (3, 4, 4, 3) or not (same_dim(s3[1], s4[2]) and same_dim(s3[2], s4[3]) and same_dim(p3[0], s3[0])
                                     and same_dim(p3[1], s3[1]) and same_dim(p3[2], s3[2])):
        raise Reject("cannot prove the Reshapes around the Softmax only view the (B*H, Sq, Sk) scores as "
                     f"(B, H, Sq, Sk) and back: {_shape_str(shapes, m.view.inputs[0])} -> "
                     f"{_shape_str(shapes, m.view.outputs[0])}, {_shape_str(shapes, m.unview.inputs[0])} -> "
                     f"{_shape_str(shapes, m.unview.outputs[0])}")
    # With the last two dims proven, d0 * d1 = N: one constant positive entry fixes the split
    # (BLOOM's view target is (B, H, Sq, -1) with B read from a shape).
    t0, t1 = _leading_target(m.view.inputs[1], shapes)
    if t0 is not None and t1 is not None and t0 > 0 and t1 > 0:
        return t0, t1
    if t1 is not None and t1 > 0 and (t0 is None or t0 == -1):
        return -1, t1
    if t0 is not None and t0 > 0 and (t1 is None or t1 == -1):
        return t0, -1
    raise Reject(f"the Reshape before the Softmax ({m.view.name}) does not split the batch-head axis by "
                 "constant sizes")


def check(match: Match, shapes: dict, opset: int) -> Plan:
    """Proves that the matched subgraph computes FusedAttention exactly. Raises Reject."""
    m = match
    scores = m.qk.outputs[0]
    kt = m.qk.inputs[1]
    r = rank(shapes, m.q)
    for name, value in (("Q", m.q), ("K^T", kt), ("V", m.v), ("scores", scores)):
        rv = rank(shapes, value)
        if rv is None:
            raise Reject(f"cannot prove the rank of {name} ({value.name}): its shape is unknown")
        if rv not in (3, 4) or rv != r:
            raise Reject(f"{name} has rank {rv} and Q rank {r}; FusedAttention needs Q, K^T, V and the scores "
                         "all rank 4 (B, H, S, D) or all rank 3 (the batched-matmul form)")
    view_dims = _head_view(m, shapes, opset) if m.view is not None or m.unview is not None else None
    if view_dims is not None and r != 3:
        raise Reject("the scores are reshaped around the Softmax, but Q is not a batched-matmul (N, S, D) tensor")
    if m.post_views:
        _check_cancelling(m.post_views, shapes)
    if not _softmax_axis_ok(m.softmax, 4 if view_dims is not None and not m.softmax_in_bmm else r, opset):
        raise Reject(f"Softmax axis {m.softmax.attributes.get_int('axis', -1 if opset >= 13 else 1)} is not the "
                     f"key axis (opset {opset})")
    # Internal values must feed only the chain (and, with a head view, Shape reads that only
    # compute the views' targets; in the 4-D form, Shape reads of the scores that only expand a
    # mask to their shape, read unexpanded instead).
    views = (m.view, m.unview, *m.post_views) if view_dims is not None else ()
    unexpanded = unexpanded_terms(m.masks, scores, m.internal, shapes) if r == 4 and view_dims is None else {}
    expanding = {id(u.shape_reader) for u in unexpanded.values()}
    for value in m.internal:
        if value.is_graph_output():
            raise Reject(f"intermediate {value.name} is a graph output")
        users = {id(u.node): u.node for u in value.uses()}
        readers = [n for n in users.values()
                   if (views and n.op_type == "Shape" and _feeds_only(n, views)) or id(n) in expanding]
        n_users = len(users) - len(readers)
        if n_users != 1 and not (m.nan_guard and n_users == 2):
            raise Reject(f"intermediate {value.name} has other consumers")
    # dtypes
    t = dtype_of(m.q, shapes)
    if t not in VALUE_DTYPES:
        raise Reject(f"Q has element type {t}; FusedAttention supports float32, float16 and bfloat16")
    t_out = dtype_of(m.pv.outputs[0], shapes)
    upcast_qk = False
    if t_out != t and t_out in VALUE_DTYPES and widening_or_same(t, t_out) and dtype_of(m.v, shapes) == t_out:
        # Half-precision Q and K whose scores are widened before the Softmax, with V and the
        # output in the wider type (TorchScript's SDPA export of float16 models). The fused node
        # reads Q and K widened (exact) and returns the wider type; its float32 scores are at
        # least as precise as the original's half-precision ones.
        widened = [c for c in m.pre_casts if ir.DataType(c.attributes.get_int("to")) == t_out]
        if not widened:
            raise Reject(f"Q is {t} and the output {t_out}, but the scores are never widened to {t_out}")
        t, upcast_qk = t_out, True
    for name, value in (("K", kt), ("V", m.v), ("output", m.pv.outputs[0]), ("scores", scores)):
        expect = dtype_of(m.q, shapes) if upcast_qk and name in ("K", "scores") else t
        if dtype_of(value, shapes) != expect:
            raise Reject(f"{name} has element type {dtype_of(value, shapes)}, Q has {dtype_of(m.q, shapes)}: "
                         "mixed precision")
    for cast in m.pre_casts:
        src, dst = dtype_of(cast.inputs[0], shapes), ir.DataType(cast.attributes.get_int("to"))
        if not widening_or_same(src, dst):
            raise Reject(f"Cast {cast.name} before the Softmax narrows {src} to {dst}")
    for cast in m.post_casts:
        dst = ir.DataType(cast.attributes.get_int("to"))
        if not widening_or_same(t, dst):
            raise Reject(f"Cast {cast.name} after the Softmax rounds the probabilities to {dst}, narrower than {t}")
    # Batch and head dims: Q is not broadcast; K and V have Q's batch and Q's heads or 1.
    # The batched-matmul form (N, S, D) is checked as (1, N, S, D), the layout it is run in.
    sq, sk, sv, ss = ((1,) * (4 - r) + tuple(shapes[x.name]) for x in (m.q, kt, m.v, scores))
    if not (same_dim(ss[0], sq[0]) and same_dim(ss[1], sq[1]) and same_dim(ss[2], sq[2])):
        raise Reject(f"cannot prove Q {_shape_str(shapes, m.q)} is not broadcast by K^T {_shape_str(shapes, kt)}")
    for name, s in (("K", sk), ("V", sv)):
        if not same_dim(s[0], sq[0]):
            raise Reject(f"cannot prove {name} has Q's batch size: Q {_shape_str(shapes, m.q)}, {name} {s}")
        if not (same_dim(s[1], sq[1]) or (s[1] == 1 and r == 4)):
            raise Reject(f"cannot prove {name} has Q's number of heads (or 1): Q {_shape_str(shapes, m.q)}, {name} {s}")
    if not (same_dim(sk[1], sv[1])):
        raise Reject(f"K and V have different head counts: K^T {sk}, V {sv}")
    check_head_sizes((("D", sq[3]), ("Dv", sv[3])))
    if not math.isfinite(m.scale) or m.scale == 0:
        raise Reject(f"the combined scale {m.scale} is not a finite non-zero number")
    # Masks.
    for term in m.masks:
        out, src = term.node.outputs[0], term.scores_in
        so, ssrc = shapes.get(out.name), shapes.get(src.name)
        if not same_shape(so, ssrc):
            raise Reject(f"cannot prove the mask of {term.node.name} does not broadcast the scores to a larger "
                         f"shape: scores {_shape_str(shapes, src)}, result {_shape_str(shapes, out)}")
        if term.kind == "clamp":
            continue  # a scalar bound of the scores' own type (Max takes one type)
        mr = rank(shapes, term.value)
        if mr is None or mr < contract.MIN_MASK_RANK:
            raise Reject(f"mask {term.value.name} has rank {mr}; FusedAttention takes rank 2 to 4")
        mt = dtype_of(term.value, shapes)
        if term.kind == "add" and mt != dtype_of(src, shapes):
            raise Reject(f"additive mask {term.value.name} is {mt}, the scores are {dtype_of(src, shapes)}")
        if term.kind == "add" and mt != t:
            raise Reject(f"additive mask {term.value.name} is {mt} but Q is {t}: the fused op would add it in {t}")
        if term.kind == "bool" and mt != ir.DataType.BOOL:
            raise Reject(f"the Where condition {term.value.name} is {mt}, not bool")
    if r == 3:
        k = m.k_base if rank(shapes, m.k_base) == 3 and is_identity_perm(m.k_perm) else kt
        lift = ()
        if view_dims is not None:
            lift = tuple(i for i, term in enumerate(m.masks)
                         if term.in_bmm and term.kind != "clamp" and _needs_view(term, scores, shapes))
        return Plan(k=k, k_perm=SWAP_LAST, v=m.v, n_rep=1, dtype=t, rank3=True, opset=opset, upcast_qk=upcast_qk,
                    view_dims=view_dims, lift_masks=lift)
    # K layout and repeat-kv.
    k_perm = compose_perm(SWAP_LAST, m.k_perm)
    k, v, n_rep = m.k_base, m.v, 1
    if is_identity_perm(k_perm):
        k_un, v_un = unrepeat_kv(k, shapes), unrepeat_kv(v, shapes)
        if k_un is not None and v_un is not None and k_un[1] == v_un[1]:
            k, v, n_rep = k_un[0], v_un[0], k_un[1]
    if rank(shapes, m.k_base) != 4:
        k, k_perm = kt, SWAP_LAST  # K^T came through something else: transpose it back explicitly
    if upcast_qk and n_rep > 1:  # V was not widened through the repeat: keep the repeated tensors
        k, v, n_rep = m.k_base, m.v, 1
    plan = Plan(k=k, k_perm=None if is_identity_perm(k_perm) else k_perm, v=v, n_rep=n_rep, dtype=t, opset=opset,
                upcast_qk=upcast_qk, unexpanded=unexpanded)
    plan.three_d, plan.three_d_why_not = _three_d(m, plan, shapes)
    return plan


def _check_cancelling(pair: tuple, shapes: dict) -> None:
    """Proves that two Reshapes in a row, (N, Sq, Sk) -> (d0, d1, Sq, Sk) -> (N, Sq, Sk), give back
    their input's shape: a Reshape moves no data, so the pair is then the identity."""
    first, second = pair
    a, b, c = (shapes.get(x.name) for x in (first.inputs[0], first.outputs[0], second.outputs[0]))
    if b is None or not same_shape(a, c) or (len(a), len(b)) != (3, 4):
        raise Reject(f"cannot prove the Reshapes after the Softmax ({first.name}, {second.name}) view the probabilities "
                     f"as (B, H, Sq, Sk) and back: {_shape_str(shapes, first.inputs[0])} -> "
                     f"{_shape_str(shapes, first.outputs[0])} -> {_shape_str(shapes, second.outputs[0])}")


def _needs_view(term: MaskTerm, scores: ir.Value, shapes: dict) -> bool:
    """A mask term added in the bmm frame: False when it broadcasts the same in (d0, d1, Sq, Sk)
    (rank 2, or a leading 1), True when it has the scores' N and is viewed with them; else Reject."""
    s, n = shapes.get(term.value.name), shapes[scores.name][0]
    if s is not None and (len(s) == 2 or (len(s) == 3 and s[0] == 1)):
        return False
    if s is not None and len(s) == 3 and same_dim(s[0], n):
        return True
    raise Reject(f"mask term {term.value.name} {_shape_str(shapes, term.value)} cannot be placed in the "
                 "(B, H, Sq, Sk) view of the scores")


def _three_d(m: Match, plan: Plan, shapes: dict) -> tuple[ThreeD | None, str]:
    """The 3-D form when Q, K and V are each Transpose(Reshape(x, (B, S, H, D)), (0, 2, 1, 3)) of a
    projection x (B, S, H*D) and the output goes Transpose(0, 2, 1, 3) -> Reshape (B, S, H*Dv) (see
    layout.split_heads / merge_heads); else (None, why the 4-D form is kept)."""
    q = split_heads(m.q, None, shapes)
    if q is None:
        return None, "Q is not a (B, S, H*D) tensor split into heads by Reshape + Transpose(0, 2, 1, 3)"
    k = split_heads(plan.k, plan.k_perm, shapes)
    if k is None:
        return None, "K is not a (B, S, H*D) tensor split into heads by Reshape + Transpose"
    v = split_heads(plan.v, None, shapes)
    if v is None:
        return None, "V is not a (B, S, H*Dv) tensor split into heads by Reshape + Transpose(0, 2, 1, 3)"
    if k.heads != v.heads:
        return None, f"K and V are split into {k.heads} and {v.heads} heads"
    if q.head_dim != k.head_dim:
        return None, f"Q and K head sizes differ ({q.head_dim}, {k.head_dim})"
    if q.heads % k.heads:
        return None, f"{q.heads} query heads are not a multiple of {k.heads} key/value heads"
    if plan.n_rep > 1 and q.heads != k.heads * plan.n_rep:
        return None, f"repeat-kv factor {plan.n_rep} does not match {q.heads} query / {k.heads} key/value heads"
    if plan.n_rep == 1 and k.heads not in (q.heads, 1):
        return None, f"{q.heads} query heads but {k.heads} key/value heads without a repeat"
    reshape, why = merge_heads(m.pv.outputs[0], shapes)
    if reshape is None:
        return None, why
    st = shapes.get(reshape.inputs[0].name)
    if st is None or st[2] != q.heads or st[3] != v.head_dim:
        return None, "the output Reshape does not merge Q's heads"
    return ThreeD(q.x, k.x, v.x, q.heads, k.heads, reshape), ""


# --------------------------------------------------------------------------------------------
# rewrite


def rewrite(graph: ir.Graph, match: Match, plan: Plan, shapes: dict) -> ir.Node:
    """Emits the FusedAttention node (and the few nodes that build its inputs) in place of the
    subgraph; returns the new node. The old nodes are removed once nothing reads them."""
    m = match
    base = emit.base_name(m.softmax, m.qk)
    new_nodes: list[ir.Node] = []
    q, k, v = m.q, plan.k, plan.v
    three = plan.three_d
    if three is not None:
        q, k, v = three.q, three.k, three.v
    if plan.upcast_qk:
        q = emit.node(new_nodes, "Cast", [q], {"to": int(plan.dtype)}, f"{base}/Q_cast")
        k = emit.node(new_nodes, "Cast", [k], {"to": int(plan.dtype)}, f"{base}/K_cast")
    masks = list(m.masks)
    for i, u in plan.unexpanded.items():  # the mask before its Expand to the scores' shape
        small = u.small if u.cast is None else emit.node(
            new_nodes, "Cast", [u.small], {"to": u.cast.attributes.get_int("to")}, f"{base}/mask{i}_cast")
        masks[i] = dataclasses.replace(masks[i], value=small)
    if plan.view_dims is not None:
        q, k, v = (emit.split_leading(new_nodes, x, plan.view_dims, plan.opset, f"{base}/{n}_heads")
                   for x, n in ((q, "Q"), (k, "K"), (v, "V")))
        for i in plan.lift_masks:
            viewed = emit.split_leading(new_nodes, masks[i].value, plan.view_dims, plan.opset, f"{base}/mask{i}_heads")
            masks[i] = dataclasses.replace(masks[i], value=viewed)
    elif plan.rank3:
        q, k, v = (emit.unsqueeze0(new_nodes, x, plan.opset, f"{base}/{n}_lift") for x, n in ((q, "Q"), (k, "K"), (v, "V")))
    if plan.k_perm is not None and three is None:
        k = emit.node(new_nodes, "Transpose", [k], {"perm": list(plan.k_perm)}, f"{base}/K_transpose")
    mask = emit.combine_masks(new_nodes, masks, plan.dtype, base)
    # The 3-D form's output replaces the final Reshape's: the Transpose and Reshape after the
    # attention, and those that split Q, K and V, become dead (with their shape arithmetic).
    y_old = three.out_reshape.outputs[0] if three is not None else m.pv.outputs[0]
    fused = emit.fused_attention(
        new_nodes, q, k, v, mask, None, scale=m.scale, is_causal=0, softcap=m.softcap,
        name=f"{base}/FusedAttention", like=None if plan.rank3 else y_old,
        heads=(three.q_heads, three.kv_heads) if three is not None else None,
    )
    y = fused.outputs[0]
    if plan.view_dims is not None:
        y = emit.merge_leading(new_nodes, y, plan.opset, f"{base}/Y_merge")
    elif plan.rank3:
        y = emit.squeeze0(new_nodes, y, plan.opset, f"{base}/Y_unlift")
    graph.insert_before(m.pv, new_nodes)
    emit.replace_output(graph, y_old, y)
    emit.remove_dead(graph, [three.out_reshape] if three is not None else [m.pv])
    return fused


def details(match: Match, plan: Plan) -> dict:
    kinds = []
    for t in match.masks:
        if t.kind == "clamp":
            kinds.append(f"clamp {t.fill:g}")
            continue
        kinds.append("additive" if t.kind == "add" else ("bool" if t.fill is None else f"where-fill {t.fill:g}"))
    return {
        "scale": float(np.float32(match.scale)),
        "softcap": match.softcap,
        "masks": kinds,
        "gqa_repeat_absorbed": plan.n_rep if plan.n_rep > 1 else 0,
        "nan_guard": match.nan_guard,
        "batched_matmul_3d": plan.rank3,
        "bmm_head_view": plan.view_dims is not None,
        "qk_widened_to": str(plan.dtype) if plan.upcast_qk else "",
        "three_d": plan.three_d is not None,
        "three_d_why_not": "" if plan.three_d is not None or plan.rank3 else plan.three_d_why_not,
    }
