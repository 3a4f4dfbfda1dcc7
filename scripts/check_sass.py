"""Issue 7's SASS check: every Hopper prefill kernel's machine code has HGMMA (wgmma) in it and no
local-memory traffic (LDL / STL: spills or a stack array), and no kernel's wgmmas were serialized.

    python scripts/check_sass.py BINARY [BINARY ...]      # an object file, .so or executable

BINARY is disassembled with cuobjdump (CUOBJDUMP, else the one on PATH, else Triton's copy). Prints
one line per Hopper kernel (HGMMA count, local loads / stores, the count of wgmma waits, and its
size: instructions and KB of code, what every SM fetches anew after other kernels have replaced it
in its instruction caches, docs/notes/cuda_kernel.md session 14) and exits 1 when a check fails.
ptxas reports a serialization (C7515) only while compiling; its trace in the SASS is a wait after
every HGMMA, which this flags as "serialized" (HGMMA count == wait count)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path


def find_cuobjdump() -> str:
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
    sys.exit("cuobjdump not found: set CUOBJDUMP, or put CUDA's bin folder on PATH")


def kernels(sass: str) -> dict[str, str]:
    """Function name -> its SASS text."""
    out: dict[str, str] = {}
    parts = re.split(r"\n\s*Function : (\S+)\n", sass)
    for name, body in zip(parts[1::2], parts[2::2]):
        out[name] = out.get(name, "") + body
    return out


def main(paths: list[str]) -> int:
    tool = find_cuobjdump()
    failed = False
    seen = 0
    for path in paths:
        sass = subprocess.run([tool, "-sass", path], check=True, capture_output=True, text=True).stdout
        for name, body in sorted(kernels(sass).items()):
            if "hopper_fwd_kernel" not in name:
                continue
            seen += 1
            hgmma = len(re.findall(r"\bHGMMA\b", body))
            local = len(re.findall(r"\b(?:LDL|STL)\b", body))
            waits = len(re.findall(r"WARPGROUP\.DEPBAR", body))
            size = len(re.findall(r"/\*[0-9a-f]{4,}\*/", body))  # one address comment per instruction
            problems = []
            if hgmma == 0:
                problems.append("no HGMMA")
            if local:
                problems.append(f"{local} local-memory instructions")
            if hgmma and waits >= hgmma:
                problems.append("serialized (a wgmma wait after every HGMMA)")
            failed = failed or bool(problems)
            short = re.sub(r"^_ZN7opsfuse4cuda6detail6hopper17hopper_fwd_kernelI", "", name)[:48]
            verdict = "FAIL " + ", ".join(problems) if problems else "ok"
            print(f"{short:50s} HGMMA {hgmma:4d}  LDL/STL {local:3d}  waits {waits:4d}  "
                  f"code {size:6d} instr ({size * 16 / 1024:5.1f} KB)  {verdict}")
    if seen == 0:
        print("no Hopper prefill kernel found")
        return 1
    print(f"{seen} Hopper prefill kernels: {'FAILED' if failed else 'all ok'}")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
