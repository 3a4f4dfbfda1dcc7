"""python -m opsfuse bench --device cpu|cuda: side-by-side benchmarks against the peers."""

from __future__ import annotations

import importlib


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="benchmark FusedAttention against its peers, side by side")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--out", default="docs/results", help="folder for the results files (default: docs/results)")
    p.add_argument("--repeat", type=int, default=None, help="timed iterations per point (default: per device)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test, not a measurement")
    p.set_defaults(func=run)


def run(args) -> int:
    backend = importlib.import_module(f"opsfuse.bench.{args.device}")
    return int(backend.run(args) or 0)
