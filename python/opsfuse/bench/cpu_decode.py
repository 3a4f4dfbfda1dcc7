"""python -m opsfuse.bench.cpu_decode: one-token decoding on the CPU, FusedAttention against ORT's
unfused graph.

B=1, H=12 (Hq = Hkv), Sq=1, D=64, Sk in {1024, 4096}, float32, no mask — the shape where a work
item of the CPU kernel holds a single query row (docs/notes/cpu_kernel.md, version 10). Both
models run through ONNX Runtime's CPU execution provider with the same session settings as
`python -m opsfuse bench --device cpu` (bench/cpu.py); rounds alternate between the models and the
median of session.run is reported. Results: cpu_decode.md and cpu_decode.json in --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path

from . import cpu
from .cpu import cpu_model, kernel_isa, load_average, make_session

B, H, D = 1, 12, 64
SK = (1024, 4096)
KINDS = ("fused", "unfused")


def build_model(kind: str, sk: int):
    """Q (B, H, 1, D), K and V (B, H, Sk, D) -> Y (B, H, 1, D)."""
    return cpu.build_model(kind, B, H, sk, D, sq=1)


def time_sk(sk: int, rounds: int) -> dict:
    import numpy as np

    rng = np.random.default_rng(0)
    feeds = {"Q": rng.standard_normal((B, H, 1, D), dtype=np.float32)}
    feeds.update({n: rng.standard_normal((B, H, sk, D), dtype=np.float32) for n in "KV"})
    sessions = {kind: make_session(kind, build_model(kind, sk)) for kind in KINDS}
    outs = {kind: sessions[kind].run(None, feeds)[0] for kind in KINDS}
    err = float(np.abs(outs["fused"] - outs["unfused"]).max())
    if not err < 1e-4:
        raise RuntimeError(f"Sk={sk}: FusedAttention differs from the unfused graph by {err}")
    for _ in range(20):
        for kind in KINDS:
            sessions[kind].run(None, feeds)
    times = {kind: [] for kind in KINDS}
    for _ in range(rounds):
        for kind in KINDS:
            t = time.perf_counter()
            sessions[kind].run(None, feeds)
            times[kind].append(time.perf_counter() - t)
    return {"Sk": sk, "max_abs_diff": err, **{kind: statistics.median(times[kind]) * 1e6 for kind in KINDS}}


def run(args) -> int:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": f"python -m opsfuse.bench.cpu_decode --out {args.out} --rounds {args.rounds}",
        "machine": f"{cpu_model()}, kernel ISA {kernel_isa()}, Python {platform.python_version()}",
        "load_before": load_average(),
    }
    rows = []
    for sk in SK:
        row = time_sk(sk, args.rounds)
        rows.append(row)
        print(f"Sk={sk:5d}  fused {row['fused']:8.0f} us  unfused {row['unfused']:8.0f} us  "
              f"speed-up {row['unfused'] / row['fused']:.2f}x", flush=True)
    meta["load_after"] = load_average()
    (out_dir / "cpu_decode.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [
        "# CPU decoding: FusedAttention vs ORT's unfused graph",
        "",
        f"- date: {meta['date']}",
        f"- command: `{meta['command']}`",
        f"- machine: {meta['machine']}; load average before {meta['load_before']}, after {meta['load_after']}",
        f"- shape: B={B}, H={H} (Hq = Hkv), Sq=1, D={D}, float32, no mask; median of session.run over "
        f"{args.rounds} alternating rounds after 20 warm-up rounds",
        "",
        "| Sk | FusedAttention (µs) | unfused MatMul-Softmax-MatMul (µs) | speed-up | max abs difference |",
        "|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {r['Sk']} | {r['fused']:.0f} | {r['unfused']:.0f} | {r['unfused'] / r['fused']:.2f}x | "
              f"{r['max_abs_diff']:.1e} |" for r in rows]
    (out_dir / "cpu_decode.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out_dir / 'cpu_decode.md'}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m opsfuse.bench.cpu_decode")
    p.add_argument("--out", default="docs/results")
    p.add_argument("--rounds", type=int, default=300)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
