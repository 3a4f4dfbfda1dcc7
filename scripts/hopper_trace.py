"""Where a persistent Hopper launch spends its time, from the kernel's own clocks (a diagnostic;
docs/notes/cuda_kernel.md quotes its output). Needs an opsfuse._cuda built with
CMAKE_CUDA_FLAGS=-DOPSFUSE_HOPPER_TRACE in place of the installed one (as scripts/ab_builds.sh swaps
its variants in; the shipped build has no stamps), on a GPU:

    python scripts/hopper_trace.py OUT.npz [NAME=VALUE,... per variant]

Each consumer warpgroup stamps 7 events per item (hopper_fwd.cuh, OPSFUSE_HOPPER_STAMP): 0 start,
1 Q in, 2 first K tile in, 3 its turn (first S issues), 4 first softmax done, 5 last P V done,
6 output stores issued; and the clocks its key loop waited for K and V tiles, the turn, the S and
the P V products (OPSFUSE_HOPPER_TIMED). Per shape it prints the medians of the phases and waits
(SM clocks), the key loop's clocks per tile, the gap between items, and how far apart the blocks
finish (globaltimer). A variant may set OPSFUSE_HOPPER_TRACE_GRID=N (trace builds: a persistent
grid of N blocks) to see how the pace depends on how many blocks share the L2. TRACE_GRID=seed
traces issue 7's seed grid (B=1 H=12 D=64 fp16, S=128..2048: one-round launches) instead, where
the block start times (launch skew) and the fixed part of an item are the question; TRACE_GRID=d128
only the prefill grid's non-causal S=1024 and 4096 (B=8 H=16 D=128 bf16), where the item boundary is.
Chained items (kPlainChain; OPSFUSE_CUDA_HOPPER_CHAIN=N chains from N key tiles) overlap: an item's
phases 0-4 come from the boundary step that starts it, its last P V and stores (5, 6) from the next
item's, so its "loop" phase runs into the next item's start and the gap reads negative; the
per-block µs per item compare alike."""
import os
import sys

import numpy as np
import torch

import opsfuse.cuda as oc
from opsfuse.bench.cuda import env_variant

SHAPES = [(8, 16, 1024, 128, torch.bfloat16), (8, 16, 4096, 128, torch.bfloat16), (2, 16, 16384, 128, torch.bfloat16),
          (8, 12, 512, 64, torch.float16), (1, 12, 1024, 64, torch.float16)]
SEED = [(1, 12, s, 64, torch.float16) for s in (128, 256, 512, 1024, 2048)]
D128 = [(8, 16, s, 128, torch.bfloat16) for s in (1024, 4096)]
GRIDS = {"seed": SEED, "d128": D128}
ROUNDS, EVENTS = 64, 32


def traced(q, k, v, spec, sms):
    buf = torch.zeros(sms * 2 * ROUNDS * EVENTS, dtype=torch.int64, device="cuda")
    with env_variant(spec):
        for _ in range(5):  # warm: clocks up, L2 state as in a loop of calls
            oc.fused_attention(q, k, v)
        os.environ["OPSFUSE_HOPPER_TRACE_PTR"] = str(buf.data_ptr())
        try:
            oc.fused_attention(q, k, v)
        finally:
            del os.environ["OPSFUSE_HOPPER_TRACE_PTR"]
    torch.cuda.synchronize()
    return buf.view(sms, 2, ROUNDS, EVENTS).cpu().numpy()


def summarize(name, tr, tiles):
    tr = tr[(tr[..., 0] > 0).any(axis=(1, 2))]  # the blocks that ran an item (a grid may have more)
    ns, clk = tr[..., :7].astype(np.float64), tr[..., 8:15].astype(np.float64)
    done = tr[..., 0] > 0  # (block, wg, round) items that ran
    t0 = ns[..., 0][done].min()
    ends = np.where(done, ns[..., 6], 0).max(axis=(1, 2)) - t0  # per block, µs below
    starts = np.where(done, ns[..., 0], np.inf).min(axis=(1, 2)) - t0
    items = done[:, 0, :].sum(axis=1)
    span = ends.max()
    # Clock rate from the blocks' own spans (clock64 against globaltimer over the whole block).
    c_first = np.where(done, clk[..., 0], np.inf).min(axis=(1, 2))
    c_last = np.where(done, clk[..., 6], 0).max(axis=(1, 2))
    ghz = np.median((c_last - c_first) / np.maximum(1.0, (ends - starts)))
    ph = {}
    d = clk[done]
    names = ["setup+Q", "K0 wait", "turn", "tile0", "loop", "epilogue"]
    for i, nm in enumerate(names):
        ph[nm] = np.median(d[:, i + 1] - d[:, i])
    per_tile = np.median((d[:, 5] - d[:, 4]) / max(1, tiles - 1))
    waits = np.median(tr[..., 16:21][done].astype(np.float64), axis=0) / max(1, tiles - 1)
    # The gap from one item's stores to the next item's start, same warpgroup.
    gaps = []
    for b in range(tr.shape[0]):
        for w in range(2):
            n = int(done[b, w].sum())
            if n > 1:
                gaps.extend(clk[b, w, 1:n, 0] - clk[b, w, : n - 1, 6])
    gap = np.median(gaps) if gaps else float("nan")
    full = items == items.max()
    # Per-SM speed: blocks with the same number of items, their time per item.
    per_item = ends[full] / items[full]
    print(f"{name}: span {span / 1e3:.1f} µs at {ghz:.2f} GHz; {items.min()}-{items.max()} items per block "
          f"({full.sum()} blocks with {items.max()}); block ends {ends.min() / 1e3:.1f} / "
          f"{np.median(ends) / 1e3:.1f} / {ends.max() / 1e3:.1f} µs (min / median / max); "
          f"µs per item over full blocks {per_item.min() / 1e3:.3f} / {np.median(per_item) / 1e3:.3f} / "
          f"{per_item.max() / 1e3:.3f}", flush=True)
    print(f"   block starts {starts.min() / 1e3:.2f} / {np.median(starts) / 1e3:.2f} / {starts.max() / 1e3:.2f} µs; "
          f"first stamp to Q in {np.median(ns[..., 1][done] - ns[..., 0][done]) / 1e3:.2f} µs, to first K "
          f"{np.median(ns[..., 2][done] - ns[..., 0][done]) / 1e3:.2f} µs, last P V to stores issued "
          f"{np.median(ns[..., 6][done] - ns[..., 5][done]) / 1e3:.2f} µs (medians)", flush=True)
    print("   clocks: " + "  ".join(f"{k} {v:.0f}" for k, v in ph.items()) + f"  per loop tile {per_tile:.0f}"
          f"  gap {gap:.0f}  (item {np.median(d[:, 6] - d[:, 0]):.0f})", flush=True)
    print("   waits per loop tile: " + "  ".join(f"{k} {v:.0f}" for k, v in zip(("K", "V", "turn", "S", "PV"), waits)),
          flush=True)


def main():
    out = sys.argv[1]
    specs = sys.argv[2:] or [""]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    saved = {}
    for (b, h, s, dim, dt) in GRIDS.get(os.environ.get("TRACE_GRID", ""), SHAPES):
        q, k, v = (torch.randn(b, h, s, dim, device="cuda", dtype=dt) for _ in range(3))
        for spec in specs:
            name = f"B={b} H={h} S={s} D={dim} {str(dt)[6:]} [{spec or 'default'}]"
            tr = traced(q, k, v, spec, sms)
            summarize(name, tr, (s + 127) // 128)
            saved[name] = tr
    np.savez_compressed(out, **saved)


if __name__ == "__main__":
    main()
