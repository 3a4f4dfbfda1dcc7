// ORT custom-op type and shape inference for FusedAttention: Y = (B, Hq, Sq, Dv), or for the 3-D
// form (B, Sq, Hq*Dv) with Hq*Dv = q_num_heads * (V's last dimension / kv_num_heads) (packed_qkv = 1:
// q_num_heads * (Q's last dimension / (q_num_heads + 2*kv_num_heads))); element type of Q. Symbolic dimensions carry over, so nodes after the op keep their shapes. Inference never fails
// the model load: where an input shape is unknown the output is left with unknown dimensions,
// and the kernel reports a bad shape with a clear message at run time.
#include <atomic>
#include <string>
#include <vector>

#include "../common/contract.h"
#include "fused_attention_op.h"

namespace opsfuse::ort {
namespace {

struct Dim {
  int64_t value = -1;    // -1: unknown or symbolic
  std::string symbol;    // symbolic name, may be empty
};

// Reads (element type, dims) of one input; false when unavailable.
bool read_input(const OrtApi& api, OrtShapeInferContext* ctx, size_t index, ONNXTensorElementDataType* type,
                std::vector<Dim>* dims) {
  OrtTensorTypeAndShapeInfo* info = nullptr;
  if (OrtStatus* st = api.ShapeInferContext_GetInputTypeShape(ctx, index, &info)) {
    api.ReleaseStatus(st);
    return false;
  }
  bool ok = true;
  size_t rank = 0;
  if (OrtStatus* st = api.GetTensorElementType(info, type)) {
    api.ReleaseStatus(st);
    ok = false;
  }
  if (ok) {
    if (OrtStatus* st = api.GetDimensionsCount(info, &rank)) {
      api.ReleaseStatus(st);
      ok = false;
    }
  }
  if (ok) {
    std::vector<int64_t> values(rank);
    std::vector<const char*> symbols(rank, nullptr);
    OrtStatus* st1 = api.GetDimensions(info, values.data(), rank);
    OrtStatus* st2 = st1 ? nullptr : api.GetSymbolicDimensions(info, symbols.data(), rank);
    if (st1) api.ReleaseStatus(st1);
    if (st2) api.ReleaseStatus(st2);
    ok = st1 == nullptr && st2 == nullptr;
    dims->resize(rank);
    for (size_t i = 0; ok && i < rank; ++i) {
      (*dims)[i].value = values[i];
      if (symbols[i] != nullptr) (*dims)[i].symbol = symbols[i];
    }
  }
  // The context owns `info` (ORT's own C++ wrapper releases its handle without freeing it).
  return ok;
}

// Reads an optional int attribute; 0 (the contract's "absent") when missing or not an int, in
// which case kernel creation reports the problem.
int64_t read_int_attr(const OrtApi& api, OrtShapeInferContext* ctx, const char* name) {
  const OrtOpAttr* attr = nullptr;
  if (OrtStatus* st = api.ShapeInferContext_GetAttribute(ctx, name, &attr)) {
    api.ReleaseStatus(st);
    return 0;
  }
  if (attr == nullptr) return 0;
  int64_t value = 0;
  size_t size = 0;
  if (OrtStatus* st = api.ReadOpAttr(attr, ORT_OP_ATTR_INT, &value, sizeof(value), &size)) {
    api.ReleaseStatus(st);
    return 0;
  }
  return value;
}

}  // namespace

OrtStatusPtr infer_output_shape(const OrtCustomOp*, OrtShapeInferContext* ctx) {
  const OrtApi& api = Ort::GetApi();
  ONNXTensorElementDataType q_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType v_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  std::vector<Dim> q, v;
  if (!read_input(api, ctx, contract::kInputQ, &q_type, &q)) return nullptr;
  const bool have_v = read_input(api, ctx, contract::kInputV, &v_type, &v);

  // ORT reports an input of unknown rank as rank 0; Y's rank (3 or 4) then is unknown too, and
  // the output keeps the element type ORT gave it from the op's declared output type.
  if (q.size() != static_cast<size_t>(contract::kPackedTensorRank) &&
      q.size() != static_cast<size_t>(contract::kTensorRank)) {
    return nullptr;
  }
  std::vector<Dim> y;
  if (q.size() == static_cast<size_t>(contract::kPackedTensorRank)) {
    // 3-D form: (B, Sq) of Q; the last dimension Hq * Dv from V's (B, Sk, Hkv * Dv).
    y.resize(contract::kPackedTensorRank);
    y[0] = q[0];
    y[1] = q[1];
    const int64_t hq = read_int_attr(api, ctx, contract::kAttrQNumHeads);
    const int64_t hkv = read_int_attr(api, ctx, contract::kAttrKvNumHeads);
    if (read_int_attr(api, ctx, contract::kAttrPackedQkv) == 1) {
      // Packed Q/K/V: Y's last dimension is Hq * D with D = W / (Hq + 2*Hkv), W Q's last dimension.
      y[2].value = packed_qkv_output_hidden(q[2].value, hq, hkv);
    } else if (have_v && v.size() == static_cast<size_t>(contract::kPackedTensorRank)) {
      if (hq > 0 && hq == hkv) {
        y[2] = v[2];  // Hq * Dv = V's last dimension, known or symbolic
      } else {
        y[2].value = packed_output_hidden(v[2].value, hq, hkv);
      }
    }
  } else {
    y.resize(contract::kTensorRank);
    y[0] = q[0];
    y[1] = q[1];
    y[2] = q[2];
    if (have_v && v.size() == static_cast<size_t>(contract::kTensorRank)) y[3] = v[3];
  }

  OrtTensorTypeAndShapeInfo* out = nullptr;
  if (OrtStatus* st = api.CreateTensorTypeAndShapeInfo(&out)) return st;
  // A dimension that is neither known nor named gets a fresh symbol: left as a bare -1, ORT
  // would take -1 for a real size and fold Shape(Y) into a -1 that breaks a later Reshape.
  static std::atomic<int64_t> unnamed_counter{0};
  std::vector<int64_t> values;
  std::vector<std::string> names;
  for (const Dim& d : y) {
    values.push_back(d.value);
    names.push_back(d.value < 0 && d.symbol.empty() ? "opsfuse_unk_" + std::to_string(unnamed_counter++)
                                                    : d.symbol);
  }
  std::vector<const char*> symbols;
  for (const std::string& name : names) symbols.push_back(name.c_str());
  OrtStatus* st = api.SetTensorElementType(out, q_type);
  if (st == nullptr) st = api.SetDimensions(out, values.data(), values.size());
  if (st == nullptr) st = api.SetSymbolicDimensions(out, symbols.data(), symbols.size());
  if (st == nullptr) st = api.ShapeInferContext_SetOutputTypeShape(ctx, contract::kOutputY, out);
  api.ReleaseTensorTypeAndShapeInfo(out);
  return st;
}

}  // namespace opsfuse::ort
