"""Model level: tiny Hugging Face transformers (random weights, nothing downloaded) exported by
``models/export_models.py``; the rewrite must fuse every attention layer of every variant and keep
the outputs (ONNX Runtime CPU, original vs rewritten).

CI runs every TorchScript export (opsets 14 and 17, eager and sdpa) and a few dynamo exports
(about 10 s each); ``OPSFUSE_ALL_EXPORTS=1`` runs the whole dynamo matrix (opsets 18 and 23).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "models"))

if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
    pytest.skip("torch and transformers are needed to export the test models", allow_module_level=True)

import export_models  # noqa: E402

from opsfuse.graph_passes import fuse_attention, model_io  # noqa: E402
from opsfuse.graph_passes.verify import ORIGINAL_FAILS, verify  # noqa: E402

# Dynamo exports run in CI: the ONNX Attention op with a bool mask and with a mask of unproven
# length (padded), GQA repeat-kv, T5's relative bias, Gemma 2's soft-capping, DeBERTa's head view
# of bmm scores with constant target pieces, XGLM's Softmax between views with the finfo.min clamp,
# GLM and PVT v2 (whose TorchScript exports fail: their only variants are dynamo's), X-MOD's SDPA
# (K^T through views whose target is sliced from K's shape), SEW's SDPA (its keys dim after the
# squeeze's strided pooling, known only through the views); GLM-4 and Apertus, whose TorchScript
# exports fail, and Helium and Cohere 2, whose TorchScript exports do not run; ERNIE 4.5 and Apertus 1.5
# likewise.
DYNAMO_CI = {("bert", "sdpa", 23), ("gpt2", "sdpa", 23), ("llama_gqa", "eager", 18), ("t5", "sdpa", 18),
             ("gemma2", "eager", 18), ("deberta_v3", "eager", 18), ("xglm", "eager", 18), ("glm", "eager", 18),
             ("pvt_v2", "eager", 18), ("xmod", "sdpa", 18), ("sew", "sdpa", 18),
             ("glm4", "eager", 18), ("apertus", "eager", 18), ("helium", "eager", 18), ("cohere2", "sdpa", 18),
             ("ernie4_5", "eager", 18), ("apertus1p5_text", "eager", 18)}
ALL = os.environ.get("OPSFUSE_ALL_EXPORTS") == "1"

# Input shapes for --verify style runs where the default (batch 2, dims 16) does not fit the model.
SPEECH = ("wav2vec2", "hubert", "wavlm", "data2vec_audio", "unispeech", "sew", "w2v2_conformer_rel",
          "w2v2_conformer_rot")
SHAPES = {name: {"input_values": (2, 800)} for name in SPEECH}

VARIANTS = [
    (model, attn, exporter, opset)
    for model in export_models.SPECS
    for attn in export_models.SPECS[model].attns
    for exporter, opset in export_models.exports_of(model)
    if exporter == "torchscript" or ALL or (model, attn, opset) in DYNAMO_CI
]


# Float16 exports (TorchScript, opset 17): eager attention softmaxes in float32 between casts;
# the SDPA export computes Q.K^T in float16 and everything after in float32. Gemma 2 soft-caps
# its float16 scores; Mistral's sliding window, through SDPA in float16.
HALF = [("bert", "eager"), ("llama_gqa", "eager"), ("llama_gqa", "sdpa"), ("gemma2", "eager"),
        ("mistral_swa", "sdpa")]


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """Exports a variant on first use (session cache); returns its path."""
    out_dir = tmp_path_factory.mktemp("hf_models")
    cache: dict = {}

    def get(model, attn, exporter, opset, half=False):
        key = (model, attn, exporter, opset, half)
        if key not in cache:
            try:
                cache[key] = export_models.export(model, attn, exporter, opset, out_dir, half=half)
            except Exception as exc:  # an exporter limitation, not ours
                cache[key] = exc
        result = cache[key]
        if isinstance(result, Exception):
            pytest.skip(f"torch.onnx could not export {key}: {type(result).__name__}: {str(result)[:200]}")
        return result

    return get


@pytest.mark.parametrize("model,attn,exporter,opset", VARIANTS,
                         ids=[export_models.variant_name(*v) for v in VARIANTS])
def test_every_attention_layer_fused_and_outputs_kept(exported, tmp_path, model, attn, exporter, opset):
    _check_variant(exported(model, attn, exporter, opset), tmp_path, model)


@pytest.mark.parametrize("model,attn", HALF, ids=[f"{m}-{a}-torchscript17-fp16" for m, a in HALF])
def test_float16_exports(exported, tmp_path, model, attn):
    _check_variant(exported(model, attn, "torchscript", 17, half=True), tmp_path, model)


def _check_variant(src, tmp_path, model):
    ir_model = model_io.load(src)
    rewritten, report = fuse_attention(ir_model)
    expected = export_models.SPECS[model].attention_layers
    assert report.fused == expected, report.format()
    assert report.found == expected, report.format()
    assert not report.left
    model_io.validate(rewritten)
    dst = tmp_path / "fused.onnx"
    model_io.save(rewritten, dst)

    import onnx

    fused = onnx.load(str(dst))
    assert sum(n.op_type == "FusedAttention" for n in fused.graph.node) == expected
    assert not [n for n in fused.graph.node if n.op_type == "Attention"]
    softmaxes = sum(n.op_type == "Softmax" for n in fused.graph.node)
    assert softmaxes == export_models.SPECS[model].other_softmaxes  # none left of attention's
    original = onnx.load(str(src))
    assert [o.name for o in fused.graph.output] == [o.name for o in original.graph.output]
    assert [i.name for i in fused.graph.input] == [i.name for i in original.graph.input]

    from opsfuse import LibraryNotBuiltError, get_library_path

    try:
        get_library_path()
    except LibraryNotBuiltError as exc:
        pytest.skip(f"structure checked; numerics need the opsfuse ORT library: {exc}")
    result = verify(src, dst, SHAPES.get(model))
    if not result.ok and result.error.startswith(ORIGINAL_FAILS):
        # A model the runtime cannot run at all (an exporter / ORT issue, e.g. opset 23
        # RotaryEmbedding), not a failure of the rewritten model.
        pytest.skip(result.error[:300])
    assert result.ok, result.format()


@pytest.mark.parametrize("attn,steps", [("eager", [(2, 7, 1), (3, 12, 1), (2, 5, 4), (1, 0, 6)]),
                                        ("sdpa", [(2, 7, 1), (3, 12, 1)])])  # its export runs at S = 1 only
def test_cached_decoding_step(tmp_path, attn, steps):
    """A decoding step whose K and V concatenate a KV cache (GQA): every layer fused, and the
    outputs (hidden state and present keys / values) kept for (batch, past, step) sizes that agree
    with each other (the mask is past + step long)."""
    import numpy as np
    import onnxruntime as ort

    try:
        src = export_models.export_llama_decode_step(tmp_path / "step.onnx", attn)
    except Exception as exc:  # an exporter limitation, not ours
        pytest.skip(f"torch.onnx could not export the decoding step: {type(exc).__name__}: {str(exc)[:200]}")
    dst = _fused_copy(src, tmp_path, layers=2)
    library = _ort_library()
    so = ort.SessionOptions()
    so.register_custom_ops_library(library)
    original = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    fused = ort.InferenceSession(str(dst), so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for batch, past, step in steps:
        feeds = {"ids": rng.integers(0, 100, (batch, step)), "mask": np.ones((batch, past + step), np.int64)}
        if batch > 1 and past > 2:
            feeds["mask"][1, :2] = 0  # a left-padded row
        feeds.update({f"past_{j}": rng.standard_normal((batch, 2, past, 8)).astype(np.float32) for j in range(4)})
        for a, b in zip(original.run(None, feeds), fused.run(None, feeds)):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("exporter,padding_mask", [("dynamo", True), ("torchscript", False), ("torchscript", True)])
def test_torch_transformer_encoder(tmp_path, exporter, padding_mask):
    """PyTorch's own encoder. Its TorchScript padding mask reaches the scores through a Reshape
    whose target TorchScript computes with Mod / Add of constants: the shape inference sees it
    only because those are folded first (shape_info._fold_integer_constants)."""
    try:
        src = export_models.export_torch_encoder(tmp_path / "enc.onnx", exporter, padding_mask)
    except Exception as exc:  # an exporter limitation, not ours
        pytest.skip(f"torch.onnx could not export the encoder: {type(exc).__name__}: {str(exc)[:200]}")
    dst = _fused_copy(src, tmp_path, layers=2)
    _ort_library()
    result = verify(src, dst)
    assert result.ok, result.format()


def _fused_copy(src, tmp_path, layers: int):
    """Rewrites `src`, asserting that all its `layers` attention layers fused, and saves the
    validated result beside it; returns its path."""
    rewritten, report = fuse_attention(model_io.load(src))
    assert report.found == layers and report.fused == layers, report.format()
    model_io.validate(rewritten)
    dst = tmp_path / f"{src.stem}.fused.onnx"
    model_io.save(rewritten, dst)
    return dst


def _ort_library() -> str:
    """The opsfuse ORT library, or a skip saying numerics need it."""
    from opsfuse import LibraryNotBuiltError, get_library_path

    try:
        return get_library_path()
    except LibraryNotBuiltError as exc:
        pytest.skip(f"structure checked; numerics need the opsfuse ORT library: {exc}")
