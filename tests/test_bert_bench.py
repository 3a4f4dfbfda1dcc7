"""The end-to-end BERT benchmark (python -m opsfuse.bench.bert) on its --quick CPU path: a tiny BERT
exported, optimized by ORT's transformers optimizer, rewritten by opsfuse (alone and after ORT's other
fusions), checked against the unfused model and a float32 reference, and timed. The GPU run uses the
same code with BERT-base in float16; these tests prove its logic before that single run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from opsfuse.bench import bert


def test_accuracy_rule_rejects_an_ignored_mask():
    """The check that guards every reported time: noise-level differences pass, a model whose
    output is off by an ignored padding mask (~10% relative here) fails."""
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((2, 16, 32)).astype(np.float32)
    noise = 5e-4 * rng.standard_normal(ref.shape).astype(np.float32)
    unfused = ref + noise
    good = ref + 0.5 * noise
    bad = ref + 0.1 * rng.standard_normal(ref.shape).astype(np.float32)
    nan = good.copy()
    nan[0, 0, 0] = np.nan
    res = bert.check_accuracy({"unfused": unfused, "opsfuse": good, "ort+opsfuse": bad, "ort_optimized": nan},
                              ref, "float16")
    assert res["unfused"]["ok"] and res["opsfuse"]["ok"]
    assert not res["ort+opsfuse"]["ok"] and "float32 reference" in res["ort+opsfuse"]["why"]
    assert not res["ort_optimized"]["ok"] and "non-finite" in res["ort_optimized"]["why"]


def test_padding_masks_keep_a_zero_tail():
    feeds = bert.make_feeds(8, 32, 1000, "padded")
    lengths = bert.lengths_of(feeds)
    assert lengths[0] == 32 and lengths[-1] < 32 and all(a >= b for a, b in zip(lengths, lengths[1:]))
    for row, n in zip(feeds["attention_mask"], lengths):
        assert row[:n].all() and not row[n:].any()
    assert bert.make_feeds(8, 32, 1000, "ones")["attention_mask"].all()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_quick_cpu_run_end_to_end(tmp_path, dtype):
    pytest.importorskip("torch", reason="torch is needed to build and export the BERT model")
    pytest.importorskip("transformers", reason="transformers is needed to build the BERT model")
    pytest.importorskip("onnxruntime.transformers.optimizer", reason="ORT's transformers optimizer is the baseline")
    from opsfuse import LibraryNotBuiltError, get_library_path

    try:
        get_library_path()
    except LibraryNotBuiltError as exc:
        pytest.skip(f"the opsfuse ORT library is not built: {exc}")

    out = tmp_path / "out"
    rc = bert.main(["--out", str(out), "--device", "cpu", "--quick", "--threads", "1", "--dtype", dtype,
                    "--tmp", str(tmp_path)])
    result = json.loads((out / "bert_e2e.json").read_text())
    assert rc == 0, result["failures"]
    assert not result["failures"] and not result["errors"], (result["failures"], result["errors"])
    layers = result["meta"]["config"]["num_hidden_layers"]
    models = result["models"]
    assert models["ort_optimized"]["fused_ops"].get("Attention") == layers
    for name in bert.OPSFUSE_MODELS:
        assert models[name]["report"]["fused"] == layers
        assert models[name]["fused_ops"]["FusedAttention"] == layers
        assert "Softmax" not in models[name]["fused_ops"]
        assert models[name]["placement"]["FusedAttention"] == {"CPU": layers}
        # The 3-D form: no per-layer Reshape/Transpose left; the mask read un-expanded.
        assert models[name]["report"]["three_d"] == layers, models[name]["report"]
        assert models[name]["report"]["mask_unbroadcast"] == layers, models[name]["report"]
        assert "Transpose" not in models[name]["placement"] and "Expand" not in models[name]["placement"]
        reshapes = models[name]["placement"].get("Reshape", {}).get("CPU", 0)
        assert reshapes <= models["unfused"]["placement"]["Reshape"]["CPU"] - 4 * layers  # 4 per layer went
    assert models["ort+opsfuse"]["fused_ops"].get("SkipLayerNormalization")
    # The packed model: the same graph but one projection MatMul per layer and no bias Add: the
    # biases are FusedAttention's qkv_bias input (docs/notes/contract_qkv_bias.md).
    packed, plain = models[bert.PACKED], models["ort+opsfuse"]
    assert packed["report"]["packed_qkv"] == layers and not packed["report"]["packed_qkv_why_not"]
    assert plain["report"]["packed_qkv"] == 0
    assert packed["fused_ops"]["MatMul"] == plain["fused_ops"]["MatMul"] - 2 * layers
    assert packed["all_ops"]["Add"] == plain["all_ops"]["Add"] - 3 * layers
    assert packed["nodes"] == plain["nodes"] - 5 * layers
    assert packed["executed_nodes"] < plain["executed_nodes"]
    assert {(a["seq"], a["mask"]) for a in result["accuracy"]} == {(32, "padded"), (32, "ones")}
    for row in result["accuracy"]:
        assert all(a["ok"] for a in row["models"].values()), row
    for row in result["timings"]:
        assert all(row["ms"][n] > 0 for n in bert.MODELS), row
        assert row["speedup_vs_ort_optimized"]["opsfuse"] > 0
    md = (out / "bert_e2e.md").read_text()
    assert "| 32 | padded |" in md and "1.90" in md and "FusedAttention 2" in md
    assert "3-D form (B, S, H·D) 2, mask read un-expanded 2" in md
    assert "3-D form (B, S, H·D) 2, mask read un-expanded 2, packed Q/K/V 2" in md
    assert "ORT fusions + opsfuse packed Q/K/V vs ORT opt." in md
    assert f"| {bert.PACKED} | {packed['nodes']} | {packed['executed_nodes']} |" in md
    assert not list(tmp_path.glob("opsfuse_bert_*")), "the temporary models were not removed"


def test_a_wrong_opsfuse_model_fails_the_run_and_gets_no_time(tmp_path, monkeypatch):
    """A session whose outputs are off (here: shifted by 0.05) must end the run with status 1, a
    FAILED section in the markdown, and no time for that model."""
    pytest.importorskip("torch", reason="torch is needed to build and export the BERT model")
    pytest.importorskip("transformers", reason="transformers is needed to build the BERT model")
    pytest.importorskip("onnxruntime.transformers.optimizer", reason="ORT's transformers optimizer is the baseline")
    from opsfuse import LibraryNotBuiltError, get_library_path

    try:
        get_library_path()
    except LibraryNotBuiltError as exc:
        pytest.skip(f"the opsfuse ORT library is not built: {exc}")

    real = bert.make_session

    class Off:
        def __init__(self, sess):
            self._sess = sess

        def run(self, names, feeds):
            return [y + np.float32(0.05) for y in self._sess.run(names, feeds)]

        def __getattr__(self, name):
            return getattr(self._sess, name)

    def make_session(path, *args, **kw):
        sess = real(path, *args, **kw)
        return Off(sess) if path.name == "bert_opsfuse.onnx" and not kw.get("profile_prefix") else sess

    monkeypatch.setattr(bert, "make_session", make_session)
    out = tmp_path / "out"
    rc = bert.main(["--out", str(out), "--device", "cpu", "--quick", "--threads", "1", "--runs", "2",
                    "--warmup", "1", "--tmp", str(tmp_path)])
    assert rc == 1
    result = json.loads((out / "bert_e2e.json").read_text())
    assert any(f.startswith("opsfuse output wrong") for f in result["failures"]), result["failures"]
    for row in result["timings"]:
        assert row["ms"]["opsfuse"] is None and row["speedup_vs_ort_optimized"]["opsfuse"] is None
        assert row["ms"]["ort+opsfuse"] > 0
    md = (out / "bert_e2e.md").read_text()
    assert "## FAILED" in md and "opsfuse output wrong" in md
