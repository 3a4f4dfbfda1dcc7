"""The rewrite pipeline: every rule, in order, over every candidate; returns {pass name: count}."""

from __future__ import annotations

import time

import onnx
import onnx_ir as ir

from .. import contract
from . import einsum_form, mask_broadcast, mask_index, onnx_attention, sdpa_subgraph
from . import pack_qkv as pack_rule
from .report import Candidate, Report
from .sdpa_subgraph import Reject
from .shape_info import infer_shapes

# Each rule module has NAME, is_candidate(node), pattern(node) -> match, check(match, shapes,
# opset) -> plan, rewrite(graph, match, plan, shapes) -> fused node, details(match, plan).
PASSES = (onnx_attention, sdpa_subgraph)


def _opset(model: ir.Model) -> int:
    for domain in ("", "ai.onnx"):
        if domain in model.opset_imports:
            return int(model.opset_imports[domain])
    return 1


def run_pipeline(model: ir.Model, report: Report | None = None, passes=PASSES, *,
                 pack_qkv: bool = False) -> dict[str, int]:
    """Rewrites `model` (onnx-ir, in place); returns {pass name: fused count}. Fills `report`.

    pack_qkv: also give the fused 3-D nodes one packed Q/K/V projection where they read three of
    one tensor (``pack_qkv.py``; not bit-exact, so off by default); its count is under "pack_qkv"."""
    report = report if report is not None else Report()
    start = time.perf_counter()
    graph = model.graph
    opset = _opset(model)
    softmaxes = [n for n in graph if n.op_type == "Softmax" and n.domain in ("", "ai.onnx")]
    if not softmaxes and not any(onnx_attention.is_candidate(n) for n in graph):
        report.counts.update({p.NAME: 0 for p in passes})
        if pack_qkv:
            report.counts[pack_rule.NAME] = 0
        report.seconds = time.perf_counter() - start
        return dict(report.counts)
    # Attention written as Einsum: its products as MatMuls for the rules to prove (before the shapes,
    # so that the new values have theirs); put back below wherever no rule fused it.
    lowered, not_lowered = {}, {}
    for n in softmaxes:
        if sdpa_subgraph.einsum_attention(n):
            form = einsum_form.lower(graph, n)
            if isinstance(form, str):
                not_lowered[id(n)] = form
            else:
                lowered[id(n)] = (n, form)
    shapes = infer_shapes(model)
    fused_nodes: list[ir.Node] = []
    for rule in passes:
        count = 0
        for node in list(graph):
            if node.graph is not graph or not rule.is_candidate(node):
                continue
            cand = Candidate(rule=rule.NAME, nodes=[node.name or node.op_type])
            report.candidates.append(cand)
            try:
                match = rule.pattern(node)
                cand.nodes = match.where
                plan = rule.check(match, shapes, opset)
                fused = rule.rewrite(graph, match, plan, shapes)
            except Reject as exc:
                cand.reason = str(exc)
                if exc.nodes:
                    cand.nodes = list(exc.nodes)
                continue
            fused_nodes.append(fused)
            cand.fused = True
            cand.fused_node = fused.name
            cand.details = rule.details(match, plan)
            count += 1
        report.counts[rule.NAME] = count
    for softmax, form in lowered.values():
        if softmax.graph is graph:  # no rule fused it
            einsum_form.restore(graph, form)
    # Masks materialized at the scores' size by the export: the fused nodes read the small tensor.
    smaller = mask_broadcast.run(graph, fused_nodes, shapes)
    for cand in report.candidates:
        if cand.fused:
            cand.details["mask_unbroadcast"] = smaller.get(cand.fused_node, "")
    # The padding mask's exported index arithmetic (attention_mask[batch_idx, kv_idx]) becomes one
    # Unsqueeze where every index is proven to be the identity.
    indexed = mask_index.run(graph, fused_nodes, shapes, opset)
    for cand in report.candidates:
        if cand.fused:
            cand.details.update(indexed.get(cand.fused_node, {"mask_index": "", "mask_index_why_not": "",
                                                                "mask_index_sliced": ""}))
    if pack_qkv:
        # Last: it replaces the projections the fused nodes read (the shapes map does not know the
        # packed tensor, and nothing after this needs it).
        packed = pack_rule.run(graph, fused_nodes, shapes, opset)
        for cand in report.candidates:
            if cand.fused and cand.fused_node in packed:
                cand.details.update(packed[cand.fused_node])
        report.counts[pack_rule.NAME] = sum(d["packed_qkv"] for d in packed.values())
    taken = {id(n) for n in softmaxes if n.graph is not graph}
    report.other_softmax = []
    for n in softmaxes:
        if id(n) in taken or id(n) in lowered or n.graph is not graph or sdpa_subgraph.is_candidate(n):
            continue  # (a lowered one was a candidate of the MatMul rule, with its reason)
        if id(n) in not_lowered:  # attention written as Einsum that no rule takes: left alone, with why
            report.candidates.append(Candidate(rule=sdpa_subgraph.NAME, nodes=[n.name or "Softmax"],
                                               reason=not_lowered[id(n)]))
        else:
            report.other_softmax.append(n.name or "Softmax")
    if report.fused:
        model.opset_imports[contract.DOMAIN] = contract.OP_VERSION
    report.seconds = time.perf_counter() - start
    return dict(report.counts)


def fuse_attention(model, *, pack_qkv: bool = False):
    """Fuses every provable attention subgraph into com.opsfuse::FusedAttention.

    pack_qkv=True: where a fused node reads three projections MatMul(X, W) [+ b] of one X, one
    MatMul on the concatenated weights feeds it as Q, K and V (``packed_qkv`` = 1), and the
    concatenated biases are its ``qkv_bias`` input (no Add). Not bit-exact (a GEMM of another
    shape may round differently); the default rewrite is.

    `model` is an ``onnx.ModelProto`` (a rewritten copy is returned; the argument is not changed)
    or an ``onnx_ir.Model`` (rewritten in place and returned). Returns ``(model, report)``.
    """
    report = Report()
    if isinstance(model, onnx.ModelProto):
        ir_model = ir.serde.deserialize_model(model)
        # deserialize_model shares nothing mutable with the proto, but its tensors may view the
        # proto's bytes: serialize before the caller can change them.
        run_pipeline(ir_model, report, pack_qkv=pack_qkv)
        return ir.serde.serialize_model(ir_model), report
    if isinstance(model, ir.Model):
        run_pipeline(model, report, pack_qkv=pack_qkv)
        return model, report
    raise TypeError(f"fuse_attention takes an onnx.ModelProto or an onnx_ir.Model, got {type(model).__name__}")
