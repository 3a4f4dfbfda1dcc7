"""CPU tests of the benchmark helpers that the GPU sweeps rely on."""
import collections
import os

import pytest

from opsfuse.bench.cuda import env_variant
from opsfuse.bench.rounds import cycle_length, round_order, whole_cycles


@pytest.mark.parametrize("n", range(1, 10))
def test_round_order_balances_first_places_and_predecessors(n):
    """Over one cycle every round is a permutation, every name comes first equally often, and every
    ordered pair of names is adjacent (one right after the other) equally often: what runs just
    before a timing is spread over all contenders (a rotation fails this from 3 names on)."""
    names = [f"impl{i}" for i in range(n)]
    cycle = cycle_length(n)
    rounds = [round_order(names, r) for r in range(cycle)]
    assert all(sorted(r) == names for r in rounds)
    firsts = collections.Counter(r[0] for r in rounds)
    assert set(firsts.values()) == {cycle // n} and len(firsts) == n
    pairs = collections.Counter((a, b) for r in rounds for a, b in zip(r, r[1:]))
    if n > 1:
        assert len(pairs) == n * (n - 1) and len(set(pairs.values())) == 1, pairs
    assert round_order(names, cycle) == rounds[0]
    assert whole_cycles(30, n) % cycle == 0 and 30 <= whole_cycles(30, n) < 30 + cycle


def test_env_variant_sets_and_restores(monkeypatch):
    monkeypatch.delenv("OPSFUSE_CUDA_TEST_A", raising=False)
    monkeypatch.setenv("OPSFUSE_CUDA_TEST_B", "7")
    with env_variant("OPSFUSE_CUDA_TEST_A=1,OPSFUSE_CUDA_TEST_B=2,ignored"):
        assert os.environ["OPSFUSE_CUDA_TEST_A"] == "1"
        assert os.environ["OPSFUSE_CUDA_TEST_B"] == "2"
    assert "OPSFUSE_CUDA_TEST_A" not in os.environ
    assert os.environ["OPSFUSE_CUDA_TEST_B"] == "7"


def test_env_variant_restores_after_an_error(monkeypatch):
    monkeypatch.delenv("OPSFUSE_CUDA_TEST_A", raising=False)
    try:
        with env_variant("OPSFUSE_CUDA_TEST_A=0"):
            raise RuntimeError("the timed call failed")
    except RuntimeError:
        pass
    assert "OPSFUSE_CUDA_TEST_A" not in os.environ


def test_time_host_interleaved_balances_and_times_every_call():
    """Each round calls every implementation once in round_order's order, for whole cycles of it
    (6 rounds for 3 names, 4 asked), each implementation walking its own input sets; one median per
    implementation."""
    from opsfuse.bench.cuda import time_host_interleaved

    class FakeTorch:  # the timer only needs torch.cuda.synchronize()
        class cuda:
            @staticmethod
            def synchronize():
                pass

    log = []
    calls = {name: [lambda name=name, i=i: log.append((name, i)) for i in range(n)]
             for name, n in (("a", 2), ("b", 3), ("c", 1))}
    times = time_host_interleaved(FakeTorch, calls, repeat=4, warmup=0)
    assert set(times) == {"a", "b", "c"} and all(t >= 0 for t in times.values())
    assert len(log) == 18
    rounds = [log[i:i + 3] for i in range(0, 18, 3)]
    assert [[n for n, _ in r] for r in rounds] == [round_order(["a", "b", "c"], r) for r in range(6)]
    assert [i for n, i in log if n == "b"] == [0, 1, 2, 0, 1, 2]


def test_summary_carries_both_errors_and_the_table_shows_them():
    """The best peer is the fastest whatever its accuracy (a TF32 float32 graph wins on time), so the
    summary and its table carry opsfuse's and the peer's error side by side."""
    from opsfuse.bench.cuda import _markdown, _summaries

    def row(impl, us, err):
        return dict(grid="seed", case="B=1 H=12 S=512 D=64 float32", impl=impl, mode="session.run", us=us,
                    tflops=1.0, tbps=0.1, rel_err=err)

    rows = [row("ORT unfused graph", 60.0, 4.3e-4), row("ORT MultiHeadAttention", 89.0, 5.9e-7),
            row("opsfuse via ORT", 82.0, 5.0e-7)]
    (s,) = _summaries(rows)
    assert s["best_peer"] == "ORT unfused graph" and s["speedup"] < 1.0
    assert s["opsfuse_err"] == 5.0e-7 and s["peer_err"] == 4.3e-4
    meta = dict(date="d", gpu="g", cuda="c", torch="t", onnxruntime="o", command="cmd", ceilings={})
    table_row = next(line for line in _markdown(meta, rows, [s]).splitlines() if "| via ORT |" in line)
    assert table_row.endswith("| 5.0e-07 | 4.3e-04 |")


def test_markdown_title_names_the_measured_gpu():
    """The results file's title is the card that ran it (an H100 run once read "(H200)")."""
    from opsfuse.bench.cuda import _markdown

    meta = dict(date="d", gpu="NVIDIA H100 80GB HBM3 (132 SMs, 79 GiB)", cuda="c", torch="t", onnxruntime="o",
                command="cmd", ceilings={})
    assert _markdown(meta, [], []).splitlines()[0] == "# CUDA FusedAttention benchmark (NVIDIA H100 80GB HBM3)"


class _FakeCudaTorch:
    """What the kernel timers use of torch.cuda, on the CPU: a capture records the calls made inside
    it and a replay makes them again; events count as zero time. `fail_capture` names the calls'
    owners whose capture raises (as for a library that cannot be captured)."""

    def __init__(self, log, fail_capture=()):
        fake = self

        class Graph:
            def __init__(self):
                self.seq = []

            def replay(self):
                for c in self.seq:
                    c()

        class Capture:
            def __init__(self, graph, stream=None):
                self.graph = graph

            def __enter__(self):
                fake.capturing = self.graph
                return self

            def __exit__(self, *exc):
                fake.capturing = None
                return False

        class TimingEvent:
            def __init__(self, enable_timing=False):
                pass

            def record(self):
                pass

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return 0.0

        class Cuda:
            CUDAGraph = Graph
            graph = Capture
            Event = TimingEvent

            @staticmethod
            def Stream():
                return type("S", (), {"wait_stream": lambda self, other: None})()

            @staticmethod
            def current_stream():
                return None

            @staticmethod
            def stream(s):
                import contextlib
                return contextlib.nullcontext()

            @staticmethod
            def synchronize():
                pass

        self.cuda = Cuda
        self.capturing = None
        self.log = log
        self.fail_capture = fail_capture

    def call(self, name, i):
        """A timed call: logged when run, recorded into the graph while one is captured."""
        def run():
            self.log.append((name, i))

        def call():
            if self.capturing is not None:
                if name in self.fail_capture:
                    raise RuntimeError("operation not permitted when stream is capturing")
                self.capturing.seq.append(run)
            else:
                run()
        return call


def test_time_kernels_interleaved_replays_every_implementation_each_round_in_balanced_order():
    """Each implementation is captured once (its calls cycled to 10 per replay), then every round
    replays each of them once in round_order's order, for whole cycles of it (6 rounds for 3 names,
    4 asked), so that no implementation is always timed right after another; one that cannot be
    captured is timed without a graph in the same rounds."""
    from opsfuse.bench.cuda import time_kernels_interleaved

    log = []
    fake = _FakeCudaTorch(log, fail_capture=("c",))
    calls = {name: [fake.call(name, i) for i in range(n)] for name, n in (("a", 2), ("b", 3), ("c", 1))}
    times = time_kernels_interleaved(fake, calls, repeat=4, warmup=0)
    assert set(times) == {"a", "b", "c"} and all(t == 0.0 for t in times.values())
    # a and b: the calls made while capturing are not run (recorded); c's capture failed on its first
    # call. Then 6 rounds of one replay each: 10 calls per replay.
    timed = [n for n, _ in log]
    assert len(timed) == 6 * 3 * 10
    rounds = [timed[i:i + 30] for i in range(0, 180, 30)]
    for r_index, r in enumerate(rounds):
        assert [r[j * 10] for j in range(3)] == round_order(["a", "b", "c"], r_index)
        assert all(len(set(r[j * 10:(j + 1) * 10])) == 1 for j in range(3))
    assert [i for n, i in log if n == "b"][:10] == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]


def test_opsfuse_rows_allocate_like_sdpa_and_the_out_row_keeps_one_output_per_set():
    """The kernel rows' calls allocate their output in the call, as SDPA's do (the same allocator
    for both); only the `out=` row writes into preallocated outputs, one per input set, each call
    into its own set's."""
    from opsfuse.bench import cuda as bench

    class Tensor:
        def __init__(self, shape, name):
            self.shape, self.dtype, self.device, self.name = shape, "f16", "dev", name

    class FakeTorch:
        made = []

        @staticmethod
        def empty(shape, dtype, device):
            t = Tensor(shape, f"out{len(FakeTorch.made)}")
            FakeTorch.made.append(t)
            return t

    class FakeModule:
        def __init__(self):
            self.log = []

        def fused_attention(self, q, k, v, is_causal=0, out=None):
            self.log.append((q.name, is_causal, out))
            return out if out is not None else Tensor(q.shape, f"fresh{len(self.log)}")

    sets = [tuple(Tensor((1, 2, 5, 8), f"{x}{i}") for x in "qkv") for i in range(3)]
    mod = FakeModule()
    calls, first = bench._opsfuse_calls(FakeTorch, mod, sets, True, "opsfuse binding")
    for c in calls:
        c()
    assert FakeTorch.made == [] and all(out is None for _, _, out in mod.log)
    assert [q for q, _, _ in mod.log] == ["q0", "q0", "q1", "q2"] and all(c == 1 for _, c, _ in mod.log)
    assert first.name.startswith("fresh")

    mod = FakeModule()
    calls, first = bench._opsfuse_calls(FakeTorch, mod, sets, False, bench._OUT_IMPL)
    for c in reversed(calls):
        c()
    assert len(FakeTorch.made) == 3 and first is FakeTorch.made[0]
    assert [(q, out.name) for q, _, out in mod.log] == [("q0", "out0"), ("q2", "out2"), ("q1", "out1"), ("q0", "out0")]


def test_grid_names_are_exact():
    """--grids selects by name: "prefill" must not also run the float16 grid, and a typo is an error."""
    from opsfuse.bench.cuda import DEFAULT_GRIDS, parse_grids

    assert parse_grids("seed,prefill") == {"seed", "prefill"}
    assert parse_grids(" prefill16 ,") == {"prefill16"}
    assert {"prefill", "prefill16"} <= parse_grids(DEFAULT_GRIDS)
    with pytest.raises(ValueError, match="prefil\\b.*choose from"):
        parse_grids("seed,prefil")
