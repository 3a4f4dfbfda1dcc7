// The FusedAttention op contract (../shared/design/ARCHITECTURE.md), written once for C++.
// python/opsfuse/contract.py holds the same values; tests/test_contract.py checks they agree.
// Header-only and free of framework headers: the CPU kernel, the CUDA launcher, the ORT op,
// the TensorRT plugin and the pybind11 module all include it.
#pragma once

#include <cstdint>

namespace opsfuse::contract {

inline constexpr const char* kOpName = "FusedAttention";
inline constexpr const char* kDomain = "com.opsfuse";
inline constexpr int kOpVersion = 1;
// TensorRT finds plugins by (op_type, plugin_version, plugin_namespace).
inline constexpr const char* kTrtPluginVersion = "1";
inline constexpr const char* kTrtPluginNamespace = "com.opsfuse";

// Inputs, in node order. Optional ones may be absent (trailing) or the empty name.
// Q, K, V and Y come in one of two forms, all four alike (docs/notes/contract_3d_form.md):
// 4-D (B, H, S, D), or 3-D (B, S, H*D) with the head counts given by q_num_heads / kv_num_heads.
inline constexpr int kInputQ = 0;           // (B, Hq, Sq, D)   or (B, Sq, Hq*D)
inline constexpr int kInputK = 1;           // (B, Hkv, Sk, D)  or (B, Sk, Hkv*D)
inline constexpr int kInputV = 2;           // (B, Hkv, Sk, Dv) or (B, Sk, Hkv*Dv)
inline constexpr int kInputMask = 3;        // broadcastable to (B, Hq, Sq, Sk); bool or T
inline constexpr int kInputKeyLengths = 4;  // (B,); int32 or int64
// ((Hq + 2*Hkv)*D,); T; only with packed_qkv = 1: added to every packed row before the windows are
// read (docs/notes/contract_qkv_bias.md).
inline constexpr int kInputQkvBias = 5;
inline constexpr int kNumRequiredInputs = 3;
inline constexpr int kNumInputs = 6;
inline constexpr int kOutputY = 0;  // (B, Hq, Sq, Dv) or (B, Sq, Hq*Dv), the form of Q

// Attributes.
inline constexpr const char* kAttrScale = "scale";          // float; default 1/sqrt(D)
inline constexpr const char* kAttrIsCausal = "is_causal";   // int; 0, 1 or 2
inline constexpr const char* kAttrSoftcap = "softcap";      // float; 0 disables
// Head counts: required with the 3-D form; with the 4-D form allowed only equal to Hq / Hkv.
inline constexpr const char* kAttrQNumHeads = "q_num_heads";    // int; 0 = absent
inline constexpr const char* kAttrKvNumHeads = "kv_num_heads";  // int; 0 = absent
inline constexpr int kDefaultNumHeads = 0;
// Packed Q/K/V (3-D form only): Q, K, V are each the packed projection (B, S, (Hq + 2*Hkv)*D),
// read as the column windows [0, Hq*D), [Hq*D, (Hq+Hkv)*D), [(Hq+Hkv)*D, (Hq+2*Hkv)*D).
inline constexpr const char* kAttrPackedQkv = "packed_qkv";  // int; 0 or 1
inline constexpr int kDefaultPackedQkv = 0;
inline constexpr float kDefaultSoftcap = 0.0f;
inline constexpr int kDefaultIsCausal = 0;

// is_causal values.
inline constexpr int kCausalNone = 0;
inline constexpr int kCausalUpperLeft = 1;   // key j visible to query i iff j <= i
inline constexpr int kCausalLowerRight = 2;  // key j visible to query i iff j <= i + (Sk - Sq)
inline constexpr int kCausalMax = 2;

// Limits.
inline constexpr int64_t kMaxHeadDim = 256;  // D and Dv
inline constexpr int kMinMaskRank = 2;
inline constexpr int kMaxMaskRank = 4;
inline constexpr int kTensorRank = 4;        // Q, K, V, Y in the 4-D form
inline constexpr int kPackedTensorRank = 3;  // Q, K, V, Y in the 3-D form

}  // namespace opsfuse::contract
