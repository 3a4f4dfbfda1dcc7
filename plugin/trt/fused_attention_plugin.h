// FusedAttention as a TensorRT IPluginV3 (TensorRT 10.x and 11.x): one object exposing the core,
// build and runtime capabilities. A thin adapter: validation and params filling come from
// plugin/common/shape_check.h, the computation from the CUDA launcher the ONNX Runtime op uses
// (plugin/cuda/attention_cuda.h). Attribute values arrive already validated by the creator.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "NvInferRuntime.h"
#include "common/shape_check.h"

namespace opsfuse::trt {

class FusedAttentionPlugin final : public nvinfer1::IPluginV3,
                                   public nvinfer1::IPluginV3OneCore,
                                   public nvinfer1::IPluginV3OneBuild,
                                   public nvinfer1::IPluginV3OneRuntime {
 public:
  // `node_name` names the layer (the ONNX node) in error messages. `workspace_budget`: the
  // workspace bytes the engine reserved (serialized field "workspace_bytes"), -1 when unknown.
  FusedAttentionPlugin(std::string node_name, const AttentionAttributes& attrs, int64_t workspace_budget = -1);
  FusedAttentionPlugin(const FusedAttentionPlugin& other);
  FusedAttentionPlugin& operator=(const FusedAttentionPlugin&) = delete;
  ~FusedAttentionPlugin() override = default;

  const AttentionAttributes& attributes() const { return attrs_; }

  // --- IPluginV3
  nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;
  nvinfer1::IPluginV3* clone() noexcept override;

  // --- IPluginV3OneCore
  const char* getPluginName() const noexcept override;
  const char* getPluginVersion() const noexcept override;
  const char* getPluginNamespace() const noexcept override;

  // --- IPluginV3OneBuild
  int32_t getNbOutputs() const noexcept override;
  int32_t getOutputDataTypes(nvinfer1::DataType* output_types, int32_t nb_outputs,
                             const nvinfer1::DataType* input_types, int32_t nb_inputs) const noexcept override;
  int32_t getOutputShapes(const nvinfer1::DimsExprs* inputs, int32_t nb_inputs,
                          const nvinfer1::DimsExprs* shape_inputs, int32_t nb_shape_inputs,
                          nvinfer1::DimsExprs* outputs, int32_t nb_outputs,
                          nvinfer1::IExprBuilder& expr_builder) noexcept override;
  bool supportsFormatCombination(int32_t pos, const nvinfer1::DynamicPluginTensorDesc* in_out, int32_t nb_inputs,
                                 int32_t nb_outputs) noexcept override;
  int32_t configurePlugin(const nvinfer1::DynamicPluginTensorDesc* in, int32_t nb_inputs,
                          const nvinfer1::DynamicPluginTensorDesc* out, int32_t nb_outputs) noexcept override;
  size_t getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc* inputs, int32_t nb_inputs,
                          const nvinfer1::DynamicPluginTensorDesc* outputs,
                          int32_t nb_outputs) const noexcept override;
  const char* getTimingCacheID() noexcept override;
  const char* getMetadataString() noexcept override;

  // --- IPluginV3OneRuntime
  int32_t onShapeChange(const nvinfer1::PluginTensorDesc* in, int32_t nb_inputs, const nvinfer1::PluginTensorDesc* out,
                        int32_t nb_outputs) noexcept override;
  int32_t enqueue(const nvinfer1::PluginTensorDesc* input_desc, const nvinfer1::PluginTensorDesc* output_desc,
                  const void* const* inputs, void* const* outputs, void* workspace,
                  cudaStream_t stream) noexcept override;
  nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
  const nvinfer1::PluginFieldCollection* getFieldsToSerialize() noexcept override;

 private:
  // "FusedAttention node '<name>': <what>", reported as an error through TensorRT's logger.
  void report(const std::string& what) const noexcept;
  // Checks the input count and the rank of every input; "" when valid.
  std::string check_io_count(int32_t nb_inputs, int32_t nb_outputs) const;
  // Y's dimension expressions for the 4-D form (B, Hq, Sq, Dv) and the 3-D form (B, Sq, Hq*Dv),
  // after the checks visible at build time; "" or the problem.
  std::string output_shape_4d(const nvinfer1::DimsExprs& q, const nvinfer1::DimsExprs& k,
                              const nvinfer1::DimsExprs& v, nvinfer1::DimsExprs* y) const;
  std::string packed_output_shape(const nvinfer1::DimsExprs& q, const nvinfer1::DimsExprs& k,
                                  const nvinfer1::DimsExprs& v, nvinfer1::IExprBuilder& expr_builder,
                                  nvinfer1::DimsExprs* y) const;
  // packed_qkv = 1: Q, K, V each (B, S, W) with W = (Hq + 2*Hkv)*D; Y = (B, S, Hq * W / (Hq + 2*Hkv)).
  std::string packed_qkv_output_shape(const nvinfer1::DimsExprs& q, const nvinfer1::DimsExprs& k,
                                      const nvinfer1::DimsExprs& v, nvinfer1::IExprBuilder& expr_builder,
                                      nvinfer1::DimsExprs* y) const;

  // The optional qkv_bias (input 5) at build time: packed_qkv = 1, rank 1, Q's packed width.
  std::string check_qkv_bias_expr(const nvinfer1::DimsExprs& bias, const nvinfer1::DimsExprs& q) const;

  std::string node_name_;
  AttentionAttributes attrs_;
  // Number of inputs (3 to 6) seen by configurePlugin / onShapeChange; enqueue does not receive it.
  int32_t nb_inputs_ = 0;
  // Largest getWorkspaceSize() answer (build phase), or the serialized one (runtime); -1 unknown.
  // enqueue refuses a launch needing more than this instead of overrunning TensorRT's buffer.
  mutable int64_t workspace_budget_ = -1;

  // Storage behind getFieldsToSerialize(); rebuilt on each call.
  float field_scale_ = 0.0f;
  int32_t field_is_causal_ = 0;
  float field_softcap_ = 0.0f;
  int32_t field_q_num_heads_ = 0;
  int32_t field_kv_num_heads_ = 0;
  int32_t field_packed_qkv_ = 0;
  int64_t field_workspace_ = 0;
  std::vector<nvinfer1::PluginField> fields_;
  nvinfer1::PluginFieldCollection field_collection_{};
  std::string metadata_;
};

// Name of the internal serialized field holding the engine's workspace reservation (not an
// attribute: the creator does not advertise it).
inline constexpr const char* kFieldWorkspaceBytes = "workspace_bytes";

// DataType -> the element type of shape_check.h (kOther for anything the contract does not know).
ElemType to_elem_type(nvinfer1::DataType t);

}  // namespace opsfuse::trt
