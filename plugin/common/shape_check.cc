#include "shape_check.h"

#include <cmath>
#include "message.h"

#include "contract.h"

namespace opsfuse {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  Message os;
  os << "(";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ")";
  return os.str();
}

bool is_float_type(ElemType t) {
  return t == ElemType::kFloat32 || t == ElemType::kFloat16 || t == ElemType::kBFloat16;
}

DType to_dtype(ElemType t) {
  switch (t) {
    case ElemType::kFloat16: return DType::kFloat16;
    case ElemType::kBFloat16: return DType::kBFloat16;
    default: return DType::kFloat32;
  }
}

// Element strides of (batch, head, sequence) for a tensor of logical shape s = (B, H, S, D):
// stored dense as (B, H, S, D) (4-D form), or as (B, S, H*D) (3-D form, `packed`), where
// element (b, h, s, d) sits at (b, s, h*D + d).
void strides(const std::vector<int64_t>& s, bool packed, int64_t out[3]) {
  if (packed) {
    out[0] = s[2] * s[1] * s[3];
    out[1] = s[3];
    out[2] = s[1] * s[3];
  } else {
    out[0] = s[1] * s[2] * s[3];
    out[1] = s[2] * s[3];
    out[2] = s[3];
  }
}

// Splits a 3-D input (B, S, hidden) into its logical 4-D shape (B, heads, S, hidden / heads).
// `attr` names the attribute holding `heads` in messages. "" or an error.
std::string unpack_3d(const char* input, const std::vector<int64_t>& shape, const char* attr, int64_t heads,
                      std::vector<int64_t>* logical) {
  Message os;
  if (heads <= 0) {
    os << input << " is rank 3 (B, S, H*D), so attribute " << attr << " is required";
    return os.str();
  }
  if (shape[2] % heads != 0) {
    os << input << "'s last dimension " << shape[2] << " is not a multiple of " << attr << " " << heads
       << " (" << input << " has shape " << shape_str(shape) << ")";
    return os.str();
  }
  *logical = {shape[0], heads, shape[1], shape[2] / heads};
  return std::string();
}

}  // namespace

const char* elem_type_name(ElemType t) {
  switch (t) {
    case ElemType::kFloat32: return "float32";
    case ElemType::kFloat16: return "float16";
    case ElemType::kBFloat16: return "bfloat16";
    case ElemType::kBool: return "bool";
    case ElemType::kInt32: return "int32";
    case ElemType::kInt64: return "int64";
    case ElemType::kOther: return "an unsupported type";
  }
  return "an unsupported type";
}

std::string check_attributes(const AttentionAttributes& a) {
  Message os;
  if (a.has_scale && !(std::isfinite(a.scale) && a.scale != 0.0f)) {
    os << "attribute 'scale' must be a finite non-zero float, got " << a.scale;
  } else if (a.is_causal < 0 || a.is_causal > contract::kCausalMax) {
    os << "attribute 'is_causal' must be 0, 1 or 2, got " << a.is_causal;
  } else if (!(std::isfinite(a.softcap) && a.softcap >= 0.0f)) {
    os << "attribute 'softcap' must be a finite float >= 0, got " << a.softcap;
  } else if (a.q_num_heads < 0) {
    os << "attribute 'q_num_heads' must be a positive int (the number of query heads), got " << a.q_num_heads;
  } else if (a.kv_num_heads < 0) {
    os << "attribute 'kv_num_heads' must be a positive int (the number of key/value heads), got "
       << a.kv_num_heads;
  } else if (a.q_num_heads > 0 && a.kv_num_heads > 0 && a.q_num_heads % a.kv_num_heads != 0) {
    os << "attribute 'q_num_heads' (" << a.q_num_heads << ") must be a multiple of attribute 'kv_num_heads' ("
       << a.kv_num_heads << ")";
  } else if (a.packed_qkv != 0 && a.packed_qkv != 1) {
    os << "attribute 'packed_qkv' must be 0 or 1, got " << a.packed_qkv;
  } else if (a.packed_qkv == 1 && (a.q_num_heads <= 0 || a.kv_num_heads <= 0)) {
    os << "attribute packed_qkv = 1 requires attributes q_num_heads and kv_num_heads (the packed last "
          "dimension is (q_num_heads + 2*kv_num_heads) * head size)";
  }
  return os.str();
}

std::string check_qkv_bias_attribute(const AttentionAttributes& attrs) {
  if (attrs.packed_qkv == 1) return std::string();
  return "qkv_bias is given, but attribute packed_qkv is not 1: the bias belongs to the packed (B, S, "
         "(q_num_heads + 2*kv_num_heads)*D) projection";
}

std::string check_qkv_bias_type(ElemType bias, ElemType q) {
  if (bias == q) return std::string();
  Message os;
  os << "qkv_bias has element type " << elem_type_name(bias) << "; it must be the type of Q (" << elem_type_name(q)
     << ")";
  return os.str();
}

std::string check_inputs_and_fill(const TensorDesc (&in)[6], const AttentionAttributes& attrs,
                                  AttentionParams* p) {
  using namespace contract;
  std::string err = check_attributes(attrs);
  if (!err.empty()) return err;

  static const char* kNames[6] = {"Q", "K", "V", "attn_mask", "key_lengths", "qkv_bias"};
  Message os;
  for (int i = 0; i < kNumRequiredInputs; ++i) {
    if (!in[i].present) {
      os << "input " << kNames[i] << " is required";
      return os.str();
    }
  }
  // The given shapes (named in messages) and their logical 4-D views (B, H, S, D).
  const auto& qg = in[kInputQ].shape;
  const auto& kg = in[kInputK].shape;
  const auto& vg = in[kInputV].shape;
  const size_t rank = qg.size();
  if (rank != static_cast<size_t>(kTensorRank) && rank != static_cast<size_t>(kPackedTensorRank)) {
    os << "input Q must have rank 4 (batch, heads, sequence, head size) or rank 3 (batch, sequence, "
          "heads*head size), got shape "
       << shape_str(qg);
    return os.str();
  }
  if (kg.size() != rank || vg.size() != rank) {
    os << "Q, K and V must all have rank 4 (B, H, S, D) or all rank 3 (B, S, H*D), got Q " << shape_str(qg)
       << ", K " << shape_str(kg) << ", V " << shape_str(vg);
    return os.str();
  }
  for (int i = 0; i < kNumRequiredInputs; ++i) {
    for (int64_t d : in[i].shape) {
      if (d < 0) {
        os << "input " << kNames[i] << " has a negative dimension " << shape_str(in[i].shape);
        return os.str();
      }
    }
  }
  const bool packed = rank == static_cast<size_t>(kPackedTensorRank);
  std::vector<int64_t> q = qg, k = kg, v = vg;
  if (attrs.packed_qkv == 1) {
    // Packed Q/K/V: each input is (B, S, W) with W = (Hq + 2*Hkv)*D; Q, K, V are column windows.
    if (!packed) {
      os << "attribute packed_qkv = 1 needs the 3-D form: Q, K and V must each be the packed (B, S, "
            "(q_num_heads + 2*kv_num_heads)*D) tensor, got rank-4 inputs Q "
         << shape_str(qg) << ", K " << shape_str(kg) << ", V " << shape_str(vg);
      return os.str();
    }
    if (kg != qg || vg != qg) {
      os << "with packed_qkv = 1, Q, K and V must have the same shape (the packed (B, S, (q_num_heads + "
            "2*kv_num_heads)*D) tensor, normally one tensor given three times), got Q "
         << shape_str(qg) << ", K " << shape_str(kg) << ", V " << shape_str(vg);
      return os.str();
    }
    const int64_t columns = attrs.q_num_heads + 2 * attrs.kv_num_heads;
    if (qg[2] % columns != 0) {
      os << "with packed_qkv = 1, the packed last dimension " << qg[2] << " must be a multiple of q_num_heads + "
         << "2*kv_num_heads = " << attrs.q_num_heads << " + 2*" << attrs.kv_num_heads << " = " << columns
         << " (Q, K, V have shape " << shape_str(qg) << ")";
      return os.str();
    }
    const int64_t d = qg[2] / columns;
    q = {qg[0], attrs.q_num_heads, qg[1], d};
    k = {qg[0], attrs.kv_num_heads, qg[1], d};
    v = k;
  } else if (packed) {
    std::string e = unpack_3d("Q", qg, kAttrQNumHeads, attrs.q_num_heads, &q);
    if (e.empty()) e = unpack_3d("K", kg, kAttrKvNumHeads, attrs.kv_num_heads, &k);
    if (e.empty()) e = unpack_3d("V", vg, kAttrKvNumHeads, attrs.kv_num_heads, &v);
    if (!e.empty()) return e;
  } else if (attrs.q_num_heads > 0 && attrs.q_num_heads != q[1]) {
    os << "attribute q_num_heads = " << attrs.q_num_heads << " does not match Q's head dimension " << q[1]
       << " (Q has the 4-D shape " << shape_str(qg) << "; with 4-D inputs q_num_heads may only repeat it)";
    return os.str();
  } else if (attrs.kv_num_heads > 0 && attrs.kv_num_heads != k[1]) {
    os << "attribute kv_num_heads = " << attrs.kv_num_heads << " does not match K's head dimension " << k[1]
       << " (K has the 4-D shape " << shape_str(kg) << "; with 4-D inputs kv_num_heads may only repeat it)";
    return os.str();
  }
  if (!is_float_type(in[kInputQ].type)) {
    os << "Q has element type " << elem_type_name(in[kInputQ].type)
       << "; supported: float32, float16, bfloat16";
    return os.str();
  }
  if (in[kInputK].type != in[kInputQ].type || in[kInputV].type != in[kInputQ].type) {
    os << "Q, K and V must share one element type, got " << elem_type_name(in[kInputQ].type) << ", "
       << elem_type_name(in[kInputK].type) << ", " << elem_type_name(in[kInputV].type);
    return os.str();
  }
  if (k[0] != q[0] || v[0] != q[0]) {
    os << "batch sizes differ: Q " << shape_str(qg) << ", K " << shape_str(kg) << ", V " << shape_str(vg);
    return os.str();
  }
  if (v[1] != k[1]) {
    os << "K and V must have the same number of heads, got K " << shape_str(kg) << ", V " << shape_str(vg);
    return os.str();
  }
  if (k[1] == 0 || q[1] % k[1] != 0) {
    os << "the number of query heads (" << q[1] << ") must be a multiple of the number of key/value heads ("
       << k[1] << ")";
    return os.str();
  }
  if (v[2] != k[2]) {
    os << "K and V must have the same sequence length, got K " << shape_str(kg) << ", V " << shape_str(vg);
    return os.str();
  }
  if (k[3] != q[3]) {
    os << "Q and K must have the same head size, got Q " << shape_str(qg) << ", K " << shape_str(kg);
    if (packed) {
      os << " (head sizes " << q[3] << " and " << k[3] << " with q_num_heads " << q[1] << ", kv_num_heads " << k[1]
         << ")";
    }
    return os.str();
  }
  if (q[3] < 1 || q[3] > kMaxHeadDim || v[3] < 1 || v[3] > kMaxHeadDim) {
    os << "unsupported head size: D = " << q[3] << ", Dv = " << v[3] << "; both must be in 1.." << kMaxHeadDim;
    return os.str();
  }

  p->dtype = to_dtype(in[kInputQ].type);
  p->batch = q[0];
  p->heads_q = q[1];
  p->heads_kv = k[1];
  p->seq_q = q[2];
  p->seq_k = k[2];
  p->head_dim = q[3];
  p->head_dim_v = v[3];
  if (attrs.packed_qkv == 1) {
    // Rows of W = (Hq + 2*Hkv)*D elements; head h of a window starts h*D into it.
    const int64_t row = qg[2];
    for (int64_t* st : {p->q_stride, p->k_stride, p->v_stride}) {
      st[0] = qg[1] * row;
      st[1] = q[3];
      st[2] = row;
    }
  } else {
    strides(q, packed, p->q_stride);
    strides(k, packed, p->k_stride);
    strides(v, packed, p->v_stride);
  }
  strides({q[0], q[1], q[2], v[3]}, packed, p->y_stride);

  // Mask: numpy broadcasting, right-aligned, from rank 2 to 4.
  p->mask_kind = MaskKind::kNone;
  for (int i = 0; i < 4; ++i) p->mask_stride[i] = 0;
  const TensorDesc& m = in[kInputMask];
  if (m.present) {
    if (m.type == ElemType::kBool) {
      p->mask_kind = MaskKind::kBool;
    } else if (m.type == in[kInputQ].type) {
      p->mask_kind = MaskKind::kAdditive;
    } else {
      os << "attn_mask has element type " << elem_type_name(m.type) << "; it must be bool or the type of Q ("
         << elem_type_name(in[kInputQ].type) << ")";
      return os.str();
    }
    const int rank = static_cast<int>(m.shape.size());
    if (rank < kMinMaskRank || rank > kMaxMaskRank) {
      os << "attn_mask must have rank 2 to 4, got shape " << shape_str(m.shape);
      return os.str();
    }
    const int64_t target[4] = {p->batch, p->heads_q, p->seq_q, p->seq_k};
    int64_t stride = 1;
    for (int i = rank - 1; i >= 0; --i) {
      const int t = 4 - rank + i;
      const int64_t d = m.shape[i];
      if (d == target[t]) {
        p->mask_stride[t] = (d == 1) ? 0 : stride;
      } else if (d == 1) {
        p->mask_stride[t] = 0;
      } else {
        os << "attn_mask of shape " << shape_str(m.shape) << " does not broadcast to (B, Hq, Sq, Sk) = "
           << shape_str({target[0], target[1], target[2], target[3]});
        return os.str();
      }
      stride *= d;
    }
  }

  const TensorDesc& kl = in[kInputKeyLengths];
  p->key_lengths_int64 = false;
  if (kl.present) {
    if (kl.type != ElemType::kInt32 && kl.type != ElemType::kInt64) {
      os << "key_lengths has element type " << elem_type_name(kl.type) << "; it must be int32 or int64";
      return os.str();
    }
    if (kl.shape.size() != 1 || kl.shape[0] != p->batch) {
      os << "key_lengths must have shape (B,) = (" << p->batch << "), got " << shape_str(kl.shape);
      return os.str();
    }
    p->key_lengths_int64 = kl.type == ElemType::kInt64;
  }

  const TensorDesc& bias = in[kInputQkvBias];
  if (bias.present) {
    const int64_t width = (p->heads_q + 2 * p->heads_kv) * p->head_dim;
    err = check_qkv_bias_attribute(attrs);
    if (err.empty()) err = check_qkv_bias_type(bias.type, in[kInputQ].type);
    if (!err.empty()) return err;
    if (bias.shape.size() != 1 || bias.shape[0] != width) {
      os << "qkv_bias must have shape ((q_num_heads + 2*kv_num_heads)*D,) = (" << width << ",), got "
         << shape_str(bias.shape);
      return os.str();
    }
  }

  p->scale = attrs.has_scale ? attrs.scale : 1.0f / std::sqrt(static_cast<float>(p->head_dim));
  p->softcap = attrs.softcap;
  p->is_causal = static_cast<int32_t>(attrs.is_causal);
  return std::string();
}

int64_t packed_k_offset(const AttentionAttributes& attrs, const AttentionParams& p) {
  return attrs.packed_qkv == 1 ? p.heads_q * p.head_dim : 0;
}

int64_t packed_v_offset(const AttentionAttributes& attrs, const AttentionParams& p) {
  return attrs.packed_qkv == 1 ? (p.heads_q + p.heads_kv) * p.head_dim : 0;
}

void set_qkv_pointers(const AttentionAttributes& attrs, const void* q, const void* k, const void* v,
                      const void* qkv_bias, AttentionParams* p) {
  const int64_t elem = p->dtype == DType::kFloat32 ? 4 : 2;
  auto at = [elem](const void* base, int64_t offset) -> const void* {
    return base == nullptr ? nullptr : static_cast<const char*>(base) + offset * elem;
  };
  p->q = q;
  p->k = at(k, packed_k_offset(attrs, *p));
  p->v = at(v, packed_v_offset(attrs, *p));
  p->q_bias = qkv_bias;
  p->k_bias = at(qkv_bias, packed_k_offset(attrs, *p));
  p->v_bias = at(qkv_bias, packed_v_offset(attrs, *p));
}

std::string check_key_lengths(const AttentionParams& p) {
  if (p.key_lengths == nullptr) return std::string();
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t len = p.key_lengths_int64 ? static_cast<const int64_t*>(p.key_lengths)[b]
                                            : static_cast<const int32_t*>(p.key_lengths)[b];
    if (len < 0 || len > p.seq_k) {
      Message os;
      os << "key_lengths[" << b << "] = " << len << " is outside 0.." << p.seq_k << " (the key sequence length)";
      return os.str();
    }
  }
  return std::string();
}

}  // namespace opsfuse
