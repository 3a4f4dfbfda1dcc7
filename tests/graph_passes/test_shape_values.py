"""shape_values: Reshape targets computed from other values' shapes (the dynamo exporter's
decomposed SDPA builds K^T that way), read back where the symbolic inference loses them."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from opsfuse.graph_passes.shape_info import ShapeMap, infer_shapes
from opsfuse.graph_passes.shape_values import refine_reshapes

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _ints(name, values):
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def _shape_map(items: dict) -> ShapeMap:
    shapes = ShapeMap()
    shapes.update(items)
    return shapes


def decomposed_k_transpose(with_mask: bool = True) -> onnx.ModelProto:
    """Q.K^T as torch.onnx's dynamo exporter writes it for SDPA: K (B, 4, S, 8) viewed as (-1, S, 8),
    transposed, viewed back with a target sliced from Shape(K) ((B, 4) + (8,) + (S,)), scaled, then
    the product and a (B, 1, 1, S) mask added."""
    nodes = [
        helper.make_node("Shape", ["K"], ["shp"]),
        helper.make_node("Slice", ["shp", "i64min", "m2"], ["bh"]),
        helper.make_node("Slice", ["shp", "m1", "i64max"], ["d"]),
        helper.make_node("Slice", ["shp", "m2", "m1"], ["s"]),
        helper.make_node("Concat", ["m1", "s", "d"], ["t3"], axis=0),
        helper.make_node("Reshape", ["K", "t3"], ["k3"]),
        helper.make_node("Transpose", ["k3"], ["k3t"], perm=[0, 2, 1]),
        helper.make_node("Concat", ["bh", "d", "s"], ["t4"], axis=0),
        helper.make_node("Reshape", ["k3t", "t4"], ["kt"]),
        helper.make_node("Mul", ["kt", "scale"], ["kts"]),
        helper.make_node("MatMul", ["Q", "kts"], ["scores"]),
    ]
    inputs = [helper.make_tensor_value_info("Q", TensorProto.FLOAT, ["B", 4, "S", 8]),
              helper.make_tensor_value_info("K", TensorProto.FLOAT, ["B", 4, "S", 8])]
    out = "scores"
    if with_mask:
        nodes.append(helper.make_node("Add", ["scores", "mask"], ["masked"]))
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["B", 1, 1, "S"]))
        out = "masked"
    inits = [_ints("i64min", [INT64_MIN]), _ints("i64max", [INT64_MAX]), _ints("m1", [-1]), _ints("m2", [-2]),
             numpy_helper.from_array(np.array(0.35, dtype=np.float32), "scale")]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_k_transpose_and_masked_scores_get_their_dims():
    """The dims as ONNX Runtime's symbolic inference left them in X-MOD's dynamo SDPA export
    (session 41: the heads of K^T made up, the masked scores' batch and keys too) are filled in."""
    model = ir.from_proto(decomposed_k_transpose())
    shapes = _shape_map({"Q": ("B", 4, "S", 8), "K": ("B", 4, "S", 8), "mask": ("B", 1, 1, "S"), "scale": (),
                         "kt": ("B", "unk__3", 8, "S"), "kts": ("B", "unk__3", 8, "S"),
                         "scores": ("B", 4, "S", "S"), "masked": ("unk__7", 4, "S", "unk__9")})
    assert refine_reshapes(model, shapes) == 5  # k3 (-1 -> None: B is left over), k3t, kt, kts, masked
    assert shapes["k3"] == (None, "S", 8) and shapes["k3t"] == (None, 8, "S")
    assert shapes["kt"] == shapes["kts"] == ("B", 4, 8, "S")
    assert shapes["masked"] == ("B", 4, "S", "S")


def test_infer_shapes_gives_the_k_transpose_its_dims():
    shapes = infer_shapes(ir.from_proto(decomposed_k_transpose()))
    assert shapes["kt"] == ("B", 4, 8, "S")
    assert shapes["kts"] == ("B", 4, 8, "S")  # the scale multiplied in keeps the shape
    assert shapes["scores"][:2] == ("B", 4) and shapes["scores"][3] == "S"
    assert shapes["masked"] == shapes["scores"]  # the (B, 1, 1, S) mask does not grow the scores


def test_a_known_dim_is_never_replaced():
    model = ir.from_proto(decomposed_k_transpose(with_mask=False))
    shapes = _shape_map({"K": ("B", 4, "S", 8), "kt": (2, None, 8, "unk__3")})
    refine_reshapes(model, shapes)
    assert shapes["kt"] == (2, 4, 8, "S")  # 2 stays; the unknown and the made-up dims are filled


@pytest.mark.parametrize("a,b,expect", [(("B", 4, "S", "S"), ("B", 1, 1, "S"), ("B", 4, "S", "S")),
                                        (("B", 4, "S", "S"), ("C", 1, 1, "S"), (None, 4, "S", "S")),
                                        (("B", 4, "S", "S"), (5, "S"), ("B", 4, None, "S")),
                                        (("B", 4, "S", "S"), (), ("B", 4, "S", "S"))])
def test_broadcast_only_where_provable(a, b, expect):
    assert _binary_op_shape("Add", a, b) == expect


def _binary_op_shape(op: str, a: tuple, b: tuple):
    """The shape refine_reshapes gives y = op(a, b), from a and b's shapes alone."""
    graph = helper.make_graph([helper.make_node(op, ["a", "b"], ["y"])], "g",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a)),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, list(b))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    shapes = _shape_map({"a": a, "b": b})
    refine_reshapes(model, shapes)
    return shapes.get("y")


def test_weights_are_not_read():
    """A large integer initializer (not a shape tensor) is never evaluated."""
    from opsfuse.graph_passes import shape_values

    big = ir.Value(name="w", const_value=ir.tensor(np.arange(1000, dtype=np.int64)))
    assert shape_values._constant(big) is None
    small = ir.Value(name="t", const_value=ir.tensor(np.array([2, -1, 8], dtype=np.int64)))
    assert shape_values._constant(small) == [2, -1, 8]


def test_an_overridable_initializer_is_not_a_constant():
    """An initializer that is also a graph input can be fed another value at run time: its stored
    value proves nothing about the Reshape target it feeds."""
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "target"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 4, 8]),
                               helper.make_tensor_value_info("target", TensorProto.INT64, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [_ints("target", [2, 4, 8])])
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    shapes = _shape_map({"x": ("B", 4, 8)})
    assert refine_reshapes(model, shapes) == 0 and "y" not in shapes
    model.graph.inputs.pop()  # the same initializer, no longer overridable
    assert refine_reshapes(model, shapes) == 1 and shapes["y"] == (2, 4, 8)


def heads_view(names: tuple = ("X", "X"), d: int = 8) -> onnx.ModelProto:
    """Q.K^T as TorchScript exports SEW's attention: each of Q, K (B, S, 32) viewed as
    (Shape(src)[0], Shape(src)[1], -1, d), transposed to heads first (K to (B, H, d, S)), then the
    product. `names` are the tensors whose Shape gives the first two dims of Q's and K's targets."""
    nodes, inits = [], [_ints("zero", [0]), _ints("m1", [-1]), _ints("d", [d])]
    for t, src, perm in (("q", names[0], [0, 2, 1, 3]), ("k", names[1], [0, 2, 3, 1])):
        nodes += [helper.make_node("Shape", [src], [f"{t}_shp"]),
                  helper.make_node("Gather", [f"{t}_shp", "i0"], [f"{t}_b"], axis=0),
                  helper.make_node("Gather", [f"{t}_shp", "i1"], [f"{t}_s"], axis=0),
                  helper.make_node("Unsqueeze", [f"{t}_b", "zero"], [f"{t}_b1"]),
                  helper.make_node("Unsqueeze", [f"{t}_s", "zero"], [f"{t}_s1"]),
                  helper.make_node("Concat", [f"{t}_b1", f"{t}_s1", "m1", "d"], [f"{t}_target"], axis=0),
                  helper.make_node("Reshape", [t.upper(), f"{t}_target"], [f"{t}4"]),
                  helper.make_node("Transpose", [f"{t}4"], [f"{t}h"], perm=perm)]
    nodes.append(helper.make_node("MatMul", ["qh", "kh"], ["scores"]))
    inits += [numpy_helper.from_array(np.array(0, dtype=np.int64), "i0"),
              numpy_helper.from_array(np.array(1, dtype=np.int64), "i1")]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("Q", "K", "X", "Y")]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("scores", TensorProto.FLOAT, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_a_minus_one_target_dim_is_the_input_size_over_the_others():
    """SEW's TorchScript export (session 42): the heads dim of Q and K is a -1 in the view, which the
    symbolic inference made up separately for each; it is 32 / 8 = 4, and the transposes and the
    product carry it to the scores."""
    model = ir.from_proto(heads_view())
    shapes = _shape_map({"X": ("B", "S", 32), "Q": ("B", "S", 32), "K": ("B", "S", 32),
                         "q4": ("B", "S", "unk__1", 8), "qh": ("B", "unk__1", "S", 8),
                         "k4": ("B", "S", "unk__2", 8), "kh": ("B", "unk__2", 8, "S"),
                         "scores": ("B", "unk__3", "S", "S")})
    refine_reshapes(model, shapes)
    assert shapes["q4"] == shapes["k4"] == ("B", "S", 4, 8)
    assert shapes["qh"] == ("B", 4, "S", 8) and shapes["kh"] == ("B", 4, 8, "S")
    assert shapes["scores"] == ("B", 4, "S", "S")


@pytest.mark.parametrize("x,q", [
    (("C", "S", 32), ("B", "S", 32)),  # Q's target reads another tensor's batch (C), Q has B
    (("B", "S", 32), ("B", "S", None)),  # Q's size unknown
    (("B", "S", 32), ("B", "S", 36)),  # 36 / 8 is not whole
])
def test_a_minus_one_dim_is_left_unknown_where_it_is_not_provable(x, q):
    model = ir.from_proto(heads_view(names=("X", "K")))
    shapes = _shape_map({"X": x, "Q": q, "K": ("B", "S", 32)})
    refine_reshapes(model, shapes)
    assert shapes["q4"][2] is None
    assert shapes["k4"] == ("B", "S", 4, 8)  # K's own target cancels
    assert shapes["scores"][1] is None  # heads: 4 against an unknown, not provably equal


@pytest.mark.parametrize("a,b,expect", [(("B", 4, "S", 8), ("B", 4, 8, "T"), ("B", 4, "S", "T")),
                                        (("B", 4, "S", 8), (1, 4, 8, "T"), ("B", 4, "S", "T")),
                                        (("B", 4, "S", 8), ("C", 4, 8, "T"), (None, 4, "S", "T")),
                                        (("S", 8), (4, 8, "T"), (4, "S", "T"))])
def test_matmul_batch_dims_broadcast_only_where_provable(a, b, expect):
    assert _binary_op_shape("MatMul", a, b) == expect
