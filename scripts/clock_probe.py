"""SM clock and board power while each contender runs alone at full load (run on the device).

    python scripts/clock_probe.py [B H S D dtype causal] [--seconds 3] [--rounds 2] [VARIANT ...]

For one prefill shape (default issue 7's B=8 H=16 S=1024 D=128 bf16, non-causal), cuDNN (PyTorch's
SDPA backend) and opsfuse under each VARIANT (comma-separated NAME=VALUE launcher switches, as in
scripts/ab_sweep.py; "default" for none) are captured into CUDA graphs over rotated input sets; each
then replays back to back for --seconds while nvidia-smi samples the SM clock, the power draw and the
active clock-event (throttle) reasons every 50 ms. Contenders take turns, --rounds times, so that
temperature drifts fall on all. Per contender and round: µs per call, the median SM clock (MHz) and
power (W) over the run's second half, and µs x MHz = SM cycles per call -- the figure that compares
two kernels' work at a common clock, which time alone cannot when one draws more power than the other
and runs slower for it. Why: docs/notes/cuda_kernel.md, session 39."""
import statistics
import subprocess
import sys
import threading
import time

import torch
import torch.nn.functional as F

import opsfuse.cuda as oc
from opsfuse.bench.cuda import _captured_replay, env_variant

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def parse(argv):
    seconds, rounds, rest = 3.0, 2, []
    it = iter(argv)
    for arg in it:
        if arg == "--seconds":
            seconds = float(next(it))
        elif arg == "--rounds":
            rounds = int(next(it))
        else:
            rest.append(arg)
    shape = (8, 16, 1024, 128, "bf16", 0)
    if len(rest) >= 6 and rest[0].isdigit():
        b, h, s, d, dt, c = rest[:6]
        shape, rest = (int(b), int(h), int(s), int(d), dt, int(c)), rest[6:]
    return shape, seconds, rounds, rest or ["default"]


class Sampler:
    """nvidia-smi's SM clock, power and clock-event reasons every 50 ms, timestamped on this host."""

    def __init__(self):
        # The reasons field's name changed (clocks_throttle_reasons -> clocks_event_reasons); an
        # unknown field fails the whole query, so ask for the one this driver knows.
        reasons = "clocks_event_reasons.active"
        if subprocess.run(["nvidia-smi", f"--query-gpu={reasons}", "--format=csv"], capture_output=True).returncode:
            reasons = "clocks_throttle_reasons.active"
        self.samples = []
        self._proc = subprocess.Popen(["nvidia-smi", f"--query-gpu=clocks.sm,power.draw,{reasons}", "--format=csv,noheader,nounits",
                                       "-lms", "50"], stdout=subprocess.PIPE, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        for line in self._proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            try:
                self.samples.append((time.monotonic(), float(parts[0]), float(parts[1]), parts[2]))
            except (ValueError, IndexError):
                continue

    def between(self, t0, t1):
        return [s for s in self.samples if t0 <= s[0] <= t1]

    def close(self):
        self._proc.terminate()
        self._proc.wait(timeout=5)


def main():
    (b, h, s, d, dt, causal), seconds, rounds, variants = parse(sys.argv[1:])
    dtype = DTYPES[dt]
    n_sets = max(1, min(16, (256 << 20) // (3 * b * h * s * d * 2)))
    sets = [tuple(torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(3)) for _ in range(n_sets)]

    def cudnn(q, k, v):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))

    def ours(spec):
        def call(q, k, v):
            with env_variant(spec):  # the plan is taken at capture: the graph keeps it
                return oc.fused_attention(q, k, v, is_causal=causal)
        return call

    contenders = {"cudnn": cudnn, **{f"opsfuse:{v}": ours(v) for v in variants}}
    replays = {name: _captured_replay(torch, [lambda st=st, f=f: f(*st) for st in sets], 3)
               for name, f in contenders.items()}
    flop = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
    print(f"clock_probe B={b} H={h} S={s} D={d} {dt} causal={causal} {torch.cuda.get_device_name(0)}", flush=True)
    sampler = Sampler()
    time.sleep(0.5)
    try:
        for r in range(rounds):
            for name, (replay, per_replay, _graph) in replays.items():
                torch.cuda.synchronize()
                t0, calls = time.monotonic(), 0
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                while time.monotonic() - t0 < seconds:
                    for _ in range(10):
                        replay()
                    calls += 10 * per_replay
                    torch.cuda.current_stream().synchronize()
                end.record()
                end.synchronize()
                t1 = time.monotonic()
                us = start.elapsed_time(end) * 1e3 / calls
                time.sleep(0.2)  # the sampler's last lines
                late = sampler.between(t0 + (t1 - t0) / 2, t1)
                if not late:
                    print(f"round {r} {name}: {us:.1f} us, no clock samples", flush=True)
                    continue
                mhz = statistics.median(x[1] for x in late)
                watts = statistics.median(x[2] for x in late)
                reasons = sorted({x[3] for x in late})
                print(f"round {r} {name:28s} {us:8.1f} us  {flop / us / 1e6:6.1f} TFLOP/s  SM {mhz:6.0f} MHz  "
                      f"{watts:5.0f} W  {us * mhz / 1e3:8.1f} kcycles  reasons {','.join(reasons)}", flush=True)
                time.sleep(1.0)  # a short pause between contenders
    finally:
        sampler.close()


if __name__ == "__main__":
    main()
