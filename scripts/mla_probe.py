"""Latent-attention (DeepSeek-style) prefill on a GPU: Q.K over 192 columns, V of 128, bf16, against
PyTorch's SDPA backends in the same process (docs/results/mla_probe_*.md). The opsfuse output is
poisoned with NaN first and compared with a float64 SDPA where that fits in memory.

    python3 scripts/mla_probe.py        (after scripts/gpu_run.sh OUT --stages env,build)
"""
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
REFERENCE_LIMIT = 4 * 16 * 4096  # B * H * S up to which the float64 reference is computed


def input_sets(b, h, s, d, dv, n=3):
    g = torch.Generator(device="cuda").manual_seed(0)
    return [tuple(torch.randn(b, h, s, x, device="cuda", dtype=torch.bfloat16, generator=g) for x in (d, d, dv))
            for _ in range(n)]


def sdpa_calls(sets, causal):
    """{backend name: calls} for the SDPA backends that take these inputs."""
    out = {}
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                          ("flash", SDPBackend.FLASH_ATTENTION)):
        def call(t, backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(*t, is_causal=bool(causal))
        try:
            call(sets[0])
        except RuntimeError as exc:
            print(f"  {name}: n/a ({str(exc).splitlines()[0][:80]})")
            continue
        out[name] = [lambda t=t, call=call: call(t) for t in sets]
    return out


def variant_call(t, causal, switches):
    with env_variant(switches):
        return oc.fused_attention(*t, is_causal=causal)


def main():
    print(torch.cuda.get_device_name(0), torch.__version__, time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
          flush=True)
    for b, h, s, d, dv, causal in SHAPES:
        sets = input_sets(b, h, s, d, dv)
        q, k, v = sets[0]
        out = torch.full((b, h, s, dv), float("nan"), device="cuda", dtype=torch.bfloat16)
        oc.fused_attention(q, k, v, is_causal=causal, out=out)
        err = float("nan")
        if b * h * s <= REFERENCE_LIMIT:
            ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=bool(causal))
            err = (out.double() - ref).abs().max().item()
        named = {"opsfuse": [lambda t=t: oc.fused_attention(*t, is_causal=causal) for t in sets]}
        if dv < d:  # the same launch in session 43's (256, 128) kernel, and with V padded to 256 too (before it)
            named["opsfuse (256,128)"] = [lambda t=t: variant_call(t, causal, "OPSFUSE_CUDA_HOPPER_D192=0") for t in sets]
            named["opsfuse V padded"] = [lambda t=t: variant_call(t, causal, "OPSFUSE_CUDA_HOPPER_DV_BUCKET=0")
                                         for t in sets]
        named.update(sdpa_calls(sets, causal))
        times = time_kernels_interleaved(torch, named, repeat=9)
        flops = 2 * b * h * s * s * (d + dv) * (0.5 if causal else 1.0)
        print(f"B={b} H={h} S={s} D={d} Dv={dv} causal={causal} nan={torch.isnan(out).any().item()} "
              f"max_err_vs_f64={err:.2e}  " +
              "  ".join(f"{n} {t:.1f} us ({flops / t / 1e6:.0f} TFLOP/s)" for n, t in times.items()), flush=True)
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
