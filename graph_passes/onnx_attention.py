"""Rule ``onnx_attention``: the standard ONNX ``Attention`` operator (opset 23 / 24) -> FusedAttention.

FusedAttention's semantics are those of ONNX Attention without past/present, so the conversion
is one-to-one:

- Q, K, V go in as they are, 4-D (B, H, S, D) or 3-D (B, S, H*D) with ``q_num_heads`` /
  ``kv_num_heads`` copied: FusedAttention's 3-D form is the operator's own.
- ``scale`` is copied (absent: both default to 1/sqrt(D)); ``attn_mask`` (bool or Q's type)
  is copied; ``is_causal`` = 1 without a cache is upper-left aligned, as FusedAttention's 1;
  opset 24's ``nonpad_kv_seqlen`` becomes ``key_lengths``.

Left alone, with a reason: past_key/past_value inputs, used present_key/present_value or
qk_matmul_output outputs, sliding windows, ``is_causal`` together with ``nonpad_kv_seqlen``
(per-batch alignment FusedAttention does not have), a mask whose key dimension is not provably
the full key length (ONNX pads a shorter mask), and ``softcap`` together with any mask: the order
of softcap and masking has differed between versions of the operator's definition and its
implementations, so such a node is not provably equal to FusedAttention (softcap first).
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from .. import contract
from . import emit
from .ir_utils import VALUE_DTYPES, dtype_of, widening_or_same
from .sdpa_subgraph import Reject, check_head_sizes
from .shape_info import rank, same_dim

NAME = "onnx_attention"

_IN_MASK, _IN_PAST_K, _IN_PAST_V, _IN_NONPAD = 3, 4, 5, 6


@dataclasses.dataclass
class Match:
    node: ir.Node

    @property
    def where(self) -> list[str]:
        return [self.node.name or "Attention"]


@dataclasses.dataclass
class Plan:
    three_d: bool
    q_heads: int | None
    kv_heads: int | None
    mask: ir.Value | None
    key_lengths: ir.Value | None
    scale: float | None
    is_causal: int
    softcap: float
    mask_kind: str = ""
    pad_mask: bool = False  # pad attn_mask's last axis to the key length, as ONNX does
    mask_rank: int = 0
    mask_dtype: ir.DataType | None = None


def is_candidate(node: ir.Node) -> bool:
    return node.op_type == "Attention" and node.domain in ("", "ai.onnx")


def pattern(node: ir.Node) -> Match:
    return Match(node)


def _input(node: ir.Node, i: int) -> ir.Value | None:
    return node.inputs[i] if len(node.inputs) > i else None


def check(match: Match, shapes: dict, opset: int) -> Plan:
    n = match.node
    if _input(n, _IN_PAST_K) is not None or _input(n, _IN_PAST_V) is not None:
        raise Reject("Attention with past_key/past_value (a KV cache) is not converted")
    for i, out in enumerate(n.outputs[1:], start=1):
        if out is not None and (out.uses() or out.is_graph_output()):
            what = {1: "present_key", 2: "present_value", 3: "qk_matmul_output"}.get(i, f"output {i}")
            raise Reject(f"Attention's {what} output is used")
    for attr in ("left_window_size", "right_window_size"):
        if n.attributes.get_int(attr, -1) >= 0:
            raise Reject(f"Attention with {attr} (sliding window) is not converted")
    q, k, v = n.inputs[0], n.inputs[1], n.inputs[2]
    mask, nonpad = _input(n, _IN_MASK), _input(n, _IN_NONPAD)
    is_causal = n.attributes.get_int("is_causal", 0)
    softcap = n.attributes.get_float("softcap", 0.0)
    if softcap > 0 and (mask is not None or is_causal or nonpad is not None):
        raise Reject("Attention with softcap and a mask: the order of softcap and masking is not provably "
                     "FusedAttention's (softcap before the mask)")
    if is_causal and nonpad is not None:
        raise Reject("Attention with is_causal and nonpad_kv_seqlen aligns the causal mask per batch")
    t = dtype_of(q, shapes)
    if t not in VALUE_DTYPES:
        raise Reject(f"Q has element type {t}; FusedAttention supports float32, float16 and bfloat16")
    if dtype_of(k, shapes) != t or dtype_of(v, shapes) != t:
        raise Reject(f"Q, K and V differ in element type ({t}, {dtype_of(k, shapes)}, {dtype_of(v, shapes)})")
    precision = n.attributes.get_int("softmax_precision", 0)
    if precision and not widening_or_same(t, ir.DataType(precision)):
        raise Reject(f"Attention computes its softmax in {ir.DataType(precision)}, narrower than {t}")
    r = rank(shapes, q)
    if r is None or rank(shapes, k) != r or rank(shapes, v) != r or r not in (3, 4):
        raise Reject(f"cannot prove Q, K and V are all rank 4 or all rank 3 (Q rank {r})")
    three_d = r == 3
    q_heads = kv_heads = None
    if three_d:
        q_heads = n.attributes.get_int("q_num_heads", 0)
        kv_heads = n.attributes.get_int("kv_num_heads", 0)
        if q_heads <= 0 or kv_heads <= 0:
            raise Reject("3-D Attention without q_num_heads/kv_num_heads")
    check_head_sizes(_head_sizes(shapes, q, v, q_heads, kv_heads))
    if mask is not None:
        mt = dtype_of(mask, shapes)
        if mt not in (ir.DataType.BOOL, t):
            raise Reject(f"attn_mask has element type {mt}; FusedAttention takes bool or Q's type {t}")
        mr = rank(shapes, mask)
        if mr is None or not contract.MIN_MASK_RANK <= mr <= contract.MAX_MASK_RANK:
            raise Reject(f"attn_mask rank {mr} is not provably 2 to 4")
        kv_len = shapes[k.name][1 if three_d else 2]
        # ONNX pads a mask shorter than the keys (False / -inf); FusedAttention broadcasts. When
        # the lengths are not provably equal the rewrite pads explicitly, as ONNX does.
        pad_mask = not same_dim(shapes[mask.name][-1], kv_len)
        mask_rank = mr
    else:
        pad_mask, mask_rank = False, 0
    if nonpad is not None and dtype_of(nonpad, shapes) not in (ir.DataType.INT64, ir.DataType.INT32):
        raise Reject("nonpad_kv_seqlen is not int32/int64")
    scale_attr = n.attributes.get("scale")
    scale = None if scale_attr is None else float(scale_attr.value)
    mask_kind = "" if mask is None else ("bool" if dtype_of(mask, shapes) == ir.DataType.BOOL else "additive")
    return Plan(three_d, q_heads, kv_heads, mask, nonpad, scale, 1 if is_causal else 0, softcap, mask_kind,
                pad_mask, mask_rank, dtype_of(mask, shapes) if mask is not None else None)


def _head_sizes(shapes: dict, q: ir.Value, v: ir.Value, q_heads: int | None, kv_heads: int | None):
    """(("D", D), ("Dv", Dv)) as far as the shapes give them: the last axis of 4-D Q / V, the hidden
    width over the head count in the 3-D form; None where not known."""
    def size(x, heads):
        last = shapes[x.name][-1]
        if heads is None:
            return last
        return last // heads if isinstance(last, int) and last % heads == 0 else None
    return (("D", size(q, q_heads)), ("Dv", size(v, kv_heads)))


def _pad_mask(new_nodes, mask: ir.Value, k: ir.Value, seq_axis: int, plan: Plan, name: str) -> ir.Value:
    """Pad(mask, last axis to K's length, False / -inf): ONNX Attention's rule for a short mask."""
    import numpy as np

    sk = emit.node(new_nodes, "Shape", [k], {"start": seq_axis, "end": seq_axis + 1}, f"{name}/key_len")
    lm = emit.node(new_nodes, "Shape", [mask], {"start": -1}, f"{name}/mask_len")
    diff = emit.node(new_nodes, "Sub", [sk, lm], name=f"{name}/missing")
    zeros = emit.node(new_nodes, "Constant", [], {"value": ir.tensor(np.zeros(2 * plan.mask_rank - 1, np.int64),
                                                                      name=f"{name}/zeros")}, f"{name}/zeros")
    pads = emit.node(new_nodes, "Concat", [zeros, diff], {"axis": 0}, f"{name}/pads")
    if plan.mask_dtype == ir.DataType.BOOL:
        fill = emit.node(new_nodes, "Constant", [], {"value": ir.tensor(np.array(False), name=f"{name}/fill")},
                         f"{name}/fill")
    else:
        fill = emit.constant(new_nodes, -np.inf, plan.mask_dtype, f"{name}/fill")
    return emit.node(new_nodes, "Pad", [mask, pads, fill], {"mode": "constant"}, name)


def rewrite(graph: ir.Graph, match: Match, plan: Plan, shapes: dict) -> ir.Node:
    n = match.node
    base = n.name or "Attention"
    new_nodes: list[ir.Node] = []
    q, k, v = n.inputs[0], n.inputs[1], n.inputs[2]
    y_old = n.outputs[0]
    mask = plan.mask
    if plan.pad_mask:
        mask = _pad_mask(new_nodes, mask, n.inputs[1], 1 if plan.three_d else 2, plan, f"{base}/mask_pad")
    fused = emit.fused_attention(new_nodes, q, k, v, mask, plan.key_lengths, scale=plan.scale,
                                 is_causal=plan.is_causal, softcap=plan.softcap, name=f"{base}/FusedAttention",
                                 like=y_old, heads=(plan.q_heads, plan.kv_heads) if plan.three_d else None)
    y = fused.outputs[0]
    graph.insert_before(n, new_nodes)
    emit.replace_output(graph, y_old, y)
    emit.remove_dead(graph, [n])
    return fused


def details(match: Match, plan: Plan) -> dict:
    return {
        "scale": plan.scale,
        "is_causal": plan.is_causal,
        "softcap": plan.softcap,
        "masks": [plan.mask_kind] if plan.mask_kind else [],
        "key_lengths": plan.key_lengths is not None,
        "three_d": plan.three_d,
        "mask_padded": plan.pad_mask,
    }
