"""Numeric check of a rewrite: the original and the rewritten model in ONNX Runtime (CPU, with the
opsfuse library) on the same random inputs, compared with a dtype-aware tolerance."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import onnx

# (rtol, atol) per output element type. The fused op accumulates in float32 where a float16 /
# bfloat16 original rounded its scores and probabilities, and sums in another order: these are
# rounding-level differences for the type.
TOLERANCES = {
    np.dtype(np.float64): (1e-6, 1e-6),
    np.dtype(np.float32): (1e-4, 1e-4),
    np.dtype(np.float16): (1e-2, 1e-2),
}
BF16_TOLERANCE = (5e-2, 5e-2)


def tolerance(dtype: np.dtype) -> tuple[float, float]:
    if dtype.name == "bfloat16":
        return BF16_TOLERANCE
    return TOLERANCES.get(np.dtype(dtype), (0.0, 0.0))


@dataclasses.dataclass
class OutputDiff:
    name: str
    dtype: str
    max_abs: float
    rtol: float
    atol: float
    ok: bool
    original_nan: int = 0  # positions where the original is NaN (a fully -inf masked row)


@dataclasses.dataclass
class VerifyResult:
    ok: bool
    outputs: list
    error: str = ""

    @property
    def max_abs(self) -> float:
        return max((o.max_abs for o in self.outputs), default=0.0)

    def format(self) -> str:
        if self.error:
            return f"verify: FAILED: {self.error}"
        lines = [f"verify: {'ok' if self.ok else 'FAILED'} (max |difference| {self.max_abs:.3g})"]
        for o in self.outputs:
            extra = f", original NaN at {o.original_nan} positions" if o.original_nan else ""
            lines.append(f"  {o.name} [{o.dtype}]: max |diff| {o.max_abs:.3g} (rtol {o.rtol:g}, atol {o.atol:g})"
                         f" {'ok' if o.ok else 'MISMATCH'}{extra}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "error": self.error, "max_abs": self.max_abs,
                "outputs": [dataclasses.asdict(o) for o in self.outputs]}


def compare(expected: dict, actual: dict) -> VerifyResult:
    outs, ok = [], True
    for name, e in expected.items():
        a = actual[name]
        e_arr, a_arr = np.asarray(e), np.asarray(a)
        if e_arr.shape != a_arr.shape:
            outs.append(OutputDiff(name, str(e_arr.dtype), float("inf"), 0, 0, False))
            ok = False
            continue
        if not np.issubdtype(e_arr.dtype, np.floating) and e_arr.dtype.name != "bfloat16":
            same = bool(np.array_equal(e_arr, a_arr))
            outs.append(OutputDiff(name, str(e_arr.dtype), 0.0 if same else float("inf"), 0, 0, same))
            ok &= same
            continue
        rtol, atol = tolerance(e_arr.dtype)
        e64, a64 = e_arr.astype(np.float64), a_arr.astype(np.float64)
        nan_e = np.isnan(e64)
        if np.isnan(a64[~nan_e]).any():
            outs.append(OutputDiff(name, str(e_arr.dtype), float("nan"), rtol, atol, False, int(nan_e.sum())))
            ok = False
            continue
        keep = ~nan_e
        diff = np.abs(e64[keep] - a64[keep])
        max_abs = float(diff.max()) if diff.size else 0.0
        good = bool(np.all(diff <= atol + rtol * np.abs(e64[keep])))
        outs.append(OutputDiff(name, str(e_arr.dtype), max_abs, rtol, atol, good, int(nan_e.sum())))
        ok &= good
    return VerifyResult(ok, outs)


# How a VerifyResult's error begins when the original model itself fails to run.
ORIGINAL_FAILS = "the original model does not run in ONNX Runtime"


def _describe(exc: Exception) -> str:
    """The exception's type and the first line of its message."""
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"


class ModelRunError(RuntimeError):
    """One of the two models failed in ONNX Runtime; the message begins by saying which."""

    def __init__(self, which: str, exc: Exception):
        super().__init__(f"{which}: {_describe(exc)}")


def _run(which: str, path, feeds: dict, names: list | None = None):
    from opsfuse.ort_session import make_session

    try:
        session = make_session(os.fspath(path), intra_op_threads=1)
        names = names or [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(names, feeds)))
    except Exception as exc:
        raise ModelRunError(which, exc) from exc


def run_both(original: str | os.PathLike, rewritten: str | os.PathLike, shapes: dict | None = None,
             seed: int = 0, feeds: dict | None = None):
    """Runs both models in ORT on the CPU; returns (feeds, original outputs, rewritten outputs).
    Raises ModelRunError naming the model that failed: an original that does not run on the
    generated inputs is the model's problem (or the inputs': see --shape), not the rewrite's."""
    from opsfuse.model_inputs import generate_inputs

    if feeds is None:
        feeds = generate_inputs(onnx.load(os.fspath(original), load_external_data=False), shapes or {}, seed=seed)
    expected = _run(f"{ORIGINAL_FAILS} on the generated inputs (the rewrite is not the cause; --shape sets "
                    "other input shapes)", original, feeds)
    actual = _run("the rewritten model does not run in ONNX Runtime", rewritten, feeds, list(expected))
    return feeds, expected, actual


def verify(original, rewritten, shapes: dict | None = None, seed: int = 0) -> VerifyResult:
    try:
        _, expected, actual = run_both(original, rewritten, shapes, seed)
    except ModelRunError as exc:
        return VerifyResult(False, [], str(exc))
    except Exception as exc:
        return VerifyResult(False, [], _describe(exc))
    return compare(expected, actual)
