// FusedAttention as an ONNX Runtime custom op. One op object per (execution provider, element
// type): ORT selects the kernel by Q's type, and every object shares the op name, the domain and
// the type/shape inference. All entry points return OrtStatus; nothing throws across the C ABI.
#pragma once

#include <string>

#include "../common/shape_check.h"
#include "ort_api.h"

namespace opsfuse::ort {

enum class Device { kCpu, kCuda };

// Attribute values and node name, read and validated once when ORT creates the kernel.
struct NodeConfig {
  std::string node_name;
  AttentionAttributes attrs;
};

class FusedAttentionKernel {
 public:
  FusedAttentionKernel(Device device, NodeConfig config, OrtAllocator* scratch_allocator)
      : device_(device), config_(std::move(config)), scratch_allocator_(scratch_allocator) {}
  ~FusedAttentionKernel();
  OrtStatusPtr ComputeV2(OrtKernelContext* context);

 private:
  OrtStatusPtr compute_cpu(Ort::KernelContext& ctx, const AttentionParams& p);
  OrtStatusPtr compute_cuda(Ort::KernelContext& ctx, const AttentionParams& p);
  OrtStatusPtr error(OrtErrorCode code, const std::string& what) const;

  Device device_;
  NodeConfig config_;
  OrtAllocator* scratch_allocator_;  // the EP's: CUDA scratch space, the CPU kernel's biased Q/K/V copies
};

struct FusedAttentionOp : Ort::CustomOpBase<FusedAttentionOp, FusedAttentionKernel, /*WithStatus=*/true> {
  FusedAttentionOp(Device device, ONNXTensorElementDataType value_type);

  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const;
  const char* GetName() const;
  const char* GetExecutionProviderType() const;
  size_t GetInputTypeCount() const;
  ONNXTensorElementDataType GetInputType(size_t index) const;
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const;
  OrtMemType GetInputMemoryType(size_t index) const;
  size_t GetOutputTypeCount() const;
  ONNXTensorElementDataType GetOutputType(size_t index) const;

 private:
  Device device_;
  ONNXTensorElementDataType value_type_;
};

// ORT's custom-op shape inference: Y = (B, Hq, Sq, Dv), or (B, Sq, Hq*Dv) for the 3-D form, with
// Q's element type.
OrtStatusPtr infer_output_shape(const OrtCustomOp* op, OrtShapeInferContext* ctx);

// "FusedAttention node 'name': what" — the prefix of every message this library returns.
std::string node_message(const std::string& node_name, const std::string& what);

}  // namespace opsfuse::ort
