"""python -m opsfuse info: versions, library paths and what this build contains."""

from __future__ import annotations

import json


def register(subparsers) -> None:
    p = subparsers.add_parser("info", help="print versions, library paths and which parts were built")
    p.add_argument("--json", action="store_true", help="print as JSON")
    p.set_defaults(func=run)


def collect() -> dict:
    import onnx

    import opsfuse

    try:
        import onnxruntime

        ort_version = onnxruntime.__version__
        providers = onnxruntime.get_available_providers()
    except ImportError:
        ort_version, providers = None, []
    info = {
        "opsfuse": opsfuse.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": ort_version,
        "onnxruntime_providers": providers,
    }
    info.update(opsfuse.build_info())
    return info


def run(args) -> int:
    info = collect()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    yes_no = lambda flag, why="": "yes" if flag else (f"no ({why})" if why else "no")  # noqa: E731
    print(f"opsfuse      {info['opsfuse']}")
    print(f"onnx         {info['onnx']}")
    print(f"onnxruntime  {info['onnxruntime']}  providers: {', '.join(info['onnxruntime_providers'])}")
    if not info["built"]:
        print(f"C++ library  not built: {info['reason']}")
        return 1
    print(f"ORT library  {info['ort_library']}")
    print(f"TRT plugin   {info['trt_library'] or '-'}")
    print(f"CPU kernel   {yes_no(info['cpu'])}")
    print(f"CUDA kernel  {yes_no(info['cuda'], info['cuda_reason'])}"
          + (f"  archs: {info['cuda_architectures']}" if info["cuda"] else ""))
    print(f"CUDA module  {yes_no(info['cuda_module'])}")
    print(f"TensorRT     {yes_no(info['tensorrt'], info['tensorrt_reason'])}")
    return 0
