// The library's one exported entry point for ONNX Runtime:
//   so.register_custom_ops_library(opsfuse.get_library_path())
// registers FusedAttention (domain com.opsfuse, version 1) for the CPU and, when built with
// CUDA, the CUDA execution provider, for float32, float16 and bfloat16.
#include <exception>
#include <mutex>
#include <string>

#include "../common/contract.h"
#include "fused_attention_op.h"

namespace {

using opsfuse::ort::Device;
using opsfuse::ort::FusedAttentionOp;

constexpr ONNXTensorElementDataType kValueTypes[] = {
    ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
    ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16,
    ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16,
};

// Op objects live as long as the library: ORT keeps pointers to them in every session.
const FusedAttentionOp kCpuOps[] = {
    FusedAttentionOp(Device::kCpu, kValueTypes[0]),
    FusedAttentionOp(Device::kCpu, kValueTypes[1]),
    FusedAttentionOp(Device::kCpu, kValueTypes[2]),
};
#ifdef OPSFUSE_WITH_CUDA
const FusedAttentionOp kCudaOps[] = {
    FusedAttentionOp(Device::kCuda, kValueTypes[0]),
    FusedAttentionOp(Device::kCuda, kValueTypes[1]),
    FusedAttentionOp(Device::kCuda, kValueTypes[2]),
};
#endif

}  // namespace

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) return nullptr;  // runtime older than the headers: it reports the failed load itself
  Ort::InitApi(api);
  // One domain object per session options; ORT does not take ownership, so keep them alive.
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  OrtCustomOpDomain* domain = nullptr;
  if (OrtStatus* st = api->CreateCustomOpDomain(opsfuse::contract::kDomain, &domain)) return st;
  auto add = [&](const FusedAttentionOp& op) -> OrtStatus* {
    return api->CustomOpDomain_Add(domain, &op);
  };
  for (const auto& op : kCpuOps)
    if (OrtStatus* st = add(op)) return st;
#ifdef OPSFUSE_WITH_CUDA
  for (const auto& op : kCudaOps)
    if (OrtStatus* st = add(op)) return st;
#endif
  return api->AddCustomOpDomain(options, domain);
}
