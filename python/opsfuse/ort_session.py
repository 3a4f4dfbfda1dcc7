"""ONNX Runtime sessions with the opsfuse custom-op library registered."""

from __future__ import annotations

import os
from collections.abc import Sequence

import onnx

from ._paths import get_library_path

_PROVIDER_NAMES = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "trt": "TensorrtExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}


def provider_name(short_or_full: str) -> str:
    """'cpu' -> 'CPUExecutionProvider'; full names pass through."""
    return _PROVIDER_NAMES.get(short_or_full.lower(), short_or_full)


def session_options(intra_op_threads: int | None = None, optimization_level=None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.register_custom_ops_library(get_library_path())
    if intra_op_threads is not None:
        so.intra_op_num_threads = intra_op_threads
    if optimization_level is not None:
        so.graph_optimization_level = optimization_level
    return so


def make_session(
    model: str | os.PathLike | onnx.ModelProto | bytes,
    providers: Sequence[str] = ("cpu",),
    intra_op_threads: int | None = None,
    optimization_level=None,
    provider_options: Sequence[dict] | None = None,
    sess_options=None,
):
    """An ``onnxruntime.InferenceSession`` over `model` (path, bytes or ModelProto) with the
    opsfuse library registered. `providers` take short names ('cpu', 'cuda') or ORT's names."""
    import onnxruntime as ort

    so = sess_options or session_options(intra_op_threads, optimization_level)
    if sess_options is not None:
        so.register_custom_ops_library(get_library_path())
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    elif isinstance(model, os.PathLike):
        model = os.fspath(model)
    names = [provider_name(p) for p in providers]
    available = ort.get_available_providers()
    missing = [n for n in names if n not in available]
    if missing:
        raise RuntimeError(
            f"ONNX Runtime provider(s) {', '.join(missing)} not available in this onnxruntime "
            f"(available: {', '.join(available)})"
        )
    kwargs = {"providers": names}
    if provider_options is not None:
        kwargs["provider_options"] = list(provider_options)
    return ort.InferenceSession(model, so, **kwargs)
