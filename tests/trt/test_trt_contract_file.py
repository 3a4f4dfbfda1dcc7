"""plugin/trt/FusedAttention.json (the plugin's machine-readable contract) agrees with the op
contract in opsfuse.contract (itself checked against plugin/common/contract.h)."""

from __future__ import annotations

import json

from opsfuse import contract
from trt_artifacts import REPO

SPEC = json.loads((REPO / "plugin" / "trt" / "FusedAttention.json").read_text())


def test_identity():
    assert SPEC["plugin"]["name"] == contract.OP_NAME
    assert SPEC["plugin"]["version"] == contract.TRT_PLUGIN_VERSION
    assert SPEC["plugin"]["namespace"] == contract.TRT_PLUGIN_NAMESPACE
    assert SPEC["onnx_node"]["op_type"] == contract.OP_NAME
    assert SPEC["onnx_node"]["domain"] == contract.DOMAIN
    lookup = SPEC["onnx_node"]["lookup_attributes"]
    assert lookup["plugin_version"]["value"] == contract.TRT_PLUGIN_VERSION
    assert lookup["plugin_namespace"]["value"] == contract.TRT_PLUGIN_NAMESPACE


def test_inputs_outputs():
    assert [i["name"] for i in SPEC["inputs"]] == list(contract.INPUT_NAMES)
    assert [i["index"] for i in SPEC["inputs"]] == list(range(contract.NUM_INPUTS))
    assert [i["optional"] for i in SPEC["inputs"]] == [i >= contract.NUM_REQUIRED_INPUTS for i in range(contract.NUM_INPUTS)]
    assert [o["name"] for o in SPEC["outputs"]] == ["Y"]
    assert SPEC["inputs"][contract.INPUT_KEY_LENGTHS]["types"] == ["int32", "int64"]


def test_qkv_bias():
    bias = SPEC["inputs"][contract.INPUT_QKV_BIAS]
    assert bias["name"] == "qkv_bias" and bias["optional"]
    assert bias["types"] == ["same as Q"]
    assert bias["shape"] == ["(Hq+2*Hkv)*D"]
    assert "packed_qkv = 1" in bias["requires"]
    # Positional inputs: TensorRT cannot skip the two before it (empty names are null tensors).
    assert "attn_mask" in bias["requires"] and "key_lengths" in bias["requires"]


def test_attributes_and_limits():
    attrs = {a["name"]: a for a in SPEC["attributes"]}
    assert set(attrs) == {contract.ATTR_SCALE, contract.ATTR_IS_CAUSAL, contract.ATTR_SOFTCAP,
                          contract.ATTR_Q_NUM_HEADS, contract.ATTR_KV_NUM_HEADS, contract.ATTR_PACKED_QKV}
    packed = attrs[contract.ATTR_PACKED_QKV]
    assert (packed["onnx_type"], packed["field_type"]) == ("INT", "kINT32")
    assert packed["default"] == contract.DEFAULT_PACKED_QKV and packed["valid"] == [0, 1]
    for name in (contract.ATTR_Q_NUM_HEADS, contract.ATTR_KV_NUM_HEADS):
        assert (attrs[name]["onnx_type"], attrs[name]["field_type"]) == ("INT", "kINT32")
        assert attrs[name]["default"] == contract.DEFAULT_NUM_HEADS
    assert attrs[contract.ATTR_IS_CAUSAL]["default"] == contract.DEFAULT_IS_CAUSAL
    assert attrs[contract.ATTR_IS_CAUSAL]["valid"] == list(range(contract.CAUSAL_MAX + 1))
    assert attrs[contract.ATTR_SOFTCAP]["default"] == contract.DEFAULT_SOFTCAP
    assert (attrs[contract.ATTR_SCALE]["onnx_type"], attrs[contract.ATTR_SCALE]["field_type"]) == ("FLOAT", "kFLOAT32")
    assert (attrs[contract.ATTR_IS_CAUSAL]["onnx_type"], attrs[contract.ATTR_IS_CAUSAL]["field_type"]) == ("INT", "kINT32")
    assert SPEC["limits"]["max_head_dim"] == contract.MAX_HEAD_DIM
    assert SPEC["limits"]["tensor_rank"] == contract.TENSOR_RANK
    assert SPEC["limits"]["packed_tensor_rank"] == contract.PACKED_TENSOR_RANK
    shapes = [t.get("shape_3d") for t in SPEC["inputs"][:contract.NUM_REQUIRED_INPUTS] + SPEC["outputs"]]
    assert all(s is not None and len(s) == contract.PACKED_TENSOR_RANK for s in shapes)
    assert SPEC["limits"]["mask_rank"] == [contract.MIN_MASK_RANK, contract.MAX_MASK_RANK]
