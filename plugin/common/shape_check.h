// Validation of FusedAttention inputs and attributes against the contract, in one place for
// every front end. Returns an empty string when valid, else one sentence naming the problem;
// the caller prefixes the op (and node) name. No exceptions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention_params.h"

namespace opsfuse {

enum class ElemType : int32_t { kFloat32, kFloat16, kBFloat16, kBool, kInt32, kInt64, kOther };

const char* elem_type_name(ElemType t);

struct TensorDesc {
  bool present = false;
  ElemType type = ElemType::kOther;
  std::vector<int64_t> shape;
};

struct AttentionAttributes {
  bool has_scale = false;  // absent: 1/sqrt(D)
  float scale = 0.0f;
  int64_t is_causal = 0;
  float softcap = 0.0f;
};

// Checks attribute values alone (at node creation time).
std::string check_attributes(const AttentionAttributes& attrs);

// Checks the five inputs (index order of contract.h; absent optional ones have present=false)
// and fills every field of `params` except the data pointers: sizes, dense strides, mask
// broadcast strides, dtype, mask kind, resolved scale, softcap, causal mode.
std::string check_inputs_and_fill(const TensorDesc (&inputs)[5], const AttentionAttributes& attrs,
                                  AttentionParams* params);

// Output shape (B, Hq, Sq, Dv) from validated params.
inline std::vector<int64_t> output_shape(const AttentionParams& p) {
  return {p.batch, p.heads_q, p.seq_q, p.head_dim_v};
}

// Checks key_lengths values read on the host (CPU kernel, tests). Empty string when valid.
std::string check_key_lengths(const AttentionParams& p);

}  // namespace opsfuse
