"""The machine code the package built, checked in CI without a GPU (nvcc compiles every
architecture's kernels on any machine): issue 7's SASS requirement -- every Hopper prefill kernel
of the ONNX Runtime library has HGMMA (wgmma) in it, no local-memory traffic and unserialized
wgmmas -- and no kernel of the ORT op's library, the Python binding's or (where it was built) the
TensorRT plugin's, in any architecture's code, has a stack frame or local memory (a ptxas spill).
The checks are scripts/check_sass.py's."""

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


def test_descriptors_moved_from_vector_registers_are_flagged():
    # An R2UR into the registers an HGMMA reads its descriptor from, before most HGMMAs (session 40's
    # chained kernel: 69 of 80), is flagged; an R2UR into other uniform registers, or one before a
    # single HGMMA of several, is not.
    moved = []
    for _ in range(4):
        moved += ["R2UR UR16, R2", "R2UR UR17, R3", "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR16], R24"]
    elsewhere = ["R2UR UR30, R2", CLEAN[0], "R2UR UR20, R4", CLEAN[1], "HGMMA.64x128x16.F32 R24, gdesc[UR8], R24",
                 "HGMMA.64x128x16.F32 R24, gdesc[UR8], R24", "WARPGROUP.DEPBAR.LE gsb0, 0x0", "EXIT"]
    once = ["R2UR UR5, R5"] + elsewhere[1:]  # UR5: the second word of the first HGMMA's descriptor (UR4)
    listing = _listing((HOPPER + "0", moved + ["WARPGROUP.DEPBAR.LE gsb0, 0x0", "EXIT"]),
                       (HOPPER + "1", elsewhere), (HOPPER + "2", once))
    reports = {r.name[-1]: r for r in check_sass.hopper_reports(listing)}
    assert reports["0"].moved_descriptors == 4
    assert reports["0"].problems == ["descriptors from vector registers (4 of 4 HGMMAs after an R2UR)"]
    assert reports["1"].moved_descriptors == 0 and reports["1"].problems == []
    assert reports["2"].moved_descriptors == 1 and reports["2"].problems == []


def _built_cuda():
    """(build_info, cuobjdump) for an install with CUDA kernels, else the test skips with the reason."""
    info = opsfuse.build_info()
    if not info["cuda"]:
        pytest.skip(f"the CUDA kernels were not built in this install: {info.get('cuda_reason') or 'no nvcc'}")
    tool = check_sass.find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (CUDA's bin folder, or Triton's copy from the test extras)")
    return info, tool


def test_usage_parser_finds_frames():
    usage = """
arch = sm_80
 Function _Z1av:
  REG:40 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:360
 Function _Z1bv:
  REG:255 STACK:16 SHARED:0 LOCAL:24 CONSTANT[0]:360
arch = sm_90a
 Function _Z1cv:
  REG:168 STACK:0 SHARED:1232 LOCAL:8 CONSTANT[0]:1432
"""
    assert check_sass.local_memory_kernels(usage) == [("sm_80", "_Z1bv", 16, 24), ("sm_90a", "_Z1cv", 0, 8)]


def test_no_kernel_spills_in_any_architecture():
    info, tool = _built_cuda()
    libraries = [info["ort_library"]] + ([info["trt_library"]] if info["trt_library"] else [])
    if info["cuda_module"]:
        import opsfuse.cuda  # noqa: PLC0415

        libraries.append(opsfuse.cuda._module().__file__)
    for library in libraries:
        usage = check_sass.resource_usage(library, tool)
        assert usage.count("Function ") >= 50, f"{library}: too few kernels listed -- did cuobjdump read it?"
        assert check_sass.local_memory_kernels(usage) == [], library


def test_shipped_hopper_kernels_use_wgmma_without_spills():
    info, tool = _built_cuda()
    if not any(a.startswith("90") for a in info["cuda_architectures"].split(";")):
        pytest.skip(f"built without sm_90 ({info['cuda_architectures']}): no Hopper kernel to check")
    reports = check_sass.hopper_reports(check_sass.disassemble(info["ort_library"], tool))
    failures = {r.name: r.problems for r in reports if r.problems}
    assert not failures
    # One translation unit per (dtype, head-size buckets), hopper/hopper_{f16,bf16}_d{64,128,256}.cu
    # and latent attention's d192v128.cu / d256v128.cu: each must be in the library with its kernels,
    # named by (dtype, D bucket, mode, Dv bucket).
    buckets = {(m.group(1), int(m.group(2)), int(m.group(3)))
               for r in reports
               if (m := re.search(r"hopper_fwd_kernelI(6__half|13__nv_bfloat16)Li(\d+)ELi\d+ELi(\d+)E", r.name))}
    assert buckets == {(t, d, dv) for t in ("6__half", "13__nv_bfloat16")
                       for d, dv in ((64, 64), (128, 128), (256, 256), (192, 128), (256, 128))}
    # The three-consumer kernel (hopper_seq3.cuh), one per dtype, checked as the others are.
    assert {m.group(1) for r in reports if (m := re.search(r"hopper_seq3_kernelI(6__half|13__nv_bfloat16)E", r.name))} \
        == {"6__half", "13__nv_bfloat16"}
