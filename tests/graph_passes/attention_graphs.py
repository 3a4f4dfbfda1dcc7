"""Small hand-built attention graphs, one knob per exporter variant, for the rewrite tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16


class G:
    """A tiny graph builder: g.op('MatMul', a, b) -> output name."""

    def __init__(self, opset: int = 17):
        self.nodes, self.inputs, self.outputs, self.inits, self.opset = [], [], [], [], opset
        self.n = 0

    def inp(self, name, elem, shape):
        self.inputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    def const(self, value, dtype=np.float32, name=None):
        self.n += 1
        name = name or f"c{self.n}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def constant_node(self, value, dtype=np.float32):
        self.n += 1
        out = f"k{self.n}"
        self.nodes.append(helper.make_node("Constant", [], [out], value=numpy_helper.from_array(np.asarray(value, dtype)),
                                           name=f"Constant_{self.n}"))
        return out

    def op(self, op_type, *inputs, n_out=1, name=None, **attrs):
        self.n += 1
        outs = [f"{op_type.lower()}{self.n}_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name or f"/attn/{op_type}_{self.n}",
                                           **attrs))
        return outs[0] if n_out == 1 else outs

    def out(self, name, elem, shape=None):
        self.outputs.append(helper.make_tensor_value_info(name, elem, shape))

    def model(self, extra_opsets=()) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "attention", self.inputs, self.outputs, self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset), *extra_opsets])
        m.ir_version = 10 if self.opset >= 21 else 8
        m.producer_name = "opsfuse-tests"
        m.metadata_props.add(key="origin", value="attention_graphs")
        return m


def sdpa_model(*, B=2, H=4, Hkv=None, S=5, Sk=None, D=8, dtype=F32, opset=17, scale="scores_mul", scale_value=None,
               k_layout="bnhd", masks=(), nan_guard=False, dropout=False, softmax_f32=False, repeat_kv=False,
               softmax_axis=-1, prob_output=False, where_fill=-np.inf, scale_dtype=None, scale_chain=None,
               mask_first=False, softcap=None, where_negated=False, repeat_op="Expand") -> onnx.ModelProto:
    """Q (B,H,S,D), K per `k_layout`, V (B,Hkv,Sk,D) -> y (B,H,S,D).

    scale: scores_mul | scores_div | q | k | split_sqrt | none | after_mask
    k_layout: bnhd (K (B,H,Sk,D), Transpose 0132) | bsnh (K (B,Sk,H,D), Transpose 0231) |
              rtr (K (B*H,Sk,D) -> Transpose -> Reshape to (B,H,D,Sk)) | pre (K^T given as (B,H,D,Sk))
    masks: sequence of 'bias' (1,H,S,Sk) float add, 'pad' (B,1,1,Sk) float add, 'where' (B,1,S,Sk) bool
    """
    Hkv = Hkv or H
    Sk = Sk or S
    np_t = np.float16 if dtype == F16 else np.float32
    g = G(opset)
    q = g.inp("q", dtype, [B, H, S, D])
    kv_heads = Hkv
    if k_layout == "bnhd":
        k = g.inp("k", dtype, [B, kv_heads, Sk, D])
    elif k_layout == "bsnh":
        k = g.inp("k", dtype, [B, Sk, kv_heads, D])
    elif k_layout == "rtr":
        k = g.inp("k", dtype, [B * kv_heads, Sk, D])
    elif k_layout == "pre":
        k = g.inp("k", dtype, [B, kv_heads, D, Sk])
    v = g.inp("v", dtype, [B, kv_heads, Sk, D])
    if repeat_kv:
        assert k_layout == "bnhd"
        rep = H // Hkv
        for name in ("k", "v"):
            x = g.op("Unsqueeze", k if name == "k" else v, g.const([2], np.int64))
            if repeat_op == "Tile":
                x = g.op("Tile", x, g.const([1, 1, rep, 1, 1], np.int64))
            else:
                x = g.op("Expand", x, g.const([B, Hkv, rep, Sk, D], np.int64))
            x = g.op("Reshape", x, g.const([B, H, Sk, D], np.int64))
            if name == "k":
                k = x
            else:
                v = x
    sv = scale_value if scale_value is not None else 1.0 / np.sqrt(D)
    sdt = scale_dtype or np_t

    def scale_const(value):
        if scale_chain == "cast":
            return g.op("Cast", g.const(value, np.float64), to=helper.np_dtype_to_tensor_dtype(np.dtype(sdt)))
        if scale_chain == "sqrt":
            return g.op("Sqrt", g.constant_node(value * value, sdt))
        return g.const(value, sdt)

    if scale == "q":
        q = g.op("Mul", q, scale_const(sv))
    if scale == "split_sqrt":
        q = g.op("Mul", q, scale_const(np.sqrt(sv)))
    # K^T
    if k_layout == "bnhd":
        if scale in ("k", "split_sqrt"):
            k = g.op("Mul", k, scale_const(sv if scale == "k" else np.sqrt(sv)))
        kt = g.op("Transpose", k, perm=[0, 1, 3, 2])
    elif k_layout == "bsnh":
        kt = g.op("Transpose", k, perm=[0, 2, 3, 1])
        if scale in ("k", "split_sqrt"):
            kt = g.op("Mul", kt, scale_const(sv if scale == "k" else np.sqrt(sv)))
    elif k_layout == "rtr":
        t = g.op("Transpose", k, perm=[0, 2, 1])
        kt = g.op("Reshape", t, g.const([B, kv_heads, D, Sk], np.int64))
    else:
        kt = k
    s = g.op("MatMul", q, kt, name="/attn/MatMul_qk")
    if scale == "scores_mul":
        s = g.op("Mul", scale_const(sv), s)  # constant first: either operand order
    elif scale == "scores_div":
        s = g.op("Div", s, scale_const(1.0 / sv))
    if softcap is not None:
        s = g.op("Mul", g.op("Tanh", g.op("Div", s, g.const(softcap, np_t))), g.const(softcap, np_t))
    mask_inputs = {
        "bias": lambda: g.inp("bias", dtype, [1, H, S, Sk]),
        "pad": lambda: g.inp("pad", dtype, [B, 1, 1, Sk]),
        "where": lambda: g.inp("bool_mask", TensorProto.BOOL, [B, 1, S, Sk]),
    }
    for m in masks:
        x = mask_inputs[m]()
        if m == "where" and where_negated:  # masked_fill(~visible, fill): Where(not_visible, fill, s)
            s = g.op("Where", g.op("Not", x), g.const(where_fill, np_t), s)
        elif m == "where":
            s = g.op("Where", x, s, g.const(where_fill, np_t))
        else:
            s = g.op("Add", x, s) if mask_first else g.op("Add", s, x)
    if scale == "after_mask":
        s = g.op("Mul", s, scale_const(sv))
    if softmax_f32:
        s = g.op("Cast", s, to=F32)
    p = g.op("Softmax", s, name="/attn/Softmax", **({} if softmax_axis is None else {"axis": softmax_axis}))
    if prob_output:
        g.out(p, F32 if softmax_f32 else dtype)
    if softmax_f32:
        p = g.op("Cast", p, to=dtype)
    if nan_guard:
        isnan = g.op("IsNaN", p)
        p = g.op("Where", isnan, g.const(0.0, np_t), p)
    if dropout:
        p = g.op("Dropout", p, g.const(0.1, np_t), g.const(False, np.bool_))
    y = g.op("MatMul", p, v, name="/attn/MatMul_pv")
    g.nodes[-1].output[0] = "y"
    g.out("y", dtype, [B, H, S, D])
    return g.model()


def classifier_softmax_model() -> onnx.ModelProto:
    """A classifier head: MatMul -> Softmax -> output. Not attention: must stay untouched."""
    g = G(17)
    x = g.inp("x", F32, [2, 16])
    logits = g.op("MatMul", x, g.const(np.random.default_rng(0).standard_normal((16, 3)), np.float32))
    p = g.op("Softmax", logits, axis=-1)
    g.nodes[-1].output[0] = "probs"
    g.out("probs", F32, [2, 3])
    return g.model()


def onnx_attention_model(*, opset=23, B=2, Hq=4, Hkv=4, S=5, Sk=None, D=8, three_d=False, mask=None, is_causal=0,
                         softcap=None, scale=None, past=False, nonpad=False, present_out=False) -> onnx.ModelProto:
    Sk = Sk or S
    g = G(opset)
    if three_d:
        q = g.inp("q", F32, [B, S, Hq * D])
        k = g.inp("k", F32, [B, Sk, Hkv * D])
        v = g.inp("v", F32, [B, Sk, Hkv * D])
    else:
        q = g.inp("q", F32, [B, Hq, S, D])
        k = g.inp("k", F32, [B, Hkv, Sk, D])
        v = g.inp("v", F32, [B, Hkv, Sk, D])
    ins = [q, k, v]
    if mask == "bool":
        ins.append(g.inp("attn_mask", TensorProto.BOOL, [B, 1, S, Sk]))
    elif mask == "float":
        ins.append(g.inp("attn_mask", F32, [1, Hq, S, Sk]))
    elif mask == "short":
        ins.append(g.inp("attn_mask", TensorProto.BOOL, [B, 1, S, "mask_len"]))
    else:
        ins.append("")
    if past:
        ins += [g.inp("past_key", F32, [B, Hkv, 3, D]), g.inp("past_value", F32, [B, Hkv, 3, D])]
    if nonpad:
        while len(ins) < 6:
            ins.append("")
        ins.append(g.inp("nonpad_kv_seqlen", TensorProto.INT64, [B]))
    while ins and ins[-1] == "":
        ins.pop()
    attrs = {"is_causal": is_causal}
    if softcap is not None:
        attrs["softcap"] = softcap
    if scale is not None:
        attrs["scale"] = scale
    if three_d:
        attrs["q_num_heads"], attrs["kv_num_heads"] = Hq, Hkv
    outs = ["y"] + (["present_key", "present_value"] if (present_out or past) else [])
    g.nodes.append(helper.make_node("Attention", ins, outs, name="/attn/Attention", **attrs))
    g.out("y", F32, [B, S, Hq * D] if three_d else [B, Hq, S, D])
    if present_out or past:
        g.out("present_key", F32, None)
        g.out("present_value", F32, None)
    return g.model()


def random_feeds(model: onnx.ModelProto, seed: int = 0, dims: dict | None = None) -> dict:
    """Random inputs; bool masks keep at least one visible key per row; nonpad lengths in 1..Sk."""
    rng = np.random.default_rng(seed)
    dims = dims or {}
    feeds = {}
    for vi in model.graph.input:
        shape = [d.dim_value if d.HasField("dim_value") else dims[d.dim_param] for d in vi.type.tensor_type.shape.dim]
        elem = vi.type.tensor_type.elem_type
        if elem == TensorProto.BOOL:
            m = rng.random(shape) < 0.7
            m[..., 0] = True
            feeds[vi.name] = m
        elif elem == TensorProto.INT64:
            feeds[vi.name] = rng.integers(1, shape[0] + 3, size=shape).astype(np.int64)
        else:
            arr = rng.standard_normal(shape)
            if vi.name == "pad":
                arr = np.where(rng.random(shape) < 0.3, np.finfo(np.float32).min, 0.0)
                arr[..., 0] = 0.0
            feeds[vi.name] = arr.astype(helper.tensor_dtype_to_np_dtype(elem))
    return feeds


def projected_model(*, B=2, S=5, Sk=None, Hq=3, Hkv=None, D=8, Dv=None, shape_style="const", k_style="direct",
                    mask=None, repeat_kv=False, out_consumer=None, q_reshape_used=False, out_reshape="merge",
                    dtype=F32, dynamic=False) -> onnx.ModelProto:
    """An exporter's attention layer on projections: xq (B, S, Hq*D), xk (B, Sk, Hkv*D), xv (B, Sk, Hkv*Dv)
    -> Reshape (B, S, H, D) -> Transpose(0, 2, 1, 3) -> attention -> Transpose(0, 2, 1, 3) -> Reshape
    (B, S, Hq*Dv) -> y.

    shape_style: const (0, 0, H, D) | minus1 (0, 0, -1, D) | shape_of (Concat of Shape/Gather, as the
        TorchScript exporter writes, with -1) | static (B, S, H, D) | input (a graph-input shape tensor)
    k_style: direct (Transpose(0, 2, 3, 1) of the BSHD tensor) | two (Transpose(0, 2, 1, 3), then (0, 1, 3, 2))
    mask: None | pad (B, 1, 1, Sk) additive | expand (that mask Expanded to (B, 1, S, Sk) first) |
        expand_where (a bool (B, 1, 1, Sk) mask, Expanded, then Where(m, 0, finfo.min)) |
        and_range (bool padding mask AND (Range(Sq) >= 0), Expanded, Where: transformers' mask builder) |
        and_unknown (the same with an AND term that is not provably all True)
    out_consumer: None | graph_output (the transposed output is also a graph output)
    out_reshape: merge (B, S, Hq*Dv) | wrong (B, S*Hq, Dv) | shape_of (target = Shape(t)[:2] + (Hq*Dv,), as
        GPT-2's export) | shape_of_used (that Shape is also a graph output)
    dynamic: the inputs' batch and sequence dims are symbols ("batch", "seq", "kv_seq")
    """
    Hkv = Hkv or Hq
    Sk = Sk or S
    Dv = Dv or D
    np_t = np.float16 if dtype == F16 else np.float32
    g = G(17)
    b_dim, s_dim, sk_dim = ("batch", "seq", "kv_seq") if dynamic else (B, S, Sk)
    xq = g.inp("xq", dtype, [b_dim, s_dim, Hq * D])
    xk = g.inp("xk", dtype, [b_dim, sk_dim, Hkv * D])
    xv = g.inp("xv", dtype, [b_dim, sk_dim, Hkv * Dv])
    shape_input = g.inp("split_shape", TensorProto.INT64, [4]) if shape_style == "input" else None

    def split(x, heads, dim, seq):
        if shape_style == "const":
            shape = g.const([0, 0, heads, dim], np.int64)
        elif shape_style == "minus1":
            shape = g.const([0, 0, -1, dim], np.int64)
        elif shape_style == "static":
            shape = g.const([B, seq, heads, dim], np.int64)
        elif shape_style == "input":
            shape = shape_input
        else:
            sh = g.op("Shape", x)
            b = g.op("Unsqueeze", g.op("Gather", sh, g.const(0, np.int64), axis=0), g.const([0], np.int64))
            s = g.op("Unsqueeze", g.op("Gather", sh, g.const(1, np.int64), axis=0), g.const([0], np.int64))
            shape = g.op("Concat", b, s, g.const([-1], np.int64), g.const([dim], np.int64), axis=0)
        return g.op("Reshape", x, shape)

    rq = split(xq, Hq, D, S)
    if q_reshape_used:
        g.out(rq, dtype, [b_dim, s_dim, Hq, D])
    q = g.op("Transpose", rq, perm=[0, 2, 1, 3])
    rk = split(xk, Hkv, D, Sk)
    v = g.op("Transpose", split(xv, Hkv, Dv, Sk), perm=[0, 2, 1, 3])
    if repeat_kv:  # Hugging Face's repeat_kv on K (B, Hkv, Sk, D) and V, then K^T
        rep = Hq // Hkv
        outs = []
        for x, last in ((g.op("Transpose", rk, perm=[0, 2, 1, 3]), D), (v, Dv)):
            x = g.op("Unsqueeze", x, g.const([2], np.int64))
            x = g.op("Expand", x, g.const([B, Hkv, rep, Sk, last], np.int64))
            outs.append(g.op("Reshape", x, g.const([B, Hq, Sk, last], np.int64)))
        kt = g.op("Transpose", outs[0], perm=[0, 1, 3, 2])
        v = outs[1]
    elif k_style == "direct":
        kt = g.op("Transpose", rk, perm=[0, 2, 3, 1])
    else:
        kt = g.op("Transpose", g.op("Transpose", rk, perm=[0, 2, 1, 3]), perm=[0, 1, 3, 2])
    s = g.op("MatMul", q, kt, name="/attn/MatMul_qk")
    s = g.op("Mul", s, g.const(1.0 / np.sqrt(D), np_t))
    if mask is not None:
        full = g.const([B, 1, S, Sk], np.int64)
        if mask == "pad":
            m = g.inp("pad", dtype, [B, 1, 1, Sk])
        elif mask == "expand":
            m = g.op("Expand", g.inp("pad", dtype, [B, 1, 1, Sk]), full)
        else:
            visible = g.inp("visible", TensorProto.BOOL, [B, 1, 1, Sk])
            if mask in ("and_range", "and_unknown"):
                rng = g.op("Range", g.const(0, np.int64), g.const(S, np.int64), g.const(1, np.int64))
                idx = g.op("Unsqueeze", rng, g.const([0, 1, 3], np.int64))  # (1, 1, S, 1)
                low = 0 if mask == "and_range" else 2
                term = g.op("GreaterOrEqual", idx, g.const(low, np.int64))
                visible = g.op("And", g.op("And", g.op("ConstantOfShape", g.const([], np.int64),
                                                        value=helper.make_tensor("v", TensorProto.BOOL, [1], [True])),
                                           term), visible)
            m = g.op("Where", g.op("Expand", visible, full), g.const(0.0, np_t),
                     g.const(np.finfo(np.float32).min if dtype == F32 else np.finfo(np.float16).min, np_t))
        s = g.op("Add", s, m)
    p = g.op("Softmax", s, axis=-1, name="/attn/Softmax")
    y4 = g.op("MatMul", p, v, name="/attn/MatMul_pv")
    t = g.op("Transpose", y4, perm=[0, 2, 1, 3])
    if out_consumer == "graph_output":
        g.out(t, dtype, [b_dim, s_dim, Hq, Dv])
    if out_reshape in ("shape_of", "shape_of_used"):  # GPT-2: x.size()[:-2] + (H*Dv,)
        sh = g.op("Shape", t)
        if out_reshape == "shape_of_used":
            g.out(sh, TensorProto.INT64, [4])
        lead = g.op("Slice", sh, g.const([0], np.int64), g.const([2], np.int64))
        target = g.op("Concat", lead, g.const([Hq * Dv], np.int64), axis=0)
    else:
        target = g.const([0, 0, Hq * Dv] if out_reshape == "merge" else [B, S * Hq, Dv], np.int64)
    g.op("Reshape", t, target)
    g.nodes[-1].output[0] = "y"
    g.out("y", dtype, [B, S * Hq, Dv] if out_reshape == "wrong" else [b_dim, s_dim, Hq * Dv])
    return g.model()
