"""``python -m opsfuse golden MODEL.onnx -o golden.json``: the model's outputs with every
FusedAttention node computed by the Triton kernel, as Polygraphy ``RunResults`` JSON; the inputs
used are saved in Polygraphy's input format beside it (``polygraphy run --load-inputs``)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ..model_inputs import add_input_arguments

HELP = "golden outputs of a model: FusedAttention computed by the Triton reference kernel"


def register(subparsers) -> None:
    p = subparsers.add_parser("golden", help=HELP, description=HELP)
    p.add_argument("model", help="the ONNX model (with FusedAttention nodes)")
    p.add_argument("-o", "--output", required=True, help="where to write the RunResults JSON")
    p.add_argument("--inputs", metavar="INPUTS.json",
                   help="Polygraphy input file (a list of feed dicts, e.g. from "
                        "`polygraphy run --save-inputs`); default: generated from the model's inputs")
    add_input_arguments(p)
    p.add_argument("--save-inputs", metavar="PATH",
                   help="where to save generated inputs (default: OUTPUT with _inputs.json)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where Triton runs: cuda (compiled) or cpu (Triton's interpreter); auto = "
                        "this process's choice (cuda when a GPU is present)")
    p.set_defaults(func=run)


def _fail(msg: str, code: int = 2) -> int:
    print(f"opsfuse golden: error: {msg}", file=sys.stderr)
    return code


def default_inputs_path(output: str | Path) -> Path:
    out = Path(output)
    stem = out.name[:-5] if out.name.endswith(".json") else out.name
    return out.with_name(f"{stem}_inputs.json")


def resolve_device(choice: str):
    """The Triton device for --device; errors when the process cannot honour it."""
    from opsfuse import triton_attention

    dev = triton_attention.default_device()
    if choice != "auto" and choice != dev.type:
        raise ValueError(
            f"--device {choice}: this process runs Triton on {dev.type} "
            + ("(set TRITON_INTERPRET=1 in the environment for the CPU)" if choice == "cpu"
               else "(no CUDA GPU visible, or TRITON_INTERPRET=1 is set)"))
    return dev


def run(args) -> int:
    import onnx

    from opsfuse import accuracy, contract, golden

    accuracy.quiet_polygraphy()
    src = Path(args.model)
    if not src.is_file():
        return _fail(f"{src}: no such file")
    try:
        device = resolve_device(args.device)
        model = onnx.load(str(src))
        feeds_list = golden.prepare_inputs(model, args.inputs, args.shape, args.seed)
        nodes = golden.fused_attention_nodes(model)
    except (ValueError, NotImplementedError, OSError) as e:
        return _fail(str(e))
    if not nodes:
        print(f"note: {src} has no {contract.OP_NAME} node; the golden is plain ONNX Runtime")

    start = time.perf_counter()
    try:
        outputs = golden.golden_outputs(model, feeds_list, device=device)
    except ValueError as e:
        return _fail(str(e))
    elapsed = time.perf_counter() - start

    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    golden.make_run_results(golden.GOLDEN_RUNNER_NAME, outputs).save(str(out))
    print(f"{len(nodes)} {contract.OP_NAME} node(s) computed by Triton on {device.type}, "
          f"{len(feeds_list)} input set(s), {elapsed:.1f} s")
    if not args.inputs:
        inputs_path = Path(args.save_inputs) if args.save_inputs else default_inputs_path(out)
        golden.save_inputs(feeds_list, inputs_path)
        print(f"wrote inputs {inputs_path}")
    for name, value in outputs[0].items():
        print(f"  {name}: {value.dtype} {tuple(value.shape)}")
    print(f"wrote {out}")
    return 0
