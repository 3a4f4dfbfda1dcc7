"""The launcher's heuristic (choose_plan in plugin/cuda/attention_cuda.cu) through the module's
describe_plan: which kernel and schedule a launch gets on a described device (default an H100 /
H200: 132 SMs, 228 KB of shared memory each, compute capability 9.0). Runs without a GPU (CI)
whenever opsfuse._cuda was built: the inputs are stand-ins whose memory is never touched. The
device measurements behind each rule are in docs/notes/cuda_kernel.md."""

from __future__ import annotations

import pytest

import opsfuse.cuda as ocuda

from cuda_helpers import FakeTensor

# Every OPSFUSE_CUDA_* switch the heuristic reads: unset for these tests unless a test sets one.
SWITCHES = ["DISABLE_HOPPER", "FORCE_HOPPER", "HOPPER_PERSISTENT", "HOPPER_SPLITS", "HOPPER_TAIL_SPLIT",
            "HOPPER_DYNAMIC", "HOPPER_SCHED_HEADS", "HOPPER_STREAM_K", "HOPPER_WG_SPLIT", "HOPPER_DECODE",
            "DECODE_SPLITS", "DECODE_NO_CLUSTER", "HOPPER_CHAIN", "HOPPER_DV_BUCKET", "HOPPER_D192", "HOPPER_SEQ3"]


@pytest.fixture()
def mod(monkeypatch):
    if not ocuda.available():
        pytest.skip("opsfuse._cuda not built in this install (no nvcc or pybind11 at build time)")
    for name in SWITCHES:
        monkeypatch.delenv("OPSFUSE_CUDA_" + name, raising=False)
    return ocuda._module()


def plan(mod, b, h, sq, sk, d, hkv=None, typestr="<f2", dv=None, **kw):
    hkv = hkv or h
    q = FakeTensor((b, h, sq, d), typestr)
    k = FakeTensor((b, hkv, sk, d), typestr)
    v = FakeTensor((b, hkv, sk, dv or d), typestr)
    code, message, summary = mod.describe_plan(q, k, v, **kw)
    assert code == 0, message
    return summary


def require_hopper(summary):
    if not summary["hopper_compiled"]:
        pytest.skip("this build has no sm_90a kernels (CMAKE_CUDA_ARCHITECTURES without 90)")


def test_prefill_takes_the_persistent_hopper_grid(mod):
    s = plan(mod, 8, 16, 4096, 4096, 128)  # fp16 (the interface cannot name bf16; the plan is the same)
    require_hopper(s)
    assert s["kernel"] == "hopper" and s["persistent"] == 132 and s["block_m"] == 128 and s["num_splits"] == 1


@pytest.mark.parametrize("sq,wg_split", [(128, False), (256, True), (512, True), (1024, False)])
def test_seed_grid(mod, sq, wg_split):
    """B=1 H=12 D=64: one round of blocks; 64-row items split between the warpgroups where they fit."""
    s = plan(mod, 1, 12, sq, sq, 64)
    require_hopper(s)
    assert s["kernel"] == "hopper" and s["persistent"] == 0 and s["wg_split"] is wg_split


@pytest.mark.parametrize("b,h,sq,sk,d,causal,three", [
    (1, 12, 1024, 1024, 64, 0, True),   # the seed's S=1024: 96 items of 8 key tiles, 13.6 against 14.4 µs
    (1, 16, 1000, 640, 40, 0, True),    # D = 40 (the 64 bucket), 5 tiles, a partial last row tile
    (1, 12, 2048, 2048, 64, 0, False),  # 16 tiles (and a persistent grid)
    (8, 12, 1024, 1024, 64, 0, False),  # 768 items: more than one round
    (1, 12, 512, 512, 64, 0, False),    # the warpgroup split's one round of 64-row items
    (1, 12, 1024, 1000, 64, 0, False),  # a key limit inside the last tile
    (1, 12, 1024, 256, 64, 0, False),   # 2 tiles
    (1, 12, 1024, 1024, 64, 1, False),  # causal
    (1, 12, 1024, 1024, 128, 0, False),  # D = 128
])
def test_three_consumer_kernel(mod, b, h, sq, sk, d, causal, three):
    """One-round plain launches at D <= 64 over 3 to 8 whole 128-key tiles whose 64-row items do not
    fit one round take the three-consumer kernel (hopper_three_consumers; session 51's A/B)."""
    s = plan(mod, b, h, sq, sk, d, is_causal=causal)
    require_hopper(s)
    assert s["kernel"] == "hopper" and s["three_consumers"] is three


def test_three_consumer_kernel_switched_off(mod, monkeypatch):
    monkeypatch.setenv("OPSFUSE_CUDA_HOPPER_SEQ3", "0")
    s = plan(mod, 1, 12, 1024, 1024, 64)
    require_hopper(s)
    assert not s["three_consumers"]


@pytest.mark.parametrize("b,h,s_,d,causal,wg_split", [
    (1, 16, 512, 128, 0, True),   # 36.5 µs portable split against 12.2 on the H200 (session 27)
    (1, 2, 4096, 128, 0, True),   # 112.0 against 60.5
    (1, 4, 1024, 64, 0, True),    # 17.6 against 10.5
    (1, 16, 512, 128, 1, False),  # causal: 64 items of 128 rows, 35.3 against 13.3
])
def test_small_grids_take_the_hopper_kernel(mod, b, h, s_, d, causal, wg_split):
    """Grids the portable plan splits by keys go to the Hopper kernel where its items fill a third of
    the SMs; the portable plan for the same launch splits (what the rule overrides)."""
    s = plan(mod, b, h, s_, s_, d, is_causal=causal)
    require_hopper(s)
    assert s["kernel"] == "hopper" and s["num_splits"] == 1 and s["wg_split"] is wg_split
    assert s["block_m"] == (64 if wg_split else 128)
    portable = plan(mod, b, h, s_, s_, d, is_causal=causal, cc=80)
    assert portable["kernel"] == "tensor_core" and portable["num_splits"] > 1


@pytest.mark.parametrize("b,h,hkv,sq,sk,d", [
    (1, 2, 2, 128, 8192, 128),  # 2 items over 64 key tiles: the portable split spreads them over the SMs
    (1, 64, 8, 32, 8192, 128),  # GQA 8, 32 rows a head: 64 items a quarter full (rows of 32 items)
    (1, 4, 4, 512, 2048, 256),  # D = 256: the portable split's 64-row blocks leave <= 33 Hopper items
])
def test_few_items_keep_the_portable_split(mod, b, h, hkv, sq, sk, d):
    s = plan(mod, b, h, sq, sk, d, hkv=hkv)
    require_hopper(s)
    assert s["kernel"] == "tensor_core" and s["num_splits"] > 1


def test_switches_reach_the_plan(mod, monkeypatch):
    require_hopper(plan(mod, 1, 16, 512, 512, 128))
    monkeypatch.setenv("OPSFUSE_CUDA_DISABLE_HOPPER", "1")
    assert plan(mod, 1, 16, 512, 512, 128)["kernel"] == "tensor_core"
    monkeypatch.delenv("OPSFUSE_CUDA_DISABLE_HOPPER")
    monkeypatch.setenv("OPSFUSE_CUDA_HOPPER_WG_SPLIT", "0")
    s = plan(mod, 1, 16, 512, 512, 128)
    assert s["kernel"] == "hopper" and not s["wg_split"] and s["block_m"] == 128


@pytest.mark.parametrize("value, tiles, causal_tiles", [(None, 16, 8), ("1", 16, 8), ("0", 0, 0), ("2", 2, 2),
                                                        ("8", 8, 8), ("32", 32, 32)])
def test_chain_switch(mod, monkeypatch, value, tiles, causal_tiles):
    """OPSFUSE_CUDA_HOPPER_CHAIN: unset or 1 chains from 16 key tiles (causal launches from 8), 0
    never, N >= 2 from N for both (the trace and A/B builds' way to move the threshold)."""
    if value is not None:
        monkeypatch.setenv("OPSFUSE_CUDA_HOPPER_CHAIN", value)
    p = plan(mod, 8, 16, 1024, 1024, 128)
    assert (p["chain_tiles"], p["chain_tiles_causal"]) == (tiles, causal_tiles)


@pytest.mark.parametrize("value, on", [(None, True), ("1", True), ("0", False)])
def test_fast_plain_switch(mod, monkeypatch, value, on):
    """OPSFUSE_CUDA_HOPPER_FAST: unset or 1 lets plain D = 128 launches with whole, visible key tiles
    take the kernel without the code they never run (kPlainFast), 0 leaves them to kPlain (or, from
    16 key tiles, the chain)."""
    if value is not None:
        monkeypatch.setenv("OPSFUSE_CUDA_HOPPER_FAST", value)
    assert plan(mod, 8, 16, 1024, 1024, 128)["fast_plain"] is on


@pytest.mark.parametrize("d,dv,bucket,bucket_v", [
    (192, 128, 192, 128),  # DeepSeek-V3's latent attention
    (160, 64, 192, 128),
    (256, 64, 256, 128),
    (200, 72, 256, 128),
    (192, 192, 256, 256),
    (96, 256, 256, 256),   # V wider than Q / K: one bucket
    (128, 64, 128, 128),   # no V bucket of its own below 256
])
def test_latent_attention_takes_its_own_buckets(mod, monkeypatch, d, dv, bucket, bucket_v):
    """128 < D <= 256 with Dv <= 128 runs on Hopper with V, O and P V at 128 columns, and Q / K at 192
    where D <= 192 (the (192, 128) and (256, 128) instantiations); OPSFUSE_CUDA_HOPPER_D192=0 keeps
    Q / K at 256, OPSFUSE_CUDA_HOPPER_DV_BUCKET=0 pads V too, and the portable kernels keep one
    bucket of 256."""
    s = plan(mod, 1, 128, 4096, 4096, d, dv=dv, is_causal=1)
    require_hopper(s)
    assert s["kernel"] == "hopper" and (s["bucket"], s["bucket_v"]) == (bucket, bucket_v)
    assert s["cluster"] == 1 and not s["stream_k"] and not s["wg_split"]
    one_bucket = 256 if bucket > 128 else bucket
    portable = plan(mod, 1, 128, 4096, 4096, d, dv=dv, cc=80)
    assert (portable["bucket"], portable["bucket_v"]) == (one_bucket, one_bucket)
    monkeypatch.setenv("OPSFUSE_CUDA_HOPPER_D192", "0")
    assert plan(mod, 1, 128, 4096, 4096, d, dv=dv, is_causal=1)["bucket"] == one_bucket
    monkeypatch.setenv("OPSFUSE_CUDA_HOPPER_DV_BUCKET", "0")
    padded = plan(mod, 1, 128, 4096, 4096, d, dv=dv, is_causal=1)
    assert (padded["bucket"], padded["bucket_v"]) == (one_bucket, one_bucket)


def test_latent_attention_with_a_q_bias_keeps_its_buckets(mod):
    """A Q bias does not move D = 192 off the (192, 128) instantiation: the kernel's walk of Q's rows
    (120 threads over rows of 24 chunks there) adds it at every head size."""
    s = plan(mod, 1, 128, 4096, 4096, 192, dv=128, q_bias=FakeTensor((128 * 192,)))
    require_hopper(s)
    assert s["kernel"] == "hopper" and (s["bucket"], s["bucket_v"]) == (192, 128)


def test_other_devices_and_dtypes(mod):
    assert plan(mod, 1, 16, 512, 512, 128, cc=89)["kernel"] == "tensor_core"
    assert plan(mod, 1, 16, 512, 512, 128, typestr="<f4")["kernel"] == "float32"
    decode = plan(mod, 8, 32, 1, 4096, 128, hkv=8)
    assert decode["kernel"] in ("tensor_core_decode", "hopper_decode")


def test_invalid_inputs_are_reported(mod):
    q = FakeTensor((1, 4, 8, 64))
    code, message, value = mod.describe_plan(q, q, q, is_causal=3)
    assert code == 1 and value is None and "is_causal" in message
