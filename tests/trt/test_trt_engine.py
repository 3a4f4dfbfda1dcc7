"""End to end through a real TensorRT engine (skipped where TensorRT is not installed, which is
every machine opsfuse is built and tested on so far): the ONNX parser finds the plugin from the
node the rewrite emits, Polygraphy's TrtRunner builds and runs the engine, and the output meets
the 2x rule against the float64 reference and agrees with the Triton golden kernel; the library
registers through each loading path; a rewritten real model passes ``python -m opsfuse check --trt``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest

from accuracy import assert_within_2x_torch, random_inputs
from ort_helpers import fused_attention_model
from opsfuse import contract
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
