#include "fused_attention_op.h"

#include <exception>
#include <functional>
#include <memory>
#include <new>
#include <vector>

#include "../common/contract.h"
#include "../cpu/attention_cpu.h"
#include "../cpu/bias_fold.h"
#ifdef OPSFUSE_WITH_CUDA
#include "../cuda/attention_cuda.h"
#endif

namespace opsfuse::ort {
namespace {

ElemType to_elem_type(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return ElemType::kFloat32;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return ElemType::kFloat16;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return ElemType::kBFloat16;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return ElemType::kBool;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return ElemType::kInt32;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return ElemType::kInt64;
    default: return ElemType::kOther;
  }
}

// Reads an optional float attribute without exceptions. Returns "" or an error.
std::string read_float_attr(const OrtApi& api, const OrtKernelInfo* info, const char* name, bool* present,
                            float* value) {
  *present = false;
  if (OrtStatus* st = api.KernelInfoGetAttribute_float(info, name, value)) {
    api.ReleaseStatus(st);
    int64_t as_int = 0;
    if (OrtStatus* st2 = api.KernelInfoGetAttribute_int64(info, name, &as_int)) {
      api.ReleaseStatus(st2);
      return std::string();  // absent
    }
    return std::string("attribute '") + name + "' must be a float, got an int";
  }
  *present = true;
  return std::string();
}

std::string read_int_attr(const OrtApi& api, const OrtKernelInfo* info, const char* name, int64_t* value) {
  if (OrtStatus* st = api.KernelInfoGetAttribute_int64(info, name, value)) {
    api.ReleaseStatus(st);
    float as_float = 0.0f;
    if (OrtStatus* st2 = api.KernelInfoGetAttribute_float(info, name, &as_float)) {
      api.ReleaseStatus(st2);
      return std::string();  // absent: keep the default
    }
    return std::string("attribute '") + name + "' must be an int, got a float";
  }
  return std::string();
}

std::string node_name_of(const OrtApi& api, const OrtKernelInfo* info) {
  size_t size = 0;
  if (OrtStatus* st = api.KernelInfo_GetNodeName(info, nullptr, &size)) {
    api.ReleaseStatus(st);
    return std::string();
  }
  std::string name(size, '\0');
  if (OrtStatus* st = api.KernelInfo_GetNodeName(info, name.data(), &size)) {
    api.ReleaseStatus(st);
    return std::string();
  }
  if (!name.empty() && name.back() == '\0') name.pop_back();
  return name;
}

}  // namespace

std::string node_message(const std::string& node_name, const std::string& what) {
  std::string msg = std::string(contract::kOpName) + " node '" + node_name + "': " + what;
  return msg;
}

// ---------------------------------------------------------------------------------------------
// Op object: what ORT asks before creating kernels.

FusedAttentionOp::FusedAttentionOp(Device device, ONNXTensorElementDataType value_type)
    : device_(device), value_type_(value_type) {
  // CustomOpBase detects a static InferOutputShape with the C++ context; ours needs input element
  // types, which only the C context gives, so install the C callback directly.
  OrtCustomOp::InferOutputShapeFn = &infer_output_shape;
}

const char* FusedAttentionOp::GetName() const { return contract::kOpName; }

const char* FusedAttentionOp::GetExecutionProviderType() const {
  return device_ == Device::kCuda ? "CUDAExecutionProvider" : "CPUExecutionProvider";
}

size_t FusedAttentionOp::GetInputTypeCount() const { return contract::kNumInputs; }

ONNXTensorElementDataType FusedAttentionOp::GetInputType(size_t index) const {
  // Q, K, V carry the kernel's type; the mask (bool or T) and key_lengths (int32 or int64) are
  // checked at run time with a clear message.
  return index < static_cast<size_t>(contract::kNumRequiredInputs) ? value_type_
                                                                    : ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
}

OrtCustomOpInputOutputCharacteristic FusedAttentionOp::GetInputCharacteristic(size_t index) const {
  return index < static_cast<size_t>(contract::kNumRequiredInputs) ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
}

OrtMemType FusedAttentionOp::GetInputMemoryType(size_t) const { return OrtMemTypeDefault; }

size_t FusedAttentionOp::GetOutputTypeCount() const { return 1; }

ONNXTensorElementDataType FusedAttentionOp::GetOutputType(size_t) const { return value_type_; }

OrtStatusPtr FusedAttentionOp::CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
  try {
    NodeConfig config;
    config.node_name = node_name_of(api, info);
    std::string err = read_float_attr(api, info, contract::kAttrScale, &config.attrs.has_scale, &config.attrs.scale);
    bool has_softcap = false;
    if (err.empty()) err = read_float_attr(api, info, contract::kAttrSoftcap, &has_softcap, &config.attrs.softcap);
    if (err.empty()) err = read_int_attr(api, info, contract::kAttrIsCausal, &config.attrs.is_causal);
    if (err.empty()) err = read_int_attr(api, info, contract::kAttrQNumHeads, &config.attrs.q_num_heads);
    if (err.empty()) err = read_int_attr(api, info, contract::kAttrKvNumHeads, &config.attrs.kv_num_heads);
    if (err.empty()) err = read_int_attr(api, info, contract::kAttrPackedQkv, &config.attrs.packed_qkv);
    if (err.empty()) err = check_attributes(config.attrs);
    if (!err.empty()) return api.CreateStatus(ORT_INVALID_ARGUMENT, node_message(config.node_name, err).c_str());

    // The EP's allocator: the CUDA kernel's scratch, and the CPU kernel's biased Q/K/V copies.
    OrtAllocator* allocator = nullptr;
    if (OrtStatus* st = api.KernelInfoGetAllocator(info, OrtMemTypeDefault, &allocator)) return st;
    *kernel = new FusedAttentionKernel(device_, std::move(config), allocator);
    return nullptr;
  } catch (const std::exception& e) {
    return api.CreateStatus(ORT_FAIL, (std::string(contract::kOpName) + ": " + e.what()).c_str());
  } catch (...) {
    return api.CreateStatus(ORT_FAIL, (std::string(contract::kOpName) + ": unknown error").c_str());
  }
}

// ---------------------------------------------------------------------------------------------
// Kernel: one per node.

FusedAttentionKernel::~FusedAttentionKernel() {
  if (scratch_allocator_ != nullptr) Ort::GetApi().ReleaseAllocator(scratch_allocator_);
}

OrtStatusPtr FusedAttentionKernel::error(OrtErrorCode code, const std::string& what) const {
  return Ort::GetApi().CreateStatus(code, node_message(config_.node_name, what).c_str());
}

OrtStatusPtr FusedAttentionKernel::ComputeV2(OrtKernelContext* context) {
  try {
    Ort::KernelContext ctx(context);
    const size_t input_count = ctx.GetInputCount();
    TensorDesc desc[contract::kNumInputs];
    const void* data[contract::kNumInputs] = {};
    for (size_t i = 0; i < static_cast<size_t>(contract::kNumInputs) && i < input_count; ++i) {
      Ort::ConstValue value = ctx.GetInput(i);
      if (!value) continue;  // optional input given as the empty name
      auto info = value.GetTensorTypeAndShapeInfo();
      desc[i].present = true;
      desc[i].type = to_elem_type(info.GetElementType());
      desc[i].shape = info.GetShape();
      data[i] = value.GetTensorRawData();
    }
    AttentionParams p;
    std::string err = check_inputs_and_fill(desc, config_.attrs, &p);
    if (!err.empty()) return error(ORT_INVALID_ARGUMENT, err);
    set_qkv_pointers(config_.attrs, data[contract::kInputQ], data[contract::kInputK], data[contract::kInputV],
                     data[contract::kInputQkvBias], &p);
    p.mask = data[contract::kInputMask];
    p.key_lengths = data[contract::kInputKeyLengths];

    std::vector<int64_t> out_shape = output_shape(p, desc[contract::kInputQ].shape.size());
    Ort::UnownedValue y = ctx.GetOutput(contract::kOutputY, out_shape);
    p.y = y.GetTensorMutableRawData();
    if (p.batch == 0 || p.heads_q == 0 || p.seq_q == 0 || p.head_dim_v == 0) return nullptr;  // empty output

    return device_ == Device::kCuda ? compute_cuda(ctx, p) : compute_cpu(ctx, p);
  } catch (const Ort::Exception& e) {
    return error(e.GetOrtErrorCode(), e.what());
  } catch (const std::bad_alloc&) {
    return error(ORT_FAIL, "out of memory");
  } catch (const std::exception& e) {
    return error(ORT_FAIL, e.what());
  } catch (...) {
    return error(ORT_FAIL, "unknown error");
  }
}

OrtStatusPtr FusedAttentionKernel::compute_cpu(Ort::KernelContext& ctx, const AttentionParams& p) {
  std::string err = check_key_lengths(p);
  if (!err.empty()) return error(ORT_INVALID_ARGUMENT, err);

  // Work items go to the session's intra-op thread pool, so the session's thread setting holds.
  cpu::ParallelFor parallel_for = [&ctx](int64_t n, const std::function<void(int64_t)>& body) {
    auto trampoline = [](void* user, size_t i) {
      (*static_cast<const std::function<void(int64_t)>*>(user))(static_cast<int64_t>(i));
    };
    ctx.ParallelFor(trampoline, static_cast<size_t>(n), 0, const_cast<std::function<void(int64_t)>*>(&body));
  };
  // Biases (qkv_bias): the kernel reads biased copies, in a block of the EP's allocator.
  AttentionParams run = p;
  std::unique_ptr<void, std::function<void(void*)>> folded(nullptr, [this](void* ptr) {
    scratch_allocator_->Free(scratch_allocator_, ptr);
  });
  if (has_bias(p)) {
    folded.reset(scratch_allocator_->Alloc(scratch_allocator_, cpu::folded_bytes(p)));
    if (folded == nullptr) return error(ORT_FAIL, "out of memory for the biased Q/K/V copies");
    run = cpu::fold_biases(p, folded.get(), parallel_for);
  }
  Status st = cpu::run_attention(run, parallel_for);
  if (st != Status::kOk) return error(ORT_FAIL, std::string("CPU kernel failed: ") + status_name(st));
  return nullptr;
}

OrtStatusPtr FusedAttentionKernel::compute_cuda(Ort::KernelContext& ctx, const AttentionParams& p) {
#ifdef OPSFUSE_WITH_CUDA
  // Scratch comes from ORT's allocator for this EP, asked for inside the launch only when its plan
  // needs some (one plan per call); freeing right after the enqueue is safe because every later
  // user of the block runs on the same compute stream.
  struct Blocks {
    OrtAllocator* allocator;
    void* ptr[2];
    int n;
  } blocks{scratch_allocator_, {nullptr, nullptr}, 0};
  auto alloc = [](void* ctx, size_t bytes) -> void* {
    Blocks& b = *static_cast<Blocks*>(ctx);
    if (b.n == 2) return nullptr;
    void* ptr = b.allocator->Alloc(b.allocator, bytes);
    if (ptr != nullptr) b.ptr[b.n++] = ptr;
    return ptr;
  };
  Status st = cuda::launch(p, alloc, &blocks, ctx.GetGPUComputeStream());
  for (int i = 0; i < blocks.n; ++i) scratch_allocator_->Free(scratch_allocator_, blocks.ptr[i]);
  if (st != Status::kOk) {
    const OrtErrorCode code = st == Status::kInvalidArgument ? ORT_INVALID_ARGUMENT
                              : st == Status::kUnsupported   ? ORT_NOT_IMPLEMENTED
                                                             : ORT_FAIL;
    return error(code, std::string("CUDA kernel: ") + cuda::last_error_message());
  }
  return nullptr;
#else
  (void)ctx;
  (void)p;
  return error(ORT_NOT_IMPLEMENTED, "this build of opsfuse has no CUDA kernel");
#endif
}

}  // namespace opsfuse::ort
