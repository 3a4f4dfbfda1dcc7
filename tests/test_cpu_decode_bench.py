"""python -m opsfuse.bench.cpu_decode: runs end to end, checks FusedAttention against the unfused
graph before timing, and writes its table."""
from __future__ import annotations

import json

import pytest


def test_cpu_decode_bench_writes_table(tmp_path):
    from opsfuse import LibraryNotBuiltError, get_library_path

    try:
        get_library_path()
    except LibraryNotBuiltError as exc:
        pytest.skip(f"the opsfuse ORT library is not built: {exc}")
    from opsfuse.bench import cpu_decode

    assert cpu_decode.main(["--out", str(tmp_path), "--rounds", "2"]) == 0
    result = json.loads((tmp_path / "cpu_decode.json").read_text())
    assert [r["Sk"] for r in result["rows"]] == list(cpu_decode.SK)
    for row in result["rows"]:
        assert row["max_abs_diff"] < 1e-4
        assert row["fused"] > 0 and row["unfused"] > 0
    table = (tmp_path / "cpu_decode.md").read_text()
    assert "| 1024 |" in table and "| 4096 |" in table
