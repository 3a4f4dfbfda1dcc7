"""GPU time per kernel of a host call, from PyTorch's profiler.

The profiler's CUDA activity (CUPTI) records every kernel the process launches on the device, so
it sees the kernels ONNX Runtime's CUDA EP launches as well as torch's: this is how the benchmarks
say where a session.run's GPU time goes (which kernels, how many, how long), next to its wall time.
"""

from __future__ import annotations


def profile_calls(torch, call, rounds: int, warmup: int):
    """Runs ``call`` ``warmup`` times, then ``rounds`` times under the profiler (CUDA activity only,
    synchronized before it stops); returns the profiler, whose events the caller reads."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(rounds):
            call()
        torch.cuda.synchronize()
    return prof


def trace_kernels(torch, call, rounds: int = 3, warmup: int = 2, top: int = 12) -> dict:
    """Runs ``call`` ``warmup`` times, then ``rounds`` times under the profiler.

    Returns {"gpu_us": summed kernel/memcpy/memset time per round, "launches": device activities
    per round, "top": [{"name", "per_round", "us"} ...] (the ``top`` longest, us per round)}.
    """
    prof = profile_calls(torch, call, rounds, warmup)
    rows = []
    for avg in prof.key_averages():
        us = float(getattr(avg, "device_time_total", 0.0) or getattr(avg, "cuda_time_total", 0.0))
        if us <= 0.0:
            continue  # host-side entries (none with CUDA activity only, but be safe)
        rows.append({"name": avg.key[:160], "per_round": avg.count / rounds, "us": us / rounds})
    rows.sort(key=lambda r: -r["us"])
    return {"gpu_us": sum(r["us"] for r in rows), "launches": sum(r["per_round"] for r in rows),
            "top": rows[:top]}


def format_trace(trace: dict) -> str:
    """Lines for a log: the total, then one line per kernel."""
    lines = [f"  GPU {trace['gpu_us']:.1f} us in {trace['launches']:.0f} device activities per round"]
    lines += [f"    {r['us']:8.1f} us  x{r['per_round']:<5.1f} {r['name'][:110]}" for r in trace["top"]]
    return "\n".join(lines)
