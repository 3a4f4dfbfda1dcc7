"""FusedAttention on a CUDA GPU through the compiled launcher (the pybind11 module ``opsfuse._cuda``).

    import torch, opsfuse.cuda
    y = opsfuse.cuda.fused_attention(q, k, v, is_causal=1)   # q: (B, Hq, Sq, D) on the GPU

Any tensor exposing ``__cuda_array_interface__`` or DLPack works (PyTorch, CuPy). The work is
enqueued on the caller's current stream (PyTorch's or CuPy's) and is not waited for; the output
(and any split-KV workspace) is allocated by the inputs' own framework, so its caching allocator
and stream semantics apply. Semantics: the FusedAttention contract (opsfuse.reference).
"""

from __future__ import annotations

import importlib

__all__ = ["available", "fused_attention", "workspace_size"]


def _module():
    try:
        return importlib.import_module("opsfuse._cuda")
    except ImportError as exc:
        reason = ""
        try:
            from . import _build_config as cfg

            if not cfg.CUDA_BUILT:
                reason = f": the CUDA kernel was not built ({cfg.CUDA_REASON})"
            elif not cfg.CUDA_MODULE:
                reason = ": the pybind11 module was not built (pybind11 or Python headers missing at build time)"
        except ImportError:
            reason = ": opsfuse's C++ part is not built (pip install . from the repository)"
        raise ImportError(f"opsfuse._cuda is not available{reason} ({exc})") from exc


def available() -> bool:
    """True when the compiled module imports (it does not check for a GPU)."""
    try:
        _module()
    except ImportError:
        return False
    return True


def _framework(x):
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        return "torch"
    if mod == "cupy":
        return "cupy"
    raise TypeError(
        f"FusedAttention: opsfuse.cuda supports torch and cupy tensors, got {type(x).__module__}.{type(x).__name__}"
    )


def _current_stream(fw, x) -> int:
    if fw == "torch":
        import torch

        return int(torch.cuda.current_stream(x.device).cuda_stream)
    import cupy

    return int(cupy.cuda.get_current_stream().ptr)


def _empty(fw, x, shape, dtype=None):
    if fw == "torch":
        import torch

        return torch.empty(shape, dtype=x.dtype if dtype is None else dtype, device=x.device)
    import cupy

    with cupy.cuda.Device(x.device.id):
        return cupy.empty(shape, dtype=x.dtype if dtype is None else dtype)


def _check(result):
    """The module returns (code, message, value) instead of raising through C++."""
    code, message, value = result
    if code == 0:
        return value
    if code == 1:
        raise ValueError(message)
    raise RuntimeError(message)


def workspace_size(q, k, v, attn_mask=None, key_lengths=None, scale=None, is_causal=0, softcap=0.0, *,
                   q_bias=None, k_bias=None, v_bias=None) -> int:
    """Bytes of device scratch the launch needs (split-KV partial results, biased copies); 0 when none."""
    scale = None if scale is None else float(scale)
    return int(_check(_module().workspace_size(q, k, v, attn_mask, key_lengths, scale, int(is_causal),
                                               float(softcap), q_bias, k_bias, v_bias)))


def fused_attention(q, k, v, attn_mask=None, key_lengths=None, scale=None, is_causal=0, softcap=0.0, *,
                    q_bias=None, k_bias=None, v_bias=None, out=None, stream=None):
    """FusedAttention of CUDA tensors q (B, Hq, Sq, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv):
    returns y (B, Hq, Sq, Dv) of q's dtype (float32, float16 or bfloat16). `attn_mask`: bool or
    q's dtype, broadcastable to (B, Hq, Sq, Sk); `key_lengths`: int32/int64 (B,). `out`: an
    optional preallocated output; `q_bias` (Hq*D,), `k_bias` (Hkv*D,), `v_bias` (Hkv*Dv,): optional
    biases of q's dtype added to Q, K, V per head and column (the ONNX op's qkv_bias, split);
    `stream`: a cudaStream_t as int (default: the framework's current stream). Raises ValueError
    for inputs outside the contract, RuntimeError for device errors."""
    m = _module()
    fw = _framework(q)
    if len(getattr(q, "shape", ())) != 4 or len(getattr(v, "shape", ())) != 4:
        raise ValueError("FusedAttention: Q and V must have rank 4 (batch, heads, sequence, head size)")
    if stream is None:
        stream = _current_stream(fw, q)
    y_shape = (q.shape[0], q.shape[1], q.shape[2], v.shape[3])
    if out is None:
        out = _empty(fw, q, y_shape)
    scale = None if scale is None else float(scale)
    ws_bytes = int(_check(m.workspace_size(q, k, v, attn_mask, key_lengths, scale, int(is_causal), float(softcap),
                                           q_bias, k_bias, v_bias)))
    workspace = None
    ws_ptr = 0
    if ws_bytes > 0:
        if fw == "torch":
            import torch

            workspace = _empty(fw, q, (ws_bytes,), torch.uint8)
            ws_ptr = workspace.data_ptr()
        else:
            import cupy

            workspace = _empty(fw, q, (ws_bytes,), cupy.uint8)
            ws_ptr = workspace.data.ptr
    device = q.device.index if fw == "torch" else q.device.id
    device = -1 if device is None else int(device)
    _check(m.fused_attention(q, k, v, out, attn_mask, key_lengths, scale, int(is_causal), float(softcap), ws_ptr,
                             int(ws_bytes), int(stream), device, q_bias, k_bias, v_bias))
    return out
