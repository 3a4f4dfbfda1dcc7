"""Issue 7's SASS requirement, checked in CI without a GPU: every Hopper prefill kernel in the
installed ONNX Runtime library has HGMMA (wgmma) in its machine code, no local-memory traffic
(ptxas spills or a stack array) and unserialized wgmmas. The checks are scripts/check_sass.py's,
run on the library the package built (nvcc compiles the sm_90a kernels on any machine)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

import opsfuse

_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_sass.py"


def _check_sass():
    spec = importlib.util.spec_from_file_location("check_sass", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


check_sass = _check_sass()


def _listing(*bodies: tuple[str, list[str]]) -> str:
    """A cuobjdump -sass listing of kernels (name, instructions), with address comments."""
    out = []
    for name, instructions in bodies:
        out.append(f"\n\t\tFunction : {name}\n")
        out += [f"        /*{i * 16:04x}*/                   {ins} ;\n" for i, ins in enumerate(instructions)]
    return "".join(out)


HOPPER = "_ZN7opsfuse4cuda6detail6hopper17hopper_fwd_kernelI6__halfLi64ELi0EEEvNS1_10KernelArgsE"
CLEAN = ["HGMMA.64x128x16.F32 R24, gdesc[UR4], RZ, !UPT", "HGMMA.64x128x16.F32 R24, gdesc[UR8], R24, gsb0",
         "WARPGROUP.DEPBAR.LE gsb0, 0x0", "EXIT"]


def test_checks_find_what_they_look_for():
    spilled = CLEAN[:2] + ["STL [R1+0x4], R3", "LDL R3, [R1+0x4]"] + CLEAN[2:]
    serialized = [CLEAN[0], "WARPGROUP.DEPBAR.LE gsb0, 0x0", CLEAN[1], "WARPGROUP.DEPBAR.LE gsb0, 0x0"]
    listing = _listing((HOPPER + "0", CLEAN), (HOPPER + "1", spilled), (HOPPER + "2", serialized),
                       (HOPPER + "3", ["FFMA R0, R1, R2, R3", "EXIT"]), ("_Z10other_kernelv", ["STL [R1], R0"]))
    reports = {r.name[-1]: r for r in check_sass.hopper_reports(listing)}
    assert sorted(reports) == ["0", "1", "2", "3"]  # the non-Hopper kernel is not ours to check
    assert reports["0"].problems == [] and reports["0"].instructions == 4
    assert reports["1"].problems == ["2 local-memory instructions"]
    assert reports["2"].problems == ["serialized (a wgmma wait after every HGMMA)"]
    assert reports["3"].problems == ["no HGMMA"]


def _shipped_reports():
    info = opsfuse.build_info()
    if not info["cuda"]:
        pytest.skip(f"the CUDA kernels were not built in this install: {info.get('cuda_reason') or 'no nvcc'}")
    if not any(a.startswith("90") for a in info["cuda_architectures"].split(";")):
        pytest.skip(f"built without sm_90 ({info['cuda_architectures']}): no Hopper kernel to check")
    tool = check_sass.find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (CUDA's bin folder, or Triton's copy from the test extras)")
    return check_sass.hopper_reports(check_sass.disassemble(info["ort_library"], tool))


def test_shipped_hopper_kernels_use_wgmma_without_spills():
    reports = _shipped_reports()
    failures = {r.name: r.problems for r in reports if r.problems}
    assert not failures
    # One translation unit per (dtype, head-size bucket), hopper/hopper_{f16,bf16}_d{64,128,256}.cu:
    # each must be in the library with its kernels.
    buckets = {(m.group(1), int(m.group(2)))
               for r in reports
               if (m := re.search(r"hopper_fwd_kernelI(6__half|13__nv_bfloat16)Li(\d+)E", r.name))}
    assert buckets == {(t, d) for t in ("6__half", "13__nv_bfloat16") for d in (64, 128, 256)}
