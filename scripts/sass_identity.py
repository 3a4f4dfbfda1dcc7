"""Is a change to the Hopper kernels' source neutral? Compiles every Hopper prefill translation unit
(plugin/cuda/hopper/hopper_{f16,bf16}_d*.cu) at a base revision and in the working tree, with the
build's own target (sm_90a), and compares their SASS. Identical SASS runs identically, so a refactor
that passes needs no device A/B; one that fails names the units whose code moved.

usage: python scripts/sass_identity.py [BASE_REV]      (default HEAD; nvcc on PATH, cuobjdump as for
                                                        scripts/check_sass.py)
Exit status: 0 identical, 1 some unit differs, 2 a compile or disassembly failed."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_sass import find_cuobjdump  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
HOPPER = Path("plugin/cuda/hopper")
NVCC_FLAGS = ["-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-I..", "-I../.."]


def units(tree: Path) -> list[str]:
    return sorted(p.name for p in (tree / HOPPER).glob("hopper_*_d*.cu") if not p.name.startswith("hopper_dec_"))


def sass_of(tree: Path, unit: str, out: Path, cuobjdump: str) -> str:
    cubin = out / f"{unit}.cubin"
    subprocess.run(["nvcc", *NVCC_FLAGS, "-cubin", unit, "-o", str(cubin)], cwd=tree / HOPPER, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return subprocess.run([cuobjdump, "--dump-sass", str(cubin)], check=True, capture_output=True, text=True).stdout


def main(argv: list[str]) -> int:
    base = argv[1] if len(argv) > 1 else "HEAD"
    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        sys.exit("cuobjdump not found: set CUOBJDUMP, or put CUDA's bin folder on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base_tree = tmp / "base_tree"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base_tree), base], cwd=REPO, check=True)
        try:
            names = sorted(set(units(base_tree)) | set(units(REPO)))
            jobs = [(tree, tag, name) for name in names for tree, tag in ((base_tree, "base"), (REPO, "tree"))]
            for tag in ("base", "tree"):
                (tmp / tag).mkdir()
            results: dict[tuple[str, str], str | None] = {}
            with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
                futures = {pool.submit(sass_of, tree, name, tmp / tag, cuobjdump): (tag, name)
                           for tree, tag, name in jobs if (tree / HOPPER / name).exists()}
                for future, key in futures.items():
                    try:
                        results[key] = future.result()
                    except subprocess.CalledProcessError as exc:
                        print(f"{key[1]} ({key[0]}): {exc.cmd[0]} failed\n{(exc.stderr or '')[-2000:]}")
                        return 2
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=REPO, check=False)
    differ = []
    for name in names:
        a, b = results.get(("base", name)), results.get(("tree", name))
        same = a is not None and a == b
        print(f"{'same' if same else 'DIFFERS'}  {name}" + ("" if a is not None and b is not None else
                                                           "  (only in one of the two)"))
        if not same:
            differ.append(name)
    print(f"{len(names) - len(differ)} of {len(names)} units have identical SASS against {base}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
