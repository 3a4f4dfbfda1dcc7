"""``python -m opsfuse rewrite IN.onnx -o OUT.onnx``: fuse every provable attention subgraph into
one com.opsfuse::FusedAttention node, check the result, write it, and print a report."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..model_inputs import add_input_arguments

HELP = "fuse the attention subgraphs of an ONNX model into FusedAttention nodes"


def register(subparsers) -> None:
    p = subparsers.add_parser("rewrite", help=HELP, description=HELP)
    p.add_argument("input", help="the ONNX model to rewrite")
    p.add_argument("-o", "--output", required=True, help="where to write the rewritten model")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--verify", action="store_true",
                   help="run the original and the rewritten model in ONNX Runtime (CPU, opsfuse library) on "
                        "random inputs and fail if outputs differ beyond a dtype-aware tolerance")
    add_input_arguments(p, "the --verify inputs")
    p.add_argument("--pack-qkv", action="store_true",
                   help="also replace the three Q/K/V projection MatMuls (and bias Adds) of one hidden state by one "
                        "MatMul on the concatenated weights, read by FusedAttention as packed_qkv=1 (3-D form only), "
                        "the concatenated biases becoming its qkv_bias input (no Add). "
                        "NOT bit-exact: one GEMM of a different shape may round differently; the default rewrite "
                        "is exact")
    p.add_argument("--overwrite", "--force", dest="overwrite", action="store_true",
                   help="allow OUTPUT to be the input file itself")
    p.add_argument("--external-data", choices=("auto", "yes", "no"), default="auto",
                   help="write weights to OUTPUT.data: auto = when the input had external data or is over 2 GB")
    p.set_defaults(func=run)


def _fail(msg: str, code: int = 2) -> int:
    print(f"opsfuse rewrite: error: {msg}", file=sys.stderr)
    return code


def _same_file(a: Path, b: Path) -> bool:
    try:
        return b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def run(args) -> int:
    from opsfuse.graph_passes import model_io
    from opsfuse.graph_passes.pipeline import fuse_attention

    src, dst = Path(args.input), Path(args.output)
    if not src.is_file():
        return _fail(f"{src}: no such file")
    if _same_file(src, dst) and not args.overwrite:
        return _fail(f"{dst} is the input model; pass --overwrite to replace it")
    shapes = {}
    if args.verify:
        from opsfuse.model_inputs import parse_shape_args

        try:
            shapes = parse_shape_args(args.shape)
        except ValueError as exc:
            return _fail(str(exc))
    try:
        model = model_io.load(src)
    except (model_io.InvalidModelError, OSError) as exc:
        return _fail(str(exc))
    external = {"auto": None, "yes": True, "no": False}[args.external_data]
    if external is None:
        external = model_io.has_external_data(model) or model_io.weight_bytes(model) > model_io.PROTOBUF_LIMIT
    try:
        model, report = fuse_attention(model, pack_qkv=args.pack_qkv)
    except Exception as exc:  # a model the passes cannot read: say so in one line
        return _fail(f"{src}: unsupported model ({type(exc).__name__}: {exc})")
    try:
        model_io.validate(model)
    except model_io.InvalidModelError as exc:
        return _fail(f"the rewritten model is not valid, nothing written: {exc}", code=3)
    try:
        model_io.save(model, dst, external_data=external)
    except Exception as exc:  # disk full, permissions, a model over 2 GB with --external-data no
        return _fail(f"cannot write {dst}: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}")

    result = None
    if args.verify:
        from opsfuse.graph_passes.verify import verify

        verify_src = src if not _same_file(src, dst) else None
        if verify_src is None:
            result = None
            print("opsfuse rewrite: --verify skipped: the input was overwritten", file=sys.stderr)
        else:
            result = verify(src, dst, shapes, seed=args.seed)
    if args.json:
        out = report.to_dict()
        out["output"] = str(dst)
        if result is not None:
            out["verify"] = result.to_dict()
        print(json.dumps(out, indent=2))
    else:
        print(report.format())
        print(f"wrote {dst}")
        if result is not None:
            print(result.format())
    if result is not None and not result.ok:
        if not args.json:
            print(f"opsfuse rewrite: error: --verify failed: {result.error or 'outputs differ beyond tolerance'}",
                  file=sys.stderr)
        return 1
    return 0
