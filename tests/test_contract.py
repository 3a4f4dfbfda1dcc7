"""The contract's constants exist once in C++ (plugin/common/contract.h) and once in Python
(opsfuse.contract): they must agree."""

from __future__ import annotations

import re
from pathlib import Path

from opsfuse import contract

HEADER = Path(__file__).resolve().parents[1] / "plugin" / "common" / "contract.h"

# C++ name -> Python name.
PAIRS = {
    "kOpName": "OP_NAME",
    "kDomain": "DOMAIN",
    "kOpVersion": "OP_VERSION",
    "kTrtPluginVersion": "TRT_PLUGIN_VERSION",
    "kTrtPluginNamespace": "TRT_PLUGIN_NAMESPACE",
    "kInputQ": "INPUT_Q",
    "kInputK": "INPUT_K",
    "kInputV": "INPUT_V",
    "kInputMask": "INPUT_MASK",
    "kInputKeyLengths": "INPUT_KEY_LENGTHS",
    "kInputQkvBias": "INPUT_QKV_BIAS",
    "kNumRequiredInputs": "NUM_REQUIRED_INPUTS",
    "kNumInputs": "NUM_INPUTS",
    "kOutputY": "OUTPUT_Y",
    "kAttrScale": "ATTR_SCALE",
    "kAttrIsCausal": "ATTR_IS_CAUSAL",
    "kAttrSoftcap": "ATTR_SOFTCAP",
    "kAttrQNumHeads": "ATTR_Q_NUM_HEADS",
    "kAttrKvNumHeads": "ATTR_KV_NUM_HEADS",
    "kDefaultNumHeads": "DEFAULT_NUM_HEADS",
    "kAttrPackedQkv": "ATTR_PACKED_QKV",
    "kDefaultPackedQkv": "DEFAULT_PACKED_QKV",
    "kDefaultSoftcap": "DEFAULT_SOFTCAP",
    "kDefaultIsCausal": "DEFAULT_IS_CAUSAL",
    "kCausalNone": "CAUSAL_NONE",
    "kCausalUpperLeft": "CAUSAL_UPPER_LEFT",
    "kCausalLowerRight": "CAUSAL_LOWER_RIGHT",
    "kCausalMax": "CAUSAL_MAX",
    "kMaxHeadDim": "MAX_HEAD_DIM",
    "kMinMaskRank": "MIN_MASK_RANK",
    "kMaxMaskRank": "MAX_MASK_RANK",
    "kTensorRank": "TENSOR_RANK",
    "kPackedTensorRank": "PACKED_TENSOR_RANK",
}

_CONSTANT = re.compile(r"inline constexpr\s+[\w:* ]+?\s+(k\w+)\s*=\s*([^;]+);")


def _cpp_constants() -> dict:
    values = {}
    for name, raw in _CONSTANT.findall(HEADER.read_text()):
        raw = raw.strip()
        if raw.startswith('"'):
            values[name] = raw.strip('"')
        else:
            values[name] = float(raw.rstrip("f")) if "." in raw else int(raw)
    return values


def test_every_cpp_constant_has_a_python_twin():
    cpp = _cpp_constants()
    assert set(cpp) == set(PAIRS), f"unpaired: {set(cpp) ^ set(PAIRS)}"


def test_cpp_and_python_values_agree():
    cpp = _cpp_constants()
    for cpp_name, py_name in PAIRS.items():
        assert cpp[cpp_name] == getattr(contract, py_name), f"{cpp_name} != contract.{py_name}"


def test_input_names_cover_every_input():
    assert len(contract.INPUT_NAMES) == contract.NUM_INPUTS
    assert contract.INPUT_NAMES[contract.INPUT_MASK] == "attn_mask"
    assert contract.INPUT_NAMES[contract.INPUT_KEY_LENGTHS] == "key_lengths"
    assert contract.INPUT_NAMES[contract.INPUT_QKV_BIAS] == "qkv_bias"
    # Every optional input follows the required ones, each at its own index.
    indices = [contract.INPUT_Q, contract.INPUT_K, contract.INPUT_V, contract.INPUT_MASK,
               contract.INPUT_KEY_LENGTHS, contract.INPUT_QKV_BIAS]
    assert indices == list(range(contract.NUM_INPUTS))


def test_schema_declares_the_contract_inputs_in_order():
    from opsfuse import schema

    inputs = schema.build_schema().inputs
    assert [p.name for p in inputs] == list(contract.INPUT_NAMES)
    required = [p.option != p.option.Optional for p in inputs]
    assert required == [i < contract.NUM_REQUIRED_INPUTS for i in range(contract.NUM_INPUTS)]
