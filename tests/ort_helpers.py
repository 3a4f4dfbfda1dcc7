"""Building single-node FusedAttention models and running them in ONNX Runtime (CPU), bfloat16
included (numpy has no bfloat16: ml_dtypes arrays travel as uint16 OrtValues through IO binding)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper

from opsfuse import contract
from opsfuse.ort_session import make_session

ONNX_TYPE = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(ml_dtypes.bfloat16): TensorProto.BFLOAT16,
    np.dtype(np.bool_): TensorProto.BOOL,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.int64): TensorProto.INT64,
}
BF16 = np.dtype(ml_dtypes.bfloat16)


def fused_attention_model(
    dtype,
    mask_dtype=None,
    mask_rank: int = 0,
    key_lengths_dtype=None,
    opset: int = 17,
    node_name: str = "attention0",
    declare_shapes: bool = True,
    rank: int = 4,
    **attrs,
) -> onnx.ModelProto:
    """One FusedAttention node; every dimension symbolic, so any shape can be fed (with
    declare_shapes=False not even the rank is declared, so the op itself sees bad ranks).
    rank=3 declares the 3-D form (B, S, H*D) (pass q_num_heads / kv_num_heads in attrs)."""
    elem = ONNX_TYPE[np.dtype(dtype)]

    def dims(names):
        return names if declare_shapes else None

    if rank == 3:
        shapes = {"Q": ["b", "sq", "hq_d"], "K": ["b", "sk", "hkv_d"], "V": ["b", "sk", "hkv_dv"],
                  "Y": ["b", "sq", "hq_dv"]}
    else:
        shapes = {"Q": ["b", "hq", "sq", "d"], "K": ["b", "hkv", "sk", "d"], "V": ["b", "hkv", "sk", "dv"],
                  "Y": ["b", "hq", "sq", "dv"]}
    inputs = [helper.make_tensor_value_info(n, elem, dims(shapes[n])) for n in ("Q", "K", "V")]
    names = ["Q", "K", "V"]
    if mask_dtype is not None:
        inputs.append(helper.make_tensor_value_info("attn_mask", ONNX_TYPE[np.dtype(mask_dtype)],
                                                    dims([f"m{i}" for i in range(mask_rank)])))
        names.append("attn_mask")
    if key_lengths_dtype is not None:
        if mask_dtype is None:
            names.append("")  # absent optional input given as the empty name
        inputs.append(helper.make_tensor_value_info("key_lengths", ONNX_TYPE[np.dtype(key_lengths_dtype)], dims(["b"])))
        names.append("key_lengths")
    node = helper.make_node(contract.OP_NAME, names, ["Y"], domain=contract.DOMAIN, name=node_name, **attrs)
    graph = helper.make_graph([node], "fused_attention", inputs,
                              [helper.make_tensor_value_info("Y", elem, dims(shapes["Y"]))])
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(contract.DOMAIN, contract.OP_VERSION)],
    )
    model.ir_version = 10  # loadable by every onnxruntime this library supports (1.21 and newer)
    return model


def run_session(session, feeds: dict[str, np.ndarray], output_dtype) -> np.ndarray:
    """Runs `session` on CPU feeds; bfloat16 inputs and outputs go through IO binding."""
    import onnxruntime as ort

    binding = session.io_binding()
    for name, array in feeds.items():
        array = np.ascontiguousarray(array)
        if array.dtype == BF16:
            value = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array.view(np.uint16), TensorProto.BFLOAT16)
            binding.bind_ortvalue_input(name, value)
        else:
            binding.bind_cpu_input(name, array)
    out_name = session.get_outputs()[0].name
    if np.dtype(output_dtype) == BF16:
        binding.bind_output(out_name, "cpu")
        session.run_with_iobinding(binding)
        value = binding.get_outputs()[0]
        raw = np.empty(value.shape(), dtype=np.uint16)
        import ctypes

        ctypes.memmove(raw.ctypes.data, value.data_ptr(), raw.nbytes)
        return raw.view(BF16)
    binding.bind_output(out_name, "cpu")
    session.run_with_iobinding(binding)
    return binding.copy_outputs_to_cpu()[0]


class FusedAttentionRunner:
    """Caches one session per model signature, so many shapes reuse few sessions."""

    def __init__(self, intra_op_threads: int | None = None, declare_shapes: bool = True):
        self._sessions: dict = {}
        self._threads = intra_op_threads
        self._declare_shapes = declare_shapes

    def __call__(self, q, k, v, attn_mask=None, key_lengths=None, **attrs) -> np.ndarray:
        mask_dtype = None if attn_mask is None else np.asarray(attn_mask).dtype
        mask_rank = 0 if attn_mask is None else np.asarray(attn_mask).ndim
        kl_dtype = None if key_lengths is None else np.asarray(key_lengths).dtype
        # The declared form follows Q (3-D: pass q_num_heads / kv_num_heads); without declared
        # shapes one session serves both forms.
        rank = 3 if q.ndim == 3 else 4
        key = (q.dtype, mask_dtype, mask_rank, kl_dtype, rank if self._declare_shapes else None,
               tuple(sorted(attrs.items())))
        session = self._sessions.get(key)
        if session is None:
            model = fused_attention_model(q.dtype, mask_dtype, mask_rank, kl_dtype,
                                         declare_shapes=self._declare_shapes, rank=rank, **attrs)
            session = make_session(model, intra_op_threads=self._threads)
            self._sessions[key] = session
        feeds = {"Q": q, "K": k, "V": v}
        if attn_mask is not None:
            feeds["attn_mask"] = attn_mask
        if key_lengths is not None:
            feeds["key_lengths"] = key_lengths
        return run_session(session, feeds, q.dtype)


def assert_onnx_shape_inference_rejects(q_shape, k_shape, v_shape, attrs: dict, expected: str) -> None:
    """onnx's shape inference (opsfuse.schema) must reject a FusedAttention node named 'bad' with
    these input shapes and attributes, naming the op, the node and `expected`."""
    from opsfuse import schema

    schema.register()
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in zip("QKV", (q_shape, k_shape, v_shape))]
    node = helper.make_node("FusedAttention", ["Q", "K", "V"], ["Y"], domain="com.opsfuse", name="bad", **attrs)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.opsfuse", 1)])
    try:
        onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except onnx.shape_inference.InferenceError as err:
        text = str(err)
        assert "FusedAttention" in text and "bad" in text and expected in text, text
    else:
        raise AssertionError(f"shape inference accepted a bad node: {attrs}, expecting '{expected}'")


def call_kwargs(kwargs: dict, hq: int, hkv: int) -> dict:
    """The keywords of a 3-D / packed FusedAttention call from a test's keywords: the optional
    inputs (attn_mask, key_lengths) and attributes (scale, is_causal, softcap) that were given, and
    the two head counts."""
    given = {n: kwargs[n] for n in ("attn_mask", "key_lengths", "scale", "is_causal", "softcap")
             if kwargs.get(n) is not None}
    return {**given, contract.ATTR_Q_NUM_HEADS: hq, contract.ATTR_KV_NUM_HEADS: hkv}


def reference_kwargs(kwargs: dict) -> dict:
    """accuracy.assert_within_2x_torch's keywords for the same call (the contract's defaults for
    what was not given)."""
    return dict(attn_mask=kwargs.get("attn_mask"), key_lengths=kwargs.get("key_lengths"), scale=kwargs.get("scale"),
                is_causal=kwargs.get("is_causal") or 0, softcap=kwargs.get("softcap") or 0.0)
