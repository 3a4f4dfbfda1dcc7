#!/usr/bin/env python3
"""opsfuse's kernel and PyTorch's cuDNN attention on the same inputs of one shape, for a profiler.

Each is called three times, opsfuse first (the first calls are warm-up: lazy module loading,
cuDNN's plan). Nsight Compute's --launch-skip counts the kernels its -k filter matches, so profile
the third call of one kernel at a time:

    ncu -k regex:hopper_fwd --launch-skip 2 --launch-count 1 --section SpeedOfLight \
        --section WarpStateStats --section SourceCounters -o ours \
        python scripts/profile_kernels.py --shape 1,12,1024,64
    ncu -k regex:cudnn ... (the same) -o cudnn ...
"""
import argparse

import torch
import torch.nn.functional as F

import opsfuse.cuda as oc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="1,12,1024,64", help="B,H,S,D (Sq = Sk = S)")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    ap.add_argument("--causal", type=int, default=0)
    ap.add_argument("--mask", default="none", choices=("none", "add0", "add_pad", "bool_pad"),
                    help="a (B,1,1,S) padding mask as BERT's rewrite feeds it: additive zeros, additive "
                         "(0 / float16 min) with BERT's padded lengths, or bool with those lengths")
    args = ap.parse_args()
    b, h, s, d = (int(x) for x in args.shape.split(","))
    dt = getattr(torch, args.dtype)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dt) for _ in range(3))
    keep = torch.arange(s, device="cuda")[None, :] < torch.tensor(
        [s - round(i * 0.4 * s / max(b - 1, 1)) for i in range(b)], device="cuda")[:, None]
    mask = {"none": None, "add0": torch.zeros(b, 1, 1, s, dtype=dt, device="cuda"),
            "add_pad": ((~keep).to(dt) * torch.finfo(dt).min).view(b, 1, 1, s),
            "bool_pad": keep.view(b, 1, 1, s)}[args.mask]
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for _ in range(3):
        y = oc.fused_attention(q, k, v, is_causal=args.causal, attn_mask=mask)
    for _ in range(3):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            ref = F.scaled_dot_product_attention(q, k, v, is_causal=bool(args.causal), attn_mask=mask)
    torch.cuda.synchronize()
    print(f"max |opsfuse - cuDNN| = {(y.float() - ref.float()).abs().max().item():.3e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
