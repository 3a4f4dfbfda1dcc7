"""The pybind11 module's validation, which runs before any CUDA call: checkable on a machine without
a GPU (CI) whenever opsfuse._cuda was built. Tensors are stand-ins that expose only
__cuda_array_interface__ (no memory behind them is ever touched on these paths)."""

from __future__ import annotations

import pytest

import opsfuse.cuda as ocuda

from cuda_helpers import FakeTensor


@pytest.fixture(scope="module")
def mod():
    if not ocuda.available():
        pytest.skip("opsfuse._cuda not built in this install (no nvcc or pybind11 at build time)")
    return ocuda._module()


CASES = [
    ((FakeTensor((1, 4, 8, 64)), FakeTensor((1, 3, 8, 64)), FakeTensor((1, 3, 8, 64))), {}, "multiple"),
    ((FakeTensor((1, 1, 2, 300)),) * 3, {}, "head size"),
    ((FakeTensor((1, 4, 8, 64)),) * 3, {"is_causal": 3}, "is_causal"),
    ((FakeTensor((1, 4, 8, 64)), FakeTensor((1, 4, 8, 64), "<f4"), FakeTensor((1, 4, 8, 64))), {}, "element type"),
    ((FakeTensor((1, 4, 8, 64)),) * 3, {"attn_mask": FakeTensor((3, 5), "|b1")}, "broadcast"),
    ((FakeTensor((1, 4, 8, 64)),) * 3, {"key_lengths": FakeTensor((2,), "<i4")}, "key_lengths"),
    ((FakeTensor((1, 4, 8)),) * 3, {}, "rank 4"),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_invalid_inputs_are_value_errors(mod, case):
    args, kw, needle = CASES[case]
    code, message, value = mod.workspace_size(*args, **kw)
    assert code == 1 and value is None
    assert message.startswith("FusedAttention: ") and needle in message, message
    with pytest.raises(ValueError, match=f"FusedAttention: .*{needle}"):
        ocuda._check(mod.fused_attention(*args, FakeTensor((1, 4, 8, 64)), **kw))


def test_output_shape_is_checked(mod):
    q = FakeTensor((1, 4, 8, 64))
    code, message, _ = mod.fused_attention(q, q, q, FakeTensor((1, 4, 8, 32)))
    assert code == 1 and "output Y must have shape (1, 4, 8, 64)" in message


def test_non_tensor_is_rejected(mod):
    q = FakeTensor((1, 4, 8, 64))
    code, message, _ = mod.fused_attention(q, q, q, object())
    assert code == 1 and "__cuda_array_interface__ or __dlpack__" in message
