"""Rule onnx_attention: the standard ONNX Attention operator (opset 23 / 24) -> FusedAttention."""

from __future__ import annotations

import numpy as np
import pytest
from attention_graphs import onnx_attention_model, random_feeds
from rewrite_helpers import assert_same_outputs, attrs, fuse, fused_nodes, validate


def _fused_one(model):
    out, report = fuse(model)
    assert report.found == 1 and report.fused == 1, report.format()
    assert report.counts["onnx_attention"] == 1
    assert not [n for n in out.graph.node if n.op_type == "Attention"]
    validate(out)
    return out, fused_nodes(out)[0]


@pytest.mark.parametrize("kw", [
    {},
    {"mask": "bool"},
    {"mask": "float"},
    {"is_causal": 1},
    {"is_causal": 1, "mask": "bool"},
    {"Hq": 4, "Hkv": 2},
    {"Hq": 4, "Hkv": 1, "mask": "bool"},
    {"scale": 0.2},
    {"S": 3, "Sk": 6, "mask": "float"},
    {"softcap": 5.0},
], ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()) or "plain")
def test_four_d(kw):
    model = onnx_attention_model(**kw)
    out, node = _fused_one(model)
    a = attrs(node)
    assert a["is_causal"] == kw.get("is_causal", 0)
    assert a["softcap"] == pytest.approx(kw.get("softcap", 0.0))
    if "scale" in kw:
        assert a["scale"] == pytest.approx(kw["scale"])
    else:
        assert "scale" not in a, "an absent scale keeps the shared default 1/sqrt(D)"
    assert list(node.input[:3]) == ["q", "k", "v"]
    assert_same_outputs(model, out, random_feeds(model))


@pytest.mark.parametrize("hkv", [4, 2])
def test_three_d(hkv):
    model = onnx_attention_model(three_d=True, Hkv=hkv, mask="bool")
    out, node = _fused_one(model)
    a = attrs(node)
    assert (a["q_num_heads"], a["kv_num_heads"]) == (4, hkv), "the operator's 3-D form is FusedAttention's"
    assert list(node.input[:3]) == ["q", "k", "v"] and node.output[0] == "y"
    assert [n.op_type for n in out.graph.node] == ["FusedAttention"]
    assert_same_outputs(model, out, random_feeds(model))


def test_opset24_nonpad_kv_seqlen_becomes_key_lengths():
    model = onnx_attention_model(opset=24, nonpad=True, S=4, Sk=6)
    out, node = _fused_one(model)
    assert node.input[4] == "nonpad_kv_seqlen" and node.input[3] == ""
    feeds = random_feeds(model)
    feeds["nonpad_kv_seqlen"] = np.array([6, 3], dtype=np.int64)
    assert_same_outputs(model, out, feeds)


@pytest.mark.parametrize("mask_len", [6, 4])
def test_mask_of_unproven_length_is_padded_as_onnx_does(mask_len):
    model = onnx_attention_model(mask="short", S=4, Sk=6)
    out, node = _fused_one(model)
    assert any(n.op_type == "Pad" for n in out.graph.node)
    feeds = random_feeds(model, dims={"mask_len": mask_len})
    assert_same_outputs(model, out, feeds)


@pytest.mark.parametrize("kw,reason", [
    ({"past": True}, "past_key"),
    ({"present_out": True}, "present_key"),
    ({"softcap": 5.0, "mask": "bool"}, "softcap and a mask"),
    ({"softcap": 5.0, "is_causal": 1}, "softcap and a mask"),
    ({"opset": 24, "nonpad": True, "is_causal": 1}, "per batch"),
    ({"D": 512}, "head size D=512 is outside FusedAttention's 1..256"),
    ({"D": 320, "three_d": True, "Hkv": 2}, "head size D=320 is outside"),
])
def test_left_alone_with_reason(kw, reason):
    model = onnx_attention_model(**kw)
    out, report = fuse(model)
    assert report.found == 1 and report.fused == 0
    assert reason in report.left[0].reason
    assert report.left[0].nodes == ["/attn/Attention"]
    assert not fused_nodes(out)
