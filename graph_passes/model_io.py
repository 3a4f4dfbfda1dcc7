"""Loading, validating and saving models for the rewrite, without copying large weights.

- ``load``: onnx-ir reads external data lazily (memory-mapped), so a multi-GB model costs little.
- ``validate``: onnx.checker and strict shape inference with the FusedAttention schema registered,
  on a copy of the graph whose large weights are typed inputs (no weight bytes copied).
- ``save``: weights go to ``<output>.data`` when the input had external data or the model is
  over ~2 GB (protobuf's limit); written to a temporary name first and moved into place, so a
  failed write never leaves a half-written model and the input's data file is never clobbered.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import onnx
import onnx_ir as ir

from .. import schema
from .shape_info import _light_proto

PROTOBUF_LIMIT = 2 * 1024**3 - 64 * 1024**2  # leave room for the graph itself


class InvalidModelError(ValueError):
    """The model is not valid ONNX (the message says why)."""


def load(path: str | os.PathLike) -> ir.Model:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        return ir.load(path)
    except Exception as exc:
        raise InvalidModelError(f"{path}: not a readable ONNX model ({type(exc).__name__}: {exc})") from exc


def has_external_data(model: ir.Model) -> bool:
    return any(isinstance(v.const_value, ir.ExternalTensor) for v in model.graph.initializers.values())


def weight_bytes(model: ir.Model) -> int:
    total = 0
    for v in model.graph.initializers.values():
        t = v.const_value
        if t is not None:
            total += t.nbytes
    return total


def validate(model: ir.Model, strict: bool = True) -> None:
    """Raises InvalidModelError unless the model passes onnx.checker and shape inference (strict)
    with the FusedAttention schema registered."""
    schema.register()
    light = _light_proto(model)
    for key, value in model.metadata_props.items():
        light.metadata_props.add(key=key, value=value)
    try:
        onnx.checker.check_model(light)
    except Exception as exc:
        raise InvalidModelError(f"onnx.checker: {str(exc).strip().splitlines()[0]}") from exc
    try:
        onnx.shape_inference.infer_shapes(light, check_type=True, strict_mode=strict)
    except Exception as exc:
        raise InvalidModelError(f"shape inference: {str(exc).strip().splitlines()[0]}") from exc


def save(model: ir.Model, path: str | os.PathLike, external_data: bool | None = None) -> list[Path]:
    """Writes the model (and its external data file when needed); returns the written paths."""
    path = Path(path)
    if external_data is None:
        external_data = has_external_data(model) or weight_bytes(model) > PROTOBUF_LIMIT
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    written = [path]
    try:
        if external_data:
            data_name = f"{path.name}.data"
            tmp_data = f"{tmp.name}.data"
            ir.save(model, tmp, external_data=tmp_data)
            # The model refers to its data file by name: point it at the final name.
            final = onnx.load(str(tmp), load_external_data=False)
            for init in final.graph.initializer:
                for entry in init.external_data:
                    if entry.key == "location" and entry.value == tmp_data:
                        entry.value = data_name
            onnx.save(final, str(tmp))
            os.replace(tmp.parent / tmp_data, path.parent / data_name)
            written.append(path.parent / data_name)
        else:
            ir.save(model, tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp made it private; give it the usual mode
        os.replace(tmp, path)
    finally:
        for leftover in (tmp, tmp.parent / f"{tmp.name}.data"):
            if leftover.exists():
                leftover.unlink()
    return written
