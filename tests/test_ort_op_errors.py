"""Bad input gets a clear ORT error naming FusedAttention and the problem; the process survives and
the session serves a valid input afterwards. Each case runs in its own process, so a crash is a
failure of that case rather than a lost test run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bad_input_cases import ATTRIBUTE_CASES, CASES

HERE = Path(__file__).resolve().parent


def _run(case: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(HERE / "bad_input_cases.py"), case],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, f"case {case}: process died with {proc.returncode}\n{proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_an_error_and_the_session_recovers(case):
    result = _run(case)
    expected = CASES[case][1]
    assert result["error"] is not None, f"{case}: no error raised"
    assert "FusedAttention" in result["error"] and "attention0" in result["error"], result["error"]
    assert expected in result["error"], f"{case}: {result['error']!r} lacks {expected!r}"
    assert result["recovered"], f"{case}: the session did not run a valid input afterwards"


@pytest.mark.parametrize("case", sorted(ATTRIBUTE_CASES))
def test_bad_attribute_is_an_error(case):
    result = _run(case)
    expected = ATTRIBUTE_CASES[case][1]
    assert result["error"] is not None, f"{case}: no error raised"
    assert "FusedAttention" in result["error"] and expected in result["error"], result["error"]
