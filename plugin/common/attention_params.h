// The one parameter struct shared by every kernel (CPU, CUDA) and every front end (ORT op,
// TensorRT plugin, pybind11 module). Plain data: pointers, sizes, element strides, attributes.
// Front ends fill it through shape_check.h, which validates shapes and computes broadcast
// strides in one place.
#pragma once

#include <cstdint>

namespace opsfuse {

enum class DType : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };
enum class MaskKind : int32_t { kNone = 0, kBool = 1, kAdditive = 2 };

// Result of a launcher or validation step. Never thrown across a library boundary.
enum class Status : int32_t {
  kOk = 0,
  kInvalidArgument = 1,  // shapes, attributes or values outside the contract
  kUnsupported = 2,      // inside the contract but not built / not implemented for this device
  kDeviceError = 3,      // a CUDA call or launch failed
};

struct AttentionParams {
  // Device or host pointers, depending on the kernel. Q/K/V/Y share the element type `dtype`.
  const void* q = nullptr;  // (B, Hq, Sq, D)
  const void* k = nullptr;  // (B, Hkv, Sk, D)
  const void* v = nullptr;  // (B, Hkv, Sk, Dv)
  void* y = nullptr;        // (B, Hq, Sq, Dv)
  const void* mask = nullptr;         // bool (1 byte) or `dtype`; see mask_kind / mask_stride
  const void* key_lengths = nullptr;  // (B,) int32 or int64, or null
  bool key_lengths_int64 = false;
  // Biases of `dtype` added to Q, K, V as they are read (null: none): q_bias (Hq*D,), k_bias
  // (Hkv*D,), v_bias (Hkv*Dv,), element h*D + d for head h, column d. The ONNX front ends set
  // them from the packed input qkv_bias (set_qkv_pointers); the binding takes them one by one.
  const void* q_bias = nullptr;
  const void* k_bias = nullptr;
  const void* v_bias = nullptr;

  DType dtype = DType::kFloat32;
  MaskKind mask_kind = MaskKind::kNone;

  int64_t batch = 0;
  int64_t heads_q = 0;
  int64_t heads_kv = 0;  // heads_q % heads_kv == 0; query head h reads kv head h / (Hq / Hkv)
  int64_t seq_q = 0;
  int64_t seq_k = 0;
  int64_t head_dim = 0;    // D
  int64_t head_dim_v = 0;  // Dv

  // Element strides of (batch, head, sequence); the last dimension is contiguous.
  int64_t q_stride[3] = {0, 0, 0};
  int64_t k_stride[3] = {0, 0, 0};
  int64_t v_stride[3] = {0, 0, 0};
  int64_t y_stride[3] = {0, 0, 0};
  // Element strides of the mask viewed as (B, Hq, Sq, Sk); 0 where the mask broadcasts.
  int64_t mask_stride[4] = {0, 0, 0, 0};

  float scale = 1.0f;    // multiplies Q.K^T (already resolved from the default)
  float softcap = 0.0f;  // > 0: s <- softcap * tanh(s / softcap), before the mask
  int32_t is_causal = 0;
};

inline bool has_bias(const AttentionParams& p) {
  return p.q_bias != nullptr || p.k_bias != nullptr || p.v_bias != nullptr;
}

inline const char* status_name(Status s) {
  switch (s) {
    case Status::kOk: return "ok";
    case Status::kInvalidArgument: return "invalid argument";
    case Status::kUnsupported: return "unsupported";
    case Status::kDeviceError: return "device error";
  }
  return "unknown status";
}

}  // namespace opsfuse
