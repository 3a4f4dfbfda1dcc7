"""CPU tests of the benchmark helpers that the GPU sweeps rely on."""
import os

from opsfuse.bench.cuda import env_variant


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


def test_time_host_interleaved_rotates_and_times_every_call():
    """Each round calls every implementation once, the starting one rotating, each implementation
    walking its own input sets; one median per implementation."""
    from opsfuse.bench.cuda import time_host_interleaved

    class FakeTorch:  # the timer only needs torch.cuda.synchronize()
        class cuda:
            @staticmethod
            def synchronize():
                pass

    log = []
    calls = {name: [lambda name=name, i=i: log.append((name, i)) for i in range(n)]
             for name, n in (("a", 2), ("b", 3), ("c", 1))}
    times = time_host_interleaved(FakeTorch, calls, repeat=6, warmup=0)
    assert set(times) == {"a", "b", "c"} and all(t >= 0 for t in times.values())
    assert len(log) == 18
    rounds = [log[i:i + 3] for i in range(0, 18, 3)]
    assert [r[0][0] for r in rounds] == ["a", "b", "c", "a", "b", "c"]
    assert all(sorted(n for n, _ in r) == ["a", "b", "c"] for r in rounds)
    assert [i for n, i in log if n == "b"] == [0, 1, 2, 0, 1, 2]
