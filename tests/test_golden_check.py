"""``python -m opsfuse golden`` and ``check`` on small models, on the CPU (Triton interpreted).

Models: hand-built transformer layers (Q/K/V projections, attention, output projection, residual),
once with FusedAttention nodes and once with the same attention in standard ops (the "original"),
sharing value names so the per-node rewrite check can line them up; and the bundled
``models/tiny_bert.onnx`` rewritten by ``opsfuse.graph_passes``. Tampered FusedAttention nodes
(scale, causal flag, mask input) must make ``check`` fail and name the node.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

# First: picks Triton's interpreter when there is no GPU, before anything imports triton.
from opsfuse import triton_attention  # noqa: F401
from opsfuse import cli, contract, golden
from opsfuse.reference import attention_reference

REPO = Path(__file__).resolve().parents[1]
B, S, H, D = 2, 12, 2, 8
E = H * D


def _ort_library_or_skip():
    from opsfuse import LibraryNotBuiltError, get_library_path

    try:
        get_library_path()
    except LibraryNotBuiltError as e:
        pytest.skip(f"the ONNX Runtime op is not built: {e}")


# --- models ----------------------------------------------------------------------------------


def layer_weights(rng, layers: int, hkv: int, np_dtype):
    w = {}
    for layer in range(layers):
        for name, cols in (("q", E), ("k", hkv * D), ("v", hkv * D), ("o", E)):
            w[f"w{name}{layer}"] = (rng.standard_normal((E, cols)) / math.sqrt(E)).astype(np_dtype)
    return w


def build_model(fused: bool, layers: int = 2, dtype=TensorProto.FLOAT, mask: str | None = "bool",
                is_causal: int = 0, hkv: int = H, scale: float | None = None, seed: int = 0) -> onnx.ModelProto:
    """X (B, S, E) -> `layers` x [attention(X Wq, X Wk, X Wv) Wo + X] -> Y.
    mask: None, "bool" (input `keep` (B, S) bool -> (B, 1, 1, S)) or "additive" (input `bias`
    (B, S) -> (B, 1, 1, S)). fused=False spells the attention in standard ops (no GQA there)."""
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    rng = np.random.default_rng(seed)
    weights = layer_weights(rng, layers, hkv, np_dtype)
    inits = [numpy_helper.from_array(v, k) for k, v in weights.items()]
    inits += [
        numpy_helper.from_array(np.array([0, 0, -1, D], np.int64), "split_heads"),
        numpy_helper.from_array(np.array([0, 0, E], np.int64), "merge_heads"),
        numpy_helper.from_array(np.array([1, 2], np.int64), "axes12"),
    ]
    inputs = [helper.make_tensor_value_info("X", dtype, ["batch", "seq", E])]
    nodes = []
    mask_name = ""
    if mask == "bool":
        inputs.append(helper.make_tensor_value_info("keep", TensorProto.BOOL, ["batch", "seq"]))
        nodes.append(helper.make_node("Unsqueeze", ["keep", "axes12"], ["mask4"]))
        mask_name = "mask4"
    elif mask == "additive":
        inputs.append(helper.make_tensor_value_info("bias", dtype, ["batch", "seq"]))
        nodes.append(helper.make_node("Unsqueeze", ["bias", "axes12"], ["mask4"]))
        mask_name = "mask4"
    x = "X"
    for layer in range(layers):
        p = f"l{layer}_"
        for name in ("q", "k", "v"):
            nodes += [
                helper.make_node("MatMul", [x, f"w{name}{layer}"], [p + name + "_proj"]),
                helper.make_node("Reshape", [p + name + "_proj", "split_heads"], [p + name + "_bshd"]),
                helper.make_node("Transpose", [p + name + "_bshd"], [p + name], perm=[0, 2, 1, 3]),
            ]
        out = p + "attn"  # the same value name in the fused and the original model
        if fused:
            attrs = {"is_causal": is_causal}
            if scale is not None:
                attrs["scale"] = scale
            node_inputs = [p + "q", p + "k", p + "v"] + ([mask_name] if mask_name else [])
            nodes.append(helper.make_node(contract.OP_NAME, node_inputs, [out], domain=contract.DOMAIN,
                                          name=f"attention{layer}", **attrs))
        else:
            nodes += _standard_attention(p, out, mask, mask_name, is_causal, scale, np_dtype, inits)
        nodes += [
            helper.make_node("Transpose", [out], [p + "bshd"], perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [p + "bshd", "merge_heads"], [p + "merged"]),
            helper.make_node("MatMul", [p + "merged", f"wo{layer}"], [p + "o"]),
            helper.make_node("Add", [p + "o", x], [p + "out"]),
        ]
        x = p + "out"
    nodes.append(helper.make_node("Identity", [x], ["Y"]))
    graph = helper.make_graph(nodes, "layers", inputs, [helper.make_tensor_value_info("Y", dtype, None)],
                              initializer=inits)
    opsets = [helper.make_opsetid("", 17)]
    if fused:
        opsets.append(helper.make_opsetid(contract.DOMAIN, contract.OP_VERSION))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def _standard_attention(p, out, mask, mask_name, is_causal, scale, np_dtype, inits):
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    inits.append(numpy_helper.from_array(np.array(scale, np_dtype), p + "scale"))
    nodes = [
        helper.make_node("Transpose", [p + "k"], [p + "kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", [p + "q", p + "kt"], [p + "qk"]),
        helper.make_node("Mul", [p + "qk", p + "scale"], [p + "s0"]),
    ]
    s = p + "s0"
    if mask == "additive":
        nodes.append(helper.make_node("Add", [s, mask_name], [p + "s1"]))
        s = p + "s1"
    if mask == "bool":
        inits.append(numpy_helper.from_array(np.array(-np.inf, np_dtype), p + "neginf"))
        nodes.append(helper.make_node("Where", [mask_name, s, p + "neginf"], [p + "s2"]))
        s = p + "s2"
    if is_causal:
        causal = np.where(np.tril(np.ones((S, S), bool)), 0.0, -np.inf).astype(np_dtype)
        inits.append(numpy_helper.from_array(causal, p + "causal"))
        nodes.append(helper.make_node("Add", [s, p + "causal"], [p + "s3"]))
        s = p + "s3"
    nodes += [
        helper.make_node("Softmax", [s], [p + "probs"], axis=-1),
        helper.make_node("MatMul", [p + "probs", p + "v"], [out]),
    ]
    return nodes


def model_in_float64(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    """The fused model of `build_model` computed in float64 with the numpy reference."""
    w = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer}
    nodes = golden.fused_attention_nodes(model)
    x = feeds["X"].astype(np.float64)
    mask = None
    if "keep" in feeds:
        mask = feeds["keep"][:, None, None, :]
    elif "bias" in feeds:
        mask = feeds["bias"].astype(np.float64)[:, None, None, :]
    for layer, node in enumerate(nodes):
        def heads(name):
            proj = x @ w[f"w{name}{layer}"]
            return proj.reshape(B, S, -1, D).transpose(0, 2, 1, 3)

        attrs = golden.node_attributes(node)
        y = attention_reference(heads("q"), heads("k"), heads("v"), mask, **attrs)
        x = y.transpose(0, 2, 1, 3).reshape(B, S, E) @ w[f"wo{layer}"] + x
    return x


def feeds_for(model, dtype=np.float32, seed=1):
    rng = np.random.default_rng(seed)
    feeds = {"X": rng.standard_normal((B, S, E)).astype(dtype)}
    names = {i.name for i in model.graph.input}
    keep = np.ones((B, S), bool)
    keep[1, S - 4:] = False
    if "keep" in names:
        feeds["keep"] = keep
    if "bias" in names:
        feeds["bias"] = np.where(keep, rng.standard_normal((B, S)), -np.inf).astype(dtype)
    return feeds


def save(model, path) -> str:
    onnx.save(model, str(path))
    return str(path)


SHAPES = ("--shape", f"batch={B}", "--shape", f"seq={S}")


def run_cli(capsys, *argv, shapes=True) -> tuple[int, str]:
    """`python -m opsfuse ...` in this process; generated inputs get the models' (B, S)."""
    argv = [str(a) for a in argv]
    if shapes and argv[0] in ("golden", "check") and "--inputs" not in argv:
        argv += SHAPES
    rc = cli.main(argv)
    out = capsys.readouterr()
    return rc, out.out + out.err


# --- golden ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mask,is_causal,hkv", [("bool", 0, H), ("additive", 1, 1), (None, 2, H)])
def test_golden_outputs_match_float64(mask, is_causal, hkv):
    model = build_model(True, mask=mask, is_causal=is_causal, hkv=hkv)
    feeds = feeds_for(model)
    seen = []
    (outputs,) = golden.golden_outputs(model, [feeds], node_callback=lambda n, a, y: seen.append(n.name))
    assert seen == ["attention0", "attention1"]
    y = outputs["Y"]
    assert y.dtype == np.float32 and y.shape == (B, S, E)
    np.testing.assert_allclose(y, model_in_float64(model, feeds), atol=2e-5, rtol=1e-5)


def test_golden_stages_share_values_and_keep_graph_order():
    # Both layers' attention read the same mask value, the output reads an intermediate value: the
    # staged runner must hand values across stages.
    model = build_model(True, layers=3, mask="bool")
    feeds = feeds_for(model)
    (outputs,) = golden.golden_outputs(model, [feeds])
    np.testing.assert_allclose(outputs["Y"], model_in_float64(model, feeds), atol=3e-5, rtol=1e-5)


def test_golden_command_writes_polygraphy_files(tmp_path, capsys):
    from polygraphy.comparator import RunResults
    from polygraphy.json import load_json

    model = build_model(True, mask="bool", is_causal=1, hkv=1)
    path = save(model, tmp_path / "m.onnx")
    rc, out = run_cli(capsys, "golden", path, "-o", tmp_path / "golden.json")
    assert rc == 0, out
    assert "2 FusedAttention node(s) computed by Triton" in out
    results = RunResults.load(str(tmp_path / "golden.json"))
    assert [name for name, _ in results] == [golden.GOLDEN_RUNNER_NAME]
    feeds_list = load_json(str(tmp_path / "golden_inputs.json"))
    assert isinstance(feeds_list, list) and set(feeds_list[0]) == {"X", "keep"}
    assert feeds_list[0]["X"].shape == (2, 12, E)
    y = results[0][1][0]["Y"]
    np.testing.assert_allclose(y, model_in_float64(model, dict(feeds_list[0])), atol=2e-5, rtol=1e-5)

    # Given inputs are used as they are, and not saved again.
    rc, out = run_cli(capsys, "golden", path, "-o", tmp_path / "again.json",
                      "--inputs", tmp_path / "golden_inputs.json")
    assert rc == 0, out
    assert not (tmp_path / "again_inputs.json").exists()
    again = RunResults.load(str(tmp_path / "again.json"))
    np.testing.assert_array_equal(again[0][1][0]["Y"], y)


def test_golden_command_errors(tmp_path, capsys):
    rc, out = run_cli(capsys, "golden", tmp_path / "missing.onnx", "-o", tmp_path / "g.json")
    assert rc == 2 and "no such file" in out
    model = build_model(True, mask=None)
    model.graph.node[9].attribute.append(helper.make_attribute("window", 3))  # the first FusedAttention
    assert model.graph.node[9].op_type == contract.OP_NAME
    rc, out = run_cli(capsys, "golden", save(model, tmp_path / "bad.onnx"), "-o", tmp_path / "g.json")
    assert rc == 2 and "FusedAttention node 'attention0': unknown attribute(s) ['window']" in out


# --- check -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.FLOAT16], ids=["fp32", "fp16"])
def test_check_passes_with_original(tmp_path, capsys, dtype):
    _ort_library_or_skip()
    fused = save(build_model(True, dtype=dtype, mask="additive", is_causal=1), tmp_path / "f.onnx")
    original = save(build_model(False, dtype=dtype, mask="additive", is_causal=1), tmp_path / "o.onnx")
    rc, out = run_cli(capsys, "check", fused, "--original", original, "--per-node")
    assert rc == 0, out
    for runner in ("onnxrt-opsfuse-cpu vs triton-golden", "onnxrt-original-cpu vs triton-golden",
                   "kernel: onnxrt-opsfuse-cpu", "rewrite: original"):
        assert runner in out, out
    assert "max abs" in out and "mismatches" in out
    assert out.count("PASS") >= 6 and "FAIL" not in out


def test_check_with_saved_golden_and_polygraphy_round_trip(tmp_path, capsys):
    _ort_library_or_skip()
    from polygraphy.comparator import Comparator, RunResults

    model = save(build_model(True, mask="bool"), tmp_path / "m.onnx")
    assert run_cli(capsys, "golden", model, "-o", tmp_path / "g.json")[0] == 0
    rc, out = run_cli(capsys, "check", model, "--golden", tmp_path / "g.json", "--inputs",
                      tmp_path / "g_inputs.json", "--save-results", tmp_path / "all.json")
    assert rc == 0, out
    assert "Outputs vs the Triton golden (" + str(tmp_path / "g.json") in out
    # What `polygraphy run --load-outputs all.json` does: the saved runs compare again.
    saved = RunResults.load(str(tmp_path / "all.json"))
    assert [n for n, _ in saved] == ["onnxrt-opsfuse-cpu", golden.GOLDEN_RUNNER_NAME]
    assert Comparator.compare_accuracy(saved)

    # A golden from other inputs (other seed) must fail.
    rc, out = run_cli(capsys, "check", model, "--golden", tmp_path / "g.json", "--seed", "7")
    assert rc == 1 and "FAIL" in out, out


def test_check_fails_on_tight_tolerance_and_stat_option(tmp_path, capsys):
    _ort_library_or_skip()
    model = save(build_model(True, dtype=TensorProto.FLOAT16, mask="bool"), tmp_path / "m.onnx")
    rc, out = run_cli(capsys, "check", model, "--atol", "0", "--rtol", "0")
    assert rc == 1 and "FAIL" in out, out  # fp16 ORT and Triton round differently somewhere
    rc, out = run_cli(capsys, "check", model, "--check-error-stat", "mean")
    assert rc == 0, out


TAMPERS = {
    "scale": lambda n: n.attribute.append(helper.make_attribute("scale", 0.6)),
    "is_causal": lambda n: n.attribute.append(helper.make_attribute("is_causal", 1)),
    "mask_input": lambda n: n.input.__delitem__(3),
}


@pytest.mark.parametrize("tamper", sorted(TAMPERS))
def test_check_names_a_tampered_node(tmp_path, capsys, tamper):
    _ort_library_or_skip()
    fused = build_model(True, mask="bool")
    node = next(n for n in fused.graph.node if n.name == "attention1")
    for a in list(node.attribute):
        node.attribute.remove(a)
    TAMPERS[tamper](node)
    original = save(build_model(False, mask="bool"), tmp_path / "o.onnx")
    path = save(fused, tmp_path / "f.onnx")
    rc, out = run_cli(capsys, "check", path, "--original", original, "--per-node")
    assert rc == 1, out
    assert "failing FusedAttention node(s): attention1" in out, out
    assert "attention0" not in out.split("failing FusedAttention node(s):")[1]
    # The ORT kernel still agrees with Triton on the tampered node: only the rewrite check fails.
    kernel = out.split("Per node, ONNX Runtime (cpu):")[1].split("Per node, against")[0]
    assert "FAIL" not in kernel

    # Without --per-node, check fails at the model level and says how to localize.
    rc, out = run_cli(capsys, "check", path, "--original", original)
    assert rc == 1 and "rerun with --per-node" in out


def test_check_names_the_node_whose_kernel_disagrees(tmp_path, capsys, monkeypatch):
    # A faulty kernel is simulated on the Triton side of the per-node kernel check: the node whose
    # two results disagree is named.
    _ort_library_or_skip()
    from opsfuse import accuracy

    real = accuracy.run_fused_attention

    def perturbed(node, inputs, device=None):
        y = real(node, inputs, device)
        return y + np.float32(0.01) if node.name == "attention0" else y

    monkeypatch.setattr(accuracy, "run_fused_attention", perturbed)
    path = save(build_model(True, mask="bool"), tmp_path / "f.onnx")
    rc, out = run_cli(capsys, "check", path, "--per-node")
    assert rc == 1, out
    assert "failing FusedAttention node(s): attention0" in out, out


def test_check_trt_without_tensorrt_says_so(tmp_path, capsys):
    _ort_library_or_skip()
    from opsfuse.accuracy import tensorrt_available

    if tensorrt_available() is None:
        pytest.skip("TensorRT is installed here; tests/trt covers --trt")
    path = save(build_model(True, mask=None, layers=1), tmp_path / "m.onnx")
    rc, out = run_cli(capsys, "check", path, "--trt")
    assert rc == 0, out
    assert "TensorRT not installed" in out and "TensorRT comparison is skipped" in out


def test_check_usage_errors(tmp_path, capsys):
    _ort_library_or_skip()
    path = save(build_model(True, mask=None, layers=1), tmp_path / "m.onnx")
    rc, out = run_cli(capsys, "check", path, "--providers", "cpu,nosuch")
    assert rc == 2 and "nosuch" in out
    rc, out = run_cli(capsys, "check", tmp_path / "none.onnx")
    assert rc == 2 and "no such file" in out


# --- the bundled model, rewritten --------------------------------------------------------------


def test_bundled_tiny_bert_rewritten_passes_check(tmp_path, capsys):
    _ort_library_or_skip()
    src = REPO / "models" / "tiny_bert.onnx"
    if not src.is_file():
        pytest.skip(f"{src} not generated (python models/export_models.py)")
    fused = tmp_path / "tiny_bert.fused.onnx"
    rc, out = run_cli(capsys, "rewrite", src, "-o", fused, shapes=False)
    assert rc == 0, out
    assert golden.fused_attention_nodes(onnx.load(str(fused))), "the rewrite fused nothing"
    rc, out = run_cli(capsys, "golden", fused, "-o", tmp_path / "golden.json", shapes=False)
    assert rc == 0, out
    rc, out = run_cli(capsys, "check", fused, "--original", src, "--per-node", "--golden",
                      tmp_path / "golden.json", "--inputs", tmp_path / "golden_inputs.json")
    assert rc == 0, out
    assert "rewrite: original" in out and "FAIL" not in out


def test_golden_single_node_absent_mask_and_key_lengths():
    # The graph output is the node's own output and every input a graph input: no ONNX Runtime
    # stage runs at all, so bfloat16 works too.
    import ml_dtypes

    rng = np.random.default_rng(3)
    for np_dtype, elem in ((np.float16, TensorProto.FLOAT16), (ml_dtypes.bfloat16, TensorProto.BFLOAT16)):
        node = helper.make_node(contract.OP_NAME, ["Q", "K", "V", "", "lengths"], ["Y"],
                                domain=contract.DOMAIN, name="only", is_causal=2, softcap=4.0)
        graph = helper.make_graph([node], "one", [
            helper.make_tensor_value_info("Q", elem, [2, 4, 5, 16]),
            helper.make_tensor_value_info("K", elem, [2, 2, 9, 16]),
            helper.make_tensor_value_info("V", elem, [2, 2, 9, 16]),
            helper.make_tensor_value_info("lengths", TensorProto.INT64, [2]),
        ], [helper.make_tensor_value_info("Y", elem, [2, 4, 5, 16])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid(contract.DOMAIN, 1)])
        feeds = {"Q": rng.standard_normal((2, 4, 5, 16)).astype(np_dtype),
                 "K": rng.standard_normal((2, 2, 9, 16)).astype(np_dtype),
                 "V": rng.standard_normal((2, 2, 9, 16)).astype(np_dtype),
                 "lengths": np.array([9, 4], np.int64)}
        (out,) = golden.golden_outputs(model, [feeds])
        assert out["Y"].dtype == np.dtype(np_dtype)
        ref = attention_reference(*(feeds[n].astype(np.float64) for n in "QKV"), None, feeds["lengths"],
                                  is_causal=2, softcap=4.0)
        tol = 2e-3 if np_dtype == np.float16 else 2e-2
        np.testing.assert_allclose(out["Y"].astype(np.float64), ref, atol=tol, rtol=tol)


def test_check_several_input_sets(tmp_path, capsys):
    _ort_library_or_skip()
    model = build_model(True, mask="bool", is_causal=2)
    path = save(model, tmp_path / "m.onnx")
    golden.save_inputs([feeds_for(model, seed=1), feeds_for(model, seed=2)], tmp_path / "in.json")
    rc, out = run_cli(capsys, "check", path, "--inputs", tmp_path / "in.json", "--per-node")
    assert rc == 0, out
    assert "2 input set(s)" in out and f"0/{2 * B * S * E}" in out
