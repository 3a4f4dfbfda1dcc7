"""BERT-base's attention layer in isolation (B=8, H=12, D=64, fp16; S=128 and 512), in the forms
the BERT benchmark feeds it: which of layout, mask kind and data makes opsfuse's kernel slower than
cuDNN there (run on the device; docs/notes/cuda_kernel.md quotes the output).

    python scripts/bert_attention_sweep.py [NAME=VALUE,... variants as in ab_sweep.py]
    BERT_LAYOUTS=packed,bhsd python scripts/bert_attention_sweep.py D=1   # some layouts only

Layouts: bhsd (contiguous (B,H,S,D)), const (the same with every element 1.06, as the check
driver's --bench), bsh (three (B,S,H*D) tensors, as the 3-D rewrite reads the
projections), packed (one (B,S,3*H*D) tensor, the --pack-qkv form), packed_bias (the same with
the projection's bias as q_bias / k_bias / v_bias, as the rewrite's qkv_bias feeds it; packed_qbias
and packed_vbias: Q's or V's alone). Masks (B,1,1,S): none, additive
zeros, additive padded as transformers builds it ((1 - m) * finfo(fp16).min, rows padded as
bench.bert pads them), bool padded. Each timed by the benchmark's graph timer over rotated input
sets; cuDNN (PyTorch SDPA) on the contiguous layout without a mask first, as the floor to reach.
"""
import os
import sys

import torch
import torch.nn.functional as F

import opsfuse.cuda as oc
from opsfuse.bench.cuda import env_variant, time_graph

B, H, D = 8, 12, 64


def lengths(s):
    return [s - round(i * 0.4 * s / (B - 1)) for i in range(B)]


def mask_of(kind, s):
    if kind == "none":
        return None
    keep = torch.zeros(B, s, dtype=torch.bool, device="cuda")
    for i, n in enumerate(lengths(s)):
        keep[i, :n] = True
    if kind == "add0":
        return torch.zeros(B, 1, 1, s, dtype=torch.float16, device="cuda")
    if kind == "add_pad":
        return ((~keep).to(torch.float16) * torch.finfo(torch.float16).min).view(B, 1, 1, s)
    if kind == "bool_pad":
        return keep.view(B, 1, 1, s)
    raise ValueError(kind)


def qkv_of(layout, s):
    if layout == "bhsd":
        return tuple(torch.randn(B, H, s, D, device="cuda", dtype=torch.float16) for _ in range(3))
    if layout == "const":  # the check driver's --bench data: every score equal
        return tuple(torch.full((B, H, s, D), 1.06, device="cuda", dtype=torch.float16) for _ in range(3))
    if layout == "bsh":
        return tuple(torch.randn(B, s, H * D, device="cuda", dtype=torch.float16).view(B, s, H, D).transpose(1, 2)
                     for _ in range(3))
    packed = torch.randn(B, s, 3, H, D, device="cuda", dtype=torch.float16)
    return tuple(packed[:, :, i].transpose(1, 2) for i in range(3))


def biases_of(layout):
    which = {"packed_bias": "qkv", "packed_qbias": "q", "packed_vbias": "v"}.get(layout, "")
    return {f"{n}_bias": 0.5 * torch.randn(H * D, device="cuda", dtype=torch.float16) for n in which}


def main():
    variants = sys.argv[1:] or ["D=1"]
    for s in (128, 512):
        n_sets = 8
        base = [qkv_of("bhsd", s) for _ in range(n_sets)]

        def cudnn(q, k, v):
            from torch.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v)

        print(f"S={s}: cuDNN bhsd no mask {time_graph(torch, [lambda x=x: cudnn(*x) for x in base], 7):.1f} us",
              flush=True)
        for layout in os.environ.get("BERT_LAYOUTS", "bhsd,const,bsh,packed,packed_bias").split(","):
            sets = base if layout == "bhsd" else [qkv_of(layout, s) for _ in range(n_sets)]
            bias = biases_of(layout)
            for kind in ("none", "add0", "add_pad", "bool_pad"):
                m = mask_of(kind, s)
                line = [f"  {layout:6s} {kind:8s}"]
                for spec in variants:
                    with env_variant(spec):
                        us = time_graph(torch, [lambda x=x: oc.fused_attention(*x, attn_mask=m, **bias) for x in sets], 7)
                    line.append(f"{spec} {us:.1f}")
                print("  ".join(line), flush=True)
            if layout != "bhsd":
                del sets
        del base
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
