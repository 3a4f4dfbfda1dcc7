"""BERT-base's attention layer (B=8, H=12, S=512, D=64, fp16, the packed (B, S, 3*H*D) layout the
--pack-qkv rewrite feeds it) timed per kernel by the PyTorch profiler in six contexts, to tell why
opsfuse's kernel takes longer inside the ONNX Runtime model than alone (docs/notes/cuda_kernel.md,
session 10): its inputs' L2 state, the GEMMs around it (clocks, caches), or nothing of the kind.

    python scripts/bert_layer_in_context.py [ROUNDS [CONTEXTS]]

CONTEXTS: a comma-separated subset of the contexts below (default: all), e.g. "alone,layer" for a
quick A/B of builds (scripts/ab_builds.sh's grid "bertctx").

Contexts, each a loop of ROUNDS (default 60) after a warm-up:
  alone        the attention call on the same inputs, back to back (inputs hot in L2)
  projection   the layer's packed projection GEMM + bias (x @ W + b, writes the packed tensor) and
               then the attention call on that tensor, as in the model
  layer        the projection, the attention, then the rest of a BERT layer's GEMMs (output
               projection 768x768 and the 768x3072 / 3072x768 feed-forward) -- the model's heat and
               L2 traffic between two attention calls
  layer+warm   the same with a small call of the same kernel (one head of the most padded row)
               right before the attention: it brings the kernel's code back into L2 (a diagnostic:
               if the code's fetch is what the GEMMs cost, the big call runs at the "projection"
               speed again; its own time is not counted)
  traffic      the projection and the attention with ~200 MB of device copies in between (L2
               flushed and refilled with dirty lines, little arithmetic)
  compute      the projection and the attention with 2048^3 matrix products on the same small
               operands in between (as much tensor-core time as the layer's GEMMs, L2 untouched)
Contenders: opsfuse (the binding; masks: none, additive zeros, transformers' padded additive) and
cuDNN (PyTorch SDPA, its backend forced; with the same additive masks where it takes them).
Prints the median device time of each attention kernel per context (µs).
"""
import statistics
import sys

import torch
import torch.nn.functional as F

import opsfuse.cuda as oc
from bert_attention_sweep import B, D, H, mask_of  # BERT's layer and masks, as the sweep builds them
from opsfuse.bench.kernel_trace import profile_calls

S = 512
HID = H * D


def views(packed):
    p = packed.view(B, S, 3, H, D)
    return tuple(p[:, :, i].transpose(1, 2) for i in range(3))


def cudnn(q, k, v, m):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)


def kernel_times(fn, rounds):
    """Median device µs of every kernel launched by `rounds` calls of fn, by kernel name (of the
    longer half of its launches when fn launches a kernel twice, a small and a large call)."""
    prof = profile_calls(torch, fn, rounds, warmup=10)
    per_name = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0:
            per_name.setdefault(e.name, []).append(e.device_time)
    out = {}
    for name, ts in per_name.items():
        if len(ts) >= 2 * rounds:
            ts = sorted(ts)[len(ts) // 2:]
        out[name] = statistics.median(ts)
    return out


def attention_kernel(times):
    keys = [k for k in times if "hopper_fwd" in k or "flash" in k or "sdpa" in k or "fmha" in k]
    return max(keys, key=lambda k: times[k]) if keys else None


def layer_tensors():
    """The layer's input x and random weights (seed 0): packed projection, output projection,
    feed-forward."""
    torch.manual_seed(0)
    x = torch.randn(B * S, HID, device="cuda", dtype=torch.float16)
    w_qkv = torch.randn(HID, 3 * HID, device="cuda", dtype=torch.float16) / HID ** 0.5
    b_qkv = torch.randn(3 * HID, device="cuda", dtype=torch.float16) * 0.1
    w_o = torch.randn(HID, HID, device="cuda", dtype=torch.float16) / HID ** 0.5
    w_1 = torch.randn(HID, 4 * HID, device="cuda", dtype=torch.float16) / HID ** 0.5
    w_2 = torch.randn(4 * HID, HID, device="cuda", dtype=torch.float16) / (4 * HID) ** 0.5
    return x, w_qkv, b_qkv, w_o, w_1, w_2


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    x, w_qkv, b_qkv, w_o, w_1, w_2 = layer_tensors()
    packed = torch.addmm(b_qkv, x, w_qkv)  # (B*S, 3*H*D)
    big_src = torch.empty(100 * 2**20, dtype=torch.uint8, device="cuda")
    big_dst = torch.empty_like(big_src)
    sq = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    masks = {kind: mask_of(kind, S) for kind in ("none", "add0", "add_pad")}
    contenders = {"opsfuse": lambda q, k, v, m: oc.fused_attention(q, k, v, attn_mask=m), "cuDNN": cudnn}

    def step(ctx, attend, m):
        small = [t[B - 1:, :1] for t in views(packed)]
        m_small = None if m is None else m[B - 1:]

        def run():
            if ctx == "alone":
                attend(*views(packed), m)
                return
            p = torch.addmm(b_qkv, x, w_qkv)
            if ctx == "layer+warm":
                attend(*small, m_small)
            y = attend(*views(p), m)
            if ctx == "traffic":
                big_dst.copy_(big_src)
                big_src.copy_(big_dst)
            if ctx == "compute":
                for _ in range(4):
                    sq @ sq
            if ctx.startswith("layer"):
                h = y.transpose(1, 2).reshape(B * S, HID) @ w_o
                (F.gelu(h @ w_1) @ w_2).sum()
        return run

    print(f"B={B} H={H} S={S} D={D} fp16, packed layout; median kernel µs over {rounds} rounds", flush=True)
    contexts = ("alone", "projection", "layer", "layer+warm", "traffic", "compute")
    if len(sys.argv) > 2:
        contexts = tuple(c for c in contexts if c in sys.argv[2].split(","))
    print(f"{'contender':9s} {'mask':8s} " + " ".join(f"{c:>12s}" for c in contexts))
    for name, attend in contenders.items():
        for mname, m in masks.items():
            cells = []
            for ctx in contexts:
                try:
                    times = kernel_times(step(ctx, attend, m), rounds)
                    k = attention_kernel(times)
                    cells.append(f"{times[k]:12.1f}" if k else f"{'?':>12s}")
                except Exception as exc:  # noqa: BLE001 - a backend that rejects this mask: say so
                    cells.append(f"{type(exc).__name__[:12]:>12s}")
            print(f"{name:9s} {mname:8s} " + " ".join(cells), flush=True)


if __name__ == "__main__":
    main()
