"""The FusedAttention op contract (``../shared/design/ARCHITECTURE.md``), written once for Python.

``plugin/common/contract.h`` holds the same values for C++; ``tests/test_contract.py`` checks
that the two agree.
"""

OP_NAME = "FusedAttention"
DOMAIN = "com.opsfuse"
OP_VERSION = 1
TRT_PLUGIN_VERSION = "1"
TRT_PLUGIN_NAMESPACE = "com.opsfuse"

# Inputs, in node order. Optional ones may be absent (trailing) or the empty name.
# Q, K, V and Y come in one of two forms, all four alike (docs/notes/contract_3d_form.md):
# 4-D (B, H, S, D), or 3-D (B, S, H*D) with the head counts given by q_num_heads / kv_num_heads.
INPUT_Q = 0  # (B, Hq, Sq, D) or (B, Sq, Hq*D)
INPUT_K = 1  # (B, Hkv, Sk, D) or (B, Sk, Hkv*D)
INPUT_V = 2  # (B, Hkv, Sk, Dv) or (B, Sk, Hkv*Dv)
INPUT_MASK = 3  # broadcastable to (B, Hq, Sq, Sk); bool or T
INPUT_KEY_LENGTHS = 4  # (B,); int32 or int64
# ((Hq + 2*Hkv)*D,); T; only with packed_qkv = 1: added to every packed row before the windows are
# read (docs/notes/contract_qkv_bias.md).
INPUT_QKV_BIAS = 5
NUM_REQUIRED_INPUTS = 3
NUM_INPUTS = 6
INPUT_NAMES = ("Q", "K", "V", "attn_mask", "key_lengths", "qkv_bias")
OUTPUT_Y = 0  # (B, Hq, Sq, Dv) or (B, Sq, Hq*Dv), the form of Q

# Attributes.
ATTR_SCALE = "scale"  # float; default 1/sqrt(D)
ATTR_IS_CAUSAL = "is_causal"  # int; 0, 1 or 2
ATTR_SOFTCAP = "softcap"  # float; 0 disables
# Head counts: required with the 3-D form; with the 4-D form allowed only equal to Hq / Hkv.
ATTR_Q_NUM_HEADS = "q_num_heads"  # int; 0 = absent
ATTR_KV_NUM_HEADS = "kv_num_heads"  # int; 0 = absent
DEFAULT_NUM_HEADS = 0
# Packed Q/K/V (3-D form only): Q, K, V are each the packed projection (B, S, (Hq + 2*Hkv)*D),
# read as the column windows [0, Hq*D), [Hq*D, (Hq+Hkv)*D), [(Hq+Hkv)*D, (Hq+2*Hkv)*D).
ATTR_PACKED_QKV = "packed_qkv"  # int; 0 or 1
DEFAULT_PACKED_QKV = 0
DEFAULT_SOFTCAP = 0.0
DEFAULT_IS_CAUSAL = 0

# is_causal values.
CAUSAL_NONE = 0
CAUSAL_UPPER_LEFT = 1  # key j visible to query i iff j <= i
CAUSAL_LOWER_RIGHT = 2  # key j visible to query i iff j <= i + (Sk - Sq)
CAUSAL_MAX = 2

# Limits.
MAX_HEAD_DIM = 256  # D and Dv
MIN_MASK_RANK = 2
MAX_MASK_RANK = 4
TENSOR_RANK = 4  # Q, K, V, Y in the 4-D form
PACKED_TENSOR_RANK = 3  # Q, K, V, Y in the 3-D form

# Element types, as onnx.TensorProto enum names.
VALUE_TYPES = ("FLOAT", "FLOAT16", "BFLOAT16")
KEY_LENGTH_TYPES = ("INT32", "INT64")
