"""End to end through a real TensorRT engine (skipped where TensorRT is not installed, which is
every machine opsfuse is built and tested on so far): the ONNX parser finds the plugin from the
node the rewrite emits, Polygraphy's TrtRunner builds and runs the engine, and the output meets
the 2x rule against the float64 reference and agrees with the Triton golden kernel; a packed node
with the qkv_bias input (a weight of the model) meets the 2x rule too; the library registers
through each loading path; a rewritten real model passes ``python -m opsfuse check --trt``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest

from accuracy import assert_within_2x_torch, max_abs_error, random_inputs, torch_attention
from ort_helpers import ONNX_TYPE, fused_attention_model
from opsfuse import contract
from opsfuse.reference import attention_reference
from trt_artifacts import REPO, find_library, not_built_reason

# Only the tensorrt marker, so that where TensorRT is missing the skip says so; the GPU is
# checked after TensorRT (select these with `pytest -m "gpu or tensorrt"`).
pytestmark = pytest.mark.tensorrt

# The attributes TensorRT's ONNX parser reads to find the plugin (strings), as the rewrite emits them.
PLUGIN_ATTRS = {"plugin_version": contract.TRT_PLUGIN_VERSION, "plugin_namespace": contract.TRT_PLUGIN_NAMESPACE}


def _tensorrt():
    try:
        import tensorrt as trt
    except Exception:  # noqa: BLE001 - absent, or the PyPI stub that cannot download
        pytest.skip("TensorRT not installed")
    return trt


@pytest.fixture(scope="module")
def plugin_library() -> Path:
    _tensorrt()
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine (torch.cuda.is_available() is False)")
    path = find_library()
    if path is None:
        pytest.skip(not_built_reason())
    return path


def _run_engine(model: onnx.ModelProto, feeds: dict, library: Path, tmp_path: Path) -> np.ndarray:
    from polygraphy.backend.trt import (CreateConfig, EngineFromNetwork, LoadPlugins, NetworkFromOnnxPath, Profile,
                                        TrtRunner)

    path = tmp_path / "fused.onnx"
    onnx.save(model, path)
    profile = Profile()
    for name, value in feeds.items():
        profile.add(name, min=value.shape, opt=value.shape, max=value.shape)
    # Strongly typed: the plugin runs in the model's element type, as in ONNX Runtime.
    network = LoadPlugins(plugins=[str(library)], obj=NetworkFromOnnxPath(str(path), strongly_typed=True))
    engine = EngineFromNetwork(network, config=CreateConfig(profiles=[profile]))
    # Fed as CUDA torch tensors: numpy has no native bfloat16 for Polygraphy to map.
    from opsfuse.triton_attention import numpy_to_torch, torch_to_numpy

    with TrtRunner(engine) as runner:
        out = runner.infer(feed_dict={name: numpy_to_torch(np.asarray(v)).cuda() for name, v in feeds.items()})
    return torch_to_numpy(out["Y"].cpu())


CASES = [
    # dtype, (B, Hq, Hkv, Sq, Sk, D, Dv), mask dtype, key_lengths, attributes
    (np.float16, (2, 4, 2, 97, 97, 64, 64), np.bool_, np.int32, {"is_causal": 1}),
    (ml_dtypes.bfloat16, (1, 8, 1, 1, 1025, 128, 128), None, None, {"is_causal": 2, "softcap": 30.0}),
    (np.float32, (2, 2, 2, 33, 130, 80, 96), np.float32, np.int64, {"scale": 0.1}),
]


@pytest.mark.parametrize("dtype,dims,mask_dtype,kl_dtype,attrs", CASES, ids=["fp16_bool_kl", "bf16_decode", "fp32_add_kl64"])
def test_engine_matches_reference_and_golden(plugin_library, tmp_path, dtype, dims, mask_dtype, kl_dtype, attrs):
    b, hq, hkv, sq, sk, d, dv = dims
    rng = np.random.default_rng(7)
    q, k, v = random_inputs(rng, dtype, b, hq, hkv, sq, sk, d, dv)
    feeds = {"Q": q, "K": k, "V": v}
    mask = lengths = None
    if mask_dtype is not None:
        mask = rng.random((b, 1, sq, sk)) < 0.8 if mask_dtype == np.bool_ else rng.standard_normal((sq, sk)).astype(dtype)
        feeds["attn_mask"] = mask
    if kl_dtype is not None:
        lengths = rng.integers(0, sk + 1, size=b).astype(kl_dtype)
        lengths[0] = sk
        feeds["key_lengths"] = lengths
    model = fused_attention_model(dtype, mask_dtype=mask_dtype, mask_rank=0 if mask is None else mask.ndim,
                                  key_lengths_dtype=kl_dtype, **attrs, **PLUGIN_ATTRS)
    y = _run_engine(model, feeds, plugin_library, tmp_path)
    kw = dict(attn_mask=mask, key_lengths=lengths, scale=attrs.get("scale"), is_causal=attrs.get("is_causal", 0),
              softcap=attrs.get("softcap", 0.0))
    assert_within_2x_torch(y.astype(dtype), q, k, v, what="TensorRT engine", **kw)

    from opsfuse.triton_attention import attention_numpy

    golden = attention_numpy(q, k, v, device="cuda", **kw)
    assert_within_2x_torch(golden, q, k, v, what="Triton golden", **kw)


def packed_bias_model(dtype, bias: np.ndarray, mask_dtype, mask_rank: int, kl_dtype, **attrs) -> onnx.ModelProto:
    """One packed node as the rewrite's pack_qkv emits it with the projection's bias absorbed: the
    input P (B, S, (Hq + 2*Hkv)*D) bound as Q, K and V, then attn_mask, key_lengths and the bias,
    an initializer (a weight of the model). attn_mask and key_lengths are real inputs: TensorRT's
    parser passes empty names as null tensors (plugin/trt/README.md, Known issues)."""
    from onnx import helper

    elem = ONNX_TYPE[np.dtype(dtype)]
    inputs = [helper.make_tensor_value_info("P", elem, ["b", "s", "w"]),
              helper.make_tensor_value_info("attn_mask", ONNX_TYPE[np.dtype(mask_dtype)],
                                            [f"m{i}" for i in range(mask_rank)]),
              helper.make_tensor_value_info("key_lengths", ONNX_TYPE[np.dtype(kl_dtype)], ["b"])]
    # Raw bytes: numpy_helper cannot write bfloat16 (ml_dtypes) arrays.
    weight = helper.make_tensor("qkv_bias", elem, list(bias.shape), vals=np.ascontiguousarray(bias).tobytes(), raw=True)
    node = helper.make_node(contract.OP_NAME, ["P", "P", "P", "attn_mask", "key_lengths", "qkv_bias"], ["Y"],
                            domain=contract.DOMAIN, name="packed_bias0", packed_qkv=1, **attrs)
    graph = helper.make_graph([node], "fused_attention_packed_bias", inputs,
                              [helper.make_tensor_value_info("Y", elem, ["b", "s", "hq_d"])], initializer=[weight])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(contract.DOMAIN, contract.OP_VERSION)])
    model.ir_version = 10
    return model


def assert_packed_bias_within_2x(y, packed, bias, mask, lengths, hq, hkv, attrs, what):
    """The 2x rule for a packed node with qkv_bias: against the float64 reference (the exact sum
    P + bias), with PyTorch's yardstick computed on what the graph's Add gave it (the float32 sum
    rounded to T) at T's precision."""
    dtype = np.dtype(packed.dtype)
    kw = dict(scale=attrs.get("scale"), is_causal=attrs.get("is_causal", 0), softcap=attrs.get("softcap", 0.0))
    ref = attention_reference(packed, packed, packed, mask, lengths, **kw, q_num_heads=hq, kv_num_heads=hkv,
                              packed_qkv=1, qkv_bias=bias)
    b, s, width = packed.shape
    d = width // (hq + 2 * hkv)
    added = (packed.astype(np.float32) + bias.astype(np.float32)).astype(dtype)

    def heads(x, h):  # (B, S, H*D) -> (B, H, S, D)
        return x.reshape(b, s, h, d).transpose(0, 2, 1, 3)

    q, k, v = np.split(added, [hq * d, (hq + hkv) * d], axis=-1)
    torch_out = torch_attention(heads(q, hq), heads(k, hkv), heads(v, hkv), mask, lengths, **kw)
    torch_err = max_abs_error(torch_out.transpose(0, 2, 1, 3).reshape(ref.shape), ref)
    assert y.shape == ref.shape, f"{what}: shape {y.shape}, expected {ref.shape}"
    err = max_abs_error(y, ref)
    # The rounding floor of accuracy.assert_within_2x_torch: 4 ulps for float32, half an ulp otherwise.
    ulps = 4.0 if dtype == np.float32 else 0.5
    floor = ulps * float(ml_dtypes.finfo(dtype).eps) * max(1.0, float(np.abs(ref).max()))
    assert err <= 2 * torch_err + floor, (
        f"{what}: max abs error {err:.3g} > 2 x PyTorch's {torch_err:.3g} + {floor:.2g}")


PACKED_BIAS_CASES = [
    # dtype, (B, Hq, Hkv, S, D), mask dtype, key_lengths dtype, bias scale, attributes
    (np.float16, (2, 4, 2, 130, 64), np.bool_, np.int32, 1.0, {}),
    (ml_dtypes.bfloat16, (2, 2, 2, 257, 128), ml_dtypes.bfloat16, np.int64, 8.0, {"softcap": 30.0}),
]


@pytest.mark.parametrize("dtype,dims,mask_dtype,kl_dtype,bias_scale,attrs", PACKED_BIAS_CASES,
                         ids=["fp16_gqa_bool", "bf16_softcap_add"])
def test_engine_packed_qkv_bias(plugin_library, tmp_path, dtype, dims, mask_dtype, kl_dtype, bias_scale, attrs):
    b, hq, hkv, s, d = dims
    width = (hq + 2 * hkv) * d
    rng = np.random.default_rng(11)
    packed = rng.standard_normal((b, s, width)).astype(dtype)
    bias = (bias_scale * rng.standard_normal(width)).astype(dtype)
    mask = rng.random((b, 1, 1, s)) < 0.8 if mask_dtype == np.bool_ else rng.standard_normal((s, s)).astype(dtype)
    lengths = rng.integers(1, s + 1, size=b).astype(kl_dtype)
    lengths[0], lengths[1] = s, 0  # a fully padded row: zeros, not V's bias
    attrs = {contract.ATTR_Q_NUM_HEADS: hq, contract.ATTR_KV_NUM_HEADS: hkv, **attrs}
    model = packed_bias_model(dtype, bias, mask_dtype, mask.ndim, kl_dtype, **attrs, **PLUGIN_ATTRS)
    y = _run_engine(model, {"P": packed, "attn_mask": mask, "key_lengths": lengths}, plugin_library, tmp_path)
    assert_packed_bias_within_2x(y, packed, bias, mask, lengths, hq, hkv, attrs, "TensorRT engine (packed, qkv_bias)")


LOAD_PATHS = {
    # ctypes / trtexec --staticPlugins / polygraphy --plugins: static registration when loaded
    "static": "import ctypes; ctypes.CDLL(lib)",
    # IPluginRegistry::loadLibrary (trtexec --dynamicPlugins): getCreators + setLoggerFinder
    "load_library": "assert registry.load_library(lib) is not None",
}


@pytest.mark.parametrize("how", sorted(LOAD_PATHS))
def test_creator_registered_by_each_loading_path(plugin_library, how):
    script = (
        "import sys, tensorrt as trt\n"
        "lib = sys.argv[1]\n"
        "registry = trt.get_plugin_registry()\n"
        f"{LOAD_PATHS[how]}\n"
        f"c = registry.get_creator({contract.OP_NAME!r}, {contract.TRT_PLUGIN_VERSION!r}, {contract.TRT_PLUGIN_NAMESPACE!r})\n"
        "assert c is not None, 'FusedAttention creator not found'\n"
        "print('found FusedAttention')\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(plugin_library)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "found FusedAttention" in proc.stdout


def test_rewritten_model_passes_check_trt(plugin_library, tmp_path):
    model = REPO / "models" / "tiny_bert.onnx"
    if not model.is_file():
        pytest.skip(f"{model} not generated (python models/export_models.py --default)")
    fused = tmp_path / "tiny_bert.fused.onnx"
    run = [sys.executable, "-m", "opsfuse"]
    rewrite = subprocess.run(run + ["rewrite", str(model), "-o", str(fused)], capture_output=True, text=True, timeout=600)
    assert rewrite.returncode == 0, rewrite.stdout + rewrite.stderr
    nodes = [n for n in onnx.load(fused).graph.node if n.op_type == contract.OP_NAME]
    assert nodes, "the rewrite fused nothing"
    for n in nodes:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        assert n.domain == contract.DOMAIN
        assert attrs.get("plugin_version") == contract.TRT_PLUGIN_VERSION.encode()
        assert attrs.get("plugin_namespace") == contract.TRT_PLUGIN_NAMESPACE.encode()
    check = subprocess.run(run + ["check", "--trt", str(fused)], capture_output=True, text=True, timeout=1800)
    assert check.returncode == 0, check.stdout[-6000:] + check.stderr[-3000:]
    assert "TensorRT comparison is skipped" not in check.stdout, check.stdout[-3000:]
