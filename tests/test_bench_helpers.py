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
