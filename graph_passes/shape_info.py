"""Symbolic shapes of every value, so the rules can prove ranks, broadcasting and head layouts.

Exporters often leave intermediate shapes out (the TorchScript exporter writes none), so the pass
runs ONNX Runtime's symbolic shape inference (which follows Shape -> Gather -> Concat -> Reshape
chains and keeps named dims such as ``batch`` and ``seq``) on a copy of the graph whose large
weights are replaced by typed graph inputs: the weights' bytes are never copied, which keeps the
memory of a multi-GB model flat. When that inference fails, ``onnx.shape_inference`` (with data
propagation) is tried, and shapes already in the model (value_info) fill the gaps.

A shape is a tuple whose items are an int (static), a str (a symbolic dim: two equal strings are
the same size) or None (unknown). Absent from the map = rank unknown.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
import warnings

import onnx
import onnx_ir as ir

Shape = tuple  # of int | str | None

_INLINE_LIMIT = 1024  # elements: initializers up to this size stay (shape tensors, scales)

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _scratch_working_dir():
    """The process's working directory is a temporary folder for the duration (then removed)."""
    previous = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="opsfuse_shapes_") as scratch:
        os.chdir(scratch)
        try:
            yield
        finally:
            os.chdir(previous)


def _dims_of(type_proto: onnx.TypeProto) -> Shape | None:
    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return None
    dims = []
    for d in type_proto.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return tuple(dims)


def _ir_shape(value: ir.Value) -> Shape | None:
    shape = value.shape
    if shape is None:
        if value.const_value is not None:
            return tuple(int(d) for d in value.const_value.shape)
        return None
    dims = []
    for d in shape:
        if isinstance(d, int):
            dims.append(d)
        elif isinstance(d, ir.SymbolicDim) and d.value is not None:
            dims.append(str(d.value))
        else:
            dims.append(None)
    return tuple(dims)


def _light_proto(model: ir.Model) -> onnx.ModelProto:
    """The main graph as a ModelProto with large initializers turned into typed inputs."""
    graph = model.graph
    gp = onnx.GraphProto(name=graph.name or "main")
    for node in graph:
        gp.node.append(ir.serde.serialize_node(node))
    names = set()
    for value in graph.inputs:
        gp.input.append(ir.serde.serialize_value(value))
        names.add(value.name)
    for value in graph.initializers.values():
        tensor = value.const_value
        if tensor is None:
            continue
        if tensor.size <= _INLINE_LIMIT:
            if isinstance(tensor, ir.ExternalTensor):  # small: read it, so the copy stands alone
                tensor = ir.Tensor(tensor.numpy(), dtype=tensor.dtype, name=value.name)
            gp.initializer.append(ir.serde.serialize_tensor(tensor))
            gp.initializer[-1].name = value.name
        elif value.name not in names:
            gp.input.append(
                onnx.helper.make_tensor_value_info(value.name, int(tensor.dtype), [int(d) for d in tensor.shape])
            )
    for value in graph.outputs:
        gp.output.append(ir.serde.serialize_value(value))
    mp = onnx.helper.make_model(
        gp, opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in model.opset_imports.items()]
    )
    mp.ir_version = model.ir_version
    for func in model.functions.values():
        mp.functions.append(ir.serde.serialize_function(func))
    return mp


# Integer ops whose constant-only instances are folded before the inference (TorchScript computes
# shape pieces as e.g. Mod(-1, 3) + 1, which the symbolic inference does not evaluate, and loses
# every shape downstream of the Reshape they feed).
_FOLDABLE = {"Mod", "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Min", "Max", "Reshape", "Unsqueeze", "Squeeze",
             "Concat", "Gather", "Cast", "Slice", "Range", "Equal", "Less", "Greater", "Not", "Where", "Identity"}
_FOLD_TYPES = {onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.BOOL}


def _fold_integer_constants(proto: onnx.ModelProto) -> int:
    """Replaces, in place, each node of _FOLDABLE whose inputs are all small constants and whose
    outputs are integer or bool tensors by Constant nodes of its values; returns how many."""
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    graph = proto.graph
    inputs = {x.name for x in graph.input}  # overridable at run time: not constants
    known = {i.name: numpy_helper.to_array(i) for i in graph.initializer if i.name not in inputs}
    folded = 0
    nodes = list(graph.node)
    del graph.node[:]
    for node in nodes:
        if node.op_type == "Constant" and not node.domain:
            attr = next((a for a in node.attribute if a.name == "value"), None)
            if attr is not None:
                known[node.output[0]] = numpy_helper.to_array(attr.t)
        elif (not node.domain and node.op_type in _FOLDABLE and len(node.output) == 1
              and all(not i or i in known for i in node.input)):
            try:
                args = [onnx.helper.make_tensor_value_info(i, onnx.helper.np_dtype_to_tensor_dtype(known[i].dtype),
                                                           known[i].shape) for i in node.input if i]
                sub = onnx.helper.make_model(
                    onnx.helper.make_graph([node], "fold", args,
                                           [onnx.helper.make_tensor_value_info(node.output[0], 0, None)]),
                    opset_imports=list(proto.opset_import))
                value = ReferenceEvaluator(sub).run(None, {i: known[i] for i in node.input if i})[0]
            except Exception:  # anything the reference cannot evaluate stays as it is
                value = None
            if (value is not None and value.size <= _INLINE_LIMIT
                    and onnx.helper.np_dtype_to_tensor_dtype(value.dtype) in _FOLD_TYPES):
                known[node.output[0]] = value
                graph.node.append(onnx.helper.make_node(
                    "Constant", [], [node.output[0]], name=node.name,
                    value=numpy_helper.from_array(value, node.output[0])))
                folded += 1
                continue
        graph.node.append(node)
    return folded


class ShapeMap(dict):
    """{value name: shape}, plus ``dtypes``: {value name: ir.DataType} from the same inference."""

    def __init__(self):
        super().__init__()
        self.dtypes: dict[str, ir.DataType] = {}


def _collect(proto: onnx.ModelProto, dtypes: dict) -> dict[str, Shape]:
    out: dict[str, Shape] = {}
    g = proto.graph
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        dims = _dims_of(vi.type)
        if dims is not None:
            out[vi.name] = dims
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            dtypes.setdefault(vi.name, ir.DataType(vi.type.tensor_type.elem_type))
    for init in g.initializer:
        out[init.name] = tuple(int(d) for d in init.dims)
        dtypes.setdefault(init.name, ir.DataType(init.data_type))
    return out


def weak_dim(d) -> bool:
    """True for a dim that proves nothing: unknown, or a fresh symbol the inference made up (``unk__N``)."""
    return d is None or (isinstance(d, str) and d.startswith("unk__"))


def _weaker(new, old) -> bool:
    """True when the inferred dim `new` says less than the dim `old` already in the model."""
    return old is not None and weak_dim(new)


def infer_shapes(model: ir.Model) -> ShapeMap:
    """{value name: shape} for the main graph (best effort: missing names have unknown rank)."""
    shapes = ShapeMap()
    values = list(model.graph.inputs) + list(model.graph.initializers.values())
    values += [v for node in model.graph for v in node.outputs]
    for value in values:
        s = _ir_shape(value)
        if s is not None:
            shapes[value.name] = s
        if value.type is not None:
            try:
                shapes.dtypes[value.name] = value.dtype
            except Exception:
                pass
        elif value.const_value is not None:
            shapes.dtypes[value.name] = value.const_value.dtype
    light = _light_proto(model)
    try:
        log.debug("folded %d constant integer nodes before shape inference", _fold_integer_constants(light))
    except Exception as exc:  # folding is only a help to the inference
        log.debug("constant folding before shape inference failed: %s", exc)
    inferred = None
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        # It prints its complaints; keep them off the user's terminal. It also saves temporary
        # models (sym_shape_infer_temp.onnx, uuid-named .data files) into the working directory:
        # run it in a scratch one so nothing is left in the user's.
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()), _scratch_working_dir():
            warnings.simplefilter("ignore")
            for merge in (False, True):
                try:
                    inferred = SymbolicShapeInference.infer_shapes(
                        light, auto_merge=merge, guess_output_rank=False, verbose=0
                    )
                    break
                except Exception as exc:  # an op it does not know, or conflicting dims
                    log.debug("symbolic shape inference (auto_merge=%s) failed: %s", merge, exc)
    except ImportError:
        pass
    if inferred is None:
        from .. import schema

        schema.register()  # a model that already holds FusedAttention nodes
        try:
            inferred = onnx.shape_inference.infer_shapes(light, data_prop=True)
        except Exception as exc:
            log.debug("onnx shape inference failed: %s", exc)
    if inferred is not None:
        for name, s in _collect(inferred, shapes.dtypes).items():
            old = shapes.get(name)
            if old is None or len(old) != len(s):
                shapes[name] = s
            else:  # keep the better-known dim of each axis
                shapes[name] = tuple(o if _weaker(n, o) else n for n, o in zip(s, old))
    from .shape_values import refine_reshapes

    try:
        log.debug("refined %d values from the Reshape targets the graph computes", refine_reshapes(model, shapes))
    except Exception as exc:  # a help to the rules, never a reason to fail
        log.debug("refining Reshape targets failed: %s", exc)
    return shapes


def rank(shapes: dict[str, Shape], value: ir.Value | None) -> int | None:
    if value is None:
        return None
    s = shapes.get(value.name)
    return None if s is None else len(s)


def same_dim(a, b) -> bool:
    """True when both dims are known and provably equal."""
    return a is not None and b is not None and a == b


def same_shape(a: Shape | None, b: Shape | None) -> bool:
    """True when both shapes are known, of one rank, and provably equal dim for dim."""
    return a is not None and b is not None and len(a) == len(b) and all(same_dim(x, y) for x, y in zip(a, b))


def dim(shapes: dict[str, Shape], value: ir.Value, axis: int):
    s = shapes.get(value.name)
    if s is None:
        return None
    return s[axis]
