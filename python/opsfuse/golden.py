"""Golden outputs for a whole model: every ``com.opsfuse::FusedAttention`` node is computed by the
Triton kernel (:mod:`opsfuse.triton_attention`), the rest of the graph by a standard runtime.

The rest of the graph runs in ONNX Runtime, without the opsfuse library: the graph is cut at the
FusedAttention nodes and run in stages. Each stage is a plain ONNX model (no custom op left in it)
that computes the inputs of the attention nodes that are ready, plus the values later stages need;
Triton then computes those nodes, and their outputs feed the next stage. This handles every
standard op ONNX Runtime supports, and each node runs once. (``onnx.reference.ReferenceEvaluator``
with a custom op was tried: it is slow and fails on ops of real exported models.)

Inputs and outputs use Polygraphy's formats: inputs are a list of feed dicts saved with
``polygraphy.json.save_json`` (``polygraphy run --load-inputs`` reads them), outputs a
``polygraphy.comparator.RunResults`` (``polygraphy run --load-outputs`` reads it).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from . import contract

GOLDEN_RUNNER_NAME = "triton-golden"
# Read by TensorRT's ONNX parser to find the plugin; no effect on the op's arithmetic.
_TRT_PARSER_ATTRIBUTES = {"plugin_version", "plugin_namespace"}

Feeds = dict[str, np.ndarray]


# --- FusedAttention nodes ------------------------------------------------------------------------


def is_fused_attention(node: onnx.NodeProto) -> bool:
    return node.op_type == contract.OP_NAME and node.domain == contract.DOMAIN


def node_label(node: onnx.NodeProto, index: int | None = None) -> str:
    """How a node is named in messages: its name, or its position and output when unnamed."""
    if node.name:
        return node.name
    where = f"#{index} " if index is not None else ""
    return f"{contract.OP_NAME} node {where}(output {node.output[0]!r})"


def fused_attention_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The FusedAttention nodes of the main graph, in graph order. Raises when one sits inside a
    subgraph (If/Loop/Scan), which the golden runner does not handle."""
    for node in model.graph.node:
        for sub in _subgraphs(node):
            if any(is_fused_attention(n) for n in _all_nodes(sub)):
                raise NotImplementedError(
                    f"{contract.OP_NAME} inside a subgraph of {node.op_type} node {node.name!r}: "
                    "the golden runner handles FusedAttention in the main graph only")
    return [n for n in model.graph.node if is_fused_attention(n)]


def node_attributes(node: onnx.NodeProto) -> dict:
    """scale (None = 1/sqrt(D)), is_causal, softcap, the head counts of the 3-D form
    (None = absent) and packed_qkv of a FusedAttention node."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    known = {contract.ATTR_SCALE, contract.ATTR_IS_CAUSAL, contract.ATTR_SOFTCAP, contract.ATTR_Q_NUM_HEADS,
             contract.ATTR_KV_NUM_HEADS, contract.ATTR_PACKED_QKV}
    unknown = sorted(set(attrs) - known - _TRT_PARSER_ATTRIBUTES)
    if unknown:
        raise ValueError(f"{contract.OP_NAME} node {node.name!r}: unknown attribute(s) {unknown}")
    return {
        "scale": float(attrs[contract.ATTR_SCALE]) if contract.ATTR_SCALE in attrs else None,
        "is_causal": int(attrs.get(contract.ATTR_IS_CAUSAL, contract.DEFAULT_IS_CAUSAL)),
        "softcap": float(attrs.get(contract.ATTR_SOFTCAP, contract.DEFAULT_SOFTCAP)),
        "q_num_heads": int(attrs[contract.ATTR_Q_NUM_HEADS]) if attrs.get(contract.ATTR_Q_NUM_HEADS) else None,
        "kv_num_heads": int(attrs[contract.ATTR_KV_NUM_HEADS]) if attrs.get(contract.ATTR_KV_NUM_HEADS) else None,
        "packed_qkv": int(attrs.get(contract.ATTR_PACKED_QKV, contract.DEFAULT_PACKED_QKV)),
    }


def run_fused_attention(node: onnx.NodeProto, inputs: Sequence[np.ndarray | None],
                        device=None) -> np.ndarray:
    """One FusedAttention node on numpy inputs (absent optional inputs as None), by Triton."""
    from . import triton_attention

    if len(inputs) < contract.NUM_REQUIRED_INPUTS or len(inputs) > contract.NUM_INPUTS:
        raise ValueError(f"{contract.OP_NAME} node {node.name!r}: {len(inputs)} inputs, expected "
                         f"{contract.NUM_REQUIRED_INPUTS} to {contract.NUM_INPUTS}")
    args = list(inputs) + [None] * (contract.NUM_INPUTS - len(inputs))
    q, k, v, mask, lengths, qkv_bias = args
    if q is None or k is None or v is None:
        raise ValueError(f"{contract.OP_NAME} node {node.name!r}: Q, K and V are required")
    attrs = node_attributes(node)
    try:
        return triton_attention.attention_numpy(q, k, v, mask, lengths, device=device, qkv_bias=qkv_bias, **attrs)
    except ValueError as e:
        raise ValueError(f"{e} (node {node.name!r})") from None


# --- graph helpers --------------------------------------------------------------------------------


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    subs = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            subs.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            subs.extend(a.graphs)
    return subs


def _all_nodes(graph: onnx.GraphProto) -> Iterable[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for sub in _subgraphs(node):
            yield from _all_nodes(sub)


def _node_deps(node: onnx.NodeProto) -> set[str]:
    """Every value a node reads: its inputs and the outer-scope names its subgraphs use."""
    deps = {i for i in node.input if i}
    for sub in _subgraphs(node):
        for inner in _all_nodes(sub):
            deps.update(i for i in inner.input if i)
    return deps


def _value_info(name: str, array: np.ndarray) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype),
                                         list(array.shape))


# --- runtime "ort": ONNX Runtime in stages cut at the FusedAttention nodes ------------------------


class _StagedOrtRunner:
    """Runs a model whose FusedAttention nodes are computed by a callback, the rest by ONNX
    Runtime (no custom op), in stages. See the module docstring."""

    def __init__(self, model: onnx.ModelProto, providers: Sequence[str] = ("CPUExecutionProvider",)):
        self.model = model
        self.providers = list(providers)
        self.graph = model.graph
        self.attention = fused_attention_nodes(model)
        self.initializers = {init.name: init for init in self.graph.initializer}
        self.output_types = {vi.name: vi for vi in list(self.graph.value_info) + list(self.graph.output)}
        self.producer = {o: node for node in self.graph.node for o in node.output if o}
        self.graph_inputs = {vi.name for vi in self.graph.input}

    def run(self, feeds: Feeds, compute_node: Callable[[onnx.NodeProto, list], np.ndarray]) -> "OrderedDict[str, np.ndarray]":
        known: dict[str, np.ndarray] = dict(feeds)
        pending = list(self.attention)
        while True:
            blocked = {o for n in pending for o in n.output if o}
            for node in self.graph.node:
                if not is_fused_attention(node) and _node_deps(node) & blocked:
                    blocked.update(o for o in node.output if o)
            ready = [n for n in pending if not ({i for i in n.input if i} & blocked)]
            if pending and not ready:
                raise RuntimeError(f"{contract.OP_NAME}: the graph's attention nodes depend on each other "
                                   "in a cycle; the graph is not topologically sortable")
            if pending:
                targets = [i for n in ready for i in n.input if i]
                # Values computable now that blocked nodes (or later attention nodes) read: hand
                # them to the next stage instead of recomputing them there.
                later_ids = {id(n) for n in pending} - {id(n) for n in ready}
                frontier = set()
                for node in self.graph.node:
                    later_attention = id(node) in later_ids
                    if later_attention or (not is_fused_attention(node) and node.output
                                           and node.output[0] in blocked):
                        frontier.update(d for d in _node_deps(node) if d not in blocked)
                frontier.update(o.name for o in self.graph.output if o.name not in blocked)
                # (Names local to a subgraph, in _node_deps, are no values of the main graph.)
                frontier = {f for f in frontier if f in self.producer}
                targets += sorted(frontier - set(self.initializers) - set(known))
            else:
                targets = [o.name for o in self.graph.output]
            known.update(self._run_stage(known, targets))
            if not pending:
                return OrderedDict((o.name, known[o.name]) for o in self.graph.output)
            for node in ready:
                args = [known[i] if i else None for i in node.input]
                known[node.output[0]] = compute_node(node, args)
            pending = [n for n in pending if all(n is not r for r in ready)]

    def _run_stage(self, known: dict, targets: Sequence[str]) -> dict[str, np.ndarray]:
        """Compute `targets` from the values in `known` with ONNX Runtime."""
        out: dict[str, np.ndarray] = {}
        to_compute = []
        for t in dict.fromkeys(targets):
            if t in known:
                continue
            if t in self.initializers:
                out[t] = numpy_helper.to_array(self.initializers[t])
            else:
                to_compute.append(t)
        if not to_compute:
            return out

        needed_nodes: list[onnx.NodeProto] = []
        seen_nodes: set[int] = set()
        used_inputs: set[str] = set()
        used_inits: set[str] = set()
        stack = list(to_compute)
        seen_values: set[str] = set()
        while stack:
            name = stack.pop()
            if name in seen_values:
                continue
            seen_values.add(name)
            if name in known:
                used_inputs.add(name)
                continue
            if name in self.initializers:
                used_inits.add(name)
                continue
            node = self.producer.get(name)
            if node is None:
                if name in self.graph_inputs:
                    raise ValueError(f"no value given for graph input {name!r}")
                continue  # an outer-scope name local to a subgraph
            if is_fused_attention(node):
                raise RuntimeError(f"internal error: {name!r} needs a {contract.OP_NAME} node not computed yet")
            if id(node) not in seen_nodes:
                seen_nodes.add(id(node))
                needed_nodes.append(node)
                stack.extend(_node_deps(node))
        order = {id(n): i for i, n in enumerate(self.graph.node)}
        needed_nodes.sort(key=lambda n: order[id(n)])

        graph = helper.make_graph(
            needed_nodes,
            f"{self.graph.name or 'graph'}_stage",
            inputs=[_value_info(n, known[n]) for n in sorted(used_inputs)],
            outputs=[self._output_info(t) for t in to_compute],
            initializer=[self.initializers[n] for n in sorted(used_inits)],
        )
        stage = helper.make_model(graph, opset_imports=[o for o in self.model.opset_import
                                                         if o.domain != contract.DOMAIN])
        stage.ir_version = self.model.ir_version
        stage.functions.extend(self.model.functions)
        session = _ort_session(stage, self.providers)
        results = session.run(to_compute, {n: known[n] for n in used_inputs})
        out.update(zip(to_compute, results))
        return out

    def _output_info(self, name: str) -> onnx.ValueInfoProto:
        vi = self.output_types.get(name)
        if vi is not None and vi.type.tensor_type.elem_type:
            info = onnx.ValueInfoProto()
            info.CopyFrom(vi)
            info.type.tensor_type.ClearField("shape")  # shapes of intermediate values may be stale
            return info
        return onnx.ValueInfoProto(name=name)  # ONNX Runtime infers the type


def _ort_session(model: onnx.ModelProto, providers: Sequence[str]):
    import onnxruntime as ort

    so = ort.SessionOptions()
    # Basic optimizations only (constant folding, redundant-node removal): no fusions that would
    # swap the graph's arithmetic for ONNX Runtime's own fused kernels.
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=list(providers))


# --- entry points ---------------------------------------------------------------------------------


def load_model(model: str | os.PathLike | onnx.ModelProto) -> onnx.ModelProto:
    return model if isinstance(model, onnx.ModelProto) else onnx.load(os.fspath(model))


def golden_outputs(
    model: str | os.PathLike | onnx.ModelProto,
    feeds_list: Sequence[Feeds],
    device=None,
    providers: Sequence[str] = ("CPUExecutionProvider",),
    node_callback: Callable[[onnx.NodeProto, list, np.ndarray], None] | None = None,
) -> list["OrderedDict[str, np.ndarray]"]:
    """The model's outputs for each feed dict, with FusedAttention computed by Triton.
    `node_callback(node, inputs, output)` sees every attention node's inputs and output;
    `providers` run the rest of the graph (ONNX Runtime's names)."""
    model = load_model(model)

    def compute(node, args):
        y = run_fused_attention(node, args, device)
        if node_callback is not None:
            node_callback(node, args, y)
        return y

    runner = _StagedOrtRunner(model, providers)
    return [runner.run(feeds, compute) for feeds in feeds_list]


def make_run_results(runner_name: str, outputs_list: Sequence[dict]):
    """A Polygraphy ``RunResults`` with one runner and one iteration per output dict."""
    from polygraphy.comparator import IterationResult, RunResults

    results = RunResults()
    results.append((runner_name, [IterationResult(OrderedDict(o), runner_name=runner_name)
                                  for o in outputs_list]))
    return results


def load_run_results(path: str | os.PathLike):
    from polygraphy.comparator import RunResults

    return RunResults.load(os.fspath(path))


def save_inputs(feeds_list: Sequence[Feeds], path: str | os.PathLike) -> None:
    """Polygraphy's input format: a JSON list of feed dicts (``polygraphy run --load-inputs``)."""
    from polygraphy.json import save_json

    save_json([dict(f) for f in feeds_list], os.fspath(path), description="input data")


def load_inputs(path: str | os.PathLike) -> list[Feeds]:
    """Feed dicts from a Polygraphy input file (a list of dicts, or one dict)."""
    from polygraphy.json import load_json

    data = load_json(os.fspath(path), description="input data")
    if isinstance(data, dict):
        data = [data]
    feeds_list = []
    for item in data:
        feeds_list.append({name: np.asarray(value) for name, value in dict(item).items()})
    return feeds_list


def prepare_inputs(model: onnx.ModelProto, inputs_path: str | None, shape_args: Sequence[str] | None,
                   seed: int = 0) -> list[Feeds]:
    """Feeds from `inputs_path` when given, else generated from the model's input specs."""
    if inputs_path:
        return load_inputs(inputs_path)
    from .model_inputs import generate_inputs, parse_shape_args

    return [generate_inputs(model, parse_shape_args(shape_args), seed=seed)]

