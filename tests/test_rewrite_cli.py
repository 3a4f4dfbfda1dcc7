"""``python -m opsfuse rewrite`` and ``python -m opsfuse demo``: outputs, report, exit codes, safety."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "graph_passes"))
from attention_graphs import sdpa_model  # noqa: E402

from opsfuse.cli import main  # noqa: E402


def _library_built() -> bool:
    from opsfuse import LibraryNotBuiltError, get_library_path

    try:
        get_library_path()
    except LibraryNotBuiltError:
        return False
    return True


needs_library = pytest.mark.skipif(not _library_built(), reason="the opsfuse ORT library is not built")


@pytest.fixture
def model_path(tmp_path) -> Path:
    path = tmp_path / "attn.onnx"
    onnx.save(sdpa_model(masks=("bias", "pad"), nan_guard=True), str(path))
    return path


def test_rewrite_writes_model_and_report(model_path, tmp_path, capsys):
    before = model_path.read_bytes()
    out = tmp_path / "out.onnx"
    assert main(["rewrite", str(model_path), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "attention candidates found: 1, fused: 1, left alone: 0" in text
    assert "sdpa_subgraph: 1 fused" in text
    assert model_path.read_bytes() == before, "the input must not change"
    fused = onnx.load(str(out))
    assert [n.op_type for n in fused.graph.node].count("FusedAttention") == 1
    assert {o.domain: o.version for o in fused.opset_import}["com.opsfuse"] == 1
    assert {p.key: p.value for p in fused.metadata_props} == {"origin": "attention_graphs"}


def test_rewrite_json_report_lists_reasons(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(sdpa_model(masks=("where",), where_fill=-1e9), str(src))
    assert main(["rewrite", str(src), "-o", str(tmp_path / "o.onnx"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["candidates_found"] == 1 and report["fused"] == 0
    left = report["candidates"][0]
    assert left["fused"] is False and "uniform attention" in left["reason"]
    assert left["nodes"] == ["/attn/MatMul_qk", "/attn/Softmax", "/attn/MatMul_pv"]
    assert report["counts"] == {"onnx_attention": 0, "sdpa_subgraph": 0}


@needs_library
def test_rewrite_verify(model_path, tmp_path, capsys):
    assert main(["rewrite", str(model_path), "-o", str(tmp_path / "o.onnx"), "--verify"]) == 0
    assert "verify: ok" in capsys.readouterr().out


def _reshape_model(target) -> onnx.ModelProto:
    """X (batch, 5) -> Reshape(X, target) -> Y: with a target whose element count is not batch * 5
    it fails when run (the kind of model an exporter can leave behind: shapes traced as constants)."""
    from onnx import TensorProto, helper

    shape = helper.make_tensor("shape", TensorProto.INT64, [len(target)], list(target))
    graph = helper.make_graph([helper.make_node("Reshape", ["X", "shape"], ["Y"], name="/bad/Reshape")], "g",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 5])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [f"y{i}" for i in range(len(target))])],
                              [shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@needs_library
def test_verify_blames_an_original_that_does_not_run(tmp_path, capsys):
    """An original model that fails in ONNX Runtime on the generated inputs (CANINE's TorchScript
    export does, session 41): --verify fails and says the original is the cause, not the rewrite."""
    src = tmp_path / "broken.onnx"
    onnx.save(_reshape_model((3, 7)), str(src))
    assert main(["rewrite", str(src), "-o", str(tmp_path / "o.onnx"), "--verify"]) == 1
    captured = capsys.readouterr()
    assert "the original model does not run in ONNX Runtime" in captured.out
    assert "the rewrite is not the cause" in captured.err


@needs_library
def test_verify_names_a_rewritten_model_that_does_not_run(tmp_path):
    from opsfuse.graph_passes.verify import verify

    good, bad = tmp_path / "good.onnx", tmp_path / "bad.onnx"
    onnx.save(_reshape_model((-1,)), str(good))
    onnx.save(_reshape_model((3, 7)), str(bad))
    assert verify(good, good).ok
    result = verify(good, bad)
    assert not result.ok and result.error.startswith("the rewritten model does not run in ONNX Runtime")


def _projection_model_path(tmp_path) -> Path:
    from test_pack_qkv import projection_model

    path = tmp_path / "proj.onnx"
    onnx.save(projection_model(Hq=4, Hkv=2, D=6, hidden=14), str(path))
    return path


def test_pack_qkv_flag(tmp_path, capsys):
    src = _projection_model_path(tmp_path)
    assert main(["rewrite", str(src), "-o", str(tmp_path / "exact.onnx")]) == 0
    assert "packed Q/K/V" not in capsys.readouterr().out, "packing is opt-in"
    exact = onnx.load(str(tmp_path / "exact.onnx"))
    assert [n.op_type for n in exact.graph.node].count("MatMul") == 3
    assert main(["rewrite", str(src), "-o", str(tmp_path / "packed.onnx"), "--pack-qkv", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["counts"]["pack_qkv"] == 1
    assert report["candidates"][0]["details"]["packed_qkv"] is True
    packed = onnx.load(str(tmp_path / "packed.onnx"))
    node = next(n for n in packed.graph.node if n.op_type == "FusedAttention")
    assert onnx.helper.get_attribute_value(next(a for a in node.attribute if a.name == "packed_qkv")) == 1
    assert node.input[0] == node.input[1] == node.input[2]
    assert [n.op_type for n in packed.graph.node].count("MatMul") == 1
    assert {i.name for i in packed.graph.initializer}.isdisjoint({"wq", "wk", "wv", "bq", "bk", "bv"})
    # The biases were absorbed: the node's sixth input (qkv_bias), no Add, and the written model
    # passed the CLI's validation with the schema that knows that input.
    assert len(node.input) == 6 and node.input[5] in {i.name for i in packed.graph.initializer}
    assert "Add" not in [n.op_type for n in packed.graph.node]
    assert report["candidates"][0]["details"]["qkv_bias_absorbed"] is True


def test_pack_qkv_help_says_not_bit_exact(capsys):
    with pytest.raises(SystemExit):
        main(["rewrite", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--pack-qkv" in text and "NOT bit-exact" in text


@needs_library
def test_pack_qkv_verify(tmp_path, capsys):
    src = _projection_model_path(tmp_path)
    assert main(["rewrite", str(src), "-o", str(tmp_path / "p.onnx"), "--pack-qkv", "--verify"]) == 0
    text = capsys.readouterr().out
    assert "pack_qkv: 1 of 1 fused nodes read one packed Q/K/V projection (not bit-exact)" in text
    assert "verify: ok" in text


def test_refuses_to_overwrite_input_unless_told(model_path, capsys):
    before = model_path.read_bytes()
    assert main(["rewrite", str(model_path), "-o", str(model_path)]) != 0
    err = capsys.readouterr().err
    assert "--overwrite" in err and len(err.strip().splitlines()) == 1
    assert model_path.read_bytes() == before
    assert main(["rewrite", str(model_path), "-o", str(model_path), "--overwrite"]) == 0
    assert any(n.op_type == "FusedAttention" for n in onnx.load(str(model_path)).graph.node)


@pytest.mark.parametrize("content", [None, b"not a model at all", b""])
def test_unreadable_input_fails_with_one_line(tmp_path, capsys, content):
    src = tmp_path / "bad.onnx"
    if content is not None:
        src.write_bytes(content)
    code = main(["rewrite", str(src), "-o", str(tmp_path / "o.onnx")])
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert err.startswith("opsfuse rewrite: error:") and len(err.splitlines()) == 1
    assert not (tmp_path / "o.onnx").exists()


def test_external_data_is_kept_external(tmp_path, capsys):
    model = sdpa_model(scale="scores_mul")
    # A weight-sized initializer so that external data is real: a big bias mask constant.
    bias = np.random.default_rng(0).standard_normal((1, 4, 5, 5)).astype(np.float32)
    big = onnx.numpy_helper.from_array(np.tile(bias, (1, 1, 1, 1)), "bias_w")
    model.graph.initializer.append(big)
    add = [n for n in model.graph.node if n.op_type == "Softmax"][0]
    add.input[0], old = "biased", add.input[0]
    model.graph.node.insert(len(model.graph.node) - 2, onnx.helper.make_node("Add", [old, "bias_w"], ["biased"],
                                                                             name="/attn/Add_bias"))
    onnx.checker.check_model(model)
    src = tmp_path / "ext.onnx"
    onnx.save(model, str(src), save_as_external_data=True, all_tensors_to_one_file=True, location="ext.onnx.data",
              size_threshold=0)
    out_dir = tmp_path / "out"
    out = out_dir / "fused.onnx"
    assert main(["rewrite", str(src), "-o", str(out)]) == 0
    assert (out_dir / "fused.onnx.data").is_file()
    loaded = onnx.load(str(out), load_external_data=False)
    assert any(i.data_location == onnx.TensorProto.EXTERNAL for i in loaded.graph.initializer)
    onnx.checker.check_model(str(out))  # the data file is found next to the model
    assert any(n.op_type == "FusedAttention" for n in loaded.graph.node)
    assert (tmp_path / "ext.onnx.data").is_file(), "the input's data file stays"


def test_python_m_opsfuse_rewrite_end_to_end(model_path, tmp_path):
    out = tmp_path / "o.onnx"
    proc = subprocess.run([sys.executable, "-m", "opsfuse", "rewrite", str(model_path), "-o", str(out), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["fused"] == 1
    assert out.is_file()


@needs_library
def test_demo_prints_report_latency_and_difference(capsys):
    assert main(["demo", "--runs", "3"]) == 0
    text = capsys.readouterr().out
    assert "attention candidates found: 2, fused: 2" in text
    assert "ONNX Runtime CPU latency" in text and "max |output difference|" in text
    diff = float(text.split("max |output difference|:")[1].split()[0])
    assert diff < 1e-4
