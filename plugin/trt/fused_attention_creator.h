// The IPluginCreatorV3One for FusedAttention (name "FusedAttention", version "1", namespace
// "com.opsfuse"). Reads and validates the attributes once; plugins it creates trust them.
#pragma once

#include <string>
#include <vector>

#include "NvInferRuntime.h"
#include "common/shape_check.h"

namespace opsfuse::trt {

class FusedAttentionCreator final : public nvinfer1::IPluginCreatorV3One {
 public:
  FusedAttentionCreator();
  ~FusedAttentionCreator() override = default;

  nvinfer1::IPluginV3* createPlugin(const char* name, const nvinfer1::PluginFieldCollection* fc,
                                    nvinfer1::TensorRTPhase phase) noexcept override;
  const nvinfer1::PluginFieldCollection* getFieldNames() noexcept override;
  const char* getPluginName() const noexcept override;
  const char* getPluginVersion() const noexcept override;
  const char* getPluginNamespace() const noexcept override;

 private:
  std::vector<nvinfer1::PluginField> field_names_;
  nvinfer1::PluginFieldCollection field_collection_{};
};

// Reads the plugin fields into attributes and validates them (check_attributes). Returns "" or
// one sentence naming the problem. Absent fields keep their defaults; an absent "scale" means
// 1/sqrt(D). "plugin_version" / "plugin_namespace" (the ONNX node's lookup keys) are ignored.
// `workspace_budget` receives the internal "workspace_bytes" field a serialized plugin carries
// (-1 when absent).
std::string parse_fields(const nvinfer1::PluginFieldCollection* fc, AttentionAttributes* attrs,
                         int64_t* workspace_budget);

}  // namespace opsfuse::trt
