"""Count the attention layers each tool fuses on a folder of exported models (from
``export_models.py``): opsfuse's rewrite, ONNX Runtime's transformers optimizer
(``onnxruntime.transformers.optimizer.optimize_model``) and onnxscript's ORT fusions
(``onnxscript.rewriter.ort_fusions.optimize_for_ort``).

    python models/compare_peers.py /tmp/models > table.md

A peer's count is the number of com.microsoft Attention / MultiHeadAttention /
GroupQueryAttention nodes in its output; a peer that raises counts 0 (the error is noted).
"""

from __future__ import annotations

import contextlib
import io
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import export_models  # noqa: E402

FUSED_OPS = {"Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention",
             "PackedMultiHeadAttention"}
# (num_heads, hidden_size) of each family's config in export_models.py, which ORT's optimizer needs
# (its auto-detection with 0 / 0 finds nothing on these exports): the tiny configs' (4, 32) unless
# listed here -- a family of other sizes must be listed.
HEADS_HIDDEN_TINY = (4, 32)
HEADS_HIDDEN = {"qwen2_mqa": (4, 64), "swin": (2, 16),
                # the vision pyramids' last stage (heads, width); LeViT's default config
                "segformer": (2, 32), "pvt": (2, 32), "pvt_v2": (2, 32), "levit": (8, 384)}
# The optimizer's own type where it has one for the family, else the closest (gpt2 for decoders,
# bert for encoders).
ORT_MODEL_TYPE = {"bert": "bert", "gpt2": "gpt2", "t5": "t5", "vit": "vit", "llama": "gpt2", "llama_gqa": "gpt2",
                  "qwen2_mqa": "gpt2", "wav2vec2": "bert", "whisper_encoder": "bert", "mistral_swa": "gpt2",
                  "gemma2": "gpt2", "phi3": "phi", "gpt_neox": "gpt_neox", "opt": "gpt2", "roberta": "bert",
                  "distilbert": "bert", "clip_text": "clip", "falcon_mqa": "gpt2", "deberta_v3": "bert",
                  "bloom_alibi": "gpt2", "gpt_bigcode_mqa": "gpt2", "gptj": "gpt2", "albert": "bert", "electra": "bert",
                  "marian": "bart", "dinov2": "vit",
                  "beit": "vit", "swin": "swin", "qwen3": "qwen3", "gemma3_text": "gpt2", "modernbert": "bert",
                  "bart": "bart", "pegasus": "bart", "m2m100": "bart", "xglm": "gpt2", "biogpt": "gpt2", "phi": "phi",
                  "stablelm": "gpt2", "starcoder2": "gpt2", "olmo2": "gpt2", "granite": "gpt2", "gpt_neo": "gpt2",
                  "codegen": "gpt2", "mpt": "gpt2", "xlm_roberta": "bert", "mobilebert": "bert", "mpnet": "bert",
                  "bigbird": "bert", "layoutlm": "bert", "clip_vision": "clip", "siglip_vision": "vit",
                  "segformer": "vit", "pvt": "vit", "levit": "vit", "esm": "bert", "nemotron": "gpt2",
                  "persimmon": "gpt2", "glm": "gpt2", "smollm3": "gpt2", "exaone4": "gpt2", "olmo": "gpt2",
                  "pvt_v2": "vit", "roformer": "bert", "squeezebert": "bert", "megatron_bert": "bert",
                  "rembert": "bert", "convbert": "bert", "umt5": "t5", "ctrl": "gpt2", "luke": "bert",
                  "data2vec_text": "bert", "ibert": "bert", "hubert": "bert", "wavlm": "bert", "deit": "vit",
                  "mbart": "bart", "blenderbot": "bart", "gemma": "gpt2", "xmod": "bert",
                  "ernie": "bert", "markuplm": "bert", "splinter": "bert", "data2vec_audio": "bert",
                  "unispeech": "bert", "data2vec_vision": "vit", "vit_msn": "vit", "ijepa": "vit", "plbart": "bart",
                  "mt5": "t5", "falcon_gqa": "gpt2", "qwen2": "gpt2", "sew": "bert",
                  "deepseek_v3": "gpt2", "w2v2_conformer_rel": "bert", "w2v2_conformer_rot": "bert",
                  "layoutlmv3": "bert", "modernbert_decoder": "gpt2", "olmo3": "gpt2", "eurobert": "bert",
                  "vaultgemma": "gpt2", "bitnet": "gpt2", "seed_oss": "gpt2", "hunyuan_dense": "gpt2", "arcee": "gpt2",
                  "glm4": "gpt2", "apertus": "gpt2", "minicpm3": "gpt2", "internlm3": "gpt2", "ministral3": "gpt2",
                  "nanochat": "gpt2", "jais2": "gpt2", "doge": "gpt2", "hyperclovax": "gpt2", "cwm": "gpt2",
                  "ministral": "gpt2", "helium": "gpt2", "cohere2": "gpt2", "gte": "bert", "nomic_bert": "bert",
                  "jina_embeddings_v3": "bert", "deberta": "bert", "esmc": "bert", "ultrabert": "bert",
                  "ernie4_5": "gpt2", "exaone": "gpt2", "iquestcoder": "gpt2", "dory": "gpt2", "beam": "gpt2",
                  "gemma4_text": "gpt2", "apertus1p5_text": "gpt2"}


def _quiet():
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
    stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
    return stack


def count_ms(nodes) -> int:
    return sum(1 for n in nodes if n.domain == "com.microsoft" and n.op_type in FUSED_OPS)


def opsfuse_count(path: Path) -> int:
    from opsfuse.graph_passes import fuse_attention, model_io

    _, report = fuse_attention(model_io.load(path))
    return report.fused


def ort_optimizer_count(path: Path, family: str) -> int | str:
    import logging

    from onnxruntime.transformers.optimizer import optimize_model

    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    try:
        with _quiet():
            heads, hidden = HEADS_HIDDEN.get(family, HEADS_HIDDEN_TINY)
            opt = optimize_model(str(path), model_type=ORT_MODEL_TYPE[family], num_heads=heads, hidden_size=hidden)
    except Exception as exc:  # a peer's failure is a data point
        return f"error: {type(exc).__name__}"
    return count_ms(opt.model.graph.node)


def onnxscript_count(path: Path) -> int | str:
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    try:
        with _quiet():
            model = ir.load(path)
            model, _ = optimize_for_ort(model)
    except Exception as exc:
        return f"error: {type(exc).__name__}"
    return count_ms(model.graph)


def main(argv=None) -> int:
    folder = Path((argv or sys.argv[1:])[0])
    rows, totals = [], {"layers": 0, "opsfuse": 0, "ort": 0, "onnxscript": 0}
    for path in sorted(folder.glob("*.onnx")):
        family = path.stem.split("-")[0]
        if family not in export_models.SPECS:
            continue
        layers = export_models.SPECS[family].attention_layers
        ours = opsfuse_count(path)
        ort_n = ort_optimizer_count(path, family)
        osc = onnxscript_count(path)
        rows.append((path.stem, layers, ours, ort_n, osc))
        totals["layers"] += layers
        totals["opsfuse"] += ours
        totals["ort"] += ort_n if isinstance(ort_n, int) else 0
        totals["onnxscript"] += osc if isinstance(osc, int) else 0
        print(f"{path.stem}: {layers} {ours} {ort_n} {osc}", file=sys.stderr, flush=True)
    print("| model variant | attention layers | opsfuse | ORT transformers optimizer | onnxscript ORT fusions |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(str(x) for x in r) + " |")
    print(f"| **total** | {totals['layers']} | {totals['opsfuse']} | {totals['ort']} | {totals['onnxscript']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
