"""FusedAttention's CUDA kernel through ONNX Runtime's CUDA execution provider: IO binding with
device buffers (no host copies), every node forced onto the CUDA EP (CPU fallback disabled), the
2x rule against the float64 reference, and CUDA graph capture (enable_cuda_graph). Skips when
this onnxruntime has no CUDA EP (onnxruntime-gpu is needed)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto

from accuracy import assert_within_2x_torch, biased_sums, random_inputs
from cuda_helpers import BF16, FakeTensor, fresh_rng, poisoned, to_device, to_numpy
from ort_helpers import fused_attention_model

pytestmark = pytest.mark.gpu

_ONNX_TYPE = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
              BF16: TensorProto.BFLOAT16}


@pytest.fixture(scope="module")
def ort():
    import torch  # noqa: F401  (loads the CUDA 13 libraries onnxruntime-gpu links against)
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.skip(f"onnxruntime {onnxruntime.__version__} has no CUDAExecutionProvider (install onnxruntime-gpu)")
    return onnxruntime


def cuda_session(ort, model, cuda_graph=False):
    import opsfuse

    model.ir_version = min(model.ir_version, 10)  # onnx 1.23 writes IR 14; onnxruntime 1.31 reads <= 13
    so = ort.SessionOptions()
    so.register_custom_ops_library(opsfuse.get_library_path())
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")  # FusedAttention must run on CUDA
    opts = {"device_id": "0"}
    if cuda_graph:
        opts["enable_cuda_graph"] = "1"
    return ort.InferenceSession(model.SerializeToString(), so, providers=[("CUDAExecutionProvider", opts)])


def bind(binding, name, tensor, np_dtype):
    elem = np_dtype
    if np.dtype(np_dtype) == BF16:
        elem = TensorProto.BFLOAT16
    binding.bind_input(name, "cuda", 0, elem, list(tensor.shape), tensor.data_ptr())


def run_ort(ort, session, q, k, v, attn_mask=None, key_lengths=None, out_shape=None, qkv_bias=None):
    import torch

    binding = session.io_binding()
    tensors = {"Q": to_device(q), "K": to_device(k), "V": to_device(v)}
    if qkv_bias is not None:
        tensors["qkv_bias"] = to_device(qkv_bias)
    if attn_mask is not None:
        tensors["attn_mask"] = to_device(attn_mask)
    if key_lengths is not None:
        tensors["key_lengths"] = torch.from_numpy(np.asarray(key_lengths)).to("cuda")
    for name, t in tensors.items():
        arr_dtype = {torch.bool: np.bool_, torch.int32: np.int32, torch.int64: np.int64}.get(t.dtype, q.dtype)
        try:
            bind(binding, name, t, arr_dtype)
        except (TypeError, RuntimeError) as exc:
            pytest.skip(f"this onnxruntime cannot bind a {t.dtype} device buffer: {exc}")
    out = poisoned(out_shape or (q.shape[0], q.shape[1], q.shape[2], v.shape[3]), q.dtype)
    out_elem = TensorProto.BFLOAT16 if np.dtype(q.dtype) == BF16 else q.dtype
    binding.bind_output("Y", "cuda", 0, out_elem, list(out.shape), out.data_ptr())
    torch.cuda.synchronize()
    session.run_with_iobinding(binding)
    torch.cuda.synchronize()
    return to_numpy(out, q.dtype)


CASES = [
    # dtype, (b, hq, hkv, sq, sk, d, dv), attrs, mask kind, key_lengths dtype
    (np.float16, (2, 4, 4, 97, 97, 64, 64), {}, None, None),
    (np.float16, (1, 8, 2, 1, 3000, 128, 128), {"is_causal": 2}, None, np.int64),
    (ml_dtypes.bfloat16, (2, 4, 2, 130, 130, 128, 128), {"is_causal": 1}, "bool", None),
    (ml_dtypes.bfloat16, (1, 2, 2, 40, 77, 96, 80), {"softcap": 20.0}, "additive", np.int32),
    (np.float32, (2, 3, 3, 65, 120, 64, 64), {"scale": 0.2}, "additive", None),
    (np.float32, (1, 4, 1, 33, 90, 256, 40), {"is_causal": 2}, "bool", np.int32),
    # latent attention (DeepSeek-V3's 192 / 128): on Hopper the (192, 128) kernel, plain and general
    (ml_dtypes.bfloat16, (2, 16, 16, 300, 300, 192, 128), {"is_causal": 1}, None, None),
    (np.float16, (2, 16, 4, 260, 520, 192, 128), {}, "bool", np.int64),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_ort_cuda_ep_io_binding(ort, case):
    dtype, (b, hq, hkv, sq, sk, d, dv), attrs, mask_kind, kl_dtype = CASES[case]
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, b, hq, hkv, sq, sk, d, dv)
    mask = None
    if mask_kind == "bool":
        mask = rng.random((b, 1, sq, sk)) < 0.8
    elif mask_kind == "additive":
        mask = rng.standard_normal((sq, sk)).astype(dtype)
    lengths = None
    if kl_dtype is not None:
        lengths = rng.integers(0, sk + 1, size=b).astype(kl_dtype)
    model = fused_attention_model(dtype, None if mask is None else mask.dtype, 0 if mask is None else mask.ndim,
                                  kl_dtype, **attrs)
    session = cuda_session(ort, model)
    out = run_ort(ort, session, q, k, v, mask, lengths)
    assert_within_2x_torch(out, q, k, v, mask, lengths, attrs.get("scale"), attrs.get("is_causal", 0),
                           attrs.get("softcap", 0.0), what=f"ORT CUDA EP (seed {seed})")


def test_ort_cuda_graph_capture(ort):
    """Static shapes under enable_cuda_graph: the op must neither synchronize nor allocate outside
    ORT's allocator; replays must see new input values written into the same buffers."""
    import torch

    rng, seed = fresh_rng()
    dtype = np.float16
    dims = (1, 8, 2, 1, 4096, 128, 128)  # split-KV: ORT-allocated workspace inside the graph
    model = fused_attention_model(dtype, is_causal=2)
    session = cuda_session(ort, model, cuda_graph=True)
    q, k, v = random_inputs(rng, dtype, *dims)
    tq, tk, tv = to_device(q), to_device(k), to_device(v)
    out = poisoned((dims[0], dims[1], dims[3], dims[6]), dtype)
    binding = session.io_binding()
    for name, t in (("Q", tq), ("K", tk), ("V", tv)):
        bind(binding, name, t, dtype)
    binding.bind_output("Y", "cuda", 0, dtype, list(out.shape), out.data_ptr())
    torch.cuda.synchronize()
    session.run_with_iobinding(binding)  # captures
    for _ in range(2):
        q, k, v = random_inputs(rng, dtype, *dims)
        tq.copy_(to_device(q)), tk.copy_(to_device(k)), tv.copy_(to_device(v))
        out.fill_(float("nan"))
        torch.cuda.synchronize()
        session.run_with_iobinding(binding)  # replays
        torch.cuda.synchronize()
        assert_within_2x_torch(to_numpy(out, dtype), q, k, v, is_causal=2, what=f"ORT CUDA graph (seed {seed})")


def to_3d(x):
    """(B, H, S, D) -> the 3-D form's (B, S, H*D) (docs/notes/contract_3d_form.md)."""
    b, h, s, d = x.shape
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3)).reshape(b, s, h * d)


CASES_3D = [
    # dtype, (b, hq, hkv, sq, sk, d, dv), attrs, additive (B,1,1,Sk) mask. Each kernel family reads
    # the (B, S, H*D) strides: Hopper prefill (fp16/bf16, D <= 256; D = 256 in 64-key tiles), decode
    # (Sq=1), float32; the "portable" run of each case sends fp16/bf16 prefill to the sm80 kernel.
    (np.float16, (2, 12, 12, 128, 128, 64, 64), {}, True),             # BERT-base layer shape
    (ml_dtypes.bfloat16, (1, 8, 2, 300, 300, 128, 128), {"is_causal": 1}, False),
    (np.float16, (3, 8, 2, 1, 1000, 128, 128), {"is_causal": 2}, True),
    (np.float16, (1, 4, 4, 97, 200, 256, 80), {"softcap": 30.0}, False),
    (np.float32, (2, 6, 3, 65, 70, 40, 40), {}, True),
]


@pytest.mark.parametrize("kernels", ["default", "portable"])
@pytest.mark.parametrize("case", range(len(CASES_3D)))
def test_ort_cuda_ep_3d_form(ort, case, kernels, monkeypatch):
    """The 3-D form on the CUDA EP: same kernels, strides of (B, S, H*D); the 2x rule on the
    4-D reference of the same data. "portable": OPSFUSE_CUDA_DISABLE_HOPPER=1 (read at every call)."""
    if kernels == "portable":
        monkeypatch.setenv("OPSFUSE_CUDA_DISABLE_HOPPER", "1")
    dtype, (b, hq, hkv, sq, sk, d, dv), attrs, with_mask = CASES_3D[case]
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, dtype, b, hq, hkv, sq, sk, d, dv)
    mask = np.where(rng.random((b, 1, 1, sk)) < 0.85, 0.0, -np.inf).astype(dtype) if with_mask else None
    model = fused_attention_model(dtype, None if mask is None else mask.dtype, 0 if mask is None else 4, None,
                                  rank=3, q_num_heads=hq, kv_num_heads=hkv, **attrs)
    session = cuda_session(ort, model)
    out3 = run_ort(ort, session, to_3d(q), to_3d(k), to_3d(v), mask, out_shape=(b, sq, hq * dv))
    out = out3.reshape(b, sq, hq, dv).transpose(0, 2, 1, 3)
    assert_within_2x_torch(out, q, k, v, mask, None, attrs.get("scale"), attrs.get("is_causal", 0),
                           attrs.get("softcap", 0.0), what=f"ORT CUDA EP, 3-D form (seed {seed})")


CASES_PACKED = [
    # dtype, (b, hq, hkv, s, d), attrs, additive (B,1,1,S) mask. Q, K, V are each the packed
    # (B, S, (Hq + 2*Hkv)*D) tensor; K and V start Hq*D and (Hq + Hkv)*D elements into each row.
    (np.float16, (2, 12, 12, 128, 64), {}, True),                     # BERT-base packed projection
    (ml_dtypes.bfloat16, (1, 8, 2, 300, 128), {"is_causal": 1}, False),  # GQA, Hopper-sized
    (np.float16, (1, 3, 1, 97, 20), {"softcap": 30.0}, True),         # window offsets not 16-byte aligned
    (np.float32, (2, 6, 2, 65, 40), {"is_causal": 2}, True),
]


@pytest.mark.parametrize("case", range(len(CASES_PACKED)))
def test_ort_cuda_ep_packed_qkv(ort, case):
    """packed_qkv = 1 on the CUDA EP: the kernels read Q, K, V as column windows of the packed
    rows; the 2x rule on the 4-D reference of the windows."""
    dtype, (b, hq, hkv, s, d), attrs, with_mask = CASES_PACKED[case]
    rng, seed = fresh_rng()
    p = rng.standard_normal((b, s, (hq + 2 * hkv) * d)).astype(dtype)
    mask = np.where(rng.random((b, 1, 1, s)) < 0.85, 0.0, -np.inf).astype(dtype) if with_mask else None
    model = fused_attention_model(dtype, None if mask is None else mask.dtype, 0 if mask is None else 4, None,
                                  rank=3, q_num_heads=hq, kv_num_heads=hkv, packed_qkv=1, **attrs)
    session = cuda_session(ort, model)
    out3 = run_ort(ort, session, p, p, p, mask, out_shape=(b, s, hq * d))
    out = out3.reshape(b, s, hq, d).transpose(0, 2, 1, 3)

    def heads(lo, n):  # columns [lo*D, (lo+n)*D) of P as (B, n, S, D)
        return np.ascontiguousarray(p[..., lo * d:(lo + n) * d].reshape(b, s, n, d).transpose(0, 2, 1, 3))

    q, k, v = heads(0, hq), heads(hq, hkv), heads(hq + hkv, hkv)
    assert_within_2x_torch(out, q, k, v, mask, None, attrs.get("scale"), attrs.get("is_causal", 0),
                           attrs.get("softcap", 0.0), what=f"ORT CUDA EP, packed Q/K/V (seed {seed})")


CASES_PACKED_BIAS = [
    # dtype, (b, hq, hkv, s, d), attrs, additive (B,1,1,S) mask, kernels. qkv_bias (input 5,
    # docs/notes/contract_qkv_bias.md): the Hopper kernel adds it itself; the other plans (float32,
    # softcap with K's bias, the portable kernels) read biased copies written into ORT's scratch.
    (np.float16, (8, 12, 12, 512, 64), {}, True, "default"),          # BERT-base S=512, as benchmarked
    (ml_dtypes.bfloat16, (1, 8, 2, 300, 128), {"is_causal": 1}, False, "default"),
    (np.float16, (2, 12, 12, 128, 64), {}, True, "portable"),
    (np.float16, (1, 4, 2, 97, 80), {"softcap": 30.0}, True, "default"),
    (np.float32, (2, 6, 2, 65, 40), {"is_causal": 2}, True, "default"),
]


@pytest.mark.parametrize("case", range(len(CASES_PACKED_BIAS)))
def test_ort_cuda_ep_packed_qkv_bias(ort, case, monkeypatch):
    """packed_qkv = 1 with qkv_bias on the CUDA EP: the 2x rule against the float64 reference on
    the exact sums P + bias (PyTorch's yardstick on the sums rounded to T, as the graph's Add did).
    Padded sequences include one with no visible key: its rows must be zeros, not V's bias."""
    import onnx
    from onnx import helper

    dtype, (b, hq, hkv, s, d), attrs, with_mask, kernels = CASES_PACKED_BIAS[case]
    if kernels == "portable":
        monkeypatch.setenv("OPSFUSE_CUDA_DISABLE_HOPPER", "1")
    rng, seed = fresh_rng()
    width = (hq + 2 * hkv) * d
    p = rng.standard_normal((b, s, width)).astype(dtype)
    bias = rng.standard_normal(width).astype(dtype)
    mask = None
    if with_mask:
        lengths = rng.integers(1, s + 1, size=b)
        lengths[-1] = 0 if b > 1 else lengths[-1]
        mask = np.where(np.arange(s)[None, None, None, :] < lengths[:, None, None, None], 0.0, -np.inf).astype(dtype)
    model = fused_attention_model(dtype, None if mask is None else mask.dtype, 0 if mask is None else 4, None,
                                  rank=3, q_num_heads=hq, kv_num_heads=hkv, packed_qkv=1, **attrs)
    node = model.graph.node[0]
    node.input.extend([""] * (5 - len(node.input)) + ["qkv_bias"])
    model.graph.input.append(helper.make_tensor_value_info("qkv_bias", _ONNX_TYPE[np.dtype(dtype)], [width]))
    onnx.checker.check_model(model)
    session = cuda_session(ort, model)
    out3 = run_ort(ort, session, p, p, p, mask, out_shape=(b, s, hq * d), qkv_bias=bias)
    out = out3.reshape(b, s, hq, d).transpose(0, 2, 1, 3)

    def heads(x, lo, n):  # columns [lo*D, (lo+n)*D) of x as (B, n, S, D)
        return np.ascontiguousarray(x[..., lo * d:(lo + n) * d].reshape(b, s, n, d).transpose(0, 2, 1, 3))

    rounded_p, exact_p = biased_sums(p, bias)
    windows = ((0, hq), (hq, hkv), (hq + hkv, hkv))
    assert_within_2x_torch(out, *(heads(rounded_p, lo, n) for lo, n in windows), mask, None, attrs.get("scale"),
                           attrs.get("is_causal", 0), attrs.get("softcap", 0.0),
                           what=f"ORT CUDA EP, packed Q/K/V + qkv_bias (seed {seed})",
                           exact=tuple(heads(exact_p, lo, n) for lo, n in windows))
    if with_mask and b > 1:
        assert not np.any(out[-1].astype(np.float32)), f"fully masked rows are not 0 (seed {seed})"


def bound_call(session, q, k, v, dtype, out_shape):
    """An IO binding of device copies of Q, K, V and a poisoned output, for calls run repeatedly
    (traced); returns (binding, output, inputs), the inputs to be kept alive with the binding."""
    binding = session.io_binding()
    tensors = {"Q": to_device(q), "K": to_device(k), "V": to_device(v)}
    for name, t in tensors.items():
        bind(binding, name, t, dtype)
    out = poisoned(out_shape, dtype)
    binding.bind_output("Y", "cuda", 0, dtype, list(out.shape), out.data_ptr())
    return binding, out, tensors


def test_kernel_trace_sees_the_ort_launched_kernel(ort):
    """The benchmarks' kernel trace (opsfuse.bench.kernel_trace) must see kernels ORT launches, not
    only torch's: one opsfuse kernel per session.run, with a positive GPU time."""
    import torch

    from opsfuse.bench.kernel_trace import trace_kernels

    rng, _ = fresh_rng()
    q, k, v = random_inputs(rng, np.float16, 1, 4, 4, 256, 256, 64, 64)
    session = cuda_session(ort, fused_attention_model(np.float16, None, 0, None))
    binding, _, _inputs = bound_call(session, q, k, v, np.float16, (1, 4, 256, 64))
    trace = trace_kernels(torch, lambda: session.run_with_iobinding(binding), rounds=3, top=50)
    ours = [r for r in trace["top"] if "opsfuse" in r["name"]]
    assert ours, f"no attention kernel in the trace: {[r['name'] for r in trace['top']]}"
    assert all(r["us"] > 0 for r in ours) and trace["gpu_us"] > 0
    assert abs(sum(r["per_round"] for r in ours) - 1.0) < 1e-9, ours


SEQ3_CASES = [
    # (b, h, s, d), the 3-D form or not; one-round launches whose 64-row items outnumber the SMs
    ((1, 12, 1024, 64), False),  # the seed grid's S=1024 point, the kernel's reason to exist
    ((2, 12, 512, 64), True),    # two unmasked BERT-base sequences in the (B, S, H*D) form
]


@pytest.mark.parametrize("case", range(len(SEQ3_CASES)))
def test_ort_runs_the_three_consumer_kernel(ort, case):
    """The launches the three-consumer kernel (kPlainSeq3, session 51) takes by default, through the
    CUDA EP: where the launcher's plan for this GPU takes it, the trace of session.run must show it,
    and its output (into a poisoned buffer) must meet the 2x rule."""
    import torch

    import opsfuse.cuda as ocuda
    from opsfuse.bench.kernel_trace import trace_kernels

    (b, h, s, d), form3d = SEQ3_CASES[case]
    props = torch.cuda.get_device_properties(0)
    shape = FakeTensor((b, h, s, d))
    code, message, plan = ocuda._module().describe_plan(
        shape, shape, shape, sms=props.multi_processor_count,
        cc=10 * props.major + props.minor)
    assert code == 0, message
    if not plan.get("three_consumers"):
        pytest.skip(f"the launcher does not take the three-consumer kernel here on {props.name} "
                    f"({props.multi_processor_count} SMs, sm_{props.major}{props.minor}): {plan}")
    rng, seed = fresh_rng()
    q, k, v = random_inputs(rng, np.float16, b, h, h, s, s, d, d)
    extra = dict(rank=3, q_num_heads=h, kv_num_heads=h) if form3d else {}
    session = cuda_session(ort, fused_attention_model(np.float16, None, 0, None, **extra))
    ins = [to_3d(x) for x in (q, k, v)] if form3d else [q, k, v]
    out_shape = (b, s, h * d) if form3d else (b, h, s, d)
    binding, out, _inputs = bound_call(session, *ins, np.float16, out_shape)
    trace = trace_kernels(torch, lambda: session.run_with_iobinding(binding), rounds=2, top=50)
    names = [r["name"] for r in trace["top"]]
    assert any("hopper_seq3_kernel" in n for n in names), f"not the three-consumer kernel: {names}"

    def check(what):
        y = to_numpy(out, np.float16)
        if form3d:
            y = y.reshape(b, s, h, d).transpose(0, 2, 1, 3)
        assert_within_2x_torch(y, q, k, v, what=f"ORT CUDA EP, three consumers, {what} (seed {seed})")

    check("the traced calls")
    out.fill_(float("nan"))  # poisoned again: this call alone must write every element
    torch.cuda.synchronize()
    session.run_with_iobinding(binding)
    torch.cuda.synchronize()
    check("one more call")
