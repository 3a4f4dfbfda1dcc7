"""opsfuse: fuse the attention subgraphs of exported ONNX transformers into one FusedAttention op.

    import onnxruntime as ort, opsfuse
    so = ort.SessionOptions()
    so.register_custom_ops_library(opsfuse.get_library_path())
"""

from __future__ import annotations

from ._paths import LibraryNotBuiltError, build_info, get_library_path, get_trt_plugin_path
from .contract import DOMAIN, OP_NAME, OP_VERSION

__version__ = "0.1.0"

__all__ = [
    "DOMAIN",
    "OP_NAME",
    "OP_VERSION",
    "LibraryNotBuiltError",
    "__version__",
    "build_info",
    "get_library_path",
    "get_trt_plugin_path",
]
