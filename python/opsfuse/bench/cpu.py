"""python -m opsfuse bench --device cpu: FusedAttention's CPU kernel side by side with its peers.

Grid (issue 2): B=1, H=12, D=64, S in {128, 256, 512, 1024, 2048, 4096}, float32, no mask.
Four ONNX models, each run through ONNX Runtime's CPU execution provider with the session's
default thread setting:
  fused      com.opsfuse::FusedAttention                    Q, K, V (B, H, S, D) -> Y (B, H, S, D)
  unfused    Transpose(K) -> MatMul -> Mul(scale) -> Softmax -> MatMul, the exporters' form
  mha        com.microsoft.MultiHeadAttention, in its own layout (B, S, H*D): no transposes
  attn23     ONNX Attention, opset 23, 4-D inputs (B, H, S, D)
Times are medians of session.run over `repeat` rounds; within a round the models run one after
the other, so a slow phase of a shared machine hits all of them alike. No session's intra-op pool
spins (session.intra_op.allow_spinning=0): with four sessions alive on two cores, idle spinning
pools stall whichever model runs. FLOPs = 4*B*H*S*S*D.
A numpy float32 matmul is timed before and after (the machine's state: peers and kernel are
bound by the same FMA units). Peak memory: a fresh subprocess per model and size builds the
session and inputs, reads its resident set, runs twice and reads its resident-set high-water
mark (VmHWM).
Results: cpu_bench.md and cpu_bench.json in --out.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODELS = ("fused", "unfused", "mha", "attn23")
PEERS = ("unfused", "mha", "attn23")
LABELS = {
    "fused": "FusedAttention (opsfuse)",
    "unfused": "unfused MatMul-Softmax-MatMul",
    "mha": "com.microsoft.MultiHeadAttention",
    "attn23": "ONNX Attention (opset 23)",
}
FULL_SIZES = (128, 256, 512, 1024, 2048, 4096)
QUICK_SIZES = (64, 128)
MEMORY_SIZES = (1024, 4096)
HEADS, HEAD_DIM = 12, 64
NOTES = [
    "All four sessions use ORT's default intra-op thread count (one thread per core) and graph "
    "optimizations; none spins (session.intra_op.allow_spinning=0): with four sessions alive on two "
    "cores, idle spinning pools stalled whichever model ran (~45 ms stalls every few runs).",
    "The peers do the same FLOPs as FusedAttention through MLAS's SGEMM; where they run near the "
    "FMA peak a float32 kernel cannot be much faster (floors and the arithmetic: "
    "docs/notes/cpu_kernel.md). The fused kernel's advantage is the S x S score matrix it never "
    "writes: flat memory, and time that grows more slowly than the peers' once that matrix leaves "
    "the caches.",
    "This is a shared 2-vCPU machine: the numpy matmul rate before/after and the load averages "
    "show its state during the run; compare models within a row, not across runs.",
]


def flops(b: int, h: int, s: int, d: int) -> float:
    return 4.0 * b * h * s * s * d


# --- models -------------------------------------------------------------------------------------

def build_model(kind: str, b: int, h: int, s: int, d: int, sq: int | None = None):
    """The ONNX model of `kind` (one of MODELS) for float32 inputs of sequence length s (keys and
    values; queries too unless `sq` is given, e.g. 1 for decoding)."""
    from onnx import TensorProto, helper

    from .. import contract

    f32 = TensorProto.FLOAT
    bhsd = [b, h, s, d]
    q_bhsd = [b, h, s if sq is None else sq, d]
    scale = 1.0 / math.sqrt(d)

    def vi(name, shape):
        return helper.make_tensor_value_info(name, f32, shape)

    if kind == "fused":
        node = helper.make_node(contract.OP_NAME, ["Q", "K", "V"], ["Y"], domain=contract.DOMAIN, scale=scale)
        graph = helper.make_graph([node], "fused", [vi("Q", q_bhsd), vi("K", bhsd), vi("V", bhsd)], [vi("Y", q_bhsd)])
        opsets = [helper.make_opsetid("", 17), helper.make_opsetid(contract.DOMAIN, contract.OP_VERSION)]
    elif kind == "unfused":
        nodes = [
            helper.make_node("Transpose", ["K"], ["Kt"], perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", ["Q", "Kt"], ["S"]),
            helper.make_node("Mul", ["S", "scale"], ["Ss"]),
            helper.make_node("Softmax", ["Ss"], ["P"], axis=-1),
            helper.make_node("MatMul", ["P", "V"], ["Y"]),
        ]
        init = [helper.make_tensor("scale", f32, [], [scale])]
        graph = helper.make_graph(nodes, "unfused", [vi("Q", q_bhsd), vi("K", bhsd), vi("V", bhsd)], [vi("Y", q_bhsd)],
                                  init)
        opsets = [helper.make_opsetid("", 17)]
    elif kind == "mha":
        bsh = [b, s, h * d]
        q_bsh = [b, q_bhsd[2], h * d]
        node = helper.make_node(
            "MultiHeadAttention", ["Q", "K", "V"], ["Y"], domain="com.microsoft", num_heads=h, scale=scale
        )
        graph = helper.make_graph([node], "mha", [vi("Q", q_bsh), vi("K", bsh), vi("V", bsh)], [vi("Y", q_bsh)])
        opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    elif kind == "attn23":
        node = helper.make_node("Attention", ["Q", "K", "V"], ["Y"], scale=scale)
        graph = helper.make_graph([node], "attn23", [vi("Q", q_bhsd), vi("K", bhsd), vi("V", bhsd)], [vi("Y", q_bhsd)])
        opsets = [helper.make_opsetid("", 23)]
    else:
        raise ValueError(f"unknown model kind {kind!r}")
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return model


def make_inputs(kind: str, b: int, h: int, s: int, d: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((b, h, s, d), dtype=np.float32) for _ in range(3))
    if kind == "mha":  # (B, H, S, D) -> (B, S, H*D), the same numbers in MHA's layout
        q, k, v = (np.ascontiguousarray(x.transpose(0, 2, 1, 3).reshape(b, s, h * d)) for x in (q, k, v))
    return {"Q": q, "K": k, "V": v}


def make_session(kind: str, model):
    import onnxruntime as ort

    so = ort.SessionOptions()
    # Four sessions live side by side, each with its own intra-op pool. Spinning idle workers of
    # the other three would steal this 2-core machine's cores (measured: a ~45 ms stall every few
    # runs for every model), so no pool spins; the setting is the same for all four models.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if kind == "fused":
        from .._paths import get_library_path

        so.register_custom_ops_library(get_library_path())
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


# --- machine ------------------------------------------------------------------------------------

def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


# The CPU flags each compiled kernel variant needs (plugin/cpu/attention_cpu.cc checks the same).
ISA_CPU_FLAGS = {
    "baseline": set(),
    "avx2": {"avx2", "fma", "f16c"},
    "avx512": {"avx512f", "avx512bw", "avx512vl", "avx2", "fma", "f16c"},
}


def kernel_isa() -> str:
    """The kernel the library picks on this CPU (the same rule as plugin/cpu/attention_cpu.cc)."""
    f = cpu_flags()
    order = ("baseline", "avx2", "avx512")
    best = [isa for isa in order if ISA_CPU_FLAGS[isa] <= f][-1]
    forced = os.environ.get("OPSFUSE_CPU_ISA")
    if forced in order and order.index(forced) < order.index(best):
        return forced
    return best


def _library_path() -> str:
    try:
        from .._paths import get_library_path

        return get_library_path()
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        return f"not found ({e})"


def load_average() -> str:
    """1-, 5- and 15-minute load averages (other work on a shared machine shows here)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def matmul_gflops(n: int = 1024, reps: int = 10) -> float:
    """numpy float32 n x n matmul rate (all threads), median: the machine's FMA throughput now."""
    import numpy as np

    a = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    b = a.copy()
    a @ b
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        ts.append(time.perf_counter() - t)
    return 2.0 * n**3 / statistics.median(ts) / 1e9


# --- timing -------------------------------------------------------------------------------------

def time_size(s: int, repeat: int | None, quick: bool, log=print) -> dict:
    """Median microseconds of session.run for every model at sequence length s, rounds interleaved."""
    import numpy as np

    b, h, d = 1, HEADS, HEAD_DIM
    sessions, feeds, outputs = {}, {}, {}
    for kind in MODELS:
        sessions[kind] = make_session(kind, build_model(kind, b, h, s, d))
        feeds[kind] = make_inputs(kind, b, h, s, d)
    # Warm-up (allocations, thread pool) and a cross-check that all four compute the same thing.
    first = {}
    for kind in MODELS:
        t = time.perf_counter()
        out = sessions[kind].run(None, feeds[kind])[0]
        first[kind] = time.perf_counter() - t
        if kind == "mha":
            out = out.reshape(b, s, h, d).transpose(0, 2, 1, 3)
        outputs[kind] = out
    for kind in PEERS:
        err = float(np.abs(outputs["fused"] - outputs[kind]).max())
        if not err < 1e-3:
            raise RuntimeError(f"S={s}: FusedAttention differs from {kind} by {err}")
    if repeat is None:
        # about 8 s of timed runs per size for the slowest model, 5..50 rounds
        slowest = max(first.values())
        repeat = 3 if quick else int(min(50, max(5, 8.0 / max(slowest, 1e-4))))
    # An untimed run before each timed one (for short runs) brings the model's data back into
    # the caches the previous model used.
    settle = {kind: first[kind] < 0.05 for kind in MODELS}
    times = {kind: [] for kind in MODELS}
    for _ in range(repeat):
        for kind in MODELS:
            if settle[kind]:
                sessions[kind].run(None, feeds[kind])
            t = time.perf_counter()
            sessions[kind].run(None, feeds[kind])
            times[kind].append(time.perf_counter() - t)
    row = {"S": s, "repeat": repeat, "gflop": flops(b, h, s, d) / 1e9}
    for kind in MODELS:
        row[kind + "_us"] = statistics.median(times[kind]) * 1e6
    best_peer = min(PEERS, key=lambda k: row[k + "_us"])
    row["best_peer"] = best_peer
    row["speedup"] = row[best_peer + "_us"] / row["fused_us"]
    log(
        f"S={s:5d}  "
        + "  ".join(f"{kind} {row[kind + '_us']:10.0f} us" for kind in MODELS)
        + f"  speedup vs best peer ({best_peer}) {row['speedup']:.2f}x  [{repeat} rounds]"
    )
    return row


# --- memory -------------------------------------------------------------------------------------

_MEMORY_CHILD = r"""
import json, os, sys
from opsfuse.bench import cpu

def status_kb(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(key + " not in /proc/self/status")

kind, s = sys.argv[1], int(sys.argv[2])
sess = cpu.make_session(kind, cpu.build_model(kind, 1, cpu.HEADS, s, cpu.HEAD_DIM))
feeds = cpu.make_inputs(kind, 1, cpu.HEADS, s, cpu.HEAD_DIM)
before = status_kb("VmRSS")
sess.run(None, feeds)
sess.run(None, feeds)
# VmHWM: this process's own resident-set high-water mark (ru_maxrss would carry the parent's
# high-water mark over the fork).
print(json.dumps({"before": before * 1024, "peak": status_kb("VmHWM") * 1024}))
"""


def measure_memory(kind: str, s: int) -> dict:
    """Resident set before the first run and its high-water mark after two runs, in a fresh process."""
    env = dict(os.environ)
    pkg_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    res = subprocess.run(
        [sys.executable, "-c", _MEMORY_CHILD, kind, str(s)], capture_output=True, text=True, env=env, timeout=900
    )
    if res.returncode != 0:
        raise RuntimeError(f"memory probe for {kind} at S={s} failed:\n{res.stderr[-2000:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    return {"model": kind, "S": s, "rss_before_mb": out["before"] / 2**20, "peak_mb": out["peak"] / 2**20,
            "growth_mb": (out["peak"] - out["before"]) / 2**20}


# --- report -------------------------------------------------------------------------------------

def write_report(out_dir: Path, result: dict) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    jpath = out_dir / "cpu_bench.json"
    mpath = out_dir / "cpu_bench.md"
    jpath.write_text(json.dumps(result, indent=2) + "\n")

    m = result["machine"]
    lines = [
        "# CPU benchmark: FusedAttention vs ONNX Runtime's attention paths",
        "",
        f"- date: {result['date']}",
        f"- command: `{result['command']}`",
        f"- machine: {m['cpu']}, {m['cores']} logical cores, kernel ISA `{m['kernel_isa']}`; "
        f"onnxruntime {m['onnxruntime']}, numpy {m['numpy']}, Python {m['python']}",
        f"- opsfuse library: `{m.get('library', 'n/a')}`",
        f"- numpy float32 1024^3 matmul (the machine's FMA throughput at the time): "
        f"{m['matmul_gflops_before']:.0f} GFLOP/s before, {m['matmul_gflops_after']:.0f} GFLOP/s after; "
        f"load average {m.get('loadavg_before', 'n/a')} before, {m.get('loadavg_after', 'n/a')} after",
        "- grid: B=1, H=12, D=64, float32, no mask; median of session.run, models interleaved per round;"
        " FLOPs = 4*B*H*S^2*D",
        "",
        "## Time per session.run (microseconds, median)",
        "",
        "| S | GFLOP | " + " | ".join(LABELS[k] for k in MODELS) + " | speedup vs best peer | fused GFLOP/s | rounds |",
        "|---:|---:|" + "---:|" * len(MODELS) + "---:|---:|---:|",
    ]
    for r in result["timings"]:
        cells = [f"{r[k + '_us']:.0f}" for k in MODELS]
        lines.append(
            f"| {r['S']} | {r['gflop']:.2f} | " + " | ".join(cells)
            + f" | {r['speedup']:.2f}x ({r['best_peer']}) | {r['gflop'] * 1e6 / r['fused_us']:.1f} | {r['repeat']} |"
        )
    if result.get("memory"):
        lines += [
            "",
            "## Peak memory (fresh process per model; MiB)",
            "",
            "Resident set after building the session and the inputs, its high-water mark after two runs,"
            " and the difference (what running the model added).",
            "",
            "| model | S | RSS before run | peak RSS | growth |",
            "|---|---:|---:|---:|---:|",
        ]
        for r in result["memory"]:
            lines.append(
                f"| {LABELS[r['model']]} | {r['S']} | {r['rss_before_mb']:.0f} | {r['peak_mb']:.0f} | {r['growth_mb']:.0f} |"
            )
    if result.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result["notes"]]
    mpath.write_text("\n".join(lines) + "\n")
    return mpath, jpath


def run(args) -> int:
    import numpy as np
    import onnxruntime as ort

    quick = bool(getattr(args, "quick", False))
    repeat = getattr(args, "repeat", None)
    out_dir = Path(getattr(args, "out", None) or "docs/results")
    sizes = QUICK_SIZES if quick else FULL_SIZES
    mem_sizes = (128,) if quick else MEMORY_SIZES

    machine = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "kernel_isa": kernel_isa(),
        "onnxruntime": ort.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "matmul_gflops_before": matmul_gflops(),
        "loadavg_before": load_average(),
        "library": _library_path(),
    }
    print(f"opsfuse CPU bench on {machine['cpu']} ({machine['cores']} cores, kernel {machine['kernel_isa']}); "
          f"numpy matmul {machine['matmul_gflops_before']:.0f} GFLOP/s")
    timings = [time_size(s, repeat, quick) for s in sizes]
    memory = []
    for s in mem_sizes:
        for kind in MODELS:
            r = measure_memory(kind, s)
            print(f"memory {kind:8s} S={s:5d}: before {r['rss_before_mb']:.0f} MiB, peak {r['peak_mb']:.0f} MiB, "
                  f"growth {r['growth_mb']:.0f} MiB")
            memory.append(r)
    machine["matmul_gflops_after"] = matmul_gflops()
    machine["loadavg_after"] = load_average()

    cmd = "python -m opsfuse bench --device cpu" + (" --quick" if quick else "") + (
        f" --repeat {repeat}" if repeat else "")
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": cmd,
        "machine": machine,
        "timings": timings,
        "memory": memory,
        "notes": NOTES + list(getattr(args, "notes", None) or []),
    }
    mpath, jpath = write_report(out_dir, result)
    print(f"wrote {mpath} and {jpath}")
    return 0
