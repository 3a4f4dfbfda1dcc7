"""python -m opsfuse bench --device cuda: FusedAttention's CUDA kernel side by side with its peers.

Five grids (issues 5 and 7):
  seed     B=1, H=12, D=64, S in {128..2048}, float32 and float16. Through ONNX Runtime's CUDA EP
           with IO binding (time per session.run): the unfused graph, com.microsoft.MultiHeadAttention,
           ONNX Attention (opset 23), opsfuse's FusedAttention. Kernel only (CUDA-graph replays):
           PyTorch SDPA's best backend and opsfuse's binding.
  prefill  B=8, H=16, D=128, S in {1024, 4096}; B=2, S=16384; bfloat16, causal and not (kernel only).
  prefill16  the same points in float16 (issue 7 names both dtypes; the kernels are separate
           instantiations, and cuDNN's float16 path is its own too).
  decode   Sq=1, B=8, Hq=32, Hkv in {8, 32}, D=128, Sk in {1024, 8192, 32768}, bfloat16 (kernel only).
  masked   BERT-base attention with the (B, 1, S, S) additive float16 mask HF exports hand over:
           B=8, H=12, D=64, S in {128, 512} (kernel only; opsfuse also unmasked, for the mask's cost).

Times are medians after warm-up, over input sets rotated so that the L2 cache (60 MB) cannot hold
them. FLOPs = 4*B*Hq*Sq*Sk*D (halved when causal); bytes = Q + K + V read once + Y written once.
Results: cuda_bench.json, cuda_bench.png and cuda_bench.md in --out.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from opsfuse.bench.rounds import round_order, whole_cycles

L2_BYTES = 60 * 2**20
ROTATE_BYTES = 4 * L2_BYTES  # each timed series cycles through at least this much input data


def _flops(b, hq, sq, sk, d, causal):
    f = 4.0 * b * hq * sq * sk * d
    return f / 2 if causal else f


def _bytes(b, hq, hkv, sq, sk, d, esize):
    return esize * (2 * b * hq * sq * d + 2 * b * hkv * sk * d)


def n_sets(set_bytes, cap=8):
    return int(max(1, min(cap, math.ceil(ROTATE_BYTES / max(set_bytes, 1)))))


# --- timing -------------------------------------------------------------------------------------

def _captured_replay(torch, calls, warmup):
    """Captures `calls` (a list of no-arg callables, one per rotated input set), cycled to 10+ calls,
    into one CUDA graph. Returns (replay, calls per replay, graph)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            for c in calls:
                c()
    torch.cuda.synchronize()
    per_replay = max(len(calls), 10)
    seq = [calls[i % len(calls)] for i in range(per_replay)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for c in seq:
            c()
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    return graph.replay, per_replay, graph


def _stream_replay(torch, calls, warmup):
    """The fallback unit of an interleaved timing where capture fails: 10+ back-to-back calls without a
    graph (launch overhead included when the kernels are shorter than it)."""
    for _ in range(warmup):
        for c in calls:
            c()
    torch.cuda.synchronize()
    n = max(len(calls), 10)

    def replay():
        for i in range(n):
            calls[i % len(calls)]()
    return replay, n, None


def _event_time_us(torch, replay, per_replay):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / per_replay


def time_graph(torch, calls, repeat, warmup=3):
    """Captures `calls` (a list of no-arg callables, one per rotated input set) into one CUDA graph,
    replays it `repeat` times and returns the median microseconds per call."""
    replay, per_replay, graph = _captured_replay(torch, calls, warmup)
    times = [_event_time_us(torch, replay, per_replay) for _ in range(repeat)]
    del graph
    return statistics.median(times)


def time_kernels_interleaved(torch, calls_by_name, repeat, warmup=3):
    """Kernel-only timing of several implementations side by side: each is captured into its own CUDA
    graph (back-to-back calls without one where capture fails), then every round replays each graph
    once, in round_order's balanced orders (whole cycles of them), so that the GPU's clock and
    temperature drifts (a slow peer's seconds of full load heat the card for whoever runs next) fall
    on all of them alike. {name: median microseconds per call}."""
    replays = {}
    try:
        for name, calls in calls_by_name.items():
            try:
                replays[name] = _captured_replay(torch, calls, warmup)
            except Exception as exc:  # noqa: BLE001 - capture unsupported: fall back, and say so
                print(f"        ({name}: graph capture failed: {str(exc)[:120]}; timed without a graph)")
                torch.cuda.synchronize()
                replays[name] = _stream_replay(torch, calls, warmup)
        names = list(replays)
        times = {n: [] for n in names}
        for r in range(whole_cycles(repeat, len(names))):
            for n in round_order(names, r):
                replay, per_replay, _graph = replays[n]
                times[n].append(_event_time_us(torch, replay, per_replay))
        return {n: statistics.median(t) for n, t in times.items()}
    finally:
        replays.clear()  # the graphs and their memory pools go before the next point's


def time_host(torch, calls, repeat, warmup=10):
    """Wall-clock microseconds per call (each call synchronizes), median; calls rotate input sets."""
    for i in range(warmup):
        calls[i % len(calls)]()
    torch.cuda.synchronize()
    times = []
    for i in range(repeat):
        t0 = time.perf_counter()
        calls[i % len(calls)]()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


@contextlib.contextmanager
def env_variant(spec):
    """An A/B variant of the launcher's switches: "NAME=VALUE,NAME=VALUE" set in os.environ for the
    block and restored after it (the launcher reads them at every call). Entries without "=" set
    nothing; a name the launcher does not read (the sweeps' "D=1") makes the default variant."""
    env = dict(kv.split("=", 1) for kv in spec.split(",") if "=" in kv)
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, val in old.items():
            if val is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = val


def time_host_interleaved(torch, calls_by_name, repeat, warmup=10):
    """time_host for several implementations side by side: each round times one call of every
    implementation, in round_order's balanced orders (whole cycles of them), so that the host's slow
    drifts (clocks, other load) fall on all of them alike. {name: median microseconds per call}."""
    names = list(calls_by_name)
    for i in range(warmup):
        for n in names:
            calls_by_name[n][i % len(calls_by_name[n])]()
    torch.cuda.synchronize()
    times = {n: [] for n in names}
    for r in range(whole_cycles(repeat, len(names))):
        for n in round_order(names, r):
            calls = calls_by_name[n]
            t0 = time.perf_counter()
            calls[r % len(calls)]()
            torch.cuda.synchronize()
            times[n].append((time.perf_counter() - t0) * 1e6)
    return {n: statistics.median(t) for n, t in times.items()}


# --- ONNX Runtime graphs ------------------------------------------------------------------------

def ort_models(dtype_name, b, h, s, d):
    """The four ORT variants of one seed point: name -> (ModelProto, input layout)."""
    import onnx
    from onnx import TensorProto, helper

    from opsfuse import contract

    elem = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}[dtype_name]
    scale = 1.0 / math.sqrt(d)
    bhsd = [b, h, s, d]
    bsh = [b, s, h * d]

    def model(nodes, inputs, out_shape, opsets):
        g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("Y", elem, out_shape)])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid(dom, v) for dom, v in opsets])
        m.ir_version = 10  # readable by every onnxruntime >= 1.20 (onnx 1.23 writes IR 14)
        return m

    ins4 = [helper.make_tensor_value_info(n, elem, bhsd) for n in ("Q", "K", "V")]
    ins3 = [helper.make_tensor_value_info(n, elem, bsh) for n in ("Q", "K", "V")]
    scale_t = helper.make_tensor("scale", elem, [], [scale])
    unfused = model(
        [
            helper.make_node("Transpose", ["K"], ["Kt"], perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", ["Q", "Kt"], ["S0"]),
            helper.make_node("Constant", [], ["scale"], value=scale_t),
            helper.make_node("Mul", ["S0", "scale"], ["S"]),
            helper.make_node("Softmax", ["S"], ["P"], axis=-1),
            helper.make_node("MatMul", ["P", "V"], ["Y"]),
        ],
        ins4, bhsd, [("", 17)])
    mha = model([helper.make_node("MultiHeadAttention", ["Q", "K", "V"], ["Y"], domain="com.microsoft",
                                  num_heads=h, scale=scale)],
                ins3, bsh, [("", 17), ("com.microsoft", 1)])
    att23 = model([helper.make_node("Attention", ["Q", "K", "V"], ["Y"], scale=scale)], ins4, bhsd, [("", 23)])
    fused = model([helper.make_node(contract.OP_NAME, ["Q", "K", "V"], ["Y"], domain=contract.DOMAIN, scale=scale)],
                  ins4, bhsd, [("", 17), (contract.DOMAIN, contract.OP_VERSION)])
    return {"ORT unfused graph": (unfused, "bhsd"), "ORT MultiHeadAttention": (mha, "bsh"),
            "ORT Attention-23": (att23, "bhsd"), "opsfuse via ORT": (fused, "bhsd")}


def ort_cuda_session(ort, model, opsfuse_op, session_options=None):
    """An ORT session of ``model`` on the CUDA EP; ``opsfuse_op``: with opsfuse's library registered and
    CPU fallback off, so that FusedAttention runs on the GPU or the session fails to build."""
    import opsfuse

    so = session_options or ort.SessionOptions()
    if opsfuse_op:
        so.register_custom_ops_library(opsfuse.get_library_path())
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    return ort.InferenceSession(model.SerializeToString(), so, providers=[("CUDAExecutionProvider", {"device_id": "0"})])


def ort_bound_calls(ort, torch, name, model, layout, tensors_sets, out_shape, torch_dtype, np_dtype,
                    session_options=None):
    """An ORT CUDA session of ``model`` and one run_with_iobinding call per input set (device buffers).
    Returns (calls, outputs, providers, session)."""
    sess = ort_cuda_session(ort, model, name.startswith("opsfuse"), session_options)
    providers = sess.get_providers()
    bindings = []
    outs = []
    for q, k, v in tensors_sets:
        if layout == "bsh":
            q, k, v = (x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1).contiguous() for x in (q, k, v))
        y = torch.empty(out_shape if layout == "bhsd" else (q.shape[0], q.shape[1], q.shape[2]),
                        dtype=torch_dtype, device="cuda")
        bnd = sess.io_binding()
        for n, t in (("Q", q), ("K", k), ("V", v)):
            bnd.bind_input(n, "cuda", 0, np_dtype, list(t.shape), t.data_ptr())
        bnd.bind_output("Y", "cuda", 0, np_dtype, list(y.shape), y.data_ptr())
        bindings.append((bnd, q, k, v, y))  # each call holds the buffers its binding points at
        outs.append(y)
    calls = [lambda bnd=bnd: sess.run_with_iobinding(bnd[0]) for bnd in bindings]
    return calls, outs, providers, sess


# --- kernel-only peers --------------------------------------------------------------------------

def _sdpa_backends(torch):
    from torch.nn.attention import SDPBackend

    return {"cuDNN": SDPBackend.CUDNN_ATTENTION, "FlashAttention-2": SDPBackend.FLASH_ATTENTION,
            "mem-efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def _sdpa_calls(torch, backend, sets, causal, gqa):
    """One SDPA call per input set with `backend`, and the first set's output (raises when the backend
    does not support the case)."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    def call(q, k, v):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    out = call(*sets[0])
    return [lambda s=s: call(*s) for s in sets], out


def _opsfuse_calls(torch, cuda_mod, sets, causal, impl):
    """One binding call per input set, with impl's kernel choice (see _kernels_of; a graph keeps the
    kernel chosen at capture), and the first set's output. Each call allocates its output through
    torch, as the SDPA rows' calls do, so that both meet the same allocator (in a captured graph its
    pool may hand every call the block the previous call freed); the `out=` row (_OUT_IMPL) writes
    each set's own preallocated output instead, as the rows did until session 26."""
    is_causal = 1 if causal else 0
    calls = []
    for q, k, v in sets:
        if impl == _OUT_IMPL:
            y = torch.empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]), dtype=q.dtype, device=q.device)
            calls.append(lambda q=q, k=k, v=v, y=y: cuda_mod.fused_attention(q, k, v, is_causal=is_causal, out=y))
            continue

        def call(q=q, k=k, v=v):
            with _kernels_of(impl):
                return cuda_mod.fused_attention(q, k, v, is_causal=is_causal)
        calls.append(call)
    return calls, calls[0]()


def _rel_err(torch, out, ref):
    o, r = out.double(), ref.double()
    return float(torch.linalg.vector_norm(o - r) / torch.linalg.vector_norm(r))


# --- the grids ----------------------------------------------------------------------------------

def _point(rows, **kw):
    rows.append(kw)
    tag = f"{kw['grid']:7s} {kw['case']:42s} {kw['impl']:24s}"
    if kw.get("us") is not None:
        print(f"{tag} {kw['us']:10.1f} us {kw['tflops']:7.1f} TFLOP/s {kw['tbps']:6.2f} TB/s", flush=True)
    else:
        print(f"{tag}  n/a: {kw.get('error', '')[:100]}", flush=True)


def make_sets(torch, dtype, b, hq, hkv, sq, sk, d, n):
    g = torch.Generator(device="cuda").manual_seed(1234)
    return [tuple(torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)
                  for shape in ((b, hq, sq, d), (b, hkv, sk, d), (b, hkv, sk, d))) for _ in range(n)]


def run_seed(torch, ort, cuda_mod, rows, repeat, quick):
    sizes = [128, 256] if quick else [128, 256, 512, 1024, 2048]
    import numpy as np

    for dtype_name in ("float16", "float32"):
        tdt = getattr(torch, dtype_name)
        npdt = getattr(np, dtype_name)
        esize = 2 if dtype_name == "float16" else 4
        for s in sizes:
            b, h, d = 1, 12, 64
            case = f"B=1 H=12 S={s} D=64 {dtype_name}"
            fl, by = _flops(b, h, s, s, d, False), _bytes(b, h, h, s, s, d, esize)
            sets = make_sets(torch, tdt, b, h, h, s, s, d, n_sets(by))
            base = dict(grid="seed", case=case, dtype=dtype_name, B=b, Hq=h, Hkv=h, Sq=s, Sk=s, D=d, causal=False,
                        flops=fl, bytes=by)
            ref = torch.nn.functional.scaled_dot_product_attention(*(x.double() for x in sets[0]))
            if ort is not None:
                # Every ORT variant's session first, then all timed together, round by round.
                ready = {}
                for name, (model, layout) in ort_models(dtype_name, b, h, s, d).items():
                    try:
                        calls, outs, prov, sess = ort_bound_calls(ort, torch, name, model, layout, sets, (b, h, s, d),
                                                                  tdt, npdt)
                        ready[name] = (calls, outs[0], prov, layout, sess)
                    except Exception as exc:  # noqa: BLE001 - record and go on
                        _point(rows, **base, impl=name, mode="session.run", us=None, error=f"{type(exc).__name__}: {exc}")
                try:
                    times = time_host_interleaved(torch, {n: r[0] for n, r in ready.items()}, max(repeat * 8, 100))
                except Exception as exc:  # noqa: BLE001 - record and go on
                    times = {}
                    for name in ready:
                        _point(rows, **base, impl=name, mode="session.run", us=None, error=f"{type(exc).__name__}: {exc}")
                for name, (calls, y, prov, layout, _sess) in ready.items() if times else ():
                    us = times[name]
                    if layout == "bsh":
                        y = y.reshape(b, s, h, d).transpose(1, 2)
                    _point(rows, **base, impl=name, mode="session.run", us=us, tflops=fl / us / 1e6,
                           tbps=by / us / 1e6, rel_err=_rel_err(torch, y, ref), providers=prov)
                ready.clear()
            _kernel_points(torch, cuda_mod, rows, base, sets, ref, False, False, repeat)


def _time_contenders(torch, rows, base, calls_by_name, repeat):
    """time_kernels_interleaved for one point's contenders; where the timing itself fails, a row
    with the error for each of them and an empty result."""
    try:
        return time_kernels_interleaved(torch, calls_by_name, repeat)
    except Exception as exc:  # noqa: BLE001 - record and go on
        for name in calls_by_name:
            _point(rows, **base, impl=name, mode="kernel", us=None, error=f"{type(exc).__name__}: {exc}")
        return {}


def _kernel_points(torch, cuda_mod, rows, base, sets, ref, causal, gqa, repeat):
    """The SDPA backends and opsfuse's binding on one point, timed together (time_kernels_interleaved)."""
    fl, by = base["flops"], base["bytes"]
    contenders = {}  # impl -> (calls, first set's output)
    for name, backend in _sdpa_backends(torch).items():
        if name == "math" and base["Sk"] * base["Sq"] * base["B"] * base["Hq"] > 2**28:
            continue  # materializes S: too slow / too large to be a peer
        try:
            contenders[f"SDPA {name}"] = _sdpa_calls(torch, backend, sets, causal, gqa)
        except Exception as exc:  # noqa: BLE001
            _point(rows, **base, impl=f"SDPA {name}", mode="kernel", us=None, error=f"{type(exc).__name__}: {exc}")
    impls = ["opsfuse binding", _OUT_IMPL]
    if _hopper_device(torch) and base["dtype"] in ("float16", "bfloat16"):
        # The launcher picks the Hopper kernel here where it covers the case; these rows measure it
        # as a programmatic dependent launch (opt-in: what overlapping one call's start with the
        # previous call's end is worth) and the portable (sm_80) tensor-core kernel, on the same
        # inputs, in the same run.
        impls += [_PDL_IMPL, _SM80_IMPL]
    for impl in impls:
        try:
            contenders[impl] = _opsfuse_calls(torch, cuda_mod, sets, causal, impl)
        except Exception as exc:  # noqa: BLE001
            _point(rows, **base, impl=impl, mode="kernel", us=None, error=f"{type(exc).__name__}: {exc}")
    times = _time_contenders(torch, rows, base, {n: c[0] for n, c in contenders.items()}, repeat)
    if not times:
        return

    def row_of(name):
        us, y = times[name], contenders[name][1]
        return dict(base, impl=name, mode="kernel", us=us, tflops=fl / us / 1e6, tbps=by / us / 1e6,
                    rel_err=_rel_err(torch, y, ref) if ref is not None else None)

    sdpa_rows = [row_of(n) for n in contenders if n.startswith("SDPA ")]
    for row in sdpa_rows:
        _point(rows, **row)
    if sdpa_rows:
        best = min(sdpa_rows, key=lambda r: r["us"])
        _point(rows, **dict(best, impl="SDPA best", backend=best["impl"]))
    for name in contenders:
        if not name.startswith("SDPA "):
            _point(rows, **row_of(name))


_SM80_IMPL = "opsfuse binding (sm80 kernel)"
_PDL_IMPL = "opsfuse binding (PDL)"
_OUT_IMPL = "opsfuse binding (out=)"
# The launcher switch each variant row sets (plugin/cuda/attention_cuda.cu reads them at every launch).
_IMPL_SWITCH = {_SM80_IMPL: ("OPSFUSE_CUDA_DISABLE_HOPPER", "1"), _PDL_IMPL: ("OPSFUSE_CUDA_HOPPER_PDL", "1")}


@contextlib.contextmanager
def _kernels_of(impl):
    """For a variant row, its launcher switch (_IMPL_SWITCH) while the call runs or is captured;
    the variable is restored afterwards."""
    if impl not in _IMPL_SWITCH:
        yield
        return
    name, value = _IMPL_SWITCH[impl]
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


def _hopper_device(torch):
    return torch.cuda.get_device_capability(0) == (9, 0)


def _reference(torch, q, k, v, causal, gqa):
    """float64 reference of a slice small enough to compute (first batch, first 2 kv heads)."""
    g = q.shape[1] // k.shape[1]
    qs, ks, vs = q[:1, : 2 * g].double(), k[:1, :2].double(), v[:1, :2].double()
    return torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, enable_gqa=gqa)


PREFILL_DTYPES = {"prefill": ("bfloat16", "bf16"), "prefill16": ("float16", "fp16")}


def run_prefill(torch, cuda_mod, rows, repeat, quick, grid="prefill"):
    dtype, short = PREFILL_DTYPES[grid]
    shapes = [(8, 1024), (8, 4096), (2, 16384)] if not quick else [(2, 1024)]
    for b, s in shapes:
        for causal in (False, True):
            h, d = 16, 128
            case = f"B={b} H=16 S={s} D=128 {short}{' causal' if causal else ''}"
            fl, by = _flops(b, h, s, s, d, causal), _bytes(b, h, h, s, s, d, 2)
            sets = make_sets(torch, getattr(torch, dtype), b, h, h, s, s, d, n_sets(by, cap=4))
            base = dict(grid=grid, case=case, dtype=dtype, B=b, Hq=h, Hkv=h, Sq=s, Sk=s, D=d, causal=causal,
                        flops=fl, bytes=by)
            _kernel_points_sliced(torch, cuda_mod, rows, base, sets, causal, False, repeat)
            del sets
            torch.cuda.empty_cache()


def _kernel_points_sliced(torch, cuda_mod, rows, base, sets, causal, gqa, repeat):
    """Like _kernel_points, with the accuracy measured on a slice (first batch, 2 kv heads)."""
    ref = _reference(torch, *sets[0], causal, gqa) if base["Sq"] * base["Sk"] <= 4096 * 4096 else None
    start = len(rows)
    _kernel_points(torch, cuda_mod, rows, base, sets, None, causal, gqa, repeat)
    if ref is not None:
        g = base["Hq"] // base["Hkv"]
        q, k, v = sets[0]
        for row in rows[start:]:
            if row.get("us") is None or row["impl"] == "SDPA best":
                continue
            if row["impl"].startswith("opsfuse binding"):
                with _kernels_of(row["impl"]):
                    y = cuda_mod.fused_attention(q[:1, : 2 * g].contiguous(), k[:1, :2].contiguous(),
                                                 v[:1, :2].contiguous(), is_causal=1 if causal else 0)
                row["rel_err"] = _rel_err(torch, y, ref)
                print(f"        {row['impl']} rel_err {row['rel_err']:.2e}")


GRIDS = ("seed", "prefill", "prefill16", "decode", "masked")
DEFAULT_GRIDS = ",".join(GRIDS)


def parse_grids(text: str) -> set[str]:
    """The grid names of a --grids value; exact names, so that "prefill" does not also select "prefill16"."""
    names = {g.strip() for g in text.split(",") if g.strip()}
    unknown = sorted(names - set(GRIDS))
    if unknown:
        raise ValueError(f"unknown benchmark grid(s) {', '.join(unknown)}: choose from {', '.join(GRIDS)}")
    return names


def run_decode(torch, cuda_mod, rows, repeat, quick):
    sks = [1024, 8192, 32768] if not quick else [1024]
    for hkv in (8, 32):
        for sk in sks:
            b, hq, d = 8, 32, 128
            case = f"B=8 Hq=32 Hkv={hkv} Sq=1 Sk={sk} D=128 bf16"
            fl, by = _flops(b, hq, 1, sk, d, False), _bytes(b, hq, hkv, 1, sk, d, 2)
            sets = make_sets(torch, torch.bfloat16, b, hq, hkv, 1, sk, d, n_sets(by))
            base = dict(grid="decode", case=case, dtype="bfloat16", B=b, Hq=hq, Hkv=hkv, Sq=1, Sk=sk, D=d, causal=False,
                        flops=fl, bytes=by)
            _kernel_points_sliced(torch, cuda_mod, rows, base, sets, False, hkv != hq, repeat)
            del sets
            torch.cuda.empty_cache()


def run_masked(torch, cuda_mod, rows, repeat, quick):
    """BERT-base attention as HF's eager export hands it over: B=8, H=12, D=64, float16, an additive
    (B, 1, S, S) mask (padding: the last keys of some rows at float16's minimum), against the same
    shapes unmasked and SDPA with the same mask."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    for s in ([128] if quick else [128, 512]):
        b, h, d = 8, 12, 64
        case = f"B=8 H=12 S={s} D=64 float16 mask (B,1,S,S)"
        fl, by = _flops(b, h, s, s, d, False), _bytes(b, h, h, s, s, d, 2)
        sets = make_sets(torch, torch.float16, b, h, h, s, s, d, n_sets(by))
        lengths = torch.tensor([s - (i * s) // 16 for i in range(b)], device="cuda")
        keep = torch.arange(s, device="cuda")[None, :] < lengths[:, None]  # (B, Sk)
        mask = torch.zeros(b, 1, s, s, dtype=torch.float16, device="cuda")
        mask.masked_fill_(~keep[:, None, None, :], torch.finfo(torch.float16).min)
        base = dict(grid="masked", case=case, dtype="float16", B=b, Hq=h, Hkv=h, Sq=s, Sk=s, D=d, causal=False,
                    flops=fl, bytes=by)
        q0, k0, v0 = (x.double() for x in sets[0])
        ref = F.scaled_dot_product_attention(q0, k0, v0, attn_mask=mask.double())
        contenders = {}  # impl -> (calls, first set's output, has a mask)
        for name, backend in _sdpa_backends(torch).items():
            if name == "math":
                continue

            def call(q, k, v, backend=backend):
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            try:
                contenders[f"SDPA {name}"] = ([lambda x=x, call=call: call(*x) for x in sets], call(*sets[0]), True)
            except Exception as exc:  # noqa: BLE001
                _point(rows, **base, impl=f"SDPA {name}", mode="kernel", us=None, error=f"{type(exc).__name__}: {exc}")
        for impl, m in (("opsfuse binding", mask), ("opsfuse binding, no mask", None)):
            try:
                # Outputs allocated per call, as the SDPA calls' are (see _opsfuse_calls).
                calls = [lambda q=q, k=k, v=v, m=m: cuda_mod.fused_attention(q, k, v, attn_mask=m) for q, k, v in sets]
                contenders[impl] = (calls, calls[0](), m is not None)
            except Exception as exc:  # noqa: BLE001
                _point(rows, **base, impl=impl, mode="kernel", us=None, error=f"{type(exc).__name__}: {exc}")
        times = _time_contenders(torch, rows, base, {n: c[0] for n, c in contenders.items()}, repeat)
        for name, (_calls, y, masked) in contenders.items() if times else ():
            us = times[name]
            _point(rows, **base, impl=name, mode="kernel", us=us, tflops=fl / us / 1e6, tbps=by / us / 1e6,
                   rel_err=_rel_err(torch, y, ref) if masked else None)
        contenders.clear()
        del sets
        torch.cuda.empty_cache()


def measure_ceilings(torch):
    """Device copy bandwidth (read + write) and bf16 matrix rate, on random data."""
    out = {}
    x = torch.randn(2**30 // 4, device="cuda")  # 1 GiB
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(10):
        y.copy_(x)
    e.record()
    e.synchronize()
    out["copy_TBps"] = 2 * x.numel() * 4 * 10 / (s.elapsed_time(e) * 1e-3) / 1e12
    del x, y
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    bm = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ bm
    torch.cuda.synchronize()
    s.record()
    for _ in range(10):
        a @ bm
    e.record()
    e.synchronize()
    out["bf16_matmul_TFLOPs"] = 2 * 8192**3 * 10 / (s.elapsed_time(e) * 1e-3) / 1e12
    return out


# --- reporting ----------------------------------------------------------------------------------

def _summaries(rows):
    """Per case: opsfuse's time against the best peer of its group (ORT group, kernel group)."""
    out = []
    cases = []
    for r in rows:
        if r["case"] not in cases:
            cases.append(r["case"])
    for case in cases:
        rs = [r for r in rows if r["case"] == case and r.get("us") is not None]
        sdpa = tuple(r["impl"] for r in rs if r["impl"].startswith("SDPA ") and r["impl"] != "SDPA best")
        for group, mine, peers in (
            ("via ORT", "opsfuse via ORT", ("ORT unfused graph", "ORT MultiHeadAttention", "ORT Attention-23")),
            ("kernel", "opsfuse binding", sdpa),
            ("kernel, PDL", _PDL_IMPL, sdpa),
            ("kernel, out=", _OUT_IMPL, sdpa),
            ("kernel, sm80 kernel", _SM80_IMPL, sdpa),
        ):
            m = [r for r in rs if r["impl"] == mine]
            p = [r for r in rs if r["impl"] in peers]
            if not m or not p:
                continue
            bp = min(p, key=lambda r: r["us"])
            out.append(dict(grid=m[0]["grid"], case=case, group=group, opsfuse_us=m[0]["us"], best_peer=bp["impl"],
                            best_peer_us=bp["us"], speedup=bp["us"] / m[0]["us"], opsfuse_tflops=m[0]["tflops"],
                            opsfuse_tbps=m[0]["tbps"], peer_tflops=bp["tflops"], peer_tbps=bp["tbps"],
                            opsfuse_err=m[0].get("rel_err"), peer_err=bp.get("rel_err")))
    return out


def _plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(24, 5.5))
    for ax, (grid, dtype, metric, title) in zip(axes, (
            ("seed", "float16", "us", "seed grid fp16: µs (lower is better)"),
            ("seed", "float32", "us", "seed grid fp32: µs (lower is better)"),
            ("prefill", "bfloat16", "tflops", "prefill bf16: TFLOP/s"),
            ("decode", "bfloat16", "tbps", "decode bf16: TB/s"))):
        rs = [r for r in rows if r["grid"] == grid and r.get("dtype") == dtype and r.get("us") is not None
              and r["impl"] != "SDPA best"]
        cases = []
        for r in rs:
            if r["case"] not in cases:
                cases.append(r["case"])
        impls = []
        for r in rs:
            if r["impl"] not in impls:
                impls.append(r["impl"])
        width = 0.8 / max(len(impls), 1)
        for i, impl in enumerate(impls):
            xs, ys = [], []
            for ci, c in enumerate(cases):
                m = [r for r in rs if r["case"] == c and r["impl"] == impl]
                if m:
                    xs.append(ci + i * width)
                    ys.append(m[0][metric])
            ax.bar(xs, ys, width, label=impl)
        ax.set_xticks([ci + 0.4 - width / 2 for ci in range(len(cases))])
        ax.set_xticklabels([c.replace(" bf16", "").replace(" float16", "").replace(" float32", "") for c in cases],
                           rotation=35, ha="right", fontsize=7)
        if metric == "us":
            ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _err(value) -> str:
    return "" if value is None else f"{value:.1e}"


def _markdown(meta, rows, summary):
    lines = [
        f"# CUDA FusedAttention benchmark ({meta['gpu'].split(' (')[0]})",
        "",
        f"- date: {meta['date']}",
        f"- GPU: {meta['gpu']}; driver/CUDA: {meta['cuda']}; torch {meta['torch']}; onnxruntime {meta['onnxruntime']}",
        f"- command: `{meta['command']}`",
        f"- measured ceilings: device copy {meta['ceilings'].get('copy_TBps', float('nan')):.2f} TB/s (read+write), "
        f"bf16 matmul {meta['ceilings'].get('bf16_matmul_TFLOPs', float('nan')):.0f} TFLOP/s",
        "- method: medians after warm-up; kernel-only rows are CUDA-graph replays of 10+ calls over rotated input "
        "sets (>= 240 MB of inputs, or one set when larger), the implementations of a point replayed round by "
        "round, interleaved, in balanced orders (each implementation follows every other equally often: a Williams design, since session 52; before, a rotation); ORT rows are wall-clock per `run_with_iobinding` "
        "(device buffers, synchronized; the four ORT variants of a point timed round by round, interleaved). FLOPs = 4·B·Hq·Sq·Sk·D (halved when causal); bytes = Q+K+V+Y once.",
        "- on Hopper `opsfuse binding (PDL)` is the sm_90a kernel as a programmatic dependent launch "
        "(OPSFUSE_CUDA_HOPPER_PDL=1, opt-in: a call's blocks start and set up while the previous call in the "
        "replay ends, and wait for its completion before any global access); `opsfuse binding` is the default, "
        "plain stream order.",
        "- outputs: every kernel row's call allocates its output through torch, as SDPA's calls do (a captured "
        "graph's pool may give each call the block the previous one freed); `opsfuse binding (out=)` writes each "
        "input set's own preallocated output instead (the opsfuse rows' method until session 26).",
        "",
        "## opsfuse against the best peer",
        "",
        "The best peer is the fastest of the group whatever its accuracy; the error columns (relative to a "
        "float64 reference) show what it computed: a float32 peer near 1e-3 rather than 1e-6 ran its matrix "
        "products in TF32.",
        "",
        "| grid | case | group | opsfuse µs | best peer | peer µs | speed-up | opsfuse TFLOP/s | opsfuse TB/s | "
        "opsfuse error | peer error |",
        "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summary:
        lines.append(f"| {s['grid']} | {s['case']} | {s['group']} | {s['opsfuse_us']:.1f} | {s['best_peer']} | "
                     f"{s['best_peer_us']:.1f} | {s['speedup']:.2f}× | {s['opsfuse_tflops']:.1f} | {s['opsfuse_tbps']:.2f} | "
                     f"{_err(s.get('opsfuse_err'))} | {_err(s.get('peer_err'))} |")
    lines += ["", "## Every measurement", "",
              "| grid | case | implementation | mode | µs | TFLOP/s | TB/s | rel. error |", "|---|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        if r["impl"] == "SDPA best":
            continue
        if r.get("us") is None:
            lines.append(f"| {r['grid']} | {r['case']} | {r['impl']} | {r.get('mode', '')} | n/a | | | "
                         f"{r.get('error', '')[:80].replace('|', '/')} |")
        else:
            lines.append(f"| {r['grid']} | {r['case']} | {r['impl']} | {r.get('mode', '')} | {r['us']:.1f} | "
                         f"{r['tflops']:.1f} | {r['tbps']:.2f} | {_err(r.get('rel_err'))} |")
    return "\n".join(lines) + "\n"


def run(args) -> int:
    import torch

    if not torch.cuda.is_available():
        print("bench --device cuda: no CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    ort = None
    try:
        import onnxruntime

        if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
            ort = onnxruntime
        else:
            print(f"note: onnxruntime {onnxruntime.__version__} has no CUDA EP: the ORT rows are skipped")
    except ImportError:
        print("note: onnxruntime not importable: the ORT rows are skipped")
    import opsfuse.cuda as cuda_mod

    quick = bool(getattr(args, "quick", False))
    repeat = getattr(args, "repeat", None) or (5 if quick else 30)
    out_dir = Path(getattr(args, "out", None) or "docs/results")
    out_dir.mkdir(parents=True, exist_ok=True)
    grids = parse_grids(getattr(args, "grids", None) or DEFAULT_GRIDS)

    props = torch.cuda.get_device_properties(0)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": f"{props.name} ({props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB)",
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "onnxruntime": getattr(ort, "__version__", "n/a (no CUDA EP)"),
        "command": "python -m opsfuse bench --device cuda" + (" --quick" if quick else "") +
                   (f" --repeat {args.repeat}" if getattr(args, "repeat", None) else "") +
                   (f" --grids {','.join(g for g in GRIDS if g in grids)}" if grids != set(GRIDS) else "") +
                   f" --out {out_dir}",
        "host": platform.node(),
        "quick": quick,
    }
    meta["ceilings"] = measure_ceilings(torch)
    print("ceilings:", meta["ceilings"], flush=True)
    rows: list[dict] = []
    if "seed" in grids:
        run_seed(torch, ort, cuda_mod, rows, repeat, quick)
    for grid in PREFILL_DTYPES:
        if grid in grids:
            run_prefill(torch, cuda_mod, rows, repeat, quick, grid)
    if "decode" in grids:
        run_decode(torch, cuda_mod, rows, repeat, quick)
    if "masked" in grids:
        run_masked(torch, cuda_mod, rows, repeat, quick)
    summary = _summaries(rows)
    (out_dir / "cuda_bench.json").write_text(json.dumps({"meta": meta, "summary": summary, "rows": rows}, indent=1,
                                                        default=str))
    try:
        _plot(rows, out_dir / "cuda_bench.png")
    except Exception as exc:  # noqa: BLE001 - the table and JSON still stand
        print(f"plot failed: {exc}")
    (out_dir / "cuda_bench.md").write_text(_markdown(meta, rows, summary))
    print("\nopsfuse vs best peer:")
    for s in summary:
        print(f"  {s['grid']:7s} {s['case']:42s} {s['group']:8s} {s['opsfuse_us']:9.1f} us vs {s['best_peer']:24s} "
              f"{s['best_peer_us']:9.1f} us  x{s['speedup']:.2f}  ({s['opsfuse_tflops']:.0f} TFLOP/s, "
              f"{s['opsfuse_tbps']:.2f} TB/s)")
    return 0


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m opsfuse.bench.cuda")
    p.add_argument("--out", default="docs/results")
    p.add_argument("--repeat", type=int, default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--grids", default=DEFAULT_GRIDS, help=f"comma-separated subset of {','.join(GRIDS)}")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
