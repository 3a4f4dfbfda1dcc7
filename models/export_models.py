"""Export tiny Hugging Face ``transformers`` models to ONNX for the attention-fusion tests.

Every model is built from a config with random weights (nothing is downloaded), in both attention
implementations (``eager`` and ``sdpa``), with torch.onnx's TorchScript exporter (``dynamo=False``,
opsets 14 and 17) and its dynamo exporter (``dynamo=True``, opsets 18 and 23).

    python models/export_models.py --out /tmp/models                 # everything
    python models/export_models.py --out /tmp/m --only bert --exporter torchscript --opset 17
    python models/export_models.py --default                         # models/tiny_bert.onnx
    python models/export_models.py --bert-large /tmp/bert_large.onnx # the rewrite benchmark's model

``SPECS`` records, for each model, how many attention layers it has: the tests pin the fused count
of every exported variant to that number.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
DEFAULT_MODEL = HERE / "tiny_bert.onnx"

EXPORTS = (("torchscript", 14), ("torchscript", 17), ("dynamo", 18), ("dynamo", 23))
ATTN_MODES = ("eager", "sdpa")


@dataclasses.dataclass(frozen=True)
class Spec:
    """One model family: how to build it and its example inputs, and its attention-layer count."""

    name: str
    build: Callable  # (attn_implementation) -> (torch.nn.Module, dict[str, torch.Tensor], dynamic axes)
    attention_layers: int
    description: str
    attns: tuple[str, ...] = ATTN_MODES  # the attention implementations transformers offers for it
    other_softmaxes: int = 0  # Softmax nodes outside attention (ConvBERT's dynamic convolution kernels)
    # The exporters whose exports of it run in ONNX Runtime (Helium's and Cohere 2's TorchScript exports
    # export, but their Q / K / V views then ask for the wrong sizes at run time): the matrix's variants.
    exporters: tuple[str, ...] = ("torchscript", "dynamo")


def _wrap(model, input_names, output_getter):
    """A module taking positional tensors (exporters want that) and returning one tensor."""
    import torch

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            out = self.model(**dict(zip(input_names, args)))
            return output_getter(out)

    return Wrapper().eval()


def _text_inputs(batch=2, seq=16, vocab=100, padded=True):
    import torch

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    if padded and batch > 1:
        mask[1, seq - 3 :] = 0  # a padded row so the exported mask path is not constant
    return ids, mask


def _text_model(model):
    """`model` (a transformers module returning last_hidden_state) on a padded token batch."""
    ids, mask = _text_inputs()
    names = ["input_ids", "attention_mask"]
    return _wrap(model, names, lambda o: o.last_hidden_state), {"input_ids": ids, "attention_mask": mask}, {
        name: {0: "batch", 1: "seq"} for name in names}


def _bert(attn):
    import transformers as tf

    cfg = tf.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, attn_implementation=attn)
    return _text_model(tf.BertModel(cfg, add_pooling_layer=False).eval())


def _gpt2(attn):
    import transformers as tf

    cfg = tf.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64, use_cache=False,
                        bos_token_id=1, eos_token_id=2, attn_implementation=attn)
    return _text_model(tf.GPT2Model(cfg).eval())


def _llama(attn, kv_heads=4):
    import transformers as tf

    cfg = tf.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=kv_heads, intermediate_size=64, max_position_embeddings=64,
                         use_cache=False, attn_implementation=attn)
    return _text_model(tf.LlamaModel(cfg).eval())


def _qwen2_gqa(attn):
    import transformers as tf

    cfg = tf.Qwen2Config(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=1, intermediate_size=64, max_position_embeddings=64,
                         use_cache=False, attn_implementation=attn)
    return _text_model(tf.Qwen2Model(cfg).eval())


def _vit(attn):
    import torch
    import transformers as tf

    cfg = tf.ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=64, attn_implementation=attn)
    model = tf.ViTModel(cfg, add_pooling_layer=False).eval()
    pix = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    return _wrap(model, ["pixel_values"], lambda o: o.last_hidden_state), {"pixel_values": pix}, {
        "pixel_values": {0: "batch"}}


def _t5(attn):
    import transformers as tf

    cfg = tf.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                      num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
                      use_cache=False, decoder_start_token_id=0, attn_implementation=attn)
    return _encoder_decoder(tf.T5Model(cfg).eval())


def _encoder_decoder(model):
    """An encoder-decoder `model` on a padded source batch and an 8-token target."""
    ids, mask = _text_inputs()
    dec_ids, _ = _text_inputs(seq=8, padded=False)
    names = ["input_ids", "attention_mask", "decoder_input_ids"]
    return _wrap(model, names, lambda o: o.last_hidden_state), {
        "input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec_ids}, {
        "input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
        "decoder_input_ids": {0: "batch", 1: "dec_seq"}}


def _speech(config: str, model: str, **config_kwargs):
    """The builder of a wav2vec2-style speech encoder (a small conv feature extractor, then the
    transformer) on two 800-sample waveforms."""

    def build(attn):
        import torch
        import transformers as tf

        cfg = getattr(tf, config)(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                  conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
                                  num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
                                  attn_implementation=attn, **config_kwargs)
        encoder = getattr(tf, model)(cfg).eval()
        wav = torch.randn(2, 800, generator=torch.Generator().manual_seed(0))
        return _wrap(encoder, ["input_values"], lambda o: o.last_hidden_state), {"input_values": wav}, {
            "input_values": {0: "batch", 1: "samples"}}

    return build


_wav2vec2 = _speech("Wav2Vec2Config", "Wav2Vec2Model", do_stable_layer_norm=True, feat_extract_norm="layer")


def _whisper_encoder(attn):
    import torch
    import transformers as tf

    cfg = tf.WhisperConfig(vocab_size=100, num_mel_bins=16, d_model=32, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                           decoder_ffn_dim=64, max_source_positions=16, max_target_positions=16,
                           pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
                           attn_implementation=attn)
    encoder = tf.WhisperModel(cfg).get_encoder().eval()
    feats = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(0))
    return _wrap(encoder, ["input_features"], lambda o: o.last_hidden_state), {"input_features": feats}, {
        "input_features": {0: "batch"}}


def _image_model(model):
    """`model` (a transformers vision module returning last_hidden_state) on two 32x32 images."""
    import torch

    pix = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    return _wrap(model, ["pixel_values"], lambda o: o.last_hidden_state), {"pixel_values": pix}, {
        "pixel_values": {0: "batch"}}


def _hf(config: str, model: str, tail=None, model_kwargs: dict | None = None, **config_kwargs):
    """The builder of a family that is a transformers config and model class on one of the input
    tails above (_text_model by default): `config(**config_kwargs, attn_implementation=attn)`."""

    def build(attn):
        import transformers as tf

        cfg = getattr(tf, config)(**config_kwargs, attn_implementation=attn)
        return (tail or _text_model)(getattr(tf, model)(cfg, **(model_kwargs or {})).eval())

    return build


_TINY = dict(vocab_size=100, num_hidden_layers=2)  # most text families' common config
_TINY_DEC = dict(_TINY, max_position_embeddings=64, use_cache=False)  # decoders
_SMALL_DEC = dict(_TINY_DEC, hidden_size=32, num_attention_heads=4, intermediate_size=64)  # llama-like decoders
_SMALL_ENC = dict(_TINY, hidden_size=32, num_attention_heads=4, intermediate_size=64)  # bert-like encoders
_SEQ2SEQ = dict(vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                pad_token_id=0, decoder_start_token_id=0, use_cache=False)  # bart-like encoder-decoders
_NO_POOLER = {"add_pooling_layer": False}
_SMALL_VISION = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64)  # ViT-like image encoders

SPECS = {
    s.name: s
    for s in (
        Spec("bert", _bert, 2, "BERT encoder, padding mask"),
        Spec("gpt2", _gpt2, 2, "GPT-2 decoder, causal + padding mask"),
        Spec("llama", _llama, 2, "LLaMA decoder (MHA), rotary, causal mask"),
        Spec("llama_gqa", lambda a: _llama(a, kv_heads=2), 2, "LLaMA decoder, GQA 4 query / 2 kv heads"),
        Spec("qwen2_mqa", _qwen2_gqa, 2, "Qwen2 decoder, MQA 4 query heads / 1 kv head"),
        Spec("vit", _vit, 2, "ViT image encoder, no mask"),
        Spec("t5", _t5, 6, "T5 encoder-decoder: relative position bias, causal, cross attention"),
        Spec("wav2vec2", _wav2vec2, 2, "Wav2Vec2 speech encoder"),
        Spec("whisper_encoder", _whisper_encoder, 2, "Whisper speech encoder"),
        Spec("mistral_swa", _hf("MistralConfig", "MistralModel", num_key_value_heads=2, sliding_window=8,
                                **_SMALL_DEC),
             2, "Mistral decoder, sliding window of 8, GQA 4 / 2"),
        # Gemma 2: tanh soft-capping of the scores, a sliding window on every other layer, GQA, the
        # scale 1 / sqrt(query_pre_attn_scalar); transformers refuses sdpa for it
        Spec("gemma2", _hf("Gemma2Config", "Gemma2Model", num_key_value_heads=2, head_dim=8, sliding_window=8,
                           attn_logit_softcapping=50.0, **_SMALL_DEC),
             2, "Gemma 2 decoder: score soft-capping, sliding window, GQA 4 / 2", attns=("eager",)),
        Spec("phi3", _hf("Phi3Config", "Phi3Model", num_key_value_heads=4, pad_token_id=0, **_SMALL_DEC),
             2, "Phi-3 decoder, fused QKV projection, causal + padding mask"),
        Spec("gpt_neox", _hf("GPTNeoXConfig", "GPTNeoXModel", **_SMALL_DEC),
             2, "GPT-NeoX decoder, partial rotary, fused QKV projection"),
        Spec("opt", _hf("OPTConfig", "OPTModel", hidden_size=32, num_attention_heads=4, ffn_dim=64,
                        word_embed_proj_dim=32, **_TINY_DEC),
             2, "OPT decoder, causal + padding mask"),
        # position ids start after the padding index: 16 tokens need 18 positions
        Spec("roberta", _hf("RobertaConfig", "RobertaModel", model_kwargs=_NO_POOLER, max_position_embeddings=70,
                            **_SMALL_ENC),
             2, "RoBERTa encoder, padding mask"),
        Spec("distilbert", _hf("DistilBertConfig", "DistilBertModel", vocab_size=100, dim=32, n_layers=2, n_heads=4,
                               hidden_dim=64, max_position_embeddings=64),
             2, "DistilBERT encoder, padding mask"),
        Spec("clip_text", _hf("CLIPTextConfig", "CLIPTextModel", max_position_embeddings=64, **_SMALL_ENC),
             2, "CLIP text encoder, causal + padding mask"),
        Spec("falcon_mqa", _hf("FalconConfig", "FalconModel", hidden_size=32, num_attention_heads=4, num_kv_heads=1,
                               multi_query=True, new_decoder_architecture=False, use_cache=False, **_TINY),
             2, "Falcon-7B-style decoder, multi-query (1 kv head)"),
        # DeBERTa-v3's disentangled attention: content-to-position and position-to-content terms
        # added to the scores in the batched-matmul frame (B*H, S, S), the padding mask after a view
        # as (B, H, S, S); eager attention only
        Spec("deberta_v3", _hf("DebertaV2Config", "DebertaV2Model", max_position_embeddings=64, relative_attention=True,
                               pos_att_type=["p2c", "c2p"], position_buckets=8, max_relative_positions=-1,
                               norm_rel_ebd="layer_norm", share_att_key=True, position_biased_input=False,
                               **_SMALL_ENC),
             2, "DeBERTa-v3 encoder: disentangled (relative position) attention", attns=("eager",)),
        # BLOOM: ALiBi biases added by baddbmm in the (B*H, S, S) frame, then a view as (B, H, S, S)
        # whose batch size is read from a shape; eager attention only
        Spec("bloom_alibi", _hf("BloomConfig", "BloomModel", vocab_size=100, hidden_size=32, n_layer=2, n_head=4,
                                use_cache=False),
             2, "BLOOM decoder: ALiBi biases in the batched-matmul frame", attns=("eager",)),
        Spec("gpt_bigcode_mqa", _hf("GPTBigCodeConfig", "GPTBigCodeModel", vocab_size=100, n_embd=32, n_layer=2,
                                    n_head=4, n_positions=64, multi_query=True, use_cache=False),
             2, "GPT-BigCode (StarCoder) decoder, multi-query"),
        Spec("gptj", _hf("GPTJConfig", "GPTJModel", vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                         rotary_dim=4, use_cache=False),
             2, "GPT-J decoder, partial rotary"),
        Spec("albert", _hf("AlbertConfig", "AlbertModel", model_kwargs=_NO_POOLER, embedding_size=16,
                           max_position_embeddings=64, **_SMALL_ENC),
             2, "ALBERT encoder, shared layers, padding mask"),
        Spec("electra", _hf("ElectraConfig", "ElectraModel", embedding_size=16, max_position_embeddings=64, **_SMALL_ENC),
             2, "ELECTRA encoder, padding mask"),
        Spec("marian", _hf("MarianConfig", "MarianModel", tail=_encoder_decoder, **_SEQ2SEQ),
             6, "Marian encoder-decoder: causal, cross attention"),
        Spec("dinov2", _hf("Dinov2Config", "Dinov2Model", tail=_image_model, image_size=32, patch_size=8,
                           hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2),
             2, "DINOv2 image encoder"),
        Spec("beit", _hf("BeitConfig", "BeitModel", tail=_image_model, model_kwargs=_NO_POOLER,
                         image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, use_relative_position_bias=True),
             2, "BEiT image encoder, relative position bias"),
        # one stage of two blocks with 2 heads: the second block's shifted windows add a mask
        Spec("swin", _hf("SwinConfig", "SwinModel", tail=_image_model, model_kwargs=_NO_POOLER,
                         image_size=32, patch_size=4, embed_dim=16, depths=[2], num_heads=[2], window_size=4),
             2, "Swin image encoder: window attention, relative position bias, shifted-window mask"),
        Spec("qwen3", _hf("Qwen3Config", "Qwen3Model", num_key_value_heads=2, head_dim=8, **_SMALL_DEC),
             2, "Qwen3 decoder: Q / K norms, GQA 4 / 2"),
        Spec("gemma3_text", _hf("Gemma3TextConfig", "Gemma3TextModel", num_key_value_heads=2, head_dim=8, sliding_window=8,
                                **_SMALL_DEC),
             2, "Gemma 3 text decoder: local sliding window and global layers, GQA"),
        # ModernBERT: local (sliding window) and global layers, rotary; its special token ids must
        # fall inside the tiny vocabulary
        Spec("modernbert", _hf("ModernBertConfig", "ModernBertModel", max_position_embeddings=64, local_attention=8,
                               global_attn_every_n_layers=2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                               cls_token_id=1, sep_token_id=2, **_SMALL_ENC),
             2, "ModernBERT encoder: local and global layers, rotary"),
        Spec("bart", _hf("BartConfig", "BartModel", tail=_encoder_decoder, **_SEQ2SEQ),
             6, "BART encoder-decoder: causal, cross attention"),
        Spec("pegasus", _hf("PegasusConfig", "PegasusModel", tail=_encoder_decoder, **_SEQ2SEQ),
             6, "Pegasus encoder-decoder: sinusoidal positions, cross attention"),
        Spec("m2m100", _hf("M2M100Config", "M2M100Model", tail=_encoder_decoder, **_SEQ2SEQ),
             6, "M2M100 / NLLB encoder-decoder: cross attention"),
        # XGLM (fairseq-style attention): the mask added in a (B, H, S, S) view of the bmm scores,
        # clamped at finfo.min, the Softmax back in the (B*H, S, S) frame; eager attention only
        Spec("xglm", _hf("XGLMConfig", "XGLMModel", vocab_size=100, d_model=32, num_layers=2, attention_heads=4,
                         ffn_dim=64, max_position_embeddings=64, use_cache=False),
             2, "XGLM decoder: the mask in a head view, clamped at finfo.min", attns=("eager",)),
        Spec("biogpt", _hf("BioGptConfig", "BioGptModel", **_SMALL_DEC), 2, "BioGPT decoder, causal + padding mask"),
        Spec("phi", _hf("PhiConfig", "PhiModel", **_SMALL_DEC), 2, "Phi-2 decoder, partial rotary"),
        Spec("stablelm", _hf("StableLmConfig", "StableLmModel", num_key_value_heads=2, **_SMALL_DEC),
             2, "StableLM decoder, partial rotary, GQA 4 / 2"),
        Spec("starcoder2", _hf("Starcoder2Config", "Starcoder2Model", num_key_value_heads=2, **_SMALL_DEC),
             2, "StarCoder2 decoder, GQA 4 / 2"),
        Spec("olmo2", _hf("Olmo2Config", "Olmo2Model", num_key_value_heads=2, **_SMALL_DEC),
             2, "OLMo 2 decoder: Q / K norms over all heads, GQA 4 / 2"),
        Spec("granite", _hf("GraniteConfig", "GraniteModel", num_key_value_heads=2, attention_multiplier=0.3,
                            **_SMALL_DEC),
             2, "Granite decoder: a configured attention scale (0.3), GQA 4 / 2"),
        # GPT-Neo: unscaled scores, a local (windowed) layer after a global one; eager attention only
        Spec("gpt_neo", _hf("GPTNeoConfig", "GPTNeoModel", vocab_size=100, hidden_size=32, num_layers=2, num_heads=4,
                            attention_types=[[["global", "local"], 1]], window_size=4, max_position_embeddings=64,
                            use_cache=False),
             2, "GPT-Neo decoder: unscaled scores, global and local layers", attns=("eager",)),
        Spec("codegen", _hf("CodeGenConfig", "CodeGenModel", vocab_size=100, n_embd=32, n_layer=2, n_head=4,
                            n_positions=64, rotary_dim=4, use_cache=False),
             2, "CodeGen decoder, fused QKV projection, partial rotary"),
        # MPT: ALiBi biases added in the (B, H, S, S) frame; eager attention only
        Spec("mpt", _hf("MptConfig", "MptModel", vocab_size=100, d_model=32, n_layers=2, n_heads=4, expansion_ratio=2,
                        max_seq_len=64, use_cache=False),
             2, "MPT decoder: ALiBi biases", attns=("eager",)),
        Spec("xlm_roberta", _hf("XLMRobertaConfig", "XLMRobertaModel", model_kwargs=_NO_POOLER,
                                max_position_embeddings=70, **_SMALL_ENC),
             2, "XLM-RoBERTa encoder, padding mask"),
        Spec("mobilebert", _hf("MobileBertConfig", "MobileBertModel", model_kwargs=_NO_POOLER, embedding_size=16,
                               intra_bottleneck_size=32, true_hidden_size=32, max_position_embeddings=64, **_SMALL_ENC),
             2, "MobileBERT encoder: bottleneck projections"),
        # MPNet: a relative position bias added to the scores; eager attention only
        Spec("mpnet", _hf("MPNetConfig", "MPNetModel", model_kwargs=_NO_POOLER, max_position_embeddings=70, **_SMALL_ENC),
             2, "MPNet encoder: relative position bias", attns=("eager",)),
        # BigBird in full attention (its block-sparse mode is not one attention product); eager only
        Spec("bigbird", _hf("BigBirdConfig", "BigBirdModel", model_kwargs=_NO_POOLER, max_position_embeddings=64,
                            attention_type="original_full", **_SMALL_ENC),
             2, "BigBird encoder (full attention)", attns=("eager",)),
        Spec("layoutlm", _hf("LayoutLMConfig", "LayoutLMModel", max_position_embeddings=64, **_SMALL_ENC),
             2, "LayoutLM encoder (text and layout embeddings)"),
        Spec("clip_vision", _hf("CLIPVisionConfig", "CLIPVisionModel", tail=_image_model, image_size=32, patch_size=8,
                                hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64),
             2, "CLIP vision encoder"),
        Spec("siglip_vision", _hf("SiglipVisionConfig", "SiglipVisionModel", tail=_image_model, image_size=32,
                                  patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64),
             2, "SigLIP vision encoder"),
        # SegFormer / PVT: efficient attention, K and V from a sequence the layer reduced by a strided
        # convolution (Sk = Sq / r^2 in the first stage), no mask
        Spec("segformer", _hf("SegformerConfig", "SegformerModel", tail=_image_model, num_encoder_blocks=2,
                              depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3],
                              strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2]),
             2, "SegFormer image encoder: spatial-reduction attention (fewer keys than queries)"),
        Spec("pvt", _hf("PvtConfig", "PvtModel", tail=_image_model, image_size=32, num_encoder_blocks=2, depths=[1, 1],
                        sequence_reduction_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[4, 2], strides=[4, 2],
                        num_attention_heads=[1, 2], mlp_ratios=[2, 2]),
             2, "PVT image encoder: spatial-reduction attention", attns=("eager",)),
        # LeViT: per-head learned attention biases gathered by relative offsets; eager attention only
        Spec("levit", _hf("LevitConfig", "LevitModel", tail=_image_model, image_size=32),
             14, "LeViT image encoder: learned attention biases, subsampling attention", attns=("eager",)),
        # ESM: Q scaled before the product, rotary positions, padding mask
        Spec("esm", _hf("EsmConfig", "EsmModel", model_kwargs=_NO_POOLER, pad_token_id=1, mask_token_id=99,
                        position_embedding_type="rotary", max_position_embeddings=64, **_SMALL_ENC),
             2, "ESM protein encoder: pre-scaled Q, rotary, padding mask"),
        Spec("nemotron", _hf("NemotronConfig", "NemotronModel", num_key_value_heads=2, partial_rotary_factor=0.5,
                             **_SMALL_DEC),
             2, "Nemotron decoder: partial rotary, GQA 4 / 2"),
        Spec("persimmon", _hf("PersimmonConfig", "PersimmonModel", qk_layernorm=True, partial_rotary_factor=0.5,
                              **_SMALL_DEC),
             2, "Persimmon decoder: Q / K layer norms, partial rotary"),
        Spec("glm", _hf("GlmConfig", "GlmModel", num_key_value_heads=2, head_dim=8, pad_token_id=0, bos_token_id=1,
                        eos_token_id=2, **_SMALL_DEC),
             2, "GLM decoder: interleaved partial rotary, GQA 4 / 2"),
        Spec("smollm3", _hf("SmolLM3Config", "SmolLM3Model", num_key_value_heads=2, no_rope_layer_interval=2,
                            pad_token_id=0, bos_token_id=1, eos_token_id=2, **_SMALL_DEC),
             2, "SmolLM3 decoder: every other layer without rotary (NoPE), GQA 4 / 2"),
        Spec("exaone4", _hf("Exaone4Config", "Exaone4Model", num_key_value_heads=2, sliding_window=8,
                            sliding_window_pattern=2, **_SMALL_DEC),
             2, "EXAONE 4 decoder: sliding-window and global layers, Q / K norms, GQA 4 / 2"),
        Spec("olmo", _hf("OlmoConfig", "OlmoModel", pad_token_id=0, eos_token_id=2, **_SMALL_DEC),
             2, "OLMo decoder: non-parametric layer norms"),
        # PVT v2 with linear spatial reduction (average pooling to 7 x 7, then a convolution); eager only
        Spec("pvt_v2", _hf("PvtV2Config", "PvtV2Model", tail=_image_model, image_size=32, num_encoder_blocks=2,
                           depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2],
                           num_attention_heads=[1, 2], mlp_ratios=[2, 2], linear_attention=True),
             2, "PVT v2 image encoder: linear spatial-reduction attention", attns=("eager",)),
        Spec("roformer", _hf("RoFormerConfig", "RoFormerModel", embedding_size=32, max_position_embeddings=64,
                             **_SMALL_ENC),
             2, "RoFormer encoder: rotary positions, padding mask", attns=("eager",)),
        # SqueezeBERT: Q, K and V from grouped 1-D convolutions in (B, C, S) layout; eager only
        Spec("squeezebert", _hf("SqueezeBertConfig", "SqueezeBertModel", embedding_size=32, max_position_embeddings=64,
                                q_groups=2, k_groups=2, v_groups=2, post_attention_groups=1, intermediate_groups=1,
                                output_groups=1, **_SMALL_ENC),
             2, "SqueezeBERT encoder: grouped-convolution projections, channels-first", attns=("eager",)),
        Spec("megatron_bert", _hf("MegatronBertConfig", "MegatronBertModel", model_kwargs=_NO_POOLER,
                                  max_position_embeddings=64, **_SMALL_ENC),
             2, "Megatron-BERT encoder: pre-norm, padding mask", attns=("eager",)),
        Spec("rembert", _hf("RemBertConfig", "RemBertModel", model_kwargs=_NO_POOLER, input_embedding_size=16,
                            output_embedding_size=16, max_position_embeddings=64, **_SMALL_ENC),
             2, "RemBERT encoder, padding mask", attns=("eager",)),
        # ConvBERT: half the heads attend, the other half are span-based dynamic convolutions; eager only
        Spec("convbert", _hf("ConvBertConfig", "ConvBertModel", embedding_size=32, max_position_embeddings=64,
                             head_ratio=2, conv_kernel_size=3, **_SMALL_ENC),
             2, "ConvBERT encoder: mixed attention and dynamic convolution heads", attns=("eager",), other_softmaxes=2),
        Spec("umt5", _hf("UMT5Config", "UMT5Model", tail=_encoder_decoder, vocab_size=100, d_model=32, d_kv=8, d_ff=64,
                         num_layers=2, num_heads=4, decoder_start_token_id=0, pad_token_id=0, use_cache=False),
             6, "UMT5 encoder-decoder: a relative position bias in every layer, cross attention"),
        Spec("ctrl", _hf("CTRLConfig", "CTRLModel", vocab_size=100, n_embd=32, n_layer=2, n_head=4, dff=64,
                         n_positions=64, use_cache=False),
             2, "CTRL decoder, causal + padding mask"),
        Spec("luke", _hf("LukeConfig", "LukeModel", model_kwargs=_NO_POOLER, entity_vocab_size=10, entity_emb_size=16,
                         max_position_embeddings=70, **_SMALL_ENC),
             2, "LUKE encoder (words only), padding mask", attns=("eager",)),
        # XLM / FlauBERT: the TorchScript export expands the mask to the scores' shape (expand_as)
        Spec("xlm", _hf("XLMConfig", "XLMModel", vocab_size=100, emb_dim=32, n_layers=2, n_heads=4), 2,
             "XLM encoder, padding mask expanded to the scores", attns=("eager",)),
        # Session 41's probe (2026-12-06): each fused on its first export, outputs kept
        Spec("data2vec_text", _hf("Data2VecTextConfig", "Data2VecTextModel", model_kwargs=_NO_POOLER,
                                  max_position_embeddings=70, **_SMALL_ENC),
             2, "Data2Vec text encoder, padding mask"),
        Spec("ibert", _hf("IBertConfig", "IBertModel", model_kwargs=_NO_POOLER, max_position_embeddings=70, **_SMALL_ENC),
             2, "I-BERT encoder (float mode), padding mask", attns=("eager",)),
        Spec("hubert", _speech("HubertConfig", "HubertModel"), 2, "HuBERT speech encoder"),
        # WavLM: a gated relative position bias, computed in the first layer and passed on, added to
        # the scores of every layer
        Spec("wavlm", _speech("WavLMConfig", "WavLMModel", num_buckets=16, max_bucket_distance=32),
             2, "WavLM speech encoder: gated relative position bias", attns=("eager",)),
        Spec("deit", _hf("DeiTConfig", "DeiTModel", tail=_image_model, model_kwargs=_NO_POOLER, image_size=32,
                         patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64),
             2, "DeiT image encoder (class and distillation tokens)"),
        Spec("mbart", _hf("MBartConfig", "MBartModel", tail=_encoder_decoder, **_SEQ2SEQ),
             6, "mBART encoder-decoder (pre-norm): causal, padding, cross attention"),
        Spec("blenderbot", _hf("BlenderbotConfig", "BlenderbotModel", tail=_encoder_decoder, **_SEQ2SEQ),
             6, "Blenderbot encoder-decoder: causal, padding, cross attention"),
        Spec("gemma", _hf("GemmaConfig", "GemmaModel", num_key_value_heads=2, head_dim=8, **_SMALL_DEC),
             2, "Gemma decoder, GQA 4 / 2"),
        # X-MOD: language adapters; its dynamo SDPA export builds K^T through views whose target is
        # sliced from K's shape (graph_passes/shape_values.py)
        Spec("xmod", _hf("XmodConfig", "XmodModel", model_kwargs=_NO_POOLER, max_position_embeddings=70,
                         default_language="en_XX", languages=["en_XX"], **_SMALL_ENC),
             2, "X-MOD encoder (language adapters), padding mask"),
        # Session 41's second probe: each fused on every export tried, outputs kept
        Spec("ernie", _hf("ErnieConfig", "ErnieModel", model_kwargs=_NO_POOLER, max_position_embeddings=64,
                          **_SMALL_ENC),
             2, "ERNIE encoder, padding mask"),
        Spec("markuplm", _hf("MarkupLMConfig", "MarkupLMModel", model_kwargs=_NO_POOLER, max_position_embeddings=70,
                             **_SMALL_ENC),
             2, "MarkupLM encoder (text only), padding mask", attns=("eager",)),
        Spec("splinter", _hf("SplinterConfig", "SplinterModel", max_position_embeddings=64, **_SMALL_ENC),
             2, "Splinter encoder, padding mask", attns=("eager",)),
        Spec("data2vec_audio", _speech("Data2VecAudioConfig", "Data2VecAudioModel"), 2, "Data2Vec audio encoder"),
        Spec("unispeech", _speech("UniSpeechConfig", "UniSpeechModel"), 2, "UniSpeech speech encoder"),
        Spec("data2vec_vision", _hf("Data2VecVisionConfig", "Data2VecVisionModel", tail=_image_model,
                                    model_kwargs=_NO_POOLER, use_relative_position_bias=True, **_SMALL_VISION),
             2, "Data2Vec vision encoder, relative position bias"),
        Spec("vit_msn", _hf("ViTMSNConfig", "ViTMSNModel", tail=_image_model, **_SMALL_VISION),
             2, "ViT-MSN image encoder"),
        Spec("ijepa", _hf("IJepaConfig", "IJepaModel", tail=_image_model, model_kwargs=_NO_POOLER, **_SMALL_VISION),
             2, "I-JEPA image encoder"),
        Spec("plbart", _hf("PLBartConfig", "PLBartModel", tail=_encoder_decoder, **_SEQ2SEQ),
             6, "PLBart encoder-decoder: causal, padding, cross attention"),
        Spec("mt5", _hf("MT5Config", "MT5Model", tail=_encoder_decoder, vocab_size=100, d_model=32, d_kv=8, d_ff=64,
                        num_layers=2, num_decoder_layers=2, num_heads=4, relative_attention_num_buckets=8,
                        relative_attention_max_distance=16, use_cache=False, decoder_start_token_id=0),
             6, "mT5 encoder-decoder: relative position bias, causal, cross attention"),
        Spec("falcon_gqa", _hf("FalconConfig", "FalconModel", hidden_size=32, num_attention_heads=4, num_kv_heads=2,
                               new_decoder_architecture=True, use_cache=False, **_TINY),
             2, "Falcon-40B-style decoder (new architecture), GQA 4 / 2"),
        Spec("qwen2", _hf("Qwen2Config", "Qwen2Model", num_key_value_heads=2, **_SMALL_DEC),
             2, "Qwen2 decoder, GQA 4 / 2"),
        # SEW: the sequence squeezed by a strided pooling before the encoder; TorchScript views the heads
        # as a -1 (graph_passes/shape_values.py infers it from the input's size)
        Spec("sew", _speech("SEWConfig", "SEWModel", squeeze_factor=2), 2, "SEW speech encoder (squeezed sequence)"),
        # Session 42's probe: each fused on every export that ran, outputs kept
        # DeepSeek-V3: multi-head latent attention, Q.K over 12 dims (8 + 4 rotary), V of 8 (Dv != D);
        # the two layers dense (first_k_dense_replace), as its MoE routing does not export
        Spec("deepseek_v3", _hf("DeepseekV3Config", "DeepseekV3Model", num_key_value_heads=4, q_lora_rank=None,
                                kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                                first_k_dense_replace=2, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
                                topk_group=1, **_SMALL_DEC),
             2, "DeepSeek-V3 decoder: latent attention, head sizes 12 (Q.K) and 8 (V)"),
        Spec("w2v2_conformer_rel", _speech("Wav2Vec2ConformerConfig", "Wav2Vec2ConformerModel",
                                           position_embeddings_type="relative"),
             2, "Wav2Vec2-Conformer: Transformer-XL relative position scores added"),
        Spec("w2v2_conformer_rot", _speech("Wav2Vec2ConformerConfig", "Wav2Vec2ConformerModel",
                                           position_embeddings_type="rotary"),
             2, "Wav2Vec2-Conformer: rotary"),
        # LayoutLMv3 (text only): the 1-D and 2-D relative position biases summed and added to the scores
        Spec("layoutlmv3", _hf("LayoutLMv3Config", "LayoutLMv3Model", visual_embed=False, max_position_embeddings=70,
                               max_2d_position_embeddings=128, coordinate_size=6, shape_size=4, rel_pos_bins=8,
                               max_rel_pos=16, rel_2d_pos_bins=8, max_rel_2d_pos=32, **_SMALL_ENC),
             2, "LayoutLMv3 encoder (text): 1-D and 2-D relative position biases"),
        Spec("modernbert_decoder", _hf("ModernBertDecoderConfig", "ModernBertDecoderModel", hidden_size=32,
                                       num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                       vocab_size=100, max_position_embeddings=64, global_attn_every_n_layers=2,
                                       local_attention=8, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                       cls_token_id=1, sep_token_id=2),
             2, "ModernBERT decoder: local (sliding) and global causal layers"),
        Spec("olmo3", _hf("Olmo3Config", "Olmo3Model", num_key_value_heads=2, sliding_window=8, eos_token_id=2,
                         **_SMALL_DEC),
             2, "OLMo 3 decoder: sliding window, GQA 4 / 2"),
        Spec("eurobert", _hf("EuroBertConfig", "EuroBertModel", num_key_value_heads=4, pad_token_id=0, bos_token_id=1,
                            eos_token_id=2, mask_token_id=3, **_SMALL_DEC),
             2, "EuroBERT encoder: rotary, padding mask"),
        Spec("vaultgemma", _hf("VaultGemmaConfig", "VaultGemmaModel", num_key_value_heads=2, head_dim=8, sliding_window=8,
                               **_SMALL_DEC),
             2, "VaultGemma decoder", attns=("eager",)),
        Spec("bitnet", _hf("BitNetConfig", "BitNetModel", num_key_value_heads=2, **_SMALL_DEC), 2, "BitNet decoder"),
        Spec("seed_oss", _hf("SeedOssConfig", "SeedOssModel", num_key_value_heads=2, head_dim=8, **_SMALL_DEC),
             2, "Seed-OSS decoder, GQA 4 / 2"),
        Spec("hunyuan_dense", _hf("HunYuanDenseV1Config", "HunYuanDenseV1Model", num_key_value_heads=2, head_dim=8,
                                  **_SMALL_DEC),
             2, "Hunyuan dense decoder: Q / K norms, GQA 4 / 2"),
        Spec("arcee", _hf("ArceeConfig", "ArceeModel", num_key_value_heads=2, **_SMALL_DEC), 2, "Arcee decoder, GQA 4 / 2"),
        # Dynamo only: GLM-4's and Apertus's TorchScript exports fail
        Spec("glm4", _hf("Glm4Config", "Glm4Model", num_key_value_heads=2, head_dim=8, pad_token_id=0, **_SMALL_DEC),
             2, "GLM-4 decoder, partial rotary, GQA 4 / 2"),
        Spec("apertus", _hf("ApertusConfig", "ApertusModel", num_key_value_heads=2, **_SMALL_DEC), 2, "Apertus decoder"),
        # Session 43: a probe of 20 more current decoders (MoE routing, exporter failures and attention sinks
        # left out: docs/results/rewrite_bench.md)
        Spec("minicpm3", _hf("MiniCPM3Config", "MiniCPM3Model", num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16,
                             qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, **_SMALL_DEC),
             2, "MiniCPM3 decoder: latent attention with a low-rank Q, head sizes 12 (Q.K) and 8 (V)"),
        Spec("internlm3", _hf("InternLM3Config", "LlamaModel", num_key_value_heads=2, **_SMALL_DEC), 2,
             "InternLM3 decoder, GQA 4 / 2"),
        Spec("ministral3", _hf("Ministral3Config", "Ministral3Model", num_key_value_heads=2, **_SMALL_DEC), 2,
             "Ministral 3 decoder: YaRN rotary with Llama 4's position-dependent Q scaling, GQA 4 / 2"),
        Spec("nanochat", _hf("NanoChatConfig", "NanoChatModel", num_key_value_heads=2, **_SMALL_DEC), 2,
             "nanochat decoder: unweighted Q / K norms, GQA 4 / 2"),
        Spec("jais2", _hf("Jais2Config", "Jais2Model", num_key_value_heads=2, **_SMALL_DEC), 2,
             "Jais 2 decoder: biased projections, GQA 4 / 2"),
        Spec("doge", _hf("DogeConfig", "DogeModel", num_key_value_heads=2, **_SMALL_DEC), 2,
             "Doge decoder: a dynamic additive mask computed from the values"),
        Spec("hyperclovax", _hf("HyperCLOVAXConfig", "HyperCLOVAXModel", num_key_value_heads=2, **_SMALL_DEC), 2,
             "HyperCLOVA X decoder: a configured score multiplier instead of 1 / sqrt(D), GQA 4 / 2"),
        Spec("cwm", _hf("CwmConfig", "CwmModel", num_key_value_heads=2, sliding_window=8, **_SMALL_DEC), 2,
             "CWM decoder: a global and a sliding-window layer, GQA 4 / 2"),
        Spec("ministral", _hf("MinistralConfig", "MinistralModel", num_key_value_heads=2, head_dim=8, sliding_window=8,
                              **_SMALL_DEC), 2, "Ministral decoder: sliding window, GQA 4 / 2"),
        # Dynamo only: Helium's and Cohere 2's TorchScript exports do not run in ONNX Runtime
        Spec("helium", _hf("HeliumConfig", "HeliumModel", num_key_value_heads=2, head_dim=8, **_SMALL_DEC), 2,
             "Helium decoder: interleaved rotary, GQA 4 / 2", exporters=("dynamo",)),
        Spec("cohere2", _hf("Cohere2Config", "Cohere2Model", num_key_value_heads=2, head_dim=8, sliding_window=8,
                            **_SMALL_DEC), 2, "Cohere 2 decoder: interleaved rotary, sliding window, GQA 4 / 2",
             exporters=("dynamo",)),
        # Session 44: embedding encoders, and decoders new in transformers 5
        Spec("gte", _hf("GteConfig", "GteModel", model_kwargs=_NO_POOLER, max_position_embeddings=70, **_SMALL_ENC),
             2, "GTE embedding encoder: rotary positions, padding mask"),
        Spec("nomic_bert", _hf("NomicBertConfig", "NomicBertModel", model_kwargs=_NO_POOLER,
                               max_position_embeddings=70, **_SMALL_ENC),
             2, "Nomic BERT embedding encoder: rotary positions, fused QKV, padding mask"),
        Spec("jina_embeddings_v3", _hf("JinaEmbeddingsV3Config", "JinaEmbeddingsV3Model", model_kwargs=_NO_POOLER,
                                       max_position_embeddings=70, **_SMALL_ENC),
             2, "Jina Embeddings v3 encoder: rotary positions, padding mask"),
        Spec("deberta", _hf("DebertaConfig", "DebertaModel", max_position_embeddings=64, **_SMALL_ENC),
             2, "DeBERTa (v1) encoder, padding mask", attns=("eager",)),
        Spec("esmc", _hf("EsmcConfig", "EsmcModel", max_position_embeddings=70, **_SMALL_ENC),
             2, "ESM C protein encoder: Q / K layer norms, rotary positions"),
        Spec("ultrabert", _hf("UltrabertConfig", "UltrabertModel", max_position_embeddings=70, **_SMALL_ENC),
             2, "UltraBERT encoder, padding mask"),
        Spec("exaone", _hf("ExaoneConfig", "LlamaModel", num_key_value_heads=2, **_SMALL_DEC), 2,
             "EXAONE decoder, GQA 4 / 2"),
        Spec("iquestcoder", _hf("IQuestCoderConfig", "LlamaModel", num_key_value_heads=2, **_SMALL_DEC), 2,
             "IQuest-Coder decoder, GQA 4 / 2"),
        Spec("dory", _hf("DoryConfig", "DoryModel", num_key_value_heads=2, **_SMALL_DEC), 4,
             "Dory decoder: its layers looped (recurrent depth), each attention run twice, GQA 4 / 2"),
        Spec("beam", _hf("BeamConfig", "BeamModel", num_key_value_heads=2, **_SMALL_DEC), 2,
             "Beam decoder, GQA 4 / 2"),
        # Gemma 4's full-attention layers have their own head size, 512 by default: beyond FusedAttention's
        # 256, so the rewrite leaves them alone; the matrix gives them 8 to check their pattern.
        Spec("gemma4_text", _hf("Gemma4TextConfig", "Gemma4TextModel", num_key_value_heads=2, head_dim=8,
                                global_head_dim=8, sliding_window=8, **_SMALL_DEC), 2,
             "Gemma 4 decoder: a sliding-window and a full-attention layer, Q / K norms, GQA 4 / 2"),
        # Dynamo only: ERNIE 4.5's TorchScript export does not run in ONNX Runtime (a Reshape fails, and its
        # Q has no shape the rewrite can prove); Apertus 1.5's fails in the exporter (aten::expm1)
        Spec("ernie4_5", _hf("Ernie4_5Config", "Ernie4_5Model", num_key_value_heads=2, **_SMALL_DEC), 2,
             "ERNIE 4.5 decoder, GQA 4 / 2", exporters=("dynamo",)),
        Spec("apertus1p5_text", _hf("Apertus1p5TextConfig", "Apertus1p5TextModel", num_key_value_heads=2,
                                    **_SMALL_DEC), 2, "Apertus 1.5 decoder, GQA 4 / 2", exporters=("dynamo",)),
    )
}


def variant_name(model: str, attn: str, exporter: str, opset: int, half: bool = False) -> str:
    return f"{model}-{attn}-{exporter}{opset}" + ("-fp16" if half else "")


def export(model: str, attn: str, exporter: str, opset: int, out_dir: str | os.PathLike,
           quiet: bool = True, half: bool = False) -> Path:
    """Export one variant to ``out_dir/<variant>.onnx`` (weights inline) and return the path.
    `half`: the model in float16 (its float inputs too)."""
    import torch

    spec = SPECS[model]
    torch.manual_seed(0)
    module, inputs, dyn = spec.build(attn)
    if half:
        module = module.half()
        inputs = {k: v.half() if v.is_floating_point() else v for k, v in inputs.items()}
    names = list(inputs)
    args = tuple(inputs[n] for n in names)
    path = Path(out_dir) / f"{variant_name(model, attn, exporter, opset, half)}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    sink = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink if quiet else sys.stdout), \
            contextlib.redirect_stderr(sink if quiet else sys.stderr), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(module, args, str(path), input_names=names, output_names=["out"],
                              dynamic_axes=dyn, opset_version=opset, dynamo=False)
        elif exporter == "dynamo":
            dims = {}
            shapes = tuple({ax: dims.setdefault(n, torch.export.Dim.AUTO) for ax, n in dyn[name].items()}
                           for name in names)
            prog = torch.onnx.export(module, args, input_names=names, output_names=["out"],
                                     dynamic_shapes=(shapes,), opset_version=opset, dynamo=True,
                                     optimize=True, verbose=False)
            prog.save(str(path), external_data=False)
        else:
            raise ValueError(f"unknown exporter {exporter!r}")
    return path


def exports_of(model: str, exports=EXPORTS):
    """The (exporter, opset) pairs of `exports` whose exports of `model` belong to the matrix
    (Spec.exporters)."""
    return [(e, o) for e, o in exports if e in SPECS[model].exporters]


def export_all(out_dir, models=None, attns=ATTN_MODES, exports=EXPORTS, quiet=True):
    """Export every requested variant; returns {variant name: path or the exception's text}."""
    results = {}
    for model in models or SPECS:
        for attn in (a for a in attns if a in SPECS[model].attns):
            for exporter, opset in exports_of(model, exports):
                name = variant_name(model, attn, exporter, opset)
                t0 = time.perf_counter()
                try:
                    results[name] = export(model, attn, exporter, opset, out_dir, quiet=quiet)
                    status = "ok"
                except Exception as exc:  # an exporter limitation: recorded, not fatal
                    results[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                    status = results[name]
                if not quiet:
                    print(f"{name}: {status} ({time.perf_counter() - t0:.1f} s)", flush=True)
    return results


def export_default(path: str | os.PathLike = DEFAULT_MODEL) -> Path:
    """The bundled default model: the 2-layer tiny BERT (eager attention), TorchScript exporter, opset 17."""
    tmp = export("bert", "eager", "torchscript", 17, Path(path).parent)
    Path(tmp).replace(path)
    return Path(path)


def export_llama_decode_step(path: str | os.PathLike, attn: str = "eager", layers: int = 2) -> Path:
    """One step of cached decoding, TorchScript exporter, opset 17: LLaMA (4 query / 2 key-value
    heads, D = 8) taking `ids` (B, S), `mask` (B, P + S) and each layer's past keys and values
    `past_2i`, `past_2i+1` (B, 2, P, 8), which it wraps in a DynamicCache; it returns the hidden
    state and the present keys and values (`present_*`). Each layer's K and V are the Concat of
    past and new."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                         attn_implementation=attn)
    model = tf.LlamaModel(cfg).eval()

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, ids, mask, *past):
            cache = tf.DynamicCache(config=cfg)
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
            present = [t for layer in out.past_key_values.layers[:layers] for t in (layer.keys, layer.values)]
            return (out.last_hidden_state, *present)

    batch, past_len, step = 2, 7, 1
    ids = torch.randint(0, 100, (batch, step))
    mask = torch.ones(batch, past_len + step, dtype=torch.int64)
    past = [torch.randn(batch, 2, past_len, 8) for _ in range(2 * layers)]
    names = ["ids", "mask"] + [f"past_{j}" for j in range(2 * layers)]
    dyn = {"ids": {0: "batch", 1: "step"}, "mask": {0: "batch", 1: "total"},
           **{f"past_{j}": {0: "batch", 2: "past"} for j in range(2 * layers)}}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(Step(), (ids, mask, *past), str(path), input_names=names,
                          output_names=["out"] + [f"present_{j}" for j in range(2 * layers)],
                          dynamic_axes=dyn, opset_version=17, dynamo=False)
    return path


def export_torch_encoder(path: str | os.PathLike, exporter: str = "dynamo", padding_mask: bool = True) -> Path:
    """PyTorch's own attention: a 2-layer torch.nn.TransformerEncoder (d_model 32, 4 heads,
    batch_first) taking `x` (B, S, 32) and `pad` (B, S, int64, 0 = padding) as its
    src_key_padding_mask; dynamo exporter at opset 18 or TorchScript at 17 (with the fused fast
    path off, which TorchScript cannot export)."""
    import torch

    torch.manual_seed(0)

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
            self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

        def forward(self, x, pad):
            return self.encoder(x, src_key_padding_mask=(pad == 0) if padding_mask else None)

    module = Encoder().eval()
    x = torch.randn(2, 16, 32)
    pad = torch.ones(2, 16, dtype=torch.int64)
    pad[1, 12:] = 0
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fastpath = torch.backends.mha.get_fastpath_enabled()
    try:
        torch.backends.mha.set_fastpath_enabled(False)
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()), torch.no_grad():
            warnings.simplefilter("ignore")
            if exporter == "torchscript":
                torch.onnx.export(module, (x, pad), str(path), input_names=["x", "pad"], output_names=["out"],
                                  dynamic_axes={"x": {0: "batch", 1: "seq"}, "pad": {0: "batch", 1: "seq"}},
                                  opset_version=17, dynamo=False)
            else:
                dim = torch.export.Dim.AUTO
                prog = torch.onnx.export(module, (x, pad), input_names=["x", "pad"], output_names=["out"],
                                         dynamic_shapes=({0: dim, 1: dim}, {0: dim, 1: dim}), opset_version=18,
                                         dynamo=True)
                prog.save(str(path))
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    return path


def export_bert_large(path: str | os.PathLike, seq: int = 128) -> Path:
    """The rewrite benchmark's model: BERT-large sized (24 layers, hidden 1024, 16 heads, random
    weights, ~1.3 GB), TorchScript exporter, opset 17, weights in ``<path>.data``."""
    import onnx
    import torch
    import transformers as tf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    cfg = tf.BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                        attn_implementation="eager")
    model = tf.BertModel(cfg, add_pooling_layer=False).eval()
    module = _wrap(model, ["input_ids", "attention_mask"], lambda o: o.last_hidden_state)
    ids, mask = _text_inputs(batch=1, seq=seq, vocab=cfg.vocab_size, padded=False)
    tmp = path.with_suffix(".inline.onnx")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (ids, mask), str(tmp), input_names=["input_ids", "attention_mask"],
                          output_names=["out"], dynamic_axes={"input_ids": {0: "batch", 1: "seq"},
                                                              "attention_mask": {0: "batch", 1: "seq"}},
                          opset_version=17, dynamo=False)
    del model, module
    proto = onnx.load(str(tmp))
    onnx.save(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=f"{path.name}.data", size_threshold=1024)
    tmp.unlink()
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="output folder")
    ap.add_argument("--only", nargs="*", choices=sorted(SPECS), help="model families (default: all)")
    ap.add_argument("--attn", nargs="*", choices=ATTN_MODES, default=list(ATTN_MODES))
    ap.add_argument("--exporter", choices=("torchscript", "dynamo"), help="only this exporter")
    ap.add_argument("--opset", type=int, help="only this opset")
    ap.add_argument("--default", action="store_true", help=f"write the bundled default model {DEFAULT_MODEL.name}")
    ap.add_argument("--bert-large", metavar="PATH", help="write the rewrite benchmark's BERT-large-sized model")
    args = ap.parse_args(argv)
    if args.default:
        print(export_default())
        return 0
    if args.bert_large:
        print(export_bert_large(args.bert_large))
        return 0
    if not args.out:
        ap.error("--out is required (or --default)")
    exports = [(e, o) for e, o in EXPORTS
               if (args.exporter is None or e == args.exporter) and (args.opset is None or o == args.opset)]
    results = export_all(args.out, args.only, args.attn, exports, quiet=False)
    failed = [n for n, r in results.items() if not isinstance(r, Path)]
    print(f"{len(results) - len(failed)} exported, {len(failed)} failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
