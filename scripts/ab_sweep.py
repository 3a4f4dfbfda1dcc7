"""A/B sweeps of the CUDA launcher's environment switches on a GPU (run on the device; the
notes in docs/notes/cuda_kernel.md quote its output).

    python scripts/ab_sweep.py decode  D=1 OPSFUSE_CUDA_DECODE_L2_PROMOTION=2 OPSFUSE_CUDA_HOPPER_DECODE=0
    python scripts/ab_sweep.py prefill D=1 OPSFUSE_CUDA_HOPPER_PINGPONG=0
    python scripts/ab_sweep.py prefill256 D=1 OPSFUSE_CUDA_DISABLE_HOPPER=1
    python scripts/ab_sweep.py d64 D=1 OPSFUSE_CUDA_HOPPER_PINGPONG=0
    python scripts/ab_sweep.py pshort D=1 OPSFUSE_CUDA_HOPPER_TAIL_SPLIT=1
    python scripts/ab_sweep.py causal D=1 OPSFUSE_CUDA_HOPPER_DYNAMIC=0 OPSFUSE_CUDA_HOPPER_SCHED_HEADS=4

Each argument after the grid is one variant: comma-separated NAME=VALUE pairs set while that variant
is captured (D=1 is a no-op: the defaults). AB_PRECEDE=gemm / add (with AB_INTERLEAVED=1): every
call of every contender after a Q/K/V projection GEMM of its shape, or an elementwise add of that
size (times are of the pair). AB_INTERLEAVED=1: the variants and cuDNN are timed side by side, every
round replaying each one's graph in a balanced order (the benchmark's time_kernels_interleaved, 15+
rounds), so that clock and temperature drifts fall on all alike. Issue 5's decode shapes (B=8,
Hq=32, Hkv 8 / 32, Sk 1024 / 8192 / 32768, D=128, bf16) or its prefill and seed shapes, each timed
by the benchmark's graph timer (opsfuse.bench.cuda.time_graph: the median of 7 CUDA-graph replays of
>= 10 calls) over rotated input sets (>= 256 MB, so that L2 does not flatter anyone), with PyTorch's
cuDNN SDPA backend on the same inputs first."""
import sys
import torch
import torch.nn.functional as F
import opsfuse.cuda as oc
from opsfuse.bench.cuda import env_variant, time_graph as bench_time_graph, time_kernels_interleaved
import os

SHAPES = [(8, 32, 8, 1024), (8, 32, 8, 8192), (8, 32, 8, 32768), (8, 32, 32, 1024), (8, 32, 32, 8192), (8, 32, 32, 32768)]
# prefill: (B, H, S, D, dtype, causal)
PREFILL = [(8, 16, 1024, 128, torch.bfloat16, 0), (8, 16, 1024, 128, torch.bfloat16, 1), (8, 16, 4096, 128, torch.bfloat16, 0),
           (8, 16, 4096, 128, torch.bfloat16, 1), (2, 16, 16384, 128, torch.bfloat16, 0), (2, 16, 16384, 128, torch.bfloat16, 1),
           (1, 12, 1024, 64, torch.float16, 0), (1, 12, 2048, 64, torch.float16, 0), (8, 12, 512, 64, torch.float16, 0)]
# prefill256: the Hopper kernel's D = 256 (64-key tiles) against cuDNN; A/B with OPSFUSE_CUDA_DISABLE_HOPPER=1
PREFILL256 = [(2, 16, 4096, 256, torch.bfloat16, 0), (2, 16, 4096, 256, torch.bfloat16, 1),
              (8, 16, 1024, 256, torch.bfloat16, 0)]
# general256: D = 256's general kernel (softcap, or a key-padding mask, the last eighth of each row's
# keys masked; session 40's uniform smem base), where cuDNN runs without them (a reference column)
GENERAL256 = [(2, 16, 4096, 256, torch.bfloat16, "softcap"), (8, 16, 1024, 256, torch.bfloat16, "softcap"),
              (2, 16, 4096, 256, torch.bfloat16, "padmask")]
# general: general256 and softcap at D = 128 and 64 (B=2 H=16 S=4096), the general kernel's other head
# sizes (session 40: softcap 7-9x the plain kernel's time at every head size), and softcap with the
# padding mask (Gemma 2 batched: "capmask"; session 41's tile classes)
GENERAL = GENERAL256 + [(2, 16, 4096, 128, torch.bfloat16, "softcap"), (2, 16, 4096, 64, torch.bfloat16, "softcap"),
                        (2, 16, 4096, 128, torch.bfloat16, "capmask"), (2, 16, 4096, 256, torch.bfloat16, "capmask")]
# d64: the Hopper kernel at D = 64 (the seed grid's and BERT's head size) from one to many items per
# SM, to separate its per-key-tile rate from its fixed part (fp16, non-causal)
D64 = [(1, 12, 512, 64, torch.float16, 0), (1, 12, 1024, 64, torch.float16, 0), (1, 12, 2048, 64, torch.float16, 0),
       (8, 12, 512, 64, torch.float16, 0), (4, 16, 4096, 64, torch.float16, 0)]
# pshort: the D = 128 prefill points of issue 7 that a quick A/B needs (one persistent grid with a
# partial round, one with a near-empty last round, causal, the longest)
PSHORT = [(8, 16, 1024, 128, torch.bfloat16, 0), (8, 16, 4096, 128, torch.bfloat16, 0),
          (8, 16, 4096, 128, torch.bfloat16, 1), (2, 16, 16384, 128, torch.bfloat16, 0)]
# pquick: pshort without S=16384 (stream-K, which neither chaining nor kPlain's item-boundary knobs
# touch), causal S=1024 instead: four points for A/Bs that must fit a device call beside builds
PQUICK = [(8, 16, 1024, 128, torch.bfloat16, 0), (8, 16, 1024, 128, torch.bfloat16, 1),
          (8, 16, 4096, 128, torch.bfloat16, 0), (8, 16, 4096, 128, torch.bfloat16, 1)]
# causal: the persistent grid's orders (session 8: the dynamic order against one block per row tile,
# OPSFUSE_CUDA_HOPPER_DYNAMIC=0): issue 7's causal points, other row-tile counts per head, D = 64
CAUSAL = [(8, 16, 1024, 128, torch.bfloat16, 1), (8, 16, 4096, 128, torch.bfloat16, 1),
          (2, 16, 16384, 128, torch.bfloat16, 1), (4, 32, 2048, 128, torch.bfloat16, 1),
          (1, 32, 8192, 128, torch.bfloat16, 1), (4, 16, 4096, 64, torch.float16, 1)]
# items: persistent grids of short items (8 and 4 key tiles: the per-item costs) and one-round seed
# launches, for changes at item boundaries (session 9: the pingpong's turns across a block's items)
ITEMS = [(8, 16, 1024, 128, torch.bfloat16, 0), (8, 16, 1024, 128, torch.bfloat16, 1),
         (8, 12, 512, 64, torch.float16, 0), (1, 12, 512, 64, torch.float16, 0), (1, 12, 1024, 64, torch.float16, 0)]
# seed: issue 7's seed grid (B=1 H=12 D=64 fp16, S=128-2048: one-round launches but the last)
SEED = [(1, 12, s, 64, torch.float16, 0) for s in (128, 256, 512, 1024, 2048)]
# rate: the key loop's per-tile rate at D = 64 and 128 (changes inside the softmax): one-round seed
# launches, BERT-like and long D = 64 grids, D = 128 prefill non-causal and causal
RATE = [(1, 12, 512, 64, torch.float16, 0), (1, 12, 1024, 64, torch.float16, 0), (1, 12, 2048, 64, torch.float16, 0),
        (8, 12, 512, 64, torch.float16, 0), (4, 16, 4096, 64, torch.float16, 0), (8, 16, 1024, 128, torch.bfloat16, 0),
        (8, 16, 4096, 128, torch.bfloat16, 0), (8, 16, 4096, 128, torch.bfloat16, 1)]
# short: D = 64 launches of items of <= 4 key tiles (kPlainSeq, session 26) -- the seed's S=128 and
# 256, BERT's S=128 and 512, S=384, causal S=512 -- and the seed's S=512 (the warpgroup split) and
# S=1024 (8 tiles), which the first limit (4 tiles) left alone, as controls
SHORT = [(1, 12, 128, 64, torch.float16, 0), (1, 12, 256, 64, torch.float16, 0), (8, 12, 128, 64, torch.float16, 0),
         (8, 12, 384, 64, torch.float16, 0), (8, 12, 512, 64, torch.float16, 0), (4, 16, 512, 64, torch.float16, 1),
         (1, 12, 512, 64, torch.float16, 0), (1, 12, 1024, 64, torch.float16, 0)]
# seqtiles: D = 64 items of 8 and 16 key tiles, one round and several, causal and not: where the
# in-sequence kernel's limit (OPSFUSE_CUDA_HOPPER_SEQ=N key tiles) should lie
SEQTILES = [(1, 12, 1024, 64, torch.float16, 0), (2, 16, 1024, 64, torch.float16, 0), (8, 12, 1024, 64, torch.float16, 0),
            (4, 16, 1024, 64, torch.float16, 1), (1, 12, 2048, 64, torch.float16, 0), (4, 16, 2048, 64, torch.float16, 0),
            (8, 12, 2048, 64, torch.float16, 1)]
# seq128: D = 128 launches of items of <= 8 key tiles (kPlainSeq at D = 128, session 27,
# OPSFUSE_CUDA_HOPPER_SEQ_D128=N): issue 7's S=1024 points, 4-tile items, a one-round launch, fp16 causal
SEQ128 = [(8, 16, 1024, 128, torch.bfloat16, 0), (8, 16, 1024, 128, torch.bfloat16, 1), (8, 16, 512, 128, torch.bfloat16, 0),
          (1, 16, 1024, 128, torch.bfloat16, 0), (4, 32, 512, 128, torch.float16, 1), (8, 16, 256, 128, torch.float16, 0)]
# short128: D = 128 launches of items of <= 4 key tiles (the limit chosen from seq128): one round and
# several, 1 to 4 tiles, causal and not; S=1024 as the control beyond the limit
SHORT128 = [(1, 16, 512, 128, torch.bfloat16, 0), (8, 16, 512, 128, torch.bfloat16, 0), (8, 16, 384, 128, torch.float16, 0),
            (8, 32, 256, 128, torch.bfloat16, 0), (16, 32, 128, 128, torch.float16, 0), (4, 32, 512, 128, torch.float16, 1),
            (8, 16, 1024, 128, torch.bfloat16, 0)]
# wide: D = 64 plain launches whose keys fill whole 256-key tiles (kPlainSeqWide, session 28,
# OPSFUSE_CUDA_HOPPER_SEQ_WIDE=N): the seed's S=1024 (one round of 96 items) and S=2048 (the tail
# split), BERT's S=512 and 256 (persistent), several rounds of 8-tile items, a long grid; the seed's
# S=512 (the warpgroup split, untouched) as the control
WIDE = [(1, 12, 1024, 64, torch.float16, 0), (1, 12, 2048, 64, torch.float16, 0), (8, 12, 512, 64, torch.float16, 0),
        (8, 12, 256, 64, torch.float16, 0), (2, 16, 1024, 64, torch.float16, 0), (8, 12, 1024, 64, torch.float16, 0),
        (4, 16, 4096, 64, torch.float16, 0), (1, 12, 512, 64, torch.float16, 0)]
# widelong: D = 64 grids beyond 16 wide tiles (4096 keys), the default limit when it was measured
# (OPSFUSE_CUDA_HOPPER_SEQ_WIDE=64 against it), which set today's 32
WIDELONG = [(2, 16, 8192, 64, torch.float16, 0), (1, 16, 16384, 64, torch.float16, 0), (1, 12, 4096, 64, torch.float16, 0)]
# probe128: small D <= 128 grids whose portable plan splits the keys (<= 66 blocks of 128 rows at
# D = 128, of 64 rows at D = 64, and >= 8 key tiles of 64), which hopper_eligible() left to the
# portable kernel until session 27 (B=1 H=16 S=512 D=128 read 37 µs against cuDNN's 13.6; A/B'd
# then with OPSFUSE_CUDA_FORCE_HOPPER=1, now the default's); the first line and S=256 are controls.
PROBE128 = [(8, 16, 1024, 128, torch.bfloat16, 0), (1, 16, 512, 128, torch.bfloat16, 0), (1, 16, 512, 128, torch.float16, 0),
            (1, 8, 1024, 128, torch.bfloat16, 0), (1, 4, 2048, 128, torch.bfloat16, 0), (1, 2, 4096, 128, torch.bfloat16, 0),
            (1, 4, 1024, 64, torch.float16, 0), (1, 16, 512, 128, torch.bfloat16, 1), (1, 8, 2048, 128, torch.bfloat16, 1),
            (1, 16, 256, 128, torch.bfloat16, 0)]
# chain8: causal D = 128 persistent launches over 8-15 key tiles (more items than SMs), where the
# chain is not the default (Plan::chain_tiles = 16): whether it should start at 8 for causal
# launches (session 36); the non-causal S=1024 beside them as the control
CHAIN8 = [(8, 16, 1024, 128, torch.bfloat16, 1), (8, 16, 1024, 128, torch.float16, 1), (4, 32, 1024, 128, torch.bfloat16, 1),
          (4, 16, 1536, 128, torch.bfloat16, 1), (2, 32, 1920, 128, torch.bfloat16, 1), (8, 16, 1024, 128, torch.bfloat16, 0)]
# lean: non-causal D = 128 launches whose key tiles hold no key limit (Sk a multiple of 128), where a
# kernel with the fast scoring only is exact (session 45): S=1024 bf16 / fp16 (8-tile items, the
# missed point), S=2048 and 4096 (the chain by default)
LEAN = [(8, 16, 1024, 128, torch.bfloat16, 0), (8, 16, 1024, 128, torch.float16, 0),
        (8, 16, 2048, 128, torch.bfloat16, 0), (8, 16, 4096, 128, torch.bfloat16, 0)]
# three: one-round D = 64 launches over 3-8 whole key tiles whose 64-row items outnumber the SMs, where
# the three-consumer kernel applies (kPlainSeq3, session 51; A/B against OPSFUSE_CUDA_HOPPER_SEQ3=0): the seed's
# S=1024 in fp16 and bf16, 16 heads of 1024 and 768 keys, 24 of 512, 40 of 384; the seed's S=2048
# (a persistent grid, untouched) as the control
THREE = [(1, 12, 1024, 64, torch.float16, 0), (1, 12, 1024, 64, torch.bfloat16, 0), (1, 16, 1024, 64, torch.float16, 0),
         (1, 16, 768, 64, torch.float16, 0), (1, 24, 512, 64, torch.float16, 0), (1, 40, 384, 64, torch.float16, 0),
         (1, 12, 2048, 64, torch.float16, 0)]
GRIDS = {"prefill": PREFILL, "three": THREE, "prefill256": PREFILL256, "general256": GENERAL256, "general": GENERAL, "d64": D64, "pshort": PSHORT, "pquick": PQUICK, "causal": CAUSAL, "items": ITEMS,
         "seed": SEED, "rate": RATE, "short": SHORT, "wide": WIDE, "widelong": WIDELONG,
         "seqtiles": SEQTILES, "seq128": SEQ128, "short128": SHORT128, "probe128": PROBE128, "chain8": CHAIN8, "lean": LEAN}
MODE = sys.argv.pop(1) if len(sys.argv) > 1 and sys.argv[1] in ("decode", *GRIDS) else "decode"


def sets_for(b, hq, hkv, sk):
    kv_bytes = 2 * b * hkv * sk * 128 * 2
    n = max(1, min(16, (256 << 20) // kv_bytes))
    out = []
    for _ in range(n):
        q = torch.randn(b, hq, 1, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, hkv, sk, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, hkv, sk, 128, device="cuda", dtype=torch.bfloat16)
        out.append((q, k, v))
    return out


def time_graph(fn, sets):
    """Median µs per call of `fn` over the rotated input sets (the benchmark's own graph timer)."""
    return bench_time_graph(torch, [lambda s=s: fn(*s) for s in sets], repeat=7)


def cudnn(q, k, v, causal=False):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])


def prefill_sets(b, h, s, d, dt):
    n = max(1, min(16, (256 << 20) // (3 * b * h * s * d * 2)))
    return [tuple(torch.randn(b, h, s, d, device="cuda", dtype=dt) for _ in range(3)) for _ in range(n)]


cases = []
if MODE == "decode":
    for shape in SHAPES:
        cases.append((f"B={shape[0]} Hkv={shape[2]} Sk={shape[3]}:", lambda shape=shape: sets_for(*shape), 0))
else:
    for (b, h, s_, d, dt, c) in GRIDS[MODE]:
        what = f"causal={c}" if isinstance(c, int) else c
        cases.append((f"B={b} H={h} S={s_} D={d} {str(dt)[6:]} {what}:", lambda a=(b, h, s_, d, dt): prefill_sets(*a), c))
for name, make, causal in cases:
    sets = make()
    ops = (lambda q, k, v: oc.fused_attention(q, k, v, is_causal=1)) if causal else (lambda q, k, v: oc.fused_attention(q, k, v))
    cudnn_fn = (lambda q, k, v: cudnn(q, k, v, True)) if causal else cudnn
    if causal == "softcap":
        cudnn_fn = cudnn
        ops = lambda q, k, v: oc.fused_attention(q, k, v, softcap=50.0)  # noqa: E731
    elif causal in ("padmask", "capmask"):
        cudnn_fn = cudnn
        s_k = sets[0][1].shape[2]
        pad = torch.arange(s_k, device="cuda").view(1, 1, 1, s_k) < s_k - s_k // 8
        cap = 50.0 if causal == "capmask" else 0.0
        ops = lambda q, k, v, pad=pad, cap=cap: oc.fused_attention(q, k, v, attn_mask=pad, softcap=cap)  # noqa: E731
    line = [name]
    if os.environ.get("AB_INTERLEAVED") == "1":
        def under(spec, fn, s):
            def call():
                with env_variant(spec):  # the plan is taken at capture: the graph keeps it
                    fn(*s)
            return call
        named = {"cudnn": [lambda s=s: cudnn_fn(*s) for s in sets]}
        for i, spec in enumerate(sys.argv[1:]):
            named[f"{i}:{spec or 'default'}"] = [under(spec, ops, s) for s in sets]
        precede = os.environ.get("AB_PRECEDE")
        if precede in ("gemm", "add"):
            # Each call after another kernel, as in a model, for what a programmatic dependent
            # launch gains there: the layer's Q/K/V projection GEMM (B*S x H*D @ H*D x 3*H*D, fp16,
            # cuBLAS) or an elementwise add over that product's output; the row named after it is
            # that kernel alone.
            b_, h_, s_, d_ = sets[0][0].shape
            x = torch.randn(b_ * s_, h_ * d_, device="cuda", dtype=torch.float16)
            w = torch.randn(h_ * d_, 3 * h_ * d_, device="cuda", dtype=torch.float16)
            xw = torch.zeros(b_ * s_, 3 * h_ * d_, device="cuda", dtype=torch.float16)
            first = (lambda: torch.matmul(x, w, out=xw)) if precede == "gemm" else (lambda: xw.add_(1.0))
            named = {n: [lambda c=c: (first(), c()) for c in calls] for n, calls in named.items()}
            named[precede] = [first]
        times = time_kernels_interleaved(torch, named, repeat=15)
        print("  ".join([name] + [f"{n} {t:.1f}" for n, t in times.items()]), flush=True)
        del sets
        torch.cuda.empty_cache()
        continue
    try:
        line.append(f"cudnn {time_graph(cudnn_fn, sets):.1f}")
    except Exception as e:  # noqa: BLE001
        line.append(f"cudnn err {type(e).__name__}")
    for spec in sys.argv[1:]:
        with env_variant(spec):
            line.append(f"{spec or 'default'} {time_graph(ops, sets):.1f}")
    print("  ".join(line), flush=True)
    del sets
    torch.cuda.empty_cache()
