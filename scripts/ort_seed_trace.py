#!/usr/bin/env python3
"""Where a seed-grid session.run's time goes, opsfuse's op against ORT's MultiHeadAttention.

For each sequence length (B=1, H=12, D=64, no mask, IO binding on device, as `opsfuse bench`):
  - wall time per run_with_iobinding (median, as the benchmark measures it);
  - GPU time per run by kernel (PyTorch's profiler sees ORT's kernels too);
  - host time of the attention node's Compute (ORT's own session profile, "_kernel_time" events).
The gap between wall time and GPU time is host and launch overhead: this says whether a miss is the
kernel's or the call's.

--bert-layer: instead, BERT-base's attention layer (B=8, H=12, D=64, fp16) as one FusedAttention
node in the forms the BERT rewrite emits (3-D Q/K/V, packed Q/K/V; an additive (B,1,1,S) mask of
0 / finfo.min, padded as bench.bert pads), and the 4-D form: the kernel's time inside ORT, alone,
to compare with the same kernel inside the whole BERT model (bench.bert --trace); then the same
node between GEMMs (12 layers of projection, attention, output projection), to see whether the
context slows it down.

    python scripts/ort_seed_trace.py --seqs 128,2048 --dtype float16
    python scripts/ort_seed_trace.py --bert-layer --seqs 128,512
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

import torch  # before onnxruntime: onnxruntime-gpu loads the CUDA libraries torch brings
import numpy as np
import onnxruntime as ort

from opsfuse.bench.cuda import make_sets, n_sets, ort_bound_calls, ort_cuda_session, ort_models, time_host
from opsfuse.bench.kernel_trace import format_trace, trace_kernels

PEERS = ("opsfuse via ORT", "ORT MultiHeadAttention", "ORT Attention-23")


def node_host_us(ort, torch, name, model, layout, sets, shape, tdt, npdt, tmp):
    """Median host duration of each node's Compute over 50 profiled runs: {op type: us}."""
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(Path(tmp) / "seedtrace")
    calls, _, _, sess = ort_bound_calls(ort, torch, name, model, layout, sets, shape, tdt, npdt, so)
    for i in range(60):
        calls[i % len(calls)]()
    torch.cuda.synchronize()
    events = json.loads(Path(sess.end_profiling()).read_text())
    per_op: dict = {}
    for e in events:
        if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time"):
            per_op.setdefault(e["args"].get("op_name", "?"), []).append(float(e["dur"]))
        if e.get("cat") == "Session" and e.get("name") == "model_run":
            per_op.setdefault("(model_run)", []).append(float(e["dur"]))
    return {op: statistics.median(v[10:] or v) for op, v in per_op.items()}


def bert_layer(args) -> int:
    from onnx import TensorProto, helper

    from opsfuse import contract

    b, h, d = 8, 12, 64
    fp16 = TensorProto.FLOAT16
    for s in (int(x) for x in args.seqs.split(",")):
        keep = torch.zeros(b, s, dtype=torch.bool, device="cuda")
        for i in range(b):
            keep[i, : s - round(i * 0.4 * s / (b - 1))] = True
        mask = ((~keep).to(torch.float16) * torch.finfo(torch.float16).min).view(b, 1, 1, s).contiguous()
        forms = {
            "4-D": ([b, h, s, d], {}, lambda: [torch.randn(b, h, s, d, device="cuda", dtype=torch.float16)
                                               for _ in range(3)]),
            "3-D": ([b, s, h * d], {contract.ATTR_Q_NUM_HEADS: h, contract.ATTR_KV_NUM_HEADS: h},
                    lambda: [torch.randn(b, s, h * d, device="cuda", dtype=torch.float16) for _ in range(3)]),
            "packed": ([b, s, 3 * h * d], {contract.ATTR_Q_NUM_HEADS: h, contract.ATTR_KV_NUM_HEADS: h,
                                           contract.ATTR_PACKED_QKV: 1},
                       lambda: [torch.randn(b, s, 3 * h * d, device="cuda", dtype=torch.float16)] * 3),
        }
        for form, (shape, attrs, make) in forms.items():
            for with_mask in (False, True):
                names = ["Q", "K", "V"] + (["attn_mask"] if with_mask else [])
                ins = [helper.make_tensor_value_info(n, fp16, shape) for n in ("Q", "K", "V")]
                if with_mask:
                    ins.append(helper.make_tensor_value_info("attn_mask", fp16, [b, 1, 1, s]))
                out_shape = [b, h, s, d] if form == "4-D" else [b, s, h * d]
                node = helper.make_node(contract.OP_NAME, names, ["Y"], domain=contract.DOMAIN,
                                        scale=1.0 / d ** 0.5, **attrs)
                g = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info("Y", fp16, out_shape)])
                m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid(contract.DOMAIN, contract.OP_VERSION)])
                m.ir_version = 10
                sess = ort_cuda_session(ort, m, opsfuse_op=True)
                qkv = make()
                y = torch.empty(out_shape, device="cuda", dtype=torch.float16)
                bnd = sess.io_binding()
                for n, t in zip(("Q", "K", "V"), qkv):
                    bnd.bind_input(n, "cuda", 0, np.float16, list(t.shape), t.data_ptr())
                if with_mask:
                    bnd.bind_input("attn_mask", "cuda", 0, np.float16, list(mask.shape), mask.data_ptr())
                bnd.bind_output("Y", "cuda", 0, np.float16, out_shape, y.data_ptr())
                trace = trace_kernels(torch, lambda: sess.run_with_iobinding(bnd), rounds=20)
                ours = [r for r in trace["top"] if "opsfuse" in r["name"]]
                print(f"S={s} {form:6s} mask={'padded' if with_mask else 'none  '}: kernel "
                      f"{sum(r['us'] for r in ours):.1f} us ({ours[0]['name'][:70] if ours else '?'})", flush=True)
        layer_stack(s, mask, b, h, d)
    return 0


def layer_stack(s, mask, b, h, d, layers=12):
    """The attention node between GEMMs, as in the model: X -> [packed Q/K/V projection (MatMul, bias
    Add) -> FusedAttention (packed, the mask) -> output projection (MatMul)] x layers, random fp16
    weights. The kernel's time per layer here against the node alone says whether the model's
    context (the GEMMs around it) is what slows it down."""
    sess = ort_cuda_session(ort, stack_model(s, b, h, d, layers), opsfuse_op=True)
    hd = h * d
    xin = torch.randn(b, s, hd, device="cuda", dtype=torch.float16)
    y = torch.empty(b, s, hd, device="cuda", dtype=torch.float16)
    for name, mk in (("padded", mask), ("zeros", torch.zeros_like(mask))):
        bnd = sess.io_binding()
        bnd.bind_input("X", "cuda", 0, np.float16, list(xin.shape), xin.data_ptr())
        bnd.bind_input("attn_mask", "cuda", 0, np.float16, list(mk.shape), mk.data_ptr())
        bnd.bind_output("Y", "cuda", 0, np.float16, list(y.shape), y.data_ptr())
        trace = trace_kernels(torch, lambda: sess.run_with_iobinding(bnd), rounds=10, top=40)
        ours = [r for r in trace["top"] if "opsfuse" in r["name"]]
        per_layer = sum(r["us"] for r in ours) / layers
        print(f"S={s} {layers} layers between GEMMs, mask={name}: attention kernel {per_layer:.1f} us per layer; "
              f"GPU {trace['gpu_us']:.0f} us per run", flush=True)


def stack_model(s, b, h, d, layers):
    """layer_stack's graph (float16, random weights; inputs X (B,S,H*D) and attn_mask (B,1,1,S))."""
    import numpy.random as npr
    from onnx import TensorProto, helper, numpy_helper

    from opsfuse import contract

    fp16 = TensorProto.FLOAT16
    hd = h * d
    rng = npr.default_rng(0)
    nodes, inits = [], []
    x = "X"
    for i in range(layers):
        wq = numpy_helper.from_array((rng.standard_normal((hd, 3 * hd)) * 0.03).astype(np.float16), f"Wqkv{i}")
        bq = numpy_helper.from_array((rng.standard_normal(3 * hd) * 0.03).astype(np.float16), f"Bqkv{i}")
        wo = numpy_helper.from_array((rng.standard_normal((hd, hd)) * 0.03).astype(np.float16), f"Wo{i}")
        inits += [wq, bq, wo]
        nodes += [helper.make_node("MatMul", [x, f"Wqkv{i}"], [f"P{i}"]),
                  helper.make_node("Add", [f"P{i}", f"Bqkv{i}"], [f"QKV{i}"]),
                  helper.make_node(contract.OP_NAME, [f"QKV{i}", f"QKV{i}", f"QKV{i}", "attn_mask"], [f"A{i}"],
                                   domain=contract.DOMAIN, scale=1.0 / d ** 0.5, q_num_heads=h, kv_num_heads=h,
                                   packed_qkv=1),
                  helper.make_node("MatMul", [f"A{i}", f"Wo{i}"], [f"Y{i}" if i < layers - 1 else "Y"])]
        x = f"Y{i}"
    g = helper.make_graph(nodes, "stack", [helper.make_tensor_value_info("X", fp16, [b, s, hd]),
                                           helper.make_tensor_value_info("attn_mask", fp16, [b, 1, 1, s])],
                          [helper.make_tensor_value_info("Y", fp16, [b, s, hd])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid(contract.DOMAIN, contract.OP_VERSION)])
    m.ir_version = 10
    return m


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqs", default="128,2048")
    ap.add_argument("--dtype", default="float16", choices=("float16", "float32"))
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    ap.add_argument("--tmp", default="/tmp")
    ap.add_argument("--bert-layer", action="store_true", help="BERT's attention layer instead (see above)")
    args = ap.parse_args()
    if args.bert_layer:
        return bert_layer(args)
    tdt, npdt = getattr(torch, args.dtype), getattr(np, args.dtype)
    esize = 2 if args.dtype == "float16" else 4
    result = {"dtype": args.dtype, "gpu": torch.cuda.get_device_name(0), "onnxruntime": ort.__version__,
              "points": []}
    for s in (int(x) for x in args.seqs.split(",")):
        b, h, d = 1, 12, 64
        sets = make_sets(torch, tdt, b, h, h, s, s, d, n_sets(3 * b * h * s * d * esize))
        for name, (model, layout) in ort_models(args.dtype, b, h, s, d).items():
            if name not in PEERS:
                continue
            calls, _, _, _ = ort_bound_calls(ort, torch, name, model, layout, sets, (b, h, s, d), tdt, npdt)
            wall = time_host(torch, calls, 400)
            trace = trace_kernels(torch, lambda: [c() for c in calls], rounds=2)
            per_call = {k: v / len(calls) if k != "top" else v for k, v in trace.items()}
            per_call["top"] = [dict(r, us=r["us"] / len(calls), per_round=r["per_round"] / len(calls))
                               for r in trace["top"]]
            host = node_host_us(ort, torch, name, model, layout, sets, (b, h, s, d), tdt, npdt, args.tmp)
            print(f"S={s} {name}: wall {wall:.1f} us per run; node Compute (host) {host}")
            print(format_trace(per_call), flush=True)
            result["points"].append({"S": s, "impl": name, "wall_us": wall, "kernels": per_call, "host_us": host})
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
