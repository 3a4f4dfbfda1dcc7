"""Polygraphy glue: run a model through every backend, compare each against the Triton golden,
report per output, and localize a failure to one FusedAttention node.

Backends (Polygraphy runners):

* ``onnxrt-opsfuse-<provider>``: ONNX Runtime with the opsfuse library on each provider
  (Polygraphy's ``OnnxrtRunner`` over a session from :func:`opsfuse.ort_session.make_session`,
  since Polygraphy cannot register a custom-op library itself);
* ``onnxrt-original-cpu``: the original (unfused) model, when given;
* ``trt-opsfuse``: TensorRT with the opsfuse plugin, when asked and installed;
* ``triton-golden``: :mod:`opsfuse.golden` (or a saved ``RunResults``).

Each backend is compared against the golden with Polygraphy's ``Comparator.compare_accuracy``
(the backend first, the golden second: relative errors are relative to the golden).

Per node (:func:`check_nodes`), each FusedAttention node is checked two ways:

* kernel: the node's output inside an ONNX Runtime run vs Triton on the exact inputs the node saw
  in that run (the node's inputs and output are exposed as extra graph outputs);
* rewrite (with the original model): the original model's value of the node's output vs Triton on
  the fused model's inputs for that node, with every earlier attention node's output taken from
  the original model, so each node is judged on its own.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx

from . import contract
from .golden import (GOLDEN_RUNNER_NAME, Feeds, _StagedOrtRunner, fused_attention_nodes, load_model,
                     node_label, run_fused_attention)

# Whole-model tolerances by output dtype: (atol, rtol). An element fails when its absolute error
# exceeds atol AND its relative error exceeds rtol (Polygraphy's elemwise check). The errors of a
# whole model include every other op's rounding, hence looser than a single kernel's.
MODEL_TOLERANCES = {
    "float32": (1e-4, 1e-3),
    "float64": (1e-7, 1e-6),
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
}
# One FusedAttention node on identical inputs: the two kernels differ by rounding only.
NODE_TOLERANCES = {
    "float32": (1e-5, 1e-4),
    "float16": (2e-3, 5e-3),
    "bfloat16": (1.6e-2, 2e-2),
}
EXACT = (0.0, 0.0)  # integer and bool outputs


def dtype_name(array) -> str:
    dt = np.asarray(array).dtype
    return "bfloat16" if dt.name == "bfloat16" else dt.name


def default_tolerance(array, table=None) -> tuple[float, float]:
    table = MODEL_TOLERANCES if table is None else table
    return table.get(dtype_name(array), EXACT)


def quiet_polygraphy(verbose: bool = False) -> None:
    """Polygraphy logs every comparison (INFO) and every failed one (ERROR); opsfuse prints its
    own table, so only Polygraphy's critical messages remain unless verbose."""
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.INFO if verbose else G_LOGGER.CRITICAL


# --- runners -------------------------------------------------------------------------------------


def ort_runner(model: str | os.PathLike | onnx.ModelProto, provider: str, name: str):
    """Polygraphy ``OnnxrtRunner`` over an opsfuse-enabled ONNX Runtime session."""
    from polygraphy.backend.onnxrt import OnnxrtRunner

    from .ort_session import make_session

    def build():
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 3
        return make_session(model, providers=(provider,), sess_options=so)

    return OnnxrtRunner(build, name=name)


def tensorrt_available() -> str | None:
    """None when TensorRT can be used, else the reason it cannot."""
    try:
        import tensorrt  # noqa: F401
    except Exception as e:  # noqa: BLE001 - absent, or a stub package that fails on import
        return f"TensorRT not installed ({type(e).__name__}: {e})"
    return None


def trt_runner(model_path: str, feeds: Feeds, name: str = "trt-opsfuse"):
    """Polygraphy ``TrtRunner``: the ONNX parser finds FusedAttention in the opsfuse plugin;
    one optimization profile fixed at the feeds' shapes; strongly typed, so the plugin runs in the
    model's element type as in ONNX Runtime."""
    from polygraphy.backend.trt import (CreateConfig, EngineFromNetwork, LoadPlugins,
                                        NetworkFromOnnxPath, Profile, TrtRunner)

    from . import get_trt_plugin_path

    profile = Profile()
    for input_name, value in feeds.items():
        profile.add(input_name, min=value.shape, opt=value.shape, max=value.shape)
    network = LoadPlugins(plugins=[get_trt_plugin_path()],
                          obj=NetworkFromOnnxPath(os.fspath(model_path), strongly_typed=True))
    engine = EngineFromNetwork(network, config=CreateConfig(profiles=[profile]))
    return TrtRunner(engine, name=name)


def run_runners(runners: Sequence, feeds_list: Sequence[Feeds]):
    """Polygraphy ``Comparator.run`` over the feeds; returns ``RunResults``."""
    from polygraphy.comparator import Comparator

    return Comparator.run(list(runners), data_loader=list(feeds_list))


# --- comparison and report -----------------------------------------------------------------------


@dataclass
class Row:
    """One output (or node) of one comparison, aggregated over iterations."""
    comparison: str  # "runner vs golden"
    output: str
    dtype: str
    atol: float
    rtol: float
    max_abs: float = 0.0
    max_rel: float = 0.0
    mean_abs: float = 0.0
    mismatches: int = 0
    total: int = 0
    passed: bool = True
    note: str = ""


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows)

    def failed_rows(self) -> list[Row]:
        return [r for r in self.rows if not r.passed]


def _mismatch_count(a, b, atol: float, rtol: float) -> int:
    a64 = np.asarray(a).astype(np.float64)
    b64 = np.asarray(b).astype(np.float64)
    if a64.shape != b64.shape:
        return int(max(a64.size, b64.size))
    with np.errstate(invalid="ignore", divide="ignore"):
        absdiff = np.abs(a64 - b64)
        reldiff = absdiff / np.where(b64 == 0, np.finfo(np.float64).eps, np.abs(b64))
    bad = ((absdiff > atol) | np.isnan(absdiff)) & ((reldiff > rtol) | np.isnan(reldiff))
    return int(bad.sum())


def compare_to_golden(run_results, golden_name: str = GOLDEN_RUNNER_NAME,
                      atol: float | None = None, rtol: float | None = None,
                      check_error_stat: str = "elemwise", table=None,
                      label: str | None = None) -> Report:
    """Compare every runner of `run_results` against the golden runner with Polygraphy.
    atol/rtol override the dtype-aware defaults (`table`: MODEL_TOLERANCES or NODE_TOLERANCES)."""
    from polygraphy.comparator import Comparator

    try:
        from polygraphy.comparator import SimpleCompareFunc
    except ImportError:  # Polygraphy before 0.50
        from polygraphy.comparator import CompareFunc

        SimpleCompareFunc = CompareFunc.simple

    names = [name for name, _ in run_results]
    if golden_name not in names:
        raise ValueError(f"no {golden_name!r} runner in the results (runners: {names})")
    golden_index = names.index(golden_name)
    golden_iters = run_results[golden_index][1]
    if not golden_iters:
        raise ValueError("the golden results hold no iteration")

    # Per-output tolerances from the golden's dtypes.
    atols, rtols = {}, {}
    for out_name, value in golden_iters[0].items():
        d_atol, d_rtol = default_tolerance(value, table)
        atols[out_name] = d_atol if atol is None else atol
        rtols[out_name] = d_rtol if rtol is None else rtol
    compare_func = SimpleCompareFunc(atol=atols, rtol=rtols, check_error_stat=check_error_stat)

    report = Report()
    for index, (runner_name, iters) in enumerate(run_results):
        if index == golden_index:
            continue
        if len(iters) != len(golden_iters):
            raise ValueError(f"{runner_name} has {len(iters)} iteration(s), the golden "
                             f"{len(golden_iters)}: were they run on the same inputs?")
        accuracy = Comparator.compare_accuracy(run_results, comparisons=[(index, golden_index)],
                                               compare_func=compare_func)
        result = accuracy[0]  # AccuracyResults: one AccuracyResult per compare function
        per_iteration = result[(runner_name, golden_name)]
        comparison = label or f"{runner_name} vs {golden_name}"
        for out_name, golden_value in golden_iters[0].items():
            row = Row(comparison, out_name, dtype_name(golden_value), atols[out_name], rtols[out_name])
            means = []
            for it, compared in enumerate(per_iteration):
                res = compared[out_name] if out_name in compared else None
                actual = iters[it][out_name] if out_name in iters[it] else None
                expected = golden_iters[it][out_name]
                if res is None or actual is None:
                    row.passed = False
                    row.note = f"missing from {runner_name}"
                    continue
                row.passed &= bool(res)
                if hasattr(res, "max_absdiff"):
                    row.max_abs = max(row.max_abs, _nan_max(res.max_absdiff))
                    row.max_rel = max(row.max_rel, _nan_max(res.max_reldiff))
                    means.append(res.mean_absdiff)
                else:
                    row.note = "shape mismatch"
                actual_np, expected_np = _as_numpy(actual), _as_numpy(expected)
                row.mismatches += _mismatch_count(actual_np, expected_np, row.atol, row.rtol)
                row.total += int(np.asarray(expected_np).size)
            row.mean_abs = float(np.mean(means)) if means else float("nan")
            report.rows.append(row)
    return report


def _nan_max(value) -> float:
    return float("inf") if value is None or np.isnan(value) else float(value)


def _as_numpy(value) -> np.ndarray:
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):
        from .triton_attention import torch_to_numpy

        return torch_to_numpy(value)
    return np.asarray(value)


def format_report(report: Report, title: str) -> str:
    lines = [title]
    by_comparison: OrderedDict[str, list[Row]] = OrderedDict()
    for row in report.rows:
        by_comparison.setdefault(row.comparison, []).append(row)
    for comparison, rows in by_comparison.items():
        lines.append(f"  {comparison}")
        width = max([len(r.output) for r in rows] + [6])
        lines.append(f"    {'output':<{width}}  {'dtype':<8}  {'max abs':>9}  {'max rel':>9}  "
                     f"{'mean abs':>9}  {'mismatches':>16}  {'atol':>7}  {'rtol':>7}  result")
        for r in rows:
            verdict = "PASS" if r.passed else "FAIL"
            if r.note:
                verdict += f" ({r.note})"
            lines.append(f"    {r.output:<{width}}  {r.dtype:<8}  {r.max_abs:>9.3g}  {r.max_rel:>9.3g}  "
                         f"{r.mean_abs:>9.3g}  {f'{r.mismatches}/{r.total}':>16}  {r.atol:>7.2g}  "
                         f"{r.rtol:>7.2g}  {verdict}")
    for note in report.notes:
        lines.append(f"  note: {note}")
    return "\n".join(lines)


# --- per node ------------------------------------------------------------------------------------


def _with_extra_outputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    extended = onnx.ModelProto()
    extended.CopyFrom(model)
    have = {o.name for o in extended.graph.output}
    for name in dict.fromkeys(names):
        if name and name not in have:
            extended.graph.output.append(onnx.ValueInfoProto(name=name))  # ORT infers the type
    return extended


def _node_results(node_values: list[OrderedDict], runner_name: str, golden_values: list[OrderedDict]):
    from .golden import make_run_results

    results = make_run_results(runner_name, node_values)
    results.extend(make_run_results(GOLDEN_RUNNER_NAME, golden_values))
    return results


def check_nodes_kernel(model: onnx.ModelProto, feeds_list: Sequence[Feeds], provider: str,
                       atol=None, rtol=None, check_error_stat="elemwise", device=None) -> Report:
    """Each FusedAttention node's ONNX Runtime output vs Triton on the inputs it saw there."""
    from .ort_session import make_session

    nodes = fused_attention_nodes(model)
    labels = [node_label(n, i) for i, n in enumerate(nodes)]
    graph_inputs = {i.name for i in model.graph.input}
    initializers = {i.name: i for i in model.graph.initializer}
    exposed = [name for n in nodes for name in list(n.input) + [n.output[0]]
               if name and name not in graph_inputs and name not in initializers]
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = make_session(_with_extra_outputs(model, exposed), providers=(provider,), sess_options=so)
    out_names = [o.name for o in session.get_outputs()]
    ort_values, golden_values = [], []
    for feeds in feeds_list:
        values = dict(zip(out_names, session.run(out_names, feeds)))
        values.update(feeds)

        def value(name):
            if not name:
                return None
            if name in values:
                return values[name]
            return onnx.numpy_helper.to_array(initializers[name])

        ort_iter, golden_iter = OrderedDict(), OrderedDict()
        for node, label in zip(nodes, labels):
            ort_iter[label] = values[node.output[0]]
            golden_iter[label] = run_fused_attention(node, [value(i) for i in node.input], device)
        ort_values.append(ort_iter)
        golden_values.append(golden_iter)
    runner_name = f"onnxrt-opsfuse-{provider}"
    report = compare_to_golden(_node_results(ort_values, runner_name, golden_values),
                               atol=atol, rtol=rtol, check_error_stat=check_error_stat,
                               table=NODE_TOLERANCES,
                               label=f"kernel: {runner_name} node output vs Triton on the node's inputs")
    return report


def check_nodes_rewrite(model: onnx.ModelProto, original: onnx.ModelProto, feeds_list: Sequence[Feeds],
                        atol=None, rtol=None, check_error_stat="elemwise", device=None) -> Report:
    """Each FusedAttention node (Triton) vs the original model's value of the node's output, with
    every attention output fed from the original model (so each node is judged on its own)."""
    from .golden import _ort_session

    nodes = fused_attention_nodes(model)
    original_values = {o.name for o in original.graph.output}
    produced = {o for n in original.graph.node for o in n.output} | {i.name for i in original.graph.input}
    comparable = [n for n in nodes if n.output[0] in produced]
    report = Report()
    for n in nodes:
        if n.output[0] not in produced:
            report.notes.append(f"{node_label(n)}: its output {n.output[0]!r} is not a value of the "
                                "original model; no rewrite check for this node")
    if not comparable:
        return report
    extended = _with_extra_outputs(original, [n.output[0] for n in comparable
                                              if n.output[0] not in original_values])
    session = _ort_session(extended, ["CPUExecutionProvider"])
    out_names = [o.name for o in session.get_outputs()]
    runner = _StagedOrtRunner(model)
    labels = {id(n): node_label(n, i) for i, n in enumerate(nodes)}
    orig_iters, golden_iters = [], []
    for feeds in feeds_list:
        orig = dict(zip(out_names, session.run(out_names, feeds)))
        orig_iter, golden_iter = OrderedDict(), OrderedDict()

        def compute(node, args, orig=orig, orig_iter=orig_iter, golden_iter=golden_iter):
            y = run_fused_attention(node, args, device)
            if node.output[0] in orig:
                golden_iter[labels[id(node)]] = y
                orig_iter[labels[id(node)]] = orig[node.output[0]]
                return orig[node.output[0]]  # downstream nodes see the original's value
            return y

        runner.run(feeds, compute)
        orig_iters.append(orig_iter)
        golden_iters.append(golden_iter)
    sub = compare_to_golden(_node_results(orig_iters, "onnxrt-original-cpu", golden_iters),
                            atol=atol, rtol=rtol, check_error_stat=check_error_stat,
                            table=MODEL_TOLERANCES,
                            label="rewrite: original model's value vs Triton on the fused node")
    report.rows.extend(sub.rows)
    return report
