"""Random inputs for a model, generated from its input specs.

Dynamic dimensions come from ``--shape name:1x128`` arguments (whole input shapes) or
``--shape dim_name=128`` (one symbolic dimension everywhere). Integer inputs that index an
embedding table (through Gather) stay inside the table; attention-mask inputs get ones with
random trailing padding (at least one key kept per row); position ids count up.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx
from onnx import TensorProto, helper

DEFAULT_BATCH = 2
DEFAULT_DIM = 16

# Ops that pass integer indices through unchanged in value.
_INDEX_PASSTHROUGH = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand"}


def add_input_arguments(parser, purpose: str = "the generated inputs") -> None:
    """The --shape and --seed options every command that generates inputs takes (parse the
    --shape values with parse_shape_args)."""
    parser.add_argument("--shape", action="append", default=[], metavar="NAME:D0xD1|DIM=N",
                        help=f"shape of an input (input_ids:1x128) or a symbolic dim (seq=128) for {purpose}; "
                             "repeatable")
    parser.add_argument("--seed", type=int, default=0, help=f"seed of {purpose}")


def parse_shape_args(items: Iterable[str] | None) -> dict:
    """['input_ids:1x128', 'seq=128'] -> {'input_ids': (1, 128), 'seq': 128}."""
    shapes: dict = {}
    for item in items or ():
        if ":" in item:
            name, dims = item.rsplit(":", 1)
            try:
                shapes[name] = tuple(int(d) for d in dims.lower().split("x")) if dims else ()
            except ValueError:
                raise ValueError(f"--shape {item!r}: expected NAME:D0xD1x... with integer dims") from None
        elif "=" in item:
            name, value = item.split("=", 1)
            try:
                shapes[name] = int(value)
            except ValueError:
                raise ValueError(f"--shape {item!r}: expected DIM_NAME=INT") from None
        else:
            raise ValueError(f"--shape {item!r}: expected NAME:D0xD1x... or DIM_NAME=INT")
    return shapes


def _initializer_shapes(graph: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    shapes = {init.name: tuple(init.dims) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            shapes[node.output[0]] = tuple(node.attribute[0].t.dims)
    return shapes


def _index_bound(graph: onnx.GraphProto, name: str) -> int | None:
    """The size of the embedding table that `name` indexes through Gather, if any."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for inp in node.input:
            consumers.setdefault(inp, []).append(node)
    tables = _initializer_shapes(graph)
    frontier, seen, bounds = [name], set(), []
    while frontier:
        value = frontier.pop()
        if value in seen:
            continue
        seen.add(value)
        for node in consumers.get(value, []):
            if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == value:
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                shape = tables.get(node.input[0])
                if shape:
                    bounds.append(shape[axis])
            elif node.op_type in _INDEX_PASSTHROUGH and node.input[0] == value:
                frontier.extend(node.output)
    return min(bounds) if bounds else None


def _resolve_shape(vi: onnx.ValueInfoProto, shapes: dict) -> tuple[int, ...]:
    if vi.name in shapes and isinstance(shapes[vi.name], tuple):
        return shapes[vi.name]
    dims = []
    for i, d in enumerate(vi.type.tensor_type.shape.dim):
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(d.dim_value)
        elif d.dim_param and isinstance(shapes.get(d.dim_param), int):
            dims.append(shapes[d.dim_param])
        else:
            dims.append(DEFAULT_BATCH if i == 0 else DEFAULT_DIM)
    return tuple(dims)


def _is_mask_name(name: str) -> bool:
    lowered = name.lower()
    return "mask" in lowered and "head_mask" not in lowered


def generate_inputs(model: onnx.ModelProto, shapes: dict | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """Random feeds for every graph input that is not an initializer."""
    shapes = shapes or {}
    rng = np.random.default_rng(seed)
    graph = model.graph
    initializers = {init.name for init in graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for vi in graph.input:
        if vi.name in initializers:
            continue
        elem = vi.type.tensor_type.elem_type
        if elem == TensorProto.UNDEFINED:
            raise ValueError(f"input {vi.name!r} is not a tensor; opsfuse generates tensor inputs only")
        shape = _resolve_shape(vi, shapes)
        np_dtype = helper.tensor_dtype_to_np_dtype(elem)
        if elem in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16):
            feeds[vi.name] = rng.standard_normal(shape).astype(np_dtype)
        elif _is_mask_name(vi.name) and len(shape) >= 2:
            # Ones with random trailing padding; every row keeps at least one position.
            mask = np.ones(shape, dtype=np.int64)
            lengths = rng.integers(max(1, shape[-1] // 2), shape[-1] + 1, size=shape[0])
            lengths[0] = shape[-1]
            for b, n in enumerate(lengths):
                mask[b, ..., n:] = 0
            feeds[vi.name] = mask.astype(np_dtype)
        elif elem == TensorProto.BOOL:
            feeds[vi.name] = rng.random(shape) < 0.8
        elif "position" in vi.name.lower() and len(shape) >= 1:
            feeds[vi.name] = np.broadcast_to(np.arange(shape[-1]), shape).astype(np_dtype).copy()
        else:
            bound = _index_bound(graph, vi.name) or 2
            feeds[vi.name] = rng.integers(0, bound, size=shape).astype(np_dtype)
    return feeds
