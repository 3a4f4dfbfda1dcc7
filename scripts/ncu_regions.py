"""Summarizes an Nsight Compute source export (scripts/ncu_source.sh's OUT.source.csv) by how often
each SASS instruction ran: the hot loop's instructions run (key tiles - 1) times per item and warp,
the once-per-item code (setup, first tile, epilogue) once, the once-per-block code once per block.
Per class of execution count it prints the instructions, their share of the stall samples and the
leading stall reasons; then the instructions with the most samples. A way to see where a kernel's
time goes without a trace build's stamps, which move ptxas's schedule.

    python scripts/ncu_regions.py OUT.source.csv [TOP]
"""
from __future__ import annotations

import csv
import sys


def number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def columns(header: list[str]) -> tuple[int, int, int, list[int]]:
    """(source, executed, all samples, reason columns) indices."""
    def find(*needles: str) -> int:
        for i, h in enumerate(header):
            if all(n.lower() in h.lower() for n in needles):
                return i
        raise SystemExit(f"no column with {needles} in {header}")

    src = find("source")
    exact = [i for i, h in enumerate(header) if h.strip().lower() == "instructions executed"]
    executed = exact[0] if exact else find("instructions executed")
    samples = find("warp stall sampling", "all")
    skip = {src, executed, samples}
    reasons = [i for i, h in enumerate(header) if i not in skip and "stall" in h.lower() and "sampling" not in h.lower()]
    return src, executed, samples, reasons


def main() -> int:
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    # The export opens with a row or two about the kernel; the table's header is the first row
    # that names a "Source" column.
    start = next((i for i, r in enumerate(rows) if any(c.strip() == "Source" for c in r)), 0)
    header = rows[start]
    src, ex, sa, reasons = columns(header)
    data = []
    for r in rows[start + 1:]:
        if len(r) != len(header):
            continue
        e, s = number(r[ex]), number(r[sa])
        if e is None or s is None:
            continue
        data.append((r, e, s))
    if not data:
        raise SystemExit("no instruction rows")
    peak = max(e for _, e, _ in data)
    total_samples = sum(s for _, _, s in data) or 1.0
    print(f"{len(data)} instructions, peak executed {peak:.0f}, {total_samples:.0f} samples")
    print("reason columns: " + ", ".join(header[i].strip()[:30] for i in reasons))
    # Classes by executed count relative to the hottest instruction: >= 1/2 of it, 1/16 to 1/2, below.
    # The hottest is the key loop's, or an idle producer warp's barrier spin loop where that runs
    # more often (opsfuse's kernel, session 33: its consumers' loop then falls in the middle class).
    bands = [("hot (>= 1/2 peak)", 0.5, float("inf")), ("warm (1/16-1/2 peak)", 1 / 16, 0.5),
             ("cold (< 1/16 peak)", 0.0, 1 / 16)]
    for name, low, high in bands:
        members = [(r, e, s) for r, e, s in data if low * peak <= e < high * peak]
        n_s = sum(s for _, _, s in members)
        by_reason = []
        for i in reasons:
            v = sum(number(r[i]) or 0.0 for r, _, _ in members)
            if v > 0:
                by_reason.append((v, header[i]))
        by_reason.sort(reverse=True)
        lead = ", ".join(f"{h.strip()[:40]} {100 * v / max(n_s, 1):.0f}%" for v, h in by_reason[:6])
        print(f"{name}: {len(members)} instructions, {sum(e for _, e, _ in members):.0f} executed, "
              f"{100 * n_s / total_samples:.1f}% of samples; {lead}")
    print(f"top {top} instructions by samples (executed / peak, samples %, leading reason, source):")
    for r, e, s in sorted(data, key=lambda x: -x[2])[:top]:
        lead = max(((number(r[i]) or 0.0, header[i]) for i in reasons), default=(0.0, "-"))
        print(f"  {e / peak:6.3f}  {100 * s / total_samples:5.2f}%  {lead[1].strip()[:28]:28s}  {r[src].strip()[:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
