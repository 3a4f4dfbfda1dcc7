"""``python -m opsfuse check MODEL.onnx``: run the model through ONNX Runtime with the opsfuse
library (per provider), the original model, TensorRT with the opsfuse plugin, and compare each
against the Triton golden with Polygraphy. Prints a table per comparison and a verdict; exits 0
when every comparison passes, 1 when any fails (2 on usage errors)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..model_inputs import add_input_arguments

HELP = "compare ONNX Runtime / TensorRT / the original model against the Triton golden (Polygraphy)"


def register(subparsers) -> None:
    p = subparsers.add_parser("check", help=HELP, description=HELP)
    p.add_argument("model", help="the ONNX model with FusedAttention nodes (e.g. from `rewrite`)")
    p.add_argument("--original", metavar="ORIG.onnx", help="the model before `rewrite`: also compared")
    p.add_argument("--golden", metavar="GOLDEN.json",
                   help="saved golden RunResults (`opsfuse golden`); give the same --inputs it used. "
                        "Default: computed now")
    p.add_argument("--providers", default="cpu",
                   help="ONNX Runtime providers to check, comma-separated (cpu,cuda); default %(default)s")
    p.add_argument("--trt", action="store_true",
                   help="also build and run a TensorRT engine with the opsfuse plugin (needs TensorRT)")
    p.add_argument("--atol", type=float, help="absolute tolerance for every output (default: by dtype)")
    p.add_argument("--rtol", type=float, help="relative tolerance for every output (default: by dtype)")
    p.add_argument("--check-error-stat", default="elemwise",
                   choices=("elemwise", "max", "mean", "median", "quantile"),
                   help="Polygraphy's error statistic checked against the tolerances (default %(default)s)")
    p.add_argument("--per-node", action="store_true",
                   help="also check each FusedAttention node on the exact inputs it sees inside the model "
                        "(and against the original model's value with --original), naming failing nodes")
    p.add_argument("--inputs", metavar="INPUTS.json", help="Polygraphy input file (list of feed dicts)")
    add_input_arguments(p)
    p.add_argument("--save-results", metavar="PATH",
                   help="save every runner's outputs, the golden's included, as Polygraphy RunResults "
                        "(`polygraphy run --load-outputs PATH` compares them again)")
    p.add_argument("--verbose", action="store_true", help="show Polygraphy's own log")
    p.set_defaults(func=run)


def _fail(msg: str, code: int = 2) -> int:
    print(f"opsfuse check: error: {msg}", file=sys.stderr)
    return code


def _load_golden(path: str, n_iterations: int):
    from opsfuse import golden

    results = golden.load_run_results(path)
    names = [name for name, _ in results]
    name = golden.GOLDEN_RUNNER_NAME if golden.GOLDEN_RUNNER_NAME in names else names[0]
    iters = dict(results)[name] if name in names else []
    if len(iters) != n_iterations:
        raise ValueError(f"{path}: {len(iters)} iteration(s) of {name!r}, but {n_iterations} input "
                         "set(s): give the --inputs the golden was computed from")
    return golden.make_run_results(golden.GOLDEN_RUNNER_NAME, [dict(it) for it in iters])


def run(args) -> int:
    import onnx

    from opsfuse import LibraryNotBuiltError, accuracy, contract, get_library_path, golden, triton_attention

    src = Path(args.model)
    for path in [src] + ([Path(args.original)] if args.original else []):
        if not path.is_file():
            return _fail(f"{path}: no such file")
    providers = [p.strip().lower() for p in args.providers.split(",") if p.strip()]
    if not providers:
        return _fail("--providers: give at least one (cpu, cuda)")
    import onnxruntime as ort

    from opsfuse.ort_session import provider_name

    available = ort.get_available_providers()
    missing = [p for p in providers if provider_name(p) not in available]
    if missing:
        return _fail(f"--providers: {', '.join(missing)} not available in this onnxruntime "
                     f"(available: {', '.join(available)})")
    accuracy.quiet_polygraphy(args.verbose)
    try:
        get_library_path()
    except LibraryNotBuiltError as e:
        return _fail(str(e))

    try:
        model = onnx.load(str(src))
        original = onnx.load(args.original) if args.original else None
        feeds_list = golden.prepare_inputs(model, args.inputs, args.shape, args.seed)
        nodes = golden.fused_attention_nodes(model)
    except (ValueError, NotImplementedError, OSError) as e:
        return _fail(str(e))
    print(f"{src}: {len(nodes)} {contract.OP_NAME} node(s); {len(feeds_list)} input set(s)")

    runners = [accuracy.ort_runner(str(src), p, f"onnxrt-opsfuse-{p}") for p in providers]
    if original is not None:
        runners.append(accuracy.ort_runner(args.original, "cpu", "onnxrt-original-cpu"))
    notes = []
    if args.trt:
        reason = accuracy.tensorrt_available()
        if reason is None:
            if len(feeds_list) > 1 and any(
                    {n: v.shape for n, v in f.items()} != {n: v.shape for n, v in feeds_list[0].items()}
                    for f in feeds_list):
                return _fail("--trt: every input set must have the same shapes (one engine profile)")
            try:
                runners.append(accuracy.trt_runner(str(src), feeds_list[0]))
            except LibraryNotBuiltError as e:
                return _fail(f"--trt: {e}")
        else:
            print(f"--trt: {reason}; the TensorRT comparison is skipped")
            notes.append("TensorRT skipped: not installed")

    try:
        run_results = accuracy.run_runners(runners, feeds_list)
    except Exception as e:  # noqa: BLE001 - a runtime failing to load or run the model is a result
        return _fail(f"running the model failed: {type(e).__name__}: {e}", code=1)

    device = triton_attention.default_device()
    try:
        if args.golden:
            golden_results = _load_golden(args.golden, len(feeds_list))
            golden_source = args.golden
        else:
            golden_results = golden.make_run_results(
                golden.GOLDEN_RUNNER_NAME, golden.golden_outputs(model, feeds_list, device=device))
            golden_source = f"computed now, Triton on {device.type}"
    except (ValueError, NotImplementedError) as e:
        return _fail(str(e))
    run_results.extend(golden_results)
    if args.save_results:
        run_results.save(args.save_results)
        print(f"wrote {args.save_results}")

    report = accuracy.compare_to_golden(run_results, atol=args.atol, rtol=args.rtol,
                                        check_error_stat=args.check_error_stat)
    report.notes.extend(notes)
    print()
    print(accuracy.format_report(report, f"Outputs vs the Triton golden ({golden_source}):"))

    reports = [report]
    if args.per_node and nodes:
        for p in providers:
            kernel = accuracy.check_nodes_kernel(model, feeds_list, p, atol=args.atol, rtol=args.rtol,
                                                 check_error_stat=args.check_error_stat, device=device)
            print()
            print(accuracy.format_report(kernel, f"Per node, ONNX Runtime ({p}):"))
            reports.append(kernel)
        if original is not None:
            rewrite = accuracy.check_nodes_rewrite(model, original, feeds_list, atol=args.atol,
                                                   rtol=args.rtol, check_error_stat=args.check_error_stat,
                                                   device=device)
            print()
            print(accuracy.format_report(rewrite, "Per node, against the original model:"))
            reports.append(rewrite)

    failed = [row for r in reports for row in r.failed_rows()]
    print()
    if not failed:
        print(f"PASS: {sum(len(r.rows) for r in reports)} comparison(s) within tolerance")
        return 0
    print(f"FAIL: {len(failed)} comparison(s) out of tolerance")
    for row in failed:
        print(f"  {row.comparison}: {row.output}")
    failing_nodes = [row.output for r in reports[1:] for row in r.failed_rows()]
    if failing_nodes:
        print("failing FusedAttention node(s): " + ", ".join(dict.fromkeys(failing_nodes)))
    elif nodes and not args.per_node:
        print("rerun with --per-node (and --original) to find the FusedAttention node at fault")
    return 1
