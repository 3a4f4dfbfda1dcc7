"""``python -m opsfuse demo``: the README's main command. Rewrites the bundled tiny BERT
(``models/tiny_bert.onnx``: 2 layers, exported from Hugging Face model code with random weights by
``models/export_models.py --default``), prints the rewrite report, the ONNX Runtime CPU latency
before and after, and the largest output difference."""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

HELP = "rewrite the bundled tiny BERT and compare it with the original in ONNX Runtime (CPU)"

_REPO_MODELS = Path(__file__).resolve().parents[3] / "models"
DEFAULT_MODEL = _REPO_MODELS / "tiny_bert.onnx"


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help=HELP, description=HELP)
    p.add_argument("--model", default=None, help=f"model to use instead of {DEFAULT_MODEL.name}")
    p.add_argument("--shape", action="append", default=None, metavar="NAME:D0xD1|DIM=N",
                   help="input shapes (default: batch 1, sequence 64)")
    p.add_argument("--runs", type=int, default=50, help="timed runs per model (median reported)")
    p.add_argument("--threads", type=int, default=1, help="ORT intra-op threads")
    p.add_argument("-o", "--output", default=None, help="also keep the rewritten model here")
    p.set_defaults(func=run)


def _find_model(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    if DEFAULT_MODEL.is_file():
        return DEFAULT_MODEL
    # Not in a source checkout (or the file was removed): export it, when torch and transformers
    # are installed (random weights, nothing downloaded).
    sys.path.insert(0, str(_REPO_MODELS))
    try:
        import export_models  # noqa: PLC0415
    except ImportError:
        raise FileNotFoundError(
            f"{DEFAULT_MODEL} is missing and models/export_models.py is not available to make it; "
            "pass --model PATH") from None
    target = Path(tempfile.gettempdir()) / "opsfuse_tiny_bert.onnx"
    if not target.is_file():
        print(f"exporting the default model to {target} (random weights, no download) ...")
        export_models.export_default(target)
    return target


def _latency(session, feeds: dict, runs: int) -> float:
    for _ in range(5):
        session.run(None, feeds)
    times = []
    for _ in range(max(1, runs)):
        t0 = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def run(args) -> int:
    import numpy as np
    import onnx

    from opsfuse import LibraryNotBuiltError
    from opsfuse.graph_passes import model_io
    from opsfuse.graph_passes.pipeline import fuse_attention
    from opsfuse.model_inputs import generate_inputs, parse_shape_args

    try:
        src = _find_model(args.model)
    except FileNotFoundError as exc:
        print(f"opsfuse demo: error: {exc}", file=sys.stderr)
        return 2
    print(f"model: {src}")
    model = model_io.load(src)
    model, report = fuse_attention(model)
    model_io.validate(model)
    with tempfile.TemporaryDirectory() as tmp:
        dst = Path(args.output) if args.output else Path(tmp) / f"{src.stem}.fused.onnx"
        model_io.save(model, dst)
        print(report.format())
        print(f"rewrite took {report.seconds:.2f} s; rewritten model: {dst if args.output else '(temporary)'}")

        shape_args = args.shape
        if shape_args is None:
            proto = onnx.load(str(src), load_external_data=False)
            shape_args = [f"{i.name}:1x64" for i in proto.graph.input
                          if len(i.type.tensor_type.shape.dim) == 2]
        try:
            from opsfuse.ort_session import make_session

            s_orig = make_session(str(src), intra_op_threads=args.threads)
            s_new = make_session(str(dst), intra_op_threads=args.threads)
        except LibraryNotBuiltError as exc:
            print(f"latency: not measured: {exc}")
            return 0
        feeds = generate_inputs(onnx.load(str(src), load_external_data=False), parse_shape_args(shape_args))
        out_orig = s_orig.run(None, feeds)
        out_new = s_new.run(None, feeds)
        max_diff = max(float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
                       for a, b in zip(out_orig, out_new))
        t_orig = _latency(s_orig, feeds, args.runs)
        t_new = _latency(s_new, feeds, args.runs)
        shapes_txt = ", ".join(f"{k} {tuple(v.shape)}" for k, v in feeds.items())
        print(f"inputs: {shapes_txt}")
        print(f"ONNX Runtime CPU latency ({args.threads} thread(s), median of {args.runs}): "
              f"original {t_orig:.3f} ms, fused {t_new:.3f} ms ({t_orig / t_new:.2f}x)")
        print(f"max |output difference|: {max_diff:.3g}")
    return 0
