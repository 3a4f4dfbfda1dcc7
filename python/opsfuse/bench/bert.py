"""python -m opsfuse.bench.bert: BERT-base end to end through ONNX Runtime (issue 7, third target).

Everything is built on the machine that runs it (nothing downloaded, no model carried):

1. BERT-base (hidden 768, 12 layers, 12 heads, intermediate 3072) with random weights from a
   transformers ``BertConfig``, eval mode, exported with torch.onnx's TorchScript exporter
   (dynamo=False, opset 17, dynamic batch and sequence axes; inputs input_ids, attention_mask,
   token_type_ids). float16 for ``--device cuda`` (``model.half().cuda()`` exported directly),
   float32 for ``--device cpu``.
2. Five models:
     unfused         the plain export
     ort_optimized   onnxruntime.transformers.optimizer.optimize_model (model_type bert, opt_level 1 as
                     its docs recommend, use_gpu for cuda): Attention, SkipLayerNormalization, BiasGelu, ...
     opsfuse         the plain export rewritten by opsfuse's pass (the CLI's API): one FusedAttention per layer,
                     in the 3-D form (reads the Q/K/V projections; the export's Reshape/Transpose pairs go)
                     with the (B, 1, S, S) mask read as the (B, 1, 1, S) tensor it was expanded from
     ort+opsfuse     optimize_model with attention fusion off, then the opsfuse rewrite
     ort+opsfuse packed  the same with the rewrite's opt-in pack_qkv (``rewrite --pack-qkv``): the three
                     Q/K/V projection MatMuls of a layer become one MatMul on the concatenated weights,
                     read by FusedAttention with packed_qkv=1, and the three bias Adds its qkv_bias input
                     (not bit-exact: one GEMM of another shape; checked by the same accuracy rules)
3. session.run with host (numpy) inputs, ORT_ENABLE_ALL, the opsfuse library registered, CUDA EP
   for cuda; batch 8 x S in --seqs, a padding-style mask (a zero tail on most rows) and an all-ones
   mask; warm-up, then models interleaved round by round, median per model.
   Accuracy first: every model against the unfused one, and every model against a float32 PyTorch
   reference (for float16: the same float16-rounded weights, computed in float32). An opsfuse model
   must be within max(2 x the unfused model's error, FLOOR) of that reference and within CAP of the
   unfused output (relative L2), else the run fails (exit status 1) and no time is reported for it.
4. DIR/bert_e2e.json and DIR/bert_e2e.md.

``--quick``: a tiny BERT (2 layers, hidden 128, 2 heads, S=32, a few runs): a test of the logic, not
a measurement.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import io
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

from opsfuse.bench.rounds import round_order, whole_cycles

# The figures, measured on the H200 (batch 8, fp16, CUDA EP, session.run with host inputs).
REFERENCE_MS = {
    "ort_optimized": {128: 1.90, 512: 3.47},
    "unfused": {128: 3.69, 512: 6.11},
}

PACKED = "ort+opsfuse packed"
MODELS = ("unfused", "ort_optimized", "opsfuse", "ort+opsfuse", PACKED)
OPSFUSE_MODELS = ("opsfuse", "ort+opsfuse", PACKED)
# Column titles of the latency table.
TITLES = {"unfused": "unfused", "ort_optimized": "ORT optimizer", "opsfuse": "opsfuse",
          "ort+opsfuse": "ORT fusions + opsfuse", PACKED: "ORT fusions + opsfuse packed Q/K/V"}
COUNTED_OPS = ("FusedAttention", "Attention", "MultiHeadAttention", "SkipLayerNormalization",
               "BiasGelu", "EmbedLayerNormalization", "FastGelu", "Gelu", "LayerNormalization",
               "SkipSimplifiedLayerNormalization", "Softmax", "MatMul", "Gemm")
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
MAX_IR_VERSION = 10  # onnxruntime 1.31 rejects the IR versions onnx 1.23 writes (11+)

# Accuracy rules (relative L2 error ||y - ref|| / ||ref||). An opsfuse model must be within
# max(2 x the unfused model's error against the float32 reference, FLOOR) of that reference, and
# within CAP of the unfused model's output.
FLOOR = {"float16": 5e-3, "float32": 1e-5}
CAP = {"float16": 2e-2, "float32": 1e-4}


class BenchError(RuntimeError):
    """A failure the run must end on (the message says what and why)."""


def log(msg: str) -> None:
    print(msg, flush=True)


# --- configuration ------------------------------------------------------------------------------

def bert_config(quick: bool, attn: str):
    import transformers as tf

    if quick:
        return tf.BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=512, max_position_embeddings=512, attn_implementation=attn)
    return tf.BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                         intermediate_size=3072, max_position_embeddings=512, attn_implementation=attn)


class _Wrapper:
    """Positional inputs, one output (last_hidden_state): what the exporter wants."""

    @staticmethod
    def make(model):
        import torch

        class Wrapper(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, input_ids, attention_mask, token_type_ids):
                return self.model(input_ids=input_ids, attention_mask=attention_mask,
                                  token_type_ids=token_type_ids).last_hidden_state

        return Wrapper().eval()


def build_torch_model(cfg, dtype: str):
    """Random weights (seeded); for float16 the weights are rounded to float16 once, so that the
    float32 reference and the float16 export hold the same values."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    model = tf.BertModel(cfg, add_pooling_layer=False).eval()
    if dtype == "float16":
        model = model.half().float()
    return _Wrapper.make(model)


# --- inputs -------------------------------------------------------------------------------------

def make_feeds(batch: int, seq: int, vocab: int, mask_kind: str, seed: int = 0) -> dict:
    """Host inputs. 'padded': row i keeps S - i*0.4*S/(B-1) tokens (row 0 full, the last 60%), the
    rest of the row is padding (mask 0) on the right; 'ones': no padding."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab, size=(batch, seq), dtype=np.int64)
    mask = np.ones((batch, seq), dtype=np.int64)
    tt = np.zeros((batch, seq), dtype=np.int64)
    for i in range(batch):
        length = seq
        if mask_kind == "padded" and batch > 1:
            length = max(1, seq - round(i * 0.4 * seq / (batch - 1)))
        elif mask_kind == "padded":
            length = max(1, seq - seq // 4)
        mask[i, length:] = 0
        ids[i, length:] = 0  # [PAD]
        tt[i, length // 2:length] = 1  # a second segment, as in sentence-pair inputs
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": tt}


def lengths_of(feeds) -> list[int]:
    return [int(x) for x in feeds["attention_mask"].sum(axis=1)]


# --- models -------------------------------------------------------------------------------------

def cap_ir_version(path: Path) -> int:
    """Lowers the model's IR version to MAX_IR_VERSION in place (nothing else changes); returns it."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    if proto.ir_version > MAX_IR_VERSION:
        proto.ir_version = MAX_IR_VERSION
        onnx.save(proto, str(path))
    return proto.ir_version


def export(wrapper, cfg, device: str, dtype: str, path: Path) -> None:
    """TorchScript exporter, opset 17, dynamic batch/sequence; example inputs with a padded row so
    the traced mask path is not folded away."""
    import torch

    import copy

    dev = torch.device(device)
    module = copy.deepcopy(wrapper).to(dev)
    if dtype == "float16":
        module = module.half()
    feeds = make_feeds(2, 16, cfg.vocab_size, "padded")
    args = tuple(torch.from_numpy(feeds[n]).to(dev) for n in INPUT_NAMES)
    dyn = {n: {0: "batch", 1: "seq"} for n in INPUT_NAMES}
    dyn["last_hidden_state"] = {0: "batch", 1: "seq"}
    sink = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), \
            torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), input_names=list(INPUT_NAMES),
                          output_names=["last_hidden_state"], dynamic_axes=dyn, opset_version=17,
                          dynamo=False, do_constant_folding=True)
    del module
    if device == "cuda":
        torch.cuda.empty_cache()
    cap_ir_version(path)


def op_counts(path: Path) -> dict:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    all_ops = collections.Counter(n.op_type for n in proto.graph.node)
    counted = {op: all_ops.get(op, 0) for op in COUNTED_OPS if all_ops.get(op, 0)}
    return {"fused_ops": counted, "nodes": sum(all_ops.values()), "all_ops": dict(sorted(all_ops.items()))}


def ort_optimize(src: Path, dst: Path, cfg, device: str, dtype: str, attention: bool) -> dict:
    """onnxruntime.transformers' BERT optimizer, opt_level 1 (its recommended value: ORT's basic
    graph optimizations, then its Python fusions). attention=False: every fusion but attention, so
    opsfuse can take the attention after (at opt_level 0, see below).

    A float16 model on the CPU (a test of the graphs, not a measurement) gets opt_level 0 (the
    Python fusions alone): ORT's CPU EP has no float16 Softmax and would expand it into
    ReduceMax/Exp/ReduceSum/Div between Casts, a graph the CUDA EP never produces."""
    opt_level = 0 if (device == "cpu" and dtype == "float16") else 1
    if not attention:
        # The model goes on to opsfuse's rewrite, which validates with onnx.checker: opt_level 1
        # saves ORT's session graph, which on the CUDA EP holds ORT-internal MemcpyFromHost /
        # MemcpyToHost nodes that are no ONNX ops. The Python fusions alone (opt_level 0) give the
        # same fused ops; the session applies ORT's basic optimizations when it loads the model.
        opt_level = 0
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    opts = FusionOptions("bert")
    if not attention:
        opts.enable_attention = False
        opts.use_multi_head_attention = False
        # EmbedLayerNormalization stays on: without a fused Attention to feed, its mask-index output
        # is unused and the original mask-to-bias subgraph stays for opsfuse to read (checked: the
        # rewrite must find every layer, else the run reports the node patterns it met).
        opts.enable_rotary_embeddings = False
        opts.enable_qordered_matmul = False
    level = logging.getLogger("onnxruntime.transformers").level
    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    sink = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sink):
            warnings.simplefilter("ignore")
            opt = optimize_model(str(src), model_type="bert", num_heads=cfg.num_attention_heads,
                                 hidden_size=cfg.hidden_size, optimization_options=opts, opt_level=opt_level,
                                 use_gpu=(device == "cuda"))
            opt.save_model_to_file(str(dst))
    finally:
        logging.getLogger("onnxruntime.transformers").setLevel(level)
    cap_ir_version(dst)
    info = op_counts(dst)
    info["options"] = {k: v for k, v in vars(opts).items() if isinstance(v, (bool, int, str))}
    info["opt_level"] = opt_level
    return info


def softmax_patterns(path: Path) -> list[dict]:
    """For every Softmax left in the model: the producers of its input (3 deep) and its consumers,
    so a rewrite that missed a layer says which node pattern it met."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    producer = {o: n for n in proto.graph.node for o in n.output}
    consumers = collections.defaultdict(list)
    for n in proto.graph.node:
        for i in n.input:
            consumers[i].append(n)
    out = []
    for n in proto.graph.node:
        if n.op_type != "Softmax":
            continue
        chain, frontier = [], [n]
        for _ in range(3):
            nxt = []
            for m in frontier:
                for i in m.input:
                    p = producer.get(i)
                    if p is not None:
                        nxt.append(p)
            chain.append(sorted(f"{p.domain + '::' if p.domain else ''}{p.op_type}" for p in nxt))
            frontier = nxt
        out.append({"softmax": n.name, "upstream_by_depth": chain,
                    "consumers": sorted(c.op_type for c in consumers[n.output[0]])})
    return out


def opsfuse_rewrite(src: Path, dst: Path, pack_qkv: bool = False) -> dict:
    """The rewrite the CLI runs (model_io.load, fuse_attention, validate, save); pack_qkv as the
    CLI's --pack-qkv."""
    from opsfuse.graph_passes import model_io
    from opsfuse.graph_passes.pipeline import fuse_attention

    model = model_io.load(src)
    model, report = fuse_attention(model, pack_qkv=pack_qkv)
    model_io.validate(model)
    model_io.save(model, dst, external_data=False)
    cap_ir_version(dst)
    info = op_counts(dst)
    fused = [c.details for c in report.candidates if c.fused]
    info["report"] = {"found": report.found, "fused": report.fused,
                      "three_d": sum(bool(d.get("three_d")) for d in fused),
                      "mask_unbroadcast": sum(bool(d.get("mask_unbroadcast")) for d in fused),
                      "three_d_why_not": sorted({d["three_d_why_not"] for d in fused if d.get("three_d_why_not")}),
                      "packed_qkv": sum(bool(d.get("packed_qkv")) for d in fused),
                      "packed_qkv_why_not": sorted({d["packed_qkv_why_not"] for d in fused
                                                    if d.get("packed_qkv_why_not")}),
                      "left_alone": [{"nodes": c.nodes, "reason": c.reason} for c in report.left],
                      "other_softmax": list(report.other_softmax), "seconds": round(report.seconds, 2)}
    info["report_text"] = report.format()
    return info


# --- sessions -----------------------------------------------------------------------------------

def make_session(path: Path, device: str, threads: int | None, profile_prefix: str | None = None):
    import onnxruntime as ort

    from opsfuse import get_library_path

    so = ort.SessionOptions()
    so.register_custom_ops_library(get_library_path())
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    if device == "cuda":
        providers = [("CUDAExecutionProvider", {"device_id": "0"})]
    else:
        providers = ["CPUExecutionProvider"]
    sess = ort.InferenceSession(str(path), so, providers=providers)
    got = sess.get_providers()
    want = "CUDAExecutionProvider" if device == "cuda" else "CPUExecutionProvider"
    if not got or got[0] != want:
        raise BenchError(f"{path.name}: the session's providers are {got}, not {want} first")
    return sess


def profile_placement(path: Path, device: str, threads: int | None, feeds: dict, tmp: Path) -> dict:
    """One profiled run: {op type: {provider: node count}} of what the session really executes after
    ORT's own graph optimizations (ORT_ENABLE_ALL)."""
    sess = make_session(path, device, threads, profile_prefix=str(tmp / f"profile_{path.stem}"))
    sess.run(None, feeds)  # warm-up run: kernels get picked
    # The profile holds both runs; count one run's nodes: halve the per-node event counts.
    sess.run(None, feeds)
    prof = Path(sess.end_profiling())
    events = json.loads(prof.read_text())
    prof.unlink(missing_ok=True)
    per_node = collections.Counter()
    kind = {}
    for e in events:
        if e.get("cat") != "Node" or not str(e.get("name", "")).endswith("_kernel_time"):
            continue
        args = e.get("args", {})
        key = e["name"]
        per_node[key] += 1
        kind[key] = (args.get("op_name", "?"), args.get("provider", "?"))
    placement: dict = collections.defaultdict(lambda: collections.Counter())
    for key in per_node:
        op, prov = kind[key]
        placement[op][prov.replace("ExecutionProvider", "")] += 1
    return {op: dict(c) for op, c in sorted(placement.items())}


# --- accuracy -----------------------------------------------------------------------------------

def compare(y, ref) -> dict:
    import numpy as np

    y = np.asarray(y, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    finite = bool(np.isfinite(y).all())
    diff = np.abs(y - ref)
    max_abs = float(diff.max()) if finite else float("inf")
    rel = float(np.linalg.norm(y - ref) / max(np.linalg.norm(ref), 1e-30)) if finite else float("inf")
    return {"max_abs": max_abs, "rel_l2": rel, "finite": finite}


def torch_reference(wrapper, feeds: dict, device: str):
    """float32 PyTorch outputs (TF32 off) of the same weights."""
    import torch

    dev = torch.device(device)
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        wrapper.to(dev)
        with torch.no_grad():
            args = [torch.from_numpy(feeds[n]).to(dev) for n in INPUT_NAMES]
            y = wrapper(*args).float().cpu().numpy()
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
        wrapper.to("cpu")
        if device == "cuda":
            torch.cuda.empty_cache()
    return y


def check_accuracy(outputs: dict, ref, dtype: str) -> dict:
    """outputs: {model: array}. Returns {model: {vs_unfused, vs_fp32_reference, ok, why}}."""
    base = outputs["unfused"]
    res = {}
    unfused_err = compare(base, ref)["rel_l2"]
    bound = max(2.0 * unfused_err, FLOOR[dtype])
    for name, y in outputs.items():
        vs_unfused = compare(y, base)
        vs_ref = compare(y, ref)
        ok, why = True, ""
        if not (vs_unfused["finite"] and vs_ref["finite"]):
            ok, why = False, "non-finite values in the output"
        elif name != "unfused" and vs_ref["rel_l2"] > bound:
            ok, why = False, (f"relative error vs the float32 reference {vs_ref['rel_l2']:.2e} > "
                              f"max(2 x unfused's {unfused_err:.2e}, {FLOOR[dtype]:.0e})")
        elif name != "unfused" and vs_unfused["rel_l2"] > CAP[dtype]:
            ok, why = False, f"relative error vs the unfused model {vs_unfused['rel_l2']:.2e} > {CAP[dtype]:.0e}"
        res[name] = {"vs_unfused": vs_unfused, "vs_fp32_reference": vs_ref, "ok": ok, "why": why}
    return res


# --- timing -------------------------------------------------------------------------------------

def time_interleaved(sessions: dict, feeds: dict, warmup: int, runs: int) -> dict:
    """Warm-up, then `runs` rounds (rounded up to whole cycles of round_order); each round runs every
    model once, in round_order's balanced order (each model follows every other equally often).
    Returns {model: {median_ms, min_ms, p90_ms}} of wall-clock session.run times (host inputs in,
    host outputs back: the call returns only when the outputs are on the host)."""
    names = list(sessions)
    for _ in range(warmup):
        for n in names:
            sessions[n].run(None, feeds)
    times = {n: [] for n in names}
    for r in range(whole_cycles(runs, len(names))):
        for n in round_order(names, r):
            t0 = time.perf_counter()
            sessions[n].run(None, feeds)
            times[n].append((time.perf_counter() - t0) * 1e3)
    out = {}
    for n, ts in times.items():
        ts = sorted(ts)
        out[n] = {"median_ms": statistics.median(ts), "min_ms": ts[0],
                  "p90_ms": ts[min(len(ts) - 1, int(0.9 * len(ts)))], "runs": len(ts)}
    return out


# --- report -------------------------------------------------------------------------------------

def _fmt_ms(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _fmt_x(x) -> str:
    return "n/a" if x is None else f"{x:.2f}×"


def markdown(result: dict) -> str:
    m = result["meta"]
    lines = [
        f"# BERT end to end through ONNX Runtime ({m['device']}, {m['dtype']})",
        "",
        f"- date: {m['date']}",
        f"- device: {m['gpu'] or m['cpu']}",
        f"- onnxruntime {m['onnxruntime']}, torch {m['torch']}, transformers {m['transformers']}, onnx {m['onnx']}",
        f"- command: `{m['command']}`",
        f"- model: BERT {m['config']['num_hidden_layers']} layers, hidden {m['config']['hidden_size']}, "
        f"{m['config']['num_attention_heads']} heads, intermediate {m['config']['intermediate_size']}, random "
        f"weights, {m['attn']} attention, torch.onnx TorchScript exporter opset 17, {m['dtype']}"
        + (" — **--quick: a tiny model, a test of the logic, not a measurement**" if m["quick"] else ""),
        f"- method: session.run with host (numpy) inputs, ORT_ENABLE_ALL, providers {m['providers']}, "
        f"{m['warmup']} warm-up rounds then the median of {m['runs']} rounds (at least: rounded up to whole "
        f"balanced cycles), models interleaved per round, each after every other equally often; "
        f"batch {m['batch']}; masks: 'padded' (row lengths below) and 'ones'",
        "",
        "## Latency (ms per session.run, median)",
        "",
        "| S | mask | " + " | ".join(TITLES[n] for n in MODELS) + " | "
        + " | ".join(f"{TITLES[n]} vs ORT opt." for n in OPSFUSE_MODELS) + " |",
        "|---:|---|" + "---:|" * (len(MODELS) + len(OPSFUSE_MODELS)),
    ]
    for row in result["timings"]:
        t = row["ms"]
        sp = row["speedup_vs_ort_optimized"]
        lines.append(f"| {row['seq']} | {row['mask']} | " + " | ".join(_fmt_ms(t.get(n)) for n in MODELS) +
                     " | " + " | ".join(_fmt_x(sp.get(n)) for n in OPSFUSE_MODELS) + " |")
    lines += ["", "Speed-up = ORT-optimized ms / opsfuse ms (> 1: opsfuse faster).", "",
              "Issue 7's reference figures (H200, fp16, batch 8, host inputs; mask not stated):", "",
              "| S | unfused | ORT optimizer |", "|---:|---:|---:|"]
    for s in (128, 512):
        lines.append(f"| {s} | {REFERENCE_MS['unfused'][s]:.2f} | {REFERENCE_MS['ort_optimized'][s]:.2f} |")
    lines += ["", "## Models", "",
              "| model | nodes in the file | nodes executed | fused ops | FusedAttention layers |",
              "|---|---:|---:|---|---:|"]
    for name in MODELS:
        info = result["models"].get(name)
        if info is None:
            continue
        ops = ", ".join(f"{k} {v}" for k, v in info["fused_ops"].items())
        fa = info["fused_ops"].get("FusedAttention", 0)
        executed = info.get("executed_nodes")
        lines.append(f"| {name} | {info['nodes']} | {'n/a' if executed is None else executed} | {ops} | {fa} |")
    for name in OPSFUSE_MODELS:
        if name not in result["models"]:
            continue
        rep = result["models"][name]["report"]
        lines.append("")
        lines.append(f"- {name}: rewrite found {rep['found']} attention candidates, fused {rep['fused']} "
                     f"(expected {result['meta']['config']['num_hidden_layers']}); 3-D form (B, S, H·D) "
                     f"{rep.get('three_d', 0)}, mask read un-expanded {rep.get('mask_unbroadcast', 0)}"
                     + (f", packed Q/K/V {rep.get('packed_qkv', 0)}" if name == PACKED else ""))
        for why in rep.get("three_d_why_not", []):
            lines.append(f"  - 4-D form kept: {why}")
        for why in rep.get("packed_qkv_why_not", []) if name == PACKED else []:
            lines.append(f"  - Q/K/V not packed: {why}")
        for c in rep["left_alone"]:
            lines.append(f"  - left alone {c['nodes']}: {c['reason']}")
        if result["models"][name].get("missed_layers_why"):
            lines.append(f"  - why layers were missed: {result['models'][name]['missed_layers_why']}")
    lines += ["", "What each session executes after ORT's own optimizations (op: provider count), "
              "non-trivial ops only:", ""]
    for name in MODELS:
        pl = result["models"].get(name, {}).get("placement")
        if not pl:
            continue
        keep = {op: v for op, v in pl.items() if op in COUNTED_OPS or op in ("FusedMatMul", "QuickGelu")}
        lines.append(f"- {name}: " + ", ".join(f"{op} {v}" for op, v in keep.items()))
    lines += ["", "## Accuracy (relative L2 error / max abs difference)", "",
              "| S | mask | model | vs unfused | vs float32 reference | ok |", "|---:|---|---|---|---|---|"]
    for row in result["accuracy"]:
        for name, a in row["models"].items():
            u, r = a["vs_unfused"], a["vs_fp32_reference"]
            lines.append(f"| {row['seq']} | {row['mask']} | {name} | {u['rel_l2']:.2e} / {u['max_abs']:.2e} | "
                         f"{r['rel_l2']:.2e} / {r['max_abs']:.2e} | {'yes' if a['ok'] else 'NO: ' + a['why']} |")
    lines += ["", f"Rules: an opsfuse model must be within max(2 × the unfused model's error, "
              f"{FLOOR[m['dtype']]:.0e}) of the float32 reference and within {CAP[m['dtype']]:.0e} of the unfused "
              "model (relative L2); a model that fails gets no time.",
              f"Padded row lengths per S: {json.dumps(m['lengths'])}"]
    traced = [row for row in result["timings"] if row.get("kernels")]
    if traced:
        lines += ["", "## GPU time per session.run by kernel (--trace; PyTorch profiler, us per run)", ""]
        for row in traced:
            lines.append(f"### S={row['seq']}, mask {row['mask']}")
            lines.append("")
            for name, tr in row["kernels"].items():
                lines.append(f"- **{name}**: {tr['gpu_us']:.1f} us GPU in {tr['launches']:.0f} launches; "
                             + "; ".join(f"{r['us']:.1f} x{r['per_round']:.0f} `{r['name'][:60]}`"
                                         for r in tr["top"][:8]))
            lines.append("")
    if result.get("errors"):
        lines += ["", "## Errors", ""] + [f"- {e}" for e in result["errors"]]
    return "\n".join(lines) + "\n"


# --- driver -------------------------------------------------------------------------------------

def run(args) -> int:
    try:
        # torch before onnxruntime: onnxruntime-gpu loads the CUDA libraries torch's wheels bring.
        import torch
        import numpy as np  # noqa: F401
        import onnx
        import onnxruntime as ort
        import transformers
    except ImportError as exc:
        print(f"bench.bert: needs torch, transformers, onnx and onnxruntime: {exc}", file=sys.stderr)
        return 2
    import opsfuse

    # run() also takes a namespace built elsewhere: every option it lacks gets the parser's default.
    for key, value in vars(parser().parse_args(["--out", str(args.out)])).items():
        if not hasattr(args, key):
            setattr(args, key, value)
    if not hasattr(args, "argv"):
        args.argv = ["--out", str(args.out), "--device", args.device] + (["--quick"] if args.quick else [])
    device = args.device
    if device == "cuda":
        if not torch.cuda.is_available():
            print("bench.bert --device cuda: no CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
            return 2
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            print(f"bench.bert --device cuda: onnxruntime {ort.__version__} has no CUDAExecutionProvider "
                  f"(available: {ort.get_available_providers()}); is onnxruntime-gpu first on PYTHONPATH?",
                  file=sys.stderr)
            return 2
    quick = bool(args.quick)
    seqs = [int(s) for s in (args.seqs or ("32" if quick else "128,512")).split(",") if s]
    runs = args.runs or (5 if quick else 100)
    warmup = args.warmup if args.warmup is not None else (2 if quick else 20)
    if not quick and runs < 50:
        print(f"note: --runs {runs} < 50", file=sys.stderr)
    dtype = args.dtype or ("float16" if device == "cuda" else "float32")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="opsfuse_bert_", dir=args.tmp))
    cfg = bert_config(quick, args.attn)
    layers = cfg.num_hidden_layers
    errors: list[str] = []
    failures: list[str] = []
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "cpu": f"{platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs"
               + (f", {args.threads} intra-op threads" if args.threads else ""),
        "device": device, "dtype": dtype, "quick": quick, "attn": args.attn,
        "onnxruntime": ort.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
        "onnx": onnx.__version__, "opsfuse_library": opsfuse.get_library_path(),
        "command": " ".join(["python -m opsfuse.bench.bert"] + list(args.argv)),
        "batch": args.batch, "seqs": seqs, "runs": runs, "warmup": warmup,
        "config": {k: getattr(cfg, k) for k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                                  "intermediate_size", "vocab_size")},
        "host": platform.node(), "python": platform.python_version(),
    }
    result = {"meta": meta, "reference_ms_issue7": REFERENCE_MS, "models": {}, "accuracy": [], "timings": [],
              "errors": errors}
    sessions: dict = {}
    try:
        # 1. build and export
        t0 = time.perf_counter()
        wrapper = build_torch_model(cfg, dtype)
        paths = {n: tmp / f"bert_{n.replace('+', '_').replace(' ', '_')}.onnx" for n in MODELS}
        export(wrapper, cfg, device, dtype, paths["unfused"])
        log(f"exported {paths['unfused'].name} ({paths['unfused'].stat().st_size / 2**20:.0f} MiB, {dtype}) "
            f"in {time.perf_counter() - t0:.1f} s")
        result["models"]["unfused"] = op_counts(paths["unfused"])

        # 2. comparison models
        t0 = time.perf_counter()
        result["models"]["ort_optimized"] = ort_optimize(paths["unfused"], paths["ort_optimized"], cfg, device,
                                                         dtype, attention=True)
        log(f"ORT optimizer: {result['models']['ort_optimized']['fused_ops']} ({time.perf_counter() - t0:.1f} s)")
        ort_ops = result["models"]["ort_optimized"]["fused_ops"]
        if not any(ort_ops.get(op) for op in ("Attention", "MultiHeadAttention")):
            errors.append("ORT's optimizer fused no attention layer: its row is not the fused baseline the issue "
                          f"measured (softmax patterns: {softmax_patterns(paths['ort_optimized'])[:1]})")
            log("warning: " + errors[-1])

        t0 = time.perf_counter()
        info = opsfuse_rewrite(paths["unfused"], paths["opsfuse"])
        result["models"]["opsfuse"] = info
        log(f"opsfuse rewrite: {info['report_text']} ({time.perf_counter() - t0:.1f} s)")
        if info["report"]["fused"] != layers or info["fused_ops"].get("FusedAttention", 0) != layers:
            raise BenchError(f"opsfuse fused {info['report']['fused']} attention layers of {layers} in the plain "
                             f"export:\n{info['report_text']}\nsoftmax patterns left: "
                             f"{json.dumps(softmax_patterns(paths['opsfuse']))}")

        t0 = time.perf_counter()
        mid = tmp / "bert_ort_noattn.onnx"
        noattn = ort_optimize(paths["unfused"], mid, cfg, device, dtype, attention=False)
        for name, pack in (("ort+opsfuse", False), (PACKED, True)):
            t1 = time.perf_counter()
            info = opsfuse_rewrite(mid, paths[name], pack_qkv=pack)
            info["ort_options"] = noattn["options"]
            info["before_rewrite"] = noattn["fused_ops"]
            result["models"][name] = info
            log(f"ORT optimizer without attention: {noattn['fused_ops']}; then opsfuse{' --pack-qkv' if pack else ''}: "
                f"{info['report_text']} ({time.perf_counter() - t1:.1f} s)")
            if info["report"]["fused"] != layers:
                why = {"left_alone": info["report"]["left_alone"],
                       "softmax_patterns_left": softmax_patterns(paths[name]) or
                       f"no Softmax left after ORT's optimizer; its ops: {noattn['all_ops']}",
                       "softmax_patterns_in_plain_export": softmax_patterns(paths["unfused"])[:1]}
                info["missed_layers_why"] = why
                errors.append(f"{name}: the rewrite fused {info['report']['fused']} of {layers} layers after ORT's "
                              f"fusions; the node patterns around the softmaxes it missed: {json.dumps(why)[:2000]}")
                log("warning: " + errors[-1])
            if pack and info["report"]["packed_qkv"] != info["report"]["fused"]:
                errors.append(f"{name}: Q/K/V packed in {info['report']['packed_qkv']} of {info['report']['fused']} "
                              f"fused layers: {info['report']['packed_qkv_why_not']}")
                log("warning: " + errors[-1])
        log(f"(ORT fusions and both rewrites: {time.perf_counter() - t0:.1f} s)")
        mid.unlink(missing_ok=True)

        # 3. sessions, placement, accuracy
        for name in MODELS:
            t0 = time.perf_counter()
            try:
                sessions[name] = make_session(paths[name], device, args.threads)
            except Exception as exc:  # noqa: BLE001 - the baseline may fail to load: say so, go on
                msg = f"{name}: no session: {type(exc).__name__}: {str(exc)[:1000]}"
                if name == "ort_optimized":
                    errors.append(msg)
                    log("warning: " + msg)
                    continue
                raise BenchError(msg) from exc
            log(f"session {name}: providers {sessions[name].get_providers()} ({time.perf_counter() - t0:.1f} s)")
        meta["providers"] = sessions["unfused"].get_providers()
        meta["lengths"] = {}
        place_feeds = make_feeds(args.batch, seqs[0], cfg.vocab_size, "padded")
        for name in sessions:
            try:
                result["models"][name]["placement"] = profile_placement(paths[name], device, args.threads,
                                                                        place_feeds, tmp)
                result["models"][name]["executed_nodes"] = sum(
                    sum(per_provider.values()) for per_provider in result["models"][name]["placement"].values())
            except Exception as exc:  # noqa: BLE001 - diagnostics only
                errors.append(f"{name}: profiling for node placement failed: {type(exc).__name__}: {exc}")
        for name in OPSFUSE_MODELS:
            pl = result["models"][name].get("placement", {}).get("FusedAttention")
            if device == "cuda" and pl is not None and set(pl) != {"CUDA"}:
                failures.append(f"{name}: FusedAttention nodes ran on {pl}, not all on the CUDA EP")

        good = set(sessions)
        for seq in seqs:
            for mask in ("padded", "ones"):
                feeds = make_feeds(args.batch, seq, cfg.vocab_size, mask, seed=seq)
                if mask == "padded":
                    meta["lengths"][seq] = lengths_of(feeds)
                outputs = {n: s.run(None, feeds)[0] for n, s in sessions.items()}
                ref = torch_reference(wrapper, feeds, device)
                acc = check_accuracy(outputs, ref, dtype)
                result["accuracy"].append({"seq": seq, "mask": mask, "models": acc})
                for n, a in acc.items():
                    log(f"accuracy S={seq} {mask:6s} {n:18s} vs unfused rel {a['vs_unfused']['rel_l2']:.2e} "
                        f"max {a['vs_unfused']['max_abs']:.2e}; vs fp32 ref rel {a['vs_fp32_reference']['rel_l2']:.2e}"
                        f"{'' if a['ok'] else '  WRONG: ' + a['why']}")
                    if not a["ok"]:
                        good.discard(n)
                        msg = f"{n} output wrong at batch {args.batch} S={seq} mask {mask}: {a['why']}"
                        (failures if n in OPSFUSE_MODELS or n == "unfused" else errors).append(msg)

        # 4. timing: only models whose outputs were right
        for seq in seqs:
            for mask in ("padded", "ones"):
                feeds = make_feeds(args.batch, seq, cfg.vocab_size, mask, seed=seq)
                timed = {n: s for n, s in sessions.items() if n in good}
                stats = time_interleaved(timed, feeds, warmup, runs) if timed else {}
                ms = {n: (stats[n]["median_ms"] if n in stats else None) for n in MODELS}
                ort_ms = ms.get("ort_optimized")
                speed = {n: (ort_ms / ms[n] if ort_ms and ms.get(n) else None) for n in OPSFUSE_MODELS}
                row = {"seq": seq, "mask": mask, "batch": args.batch, "ms": ms, "stats": stats,
                       "speedup_vs_ort_optimized": speed,
                       "issue7_reference_ms": {k: v.get(seq) for k, v in REFERENCE_MS.items()}}
                if args.trace and device == "cuda":
                    from .kernel_trace import format_trace, trace_kernels

                    row["kernels"] = {}
                    for n, sess in timed.items():
                        row["kernels"][n] = trace_kernels(torch, lambda sess=sess: sess.run(None, feeds))
                        log(f"kernels S={seq} {mask} {n}:\n{format_trace(row['kernels'][n])}")
                result["timings"].append(row)
                log(f"B={args.batch} S={seq:4d} {mask:6s} " +
                    "  ".join(f"{n} {_fmt_ms(ms[n])} ms" for n in MODELS) +
                    "  opsfuse vs ORT opt " + ", ".join(f"{k} {'n/a' if v is None else f'{v:.2f}x'}"
                                                        for k, v in speed.items()))
    except BenchError as exc:
        failures.append(str(exc))
    except Exception as exc:  # noqa: BLE001 - anything else: on record, with where it happened
        import traceback

        failures.append(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}")
    finally:
        sessions.clear()
        result["failures"] = failures
        for name in result["models"]:
            result["models"][name].pop("report_text", None)
        if args.keep_models:
            log(f"models kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    (out_dir / "bert_e2e.json").write_text(json.dumps(result, indent=1, default=str))
    if "providers" not in meta:
        meta["providers"] = []
        meta.setdefault("lengths", {})
    try:
        md = markdown(result)
    except Exception as exc:  # noqa: BLE001 - a run that failed early: the JSON holds what there is
        md = f"# BERT end to end\n\nfailed before the table could be written: {exc}\n"
    if failures:
        md += "\n## FAILED\n\n" + "\n".join(f"- {f}" for f in failures) + "\n"
    (out_dir / "bert_e2e.md").write_text(md)
    log(f"wrote {out_dir / 'bert_e2e.json'} and {out_dir / 'bert_e2e.md'}")
    if failures:
        for f in failures:
            print(f"bench.bert: FAILED: {f}", file=sys.stderr)
        return 1
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m opsfuse.bench.bert", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for bert_e2e.json and bert_e2e.md")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seqs", default=None, help="comma-separated sequence lengths (default 128,512; --quick: 32)")
    p.add_argument("--runs", type=int, default=None, help="timed rounds (default 100; --quick: 5)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up rounds (default 20; --quick: 2)")
    p.add_argument("--attn", choices=("eager", "sdpa"), default="eager",
                   help="transformers attention implementation exported (default eager: the pattern ORT's "
                        "optimizer fuses; its TorchScript export of sdpa is left unfused by ORT)")
    p.add_argument("--dtype", choices=("float16", "float32"), default=None,
                   help="model precision (default: float16 on cuda, float32 on cpu; float16 on cpu tests the "
                        "float16 graphs where ORT's CPU EP inserts casts: not a measurement)")
    p.add_argument("--threads", type=int, default=None, help="ORT intra-op threads (CPU runs)")
    p.add_argument("--tmp", default=None, help="where the temporary models go (default: the system temp folder)")
    p.add_argument("--trace", action="store_true",
                   help="after timing, GPU time per kernel of each model's session.run (PyTorch's profiler; "
                        "cuda only): where each model's time goes")
    p.add_argument("--keep-models", action="store_true", help="keep the temporary models (their folder is printed)")
    p.add_argument("--quick", action="store_true", help="a tiny BERT: a test of the logic, not a measurement")
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    args.argv = argv
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
