#!/usr/bin/env python3
"""Where a seed-grid session.run's time goes, opsfuse's op against ORT's MultiHeadAttention.

For each sequence length (B=1, H=12, D=64, no mask, IO binding on device, as `opsfuse bench`):
  - wall time per run_with_iobinding (median, as the benchmark measures it);
  - GPU time per run by kernel (PyTorch's profiler sees ORT's kernels too);
  - host time of the attention node's Compute (ORT's own session profile, "_kernel_time" events).
The gap between wall time and GPU time is host and launch overhead: this says whether a miss is the
kernel's or the call's.

    python scripts/ort_seed_trace.py --seqs 128,2048 --dtype float16
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

import torch  # before onnxruntime: onnxruntime-gpu loads the CUDA libraries torch brings
import numpy as np
import onnxruntime as ort

from opsfuse.bench.cuda import make_sets, n_sets, ort_bound_calls, ort_models, time_host
from opsfuse.bench.kernel_trace import format_trace, trace_kernels

PEERS = ("opsfuse via ORT", "ORT MultiHeadAttention", "ORT Attention-23")


def node_host_us(ort, torch, name, model, layout, sets, shape, tdt, npdt, tmp):
    """Median host duration of each node's Compute over 50 profiled runs: {op type: us}."""
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(Path(tmp) / "seedtrace")
    calls, _, _, sess = ort_bound_calls(ort, torch, name, model, layout, sets, shape, tdt, npdt, so)
    for i in range(60):
        calls[i % len(calls)]()
    torch.cuda.synchronize()
    events = json.loads(Path(sess.end_profiling()).read_text())
    per_op: dict = {}
    for e in events:
        if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time"):
            per_op.setdefault(e["args"].get("op_name", "?"), []).append(float(e["dur"]))
        if e.get("cat") == "Session" and e.get("name") == "model_run":
            per_op.setdefault("(model_run)", []).append(float(e["dur"]))
    return {op: statistics.median(v[10:] or v) for op, v in per_op.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqs", default="128,2048")
    ap.add_argument("--dtype", default="float16", choices=("float16", "float32"))
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    ap.add_argument("--tmp", default="/tmp")
    args = ap.parse_args()
    tdt, npdt = getattr(torch, args.dtype), getattr(np, args.dtype)
    esize = 2 if args.dtype == "float16" else 4
    result = {"dtype": args.dtype, "gpu": torch.cuda.get_device_name(0), "onnxruntime": ort.__version__,
              "points": []}
    for s in (int(x) for x in args.seqs.split(",")):
        b, h, d = 1, 12, 64
        sets = make_sets(torch, tdt, b, h, h, s, s, d, n_sets(3 * b * h * s * d * esize))
        for name, (model, layout) in ort_models(args.dtype, b, h, s, d).items():
            if name not in PEERS:
                continue
            calls, _, _, _ = ort_bound_calls(ort, torch, name, model, layout, sets, (b, h, s, d), tdt, npdt)
            wall = time_host(torch, calls, 400)
            trace = trace_kernels(torch, lambda: [c() for c in calls], rounds=2)
            per_call = {k: v / len(calls) if k != "top" else v for k, v in trace.items()}
            per_call["top"] = [dict(r, us=r["us"] / len(calls), per_round=r["per_round"] / len(calls))
                               for r in trace["top"]]
            host = node_host_us(ort, torch, name, model, layout, sets, (b, h, s, d), tdt, npdt, args.tmp)
            print(f"S={s} {name}: wall {wall:.1f} us per run; node Compute (host) {host}")
            print(format_trace(per_call), flush=True)
            result["points"].append({"S": s, "impl": name, "wall_us": wall, "kernels": per_call, "host_us": host})
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
