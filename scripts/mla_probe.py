"""Latent-attention (DeepSeek-style) prefill on a GPU: Q.K over 192 columns, V of 128, bf16, against
PyTorch's SDPA backends in the same process (docs/results/mla_probe_*.md). The opsfuse output is
poisoned with NaN first and compared with a float64 SDPA where that fits in memory.

    python3 scripts/mla_probe.py        (after scripts/gpu_run.sh OUT --stages env,build)
    python3 scripts/mla_probe.py --padding-mask   (a (B, 1, 1, S) bool mask hiding the last eighth of
                                                   the keys; opsfuse's pair-mask kernel against its
                                                   general scoring, OPSFUSE_CUDA_HOPPER_MASK_PAIRS=0)
    python3 scripts/mla_probe.py --shape 1,128,2048,192,128,1 --variant dyn0=OPSFUSE_CUDA_HOPPER_DYNAMIC=0
        (only the shapes given, B,H,S,D,Dv,causal; each --variant NAME=SWITCHES adds an opsfuse row
        under those launcher switches, comma-separated NAME=VALUE, timed in the same rounds)
"""
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import opsfuse.cuda as oc
from opsfuse.bench.cuda import env_variant, time_kernels_interleaved

# (B, H, S, D, Dv, causal): DeepSeek-V3's head sizes at two prefill lengths and two head counts, and
# a D = Dv = 128 control
SHAPES = [(1, 128, 4096, 192, 128, 1), (1, 128, 2048, 192, 128, 1), (4, 16, 4096, 192, 128, 1),
          (4, 16, 4096, 192, 128, 0), (4, 16, 4096, 128, 128, 1)]
MASKED_SHAPES = [(4, 16, 4096, 192, 128, 0), (1, 128, 2048, 192, 128, 1)]
REFERENCE_LIMIT = 4 * 16 * 4096  # B * H * S up to which the float64 reference is computed


def padding_mask(b, s):
    """(B, 1, 1, S) bool, True = visible: the first 7/8 of the keys (a padded batch's shape)."""
    keep = torch.arange(s, device="cuda") < s - s // 8
    return keep.view(1, 1, 1, s).expand(b, 1, 1, s).contiguous()


def input_sets(b, h, s, d, dv, n=3):
    g = torch.Generator(device="cuda").manual_seed(0)
    return [tuple(torch.randn(b, h, s, x, device="cuda", dtype=torch.bfloat16, generator=g) for x in (d, d, dv))
            for _ in range(n)]


def sdpa_mask(mask, causal, s):
    """SDPA's form of (mask, causal): it refuses attn_mask beside is_causal, so a causal launch with a
    mask passes the two combined (bool, True = visible) and is_causal False."""
    if mask is None or not causal:
        return mask, bool(causal)
    return mask & torch.ones(s, s, dtype=torch.bool, device=mask.device).tril(), False


def sdpa_calls(sets, causal, mask=None):
    """{backend name: calls} for the SDPA backends that take these inputs."""
    mask, causal = sdpa_mask(mask, causal, sets[0][0].shape[2])
    out = {}
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                          ("flash", SDPBackend.FLASH_ATTENTION)):
        def call(t, backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(*t, attn_mask=mask, is_causal=bool(causal))
        try:
            call(sets[0])
        except RuntimeError as exc:
            print(f"  {name}: n/a ({str(exc).splitlines()[0][:80]})")
            continue
        out[name] = [lambda t=t, call=call: call(t) for t in sets]
    return out


def variant_call(t, causal, switches, mask=None):
    with env_variant(switches):
        return oc.fused_attention(*t, mask, is_causal=causal)


def opsfuse_variants(sets, d, dv, causal, mask, extra=()):
    """{name: calls}: the default launch, and the alternatives it replaced -- without a mask the
    (256, 128) kernel (OPSFUSE_CUDA_HOPPER_D192=0) and V padded to 256 (_DV_BUCKET=0), with one the
    general scoring (_MASK_PAIRS=0); then `extra` ({name: switches}, the command line's --variant)."""
    alternatives = {}
    if mask is not None:
        alternatives["opsfuse general scoring"] = "OPSFUSE_CUDA_HOPPER_MASK_PAIRS=0"
    elif dv < d:
        alternatives["opsfuse (256,128)"] = "OPSFUSE_CUDA_HOPPER_D192=0"
        alternatives["opsfuse V padded"] = "OPSFUSE_CUDA_HOPPER_DV_BUCKET=0"
    alternatives.update(extra)
    named = {"opsfuse": [lambda t=t: oc.fused_attention(*t, mask, is_causal=causal) for t in sets]}
    for name, switches in alternatives.items():
        named[name] = [lambda t=t, sw=switches: variant_call(t, causal, sw, mask) for t in sets]
    return named


def parse_args(argv):
    """(masked, shapes or None, {variant name: switches}) from the command line (module docstring)."""
    masked, shapes, extra = False, [], {}
    it = iter(argv)
    for arg in it:
        if arg == "--padding-mask":
            masked = True
        elif arg == "--shape":
            shapes.append(tuple(int(x) for x in next(it).split(",")))
        elif arg == "--variant":
            name, switches = next(it).split("=", 1)
            extra[f"opsfuse {name}"] = switches
        else:
            raise SystemExit(f"unknown argument {arg!r}; see the module docstring")
    return masked, shapes or None, extra


def main():
    masked, shapes, extra = parse_args(sys.argv[1:])
    print(torch.cuda.get_device_name(0), torch.__version__, time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
          "padding mask" if masked else "", flush=True)
    for b, h, s, d, dv, causal in shapes or (MASKED_SHAPES if masked else SHAPES):
        sets = input_sets(b, h, s, d, dv)
        mask = padding_mask(b, s) if masked else None
        q, k, v = sets[0]
        out = torch.full((b, h, s, dv), float("nan"), device="cuda", dtype=torch.bfloat16)
        oc.fused_attention(q, k, v, mask, is_causal=causal, out=out)
        err = float("nan")
        if b * h * s <= REFERENCE_LIMIT:
            ref_mask, ref_causal = sdpa_mask(mask, causal, s)
            ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=ref_mask,
                                                 is_causal=ref_causal)
            err = (out.double() - ref).abs().max().item()
        named = opsfuse_variants(sets, d, dv, causal, mask, extra)
        named.update(sdpa_calls(sets, causal, mask))
        times = time_kernels_interleaved(torch, named, repeat=9)
        flops = 2 * b * h * s * s * (d + dv) * (0.5 if causal else 1.0)
        print(f"B={b} H={h} S={s} D={d} Dv={dv} causal={causal} nan={torch.isnan(out).any().item()} "
              f"max_err_vs_f64={err:.2e}  " +
              "  ".join(f"{n} {t:.1f} us ({flops / t / 1e6:.0f} TFLOP/s)" for n, t in times.items()), flush=True)
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
