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
  // Head counts of the 3-D form (B, S, H*D); 0 = absent. Required with 3-D inputs; with 4-D
  // inputs they may be given only equal to the head dimensions of Q and K.
  int64_t q_num_heads = 0;
  int64_t kv_num_heads = 0;
  // 1: packed Q/K/V (3-D form only): Q, K and V are each the packed projection
  // (B, S, (Hq + 2*Hkv)*D), read as column windows (docs/notes/contract_3d_form.md).
  int64_t packed_qkv = 0;
};

// Checks attribute values alone (at node creation time).
std::string check_attributes(const AttentionAttributes& attrs);

// The checks of a present qkv_bias that need no shapes ("" when they pass), in
// check_inputs_and_fill's words: the attribute it requires, and Q's element type. TensorRT's
// plugin makes them before shapes are known.
std::string check_qkv_bias_attribute(const AttentionAttributes& attrs);
std::string check_qkv_bias_type(ElemType bias, ElemType q);

// Checks the six inputs (index order of contract.h; absent optional ones have present=false)
// and fills every field of `params` except the data pointers: sizes, element strides (dense
// for the 4-D form; for the 3-D form (B, S, H*D) those of the same tensor viewed as
// (B, H, S, D)), mask broadcast strides, dtype, mask kind, resolved scale, softcap, causal mode.
// Q, K and V are all rank 4 or all rank 3; Y takes the same form (output_shape). With
// attrs.packed_qkv = 1 the three inputs are rank 3 and of one shape (B, S, (Hq + 2*Hkv)*D), the
// strides are those of the packed rows, and the data pointers must come from set_qkv_pointers.
// qkv_bias is allowed only with packed_qkv = 1: ((Hq + 2*Hkv)*D,) of Q's type.
std::string check_inputs_and_fill(const TensorDesc (&inputs)[6], const AttentionAttributes& attrs,
                                  AttentionParams* params);

// Sets the Q, K and V data pointers of validated `params` from the base addresses of the three
// inputs. Every front end sets them here, never itself: with packed_qkv = 1 each input is the
// packed (B, S, (Hq + 2*Hkv)*D) tensor and K, V start Hq*D and (Hq + Hkv)*D elements into their
// input's rows (Q at column 0), the window the strides of check_inputs_and_fill describe.
// `qkv_bias` (packed_qkv = 1 only, or null) is split the same way into q_bias, k_bias, v_bias.
// A null base stays null.
void set_qkv_pointers(const AttentionAttributes& attrs, const void* q, const void* k, const void* v,
                      const void* qkv_bias, AttentionParams* params);

// Element offsets of the K and V windows within a packed row (0 when not packed), from
// validated params: Hq*D and (Hq + Hkv)*D.
int64_t packed_k_offset(const AttentionAttributes& attrs, const AttentionParams& params);
int64_t packed_v_offset(const AttentionAttributes& attrs, const AttentionParams& params);

// Output shape from validated params, in the form of the inputs: `input_rank` is Q's rank
// (4: (B, Hq, Sq, Dv); 3: (B, Sq, Hq*Dv)).
inline std::vector<int64_t> output_shape(const AttentionParams& p, size_t input_rank) {
  if (input_rank == 3) return {p.batch, p.seq_q, p.heads_q * p.head_dim_v};
  return {p.batch, p.heads_q, p.seq_q, p.head_dim_v};
}

// Y's last dimension for packed Q/K/V from the packed last dimension W, for shape inference:
// Hq * W / (Hq + 2*Hkv). -1 when W is unknown (< 0), the head counts are not positive, or W is
// not a multiple of Hq + 2*Hkv (the kernel reports that at run time).
inline int64_t packed_qkv_output_hidden(int64_t packed_hidden, int64_t q_num_heads, int64_t kv_num_heads) {
  if (packed_hidden < 0 || q_num_heads <= 0 || kv_num_heads <= 0) return -1;
  const int64_t columns = q_num_heads + 2 * kv_num_heads;
  if (packed_hidden % columns != 0) return -1;
  return q_num_heads * (packed_hidden / columns);
}

// Y's last dimension in the 3-D form from V's last dimension, for shape inference before any
// data exists: Hq * (V_hidden / Hkv). -1 when V_hidden is unknown (< 0), the head counts are
// not positive, or V_hidden is not a multiple of Hkv (the kernel reports that at run time).
inline int64_t packed_output_hidden(int64_t v_hidden, int64_t q_num_heads, int64_t kv_num_heads) {
  if (v_hidden < 0 || q_num_heads <= 0 || kv_num_heads <= 0 || v_hidden % kv_num_heads != 0) return -1;
  return q_num_heads * (v_hidden / kv_num_heads);
}

// Checks key_lengths values read on the host (CPU kernel, tests). Empty string when valid.
std::string check_key_lengths(const AttentionParams& p);

}  // namespace opsfuse
