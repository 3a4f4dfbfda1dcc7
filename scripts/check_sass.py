"""Issue 7's SASS check: every Hopper prefill kernel's machine code has HGMMA (wgmma) in it and no
local-memory traffic (LDL / STL: spills or a stack array), no kernel's wgmmas were serialized, and
their shared-memory descriptors come from uniform registers.

    python scripts/check_sass.py BINARY [BINARY ...]      # an object file, .so or executable

BINARY is disassembled with cuobjdump (CUOBJDUMP, else the one on PATH, else Triton's copy). Prints
one line per Hopper kernel (HGMMA count, local loads / stores, the count of wgmma waits, and its
size: instructions and KB of code, what every SM fetches anew after other kernels have replaced it
in its instruction caches, docs/notes/cuda_kernel.md session 14) and exits 1 when a check fails.
ptxas reports a serialization (C7515) only while compiling; its trace in the SASS is a wait after
every HGMMA, which this flags as "serialized" (HGMMA count == wait count). Nor does ptxas say when it
computes the descriptors in vector registers and moves them (R2UR) into the uniform ones each HGMMA
reads, an R2UR on the path to nearly every HGMMA: that cost a chained kernel 6-15 % in session 40
(docs/notes/cuda_kernel.md), where the shipped kernels have at most one such HGMMA.
tests/gpu/test_kernel_sass_cpu.py runs the same checks on the installed library in CI, and
local_memory_kernels()'s spill check on every kernel of both libraries (cuobjdump -res-usage)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# The Hopper prefill kernels' templates: plugin/cuda/hopper/hopper_fwd.cuh and the three-consumer one
# (hopper_seq3.cuh).
KERNEL_MARKS = ("hopper_fwd_kernel", "hopper_seq3_kernel")


@dataclass
class KernelReport:
    name: str          # mangled
    hgmma: int         # HGMMA instructions
    local: int         # LDL / STL instructions
    waits: int         # WARPGROUP.DEPBAR (wgmma waits)
    instructions: int
    moved_descriptors: int = 0  # HGMMAs whose descriptor registers an R2UR wrote since the previous HGMMA

    @property
    def problems(self) -> list[str]:
        found = []
        if self.hgmma == 0:
            found.append("no HGMMA")
        if self.local:
            found.append(f"{self.local} local-memory instructions")
        if self.hgmma and self.waits >= self.hgmma:
            found.append("serialized (a wgmma wait after every HGMMA)")
        if self.hgmma and self.moved_descriptors * 4 > self.hgmma:
            found.append(f"descriptors from vector registers ({self.moved_descriptors} of {self.hgmma} HGMMAs after an R2UR)")
        return found


def find_cuobjdump() -> str | None:
    if os.environ.get("CUOBJDUMP"):
        return os.environ["CUOBJDUMP"]
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton  # noqa: PLC0415

        candidate = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    return None


def disassemble(path: str | os.PathLike, tool: str) -> str:
    return subprocess.run([tool, "-sass", str(path)], check=True, capture_output=True, text=True).stdout


def kernels(sass: str) -> dict[str, str]:
    """Function name -> its SASS text."""
    out: dict[str, str] = {}
    parts = re.split(r"\n\s*Function : (\S+)\n", sass)
    for name, body in zip(parts[1::2], parts[2::2]):
        out[name] = out.get(name, "") + body
    return out


def moved_descriptors(body: str) -> int:
    """HGMMAs whose descriptor (gdesc[URn]: URn .. URn+3) an R2UR wrote since the previous HGMMA."""
    count, written = 0, set()
    for line in body.splitlines():
        moved = re.search(r"\bR2UR\s+UR(\d+)", line)
        if moved:
            written.add(int(moved.group(1)))
        desc = re.search(r"\bHGMMA\S*\s.*gdesc\[UR(\d+)\]", line)
        if desc:
            base = int(desc.group(1))
            count += bool(written & set(range(base, base + 4)))
            written = set()
    return count


def hopper_reports(sass: str) -> list[KernelReport]:
    """One report per Hopper prefill kernel in a cuobjdump -sass listing, by name."""
    return [
        KernelReport(
            name=name,
            hgmma=len(re.findall(r"\bHGMMA\b", body)),
            local=len(re.findall(r"\b(?:LDL|STL)\b", body)),
            waits=len(re.findall(r"WARPGROUP\.DEPBAR", body)),
            instructions=len(re.findall(r"/\*[0-9a-f]{4,}\*/", body)),  # one address comment per instruction
            moved_descriptors=moved_descriptors(body),
        )
        for name, body in sorted(kernels(sass).items())
        if any(mark in name for mark in KERNEL_MARKS)
    ]


def resource_usage(path: str | os.PathLike, tool: str) -> str:
    return subprocess.run([tool, "-res-usage", str(path)], check=True, capture_output=True, text=True).stdout


def local_memory_kernels(usage: str) -> list[tuple[str, str, int, int]]:
    """(arch, kernel, stack bytes, local bytes) for every kernel of a cuobjdump -res-usage listing
    whose frame is not empty: a spill or a stack array, in any architecture's code."""
    found, arch, name = [], "?", None
    for line in usage.splitlines():
        line = line.strip()
        if line.startswith("arch = "):
            arch = line.split("=", 1)[1].strip()
        elif line.startswith("Function "):
            name = line[len("Function "):].rstrip(":")
        elif name is not None and line.startswith("REG:"):
            fields = dict(f.split(":", 1) for f in line.split() if ":" in f)
            stack, local = int(fields.get("STACK", 0)), int(fields.get("LOCAL", 0))
            if stack or local:
                found.append((arch, name, stack, local))
            name = None
    return found


def main(paths: list[str]) -> int:
    tool = find_cuobjdump()
    if tool is None:
        sys.exit("cuobjdump not found: set CUOBJDUMP, or put CUDA's bin folder on PATH")
    reports = [r for path in paths for r in hopper_reports(disassemble(path, tool))]
    for r in reports:
        short = re.sub(r"^_ZN7opsfuse4cuda6detail6hopper\d+hopper_", "", r.name)[:48]
        verdict = "FAIL " + ", ".join(r.problems) if r.problems else "ok"
        print(f"{short:50s} HGMMA {r.hgmma:4d}  LDL/STL {r.local:3d}  waits {r.waits:4d}  "
              f"code {r.instructions:6d} instr ({r.instructions * 16 / 1024:5.1f} KB)  {verdict}")
    if not reports:
        print("no Hopper prefill kernel found")
        return 1
    failed = any(r.problems for r in reports)
    print(f"{len(reports)} Hopper prefill kernels: {'FAILED' if failed else 'all ok'}")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
