"""Every compiled variant of the CPU kernel, not only the one this CPU picks.

The CPU kernel is one template compiled per instruction set (plugin/cpu/kernel_baseline.cc for
any x86-64, kernel_avx2.cc, kernel_avx512.cc) and chosen at run time; the other CPU tests only
ever exercise the best variant of the machine they run on. Here each variant this CPU can
execute runs a spread of cases through ONNX Runtime in a fresh process with OPSFUSE_CPU_ISA
forcing it (the choice is made once per process), against the float64 reference with the 2x
rule of tests/accuracy.py. Lane-block tails, GQA row stacking, fp16/bf16 conversion, masks,
causal modes and softcap all depend on the vector width, so every case matters for every width.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opsfuse.bench.cpu import ISA_CPU_FLAGS as _NEEDS
from opsfuse.bench.cpu import cpu_flags as _cpu_flags

HERE = Path(__file__).resolve().parent

# (b, hq, hkv, sq, sk, d, dv, dtype, mask, causal, key_lengths, softcap, scale); mask is None,
# "bool" or "add" followed by its shape.
CASES = [
    (1, 2, 2, 1, 1, 32, 32, "fp32", None, 0, False, 0.0, None),
    (2, 4, 2, 7, 97, 40, 40, "fp32", ("bool", (2, 1, 7, 97)), 1, False, 0.0, None),
    (1, 3, 1, 97, 7, 80, 64, "fp16", ("add", (97, 7)), 0, False, 0.0, None),
    (1, 4, 1, 1, 1025, 64, 64, "bf16", None, 2, True, 0.0, None),
    (1, 2, 2, 130, 130, 96, 96, "fp32", ("add", (1, 2, 130, 1)), 2, True, 30.0, 0.3),
    (2, 2, 1, 97, 130, 128, 24, "fp16", ("bool", (97, 130)), 1, True, 5.0, None),
    (1, 1, 1, 1025, 97, 256, 256, "bf16", None, 0, False, 0.0, 0.125),
    (1, 6, 2, 33, 65, 17, 5, "fp32", ("add", (1, 6, 33, 65)), 2, False, 0.0, None),
    # MHA decoding and other items of at most half a vector of rows: the row formulation.
    (2, 3, 3, 1, 1025, 64, 64, "fp32", ("add", (2, 3, 1, 1025)), 0, True, 0.0, None),
    (1, 4, 4, 1, 130, 59, 7, "fp16", ("bool", (1, 1, 1, 130)), 2, False, 20.0, None),
    (2, 2, 2, 3, 97, 256, 200, "bf16", ("add", (2, 1, 3, 97)), 2, True, 0.0, 0.2),
    (1, 2, 2, 1, 65, 7, 33, "fp32", None, 1, False, 0.0, None),
]

_CHILD = r"""
import json, sys
import ml_dtypes, numpy as np
sys.path.insert(0, sys.argv[1])
from accuracy import assert_within_2x_torch
from ort_helpers import FusedAttentionRunner

DT = {"fp32": np.float32, "fp16": np.float16, "bf16": ml_dtypes.bfloat16}
run = FusedAttentionRunner()
rng = np.random.default_rng(20261129)
results = []
for (b, hq, hkv, sq, sk, d, dv, dt, mask, causal, with_kl, softcap, scale) in json.loads(sys.argv[2]):
    dtype = DT[dt]
    q = rng.standard_normal((b, hq, sq, d)).astype(dtype)
    k = rng.standard_normal((b, hkv, sk, d)).astype(dtype)
    v = rng.standard_normal((b, hkv, sk, dv)).astype(dtype)
    m = None
    if mask is not None:
        kind, shape = mask
        if kind == "bool":
            m = rng.random(shape) > 0.3
        else:
            add = rng.standard_normal(shape).astype(np.float32)
            add[rng.random(shape) < 0.2] = -np.inf
            m = add.astype(dtype)
    kl = rng.integers(0, sk + 1, size=b).astype(np.int32) if with_kl else None
    attrs = {"is_causal": causal}
    if softcap:
        attrs["softcap"] = softcap
    if scale is not None:
        attrs["scale"] = scale
    out = run(q, k, v, m, kl, **attrs)
    err, torch_err = assert_within_2x_torch(out, q, k, v, attn_mask=m, key_lengths=kl, scale=scale,
                                            is_causal=causal, softcap=softcap,
                                            what=f"case b={b} hq={hq} hkv={hkv} sq={sq} sk={sk} d={d} dv={dv} {dt}")
    results.append([err, torch_err])
print("RESULTS " + json.dumps(results))
"""


@pytest.mark.parametrize("isa", ["baseline", "avx2", "avx512"])
def test_kernel_variant_matches_reference(isa):
    missing = _NEEDS[isa] - _cpu_flags()
    if missing:
        pytest.skip(f"this CPU cannot run the {isa} kernel (no {', '.join(sorted(missing))})")
    env = dict(os.environ, OPSFUSE_CPU_ISA=isa)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(HERE), json.dumps(CASES)],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert proc.returncode == 0, f"{isa} kernel: child failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULTS ")]
    assert lines, f"{isa} kernel: no results:\n{proc.stdout[-2000:]}"
    assert len(json.loads(lines[-1][len("RESULTS "):])) == len(CASES)
