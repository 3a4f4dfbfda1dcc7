#include "fused_attention_creator.h"

#include <cstring>
#include <exception>
#include <sstream>

#include "common/contract.h"
#include "fused_attention_plugin.h"
#include "trt_runtime.h"

namespace opsfuse::trt {
namespace {

using nvinfer1::PluginField;
using nvinfer1::PluginFieldType;

const char* field_type_name(PluginFieldType t) {
  switch (t) {
    case PluginFieldType::kFLOAT16: return "float16";
    case PluginFieldType::kFLOAT32: return "float32";
    case PluginFieldType::kFLOAT64: return "float64";
    case PluginFieldType::kINT8: return "int8";
    case PluginFieldType::kINT16: return "int16";
    case PluginFieldType::kINT32: return "int32";
    case PluginFieldType::kINT64: return "int64";
    case PluginFieldType::kCHAR: return "char (string)";
    default: return "an unsupported field type";
  }
}

// One float: float32 as the ONNX parser passes FLOAT attributes; float64 accepted for callers
// that build fields from Python floats.
std::string read_float(const PluginField& f, float* out) {
  if (f.data == nullptr || f.length != 1) {
    return std::string("field '") + f.name + "' must hold exactly one value, got " + std::to_string(f.length);
  }
  if (f.type == PluginFieldType::kFLOAT32) {
    std::memcpy(out, f.data, sizeof(float));
  } else if (f.type == PluginFieldType::kFLOAT64) {
    double d = 0.0;
    std::memcpy(&d, f.data, sizeof(double));
    *out = static_cast<float>(d);
  } else {
    return std::string("field '") + f.name + "' must be float32, got " + field_type_name(f.type);
  }
  return std::string();
}

// One integer: int32 as the ONNX parser passes INT attributes; int64 and int8 accepted.
std::string read_int(const PluginField& f, int64_t* out) {
  if (f.data == nullptr || f.length != 1) {
    return std::string("field '") + f.name + "' must hold exactly one value, got " + std::to_string(f.length);
  }
  if (f.type == PluginFieldType::kINT32) {
    int32_t v = 0;
    std::memcpy(&v, f.data, sizeof(v));
    *out = v;
  } else if (f.type == PluginFieldType::kINT64) {
    int64_t v = 0;
    std::memcpy(&v, f.data, sizeof(v));
    *out = v;
  } else if (f.type == PluginFieldType::kINT8) {
    int8_t v = 0;
    std::memcpy(&v, f.data, sizeof(v));
    *out = v;
  } else {
    return std::string("field '") + f.name + "' must be int32, got " + field_type_name(f.type);
  }
  return std::string();
}

}  // namespace

std::string parse_fields(const nvinfer1::PluginFieldCollection* fc, AttentionAttributes* attrs,
                         int64_t* workspace_budget) {
  *attrs = AttentionAttributes();
  *workspace_budget = -1;
  attrs->is_causal = contract::kDefaultIsCausal;
  attrs->softcap = contract::kDefaultSoftcap;
  if (fc == nullptr) return std::string();
  if (fc->nbFields < 0 || (fc->nbFields > 0 && fc->fields == nullptr)) return "malformed plugin field collection";
  for (int32_t i = 0; i < fc->nbFields; ++i) {
    const PluginField& f = fc->fields[i];
    if (f.name == nullptr) return "a plugin field has no name";
    std::string err;
    if (std::strcmp(f.name, contract::kAttrScale) == 0) {
      err = read_float(f, &attrs->scale);
      attrs->has_scale = err.empty();
    } else if (std::strcmp(f.name, contract::kAttrIsCausal) == 0) {
      err = read_int(f, &attrs->is_causal);
    } else if (std::strcmp(f.name, contract::kAttrSoftcap) == 0) {
      err = read_float(f, &attrs->softcap);
    } else if (std::strcmp(f.name, contract::kAttrQNumHeads) == 0) {
      err = read_int(f, &attrs->q_num_heads);
    } else if (std::strcmp(f.name, contract::kAttrKvNumHeads) == 0) {
      err = read_int(f, &attrs->kv_num_heads);
    } else if (std::strcmp(f.name, contract::kAttrPackedQkv) == 0) {
      err = read_int(f, &attrs->packed_qkv);
    } else if (std::strcmp(f.name, kFieldWorkspaceBytes) == 0) {
      err = read_int(f, workspace_budget);
      if (err.empty() && *workspace_budget < 0) err = "field 'workspace_bytes' must be >= 0";
    } else if (std::strcmp(f.name, "plugin_version") == 0 || std::strcmp(f.name, "plugin_namespace") == 0) {
      continue;  // lookup keys of the ONNX node, not attributes of the op
    } else {
      err = std::string("unknown field '") + f.name +
            "'; FusedAttention takes scale, is_causal, softcap, q_num_heads, kv_num_heads and packed_qkv";
    }
    if (!err.empty()) return err;
  }
  return check_attributes(*attrs);
}

FusedAttentionCreator::FusedAttentionCreator() {
  // What the ONNX parser reads from the node (INT -> int32, FLOAT -> float32). All optional.
  field_names_.emplace_back(contract::kAttrScale, nullptr, PluginFieldType::kFLOAT32, 1);
  field_names_.emplace_back(contract::kAttrIsCausal, nullptr, PluginFieldType::kINT32, 1);
  field_names_.emplace_back(contract::kAttrSoftcap, nullptr, PluginFieldType::kFLOAT32, 1);
  // Head counts of the 3-D form (B, S, H*D); required with 3-D inputs.
  field_names_.emplace_back(contract::kAttrQNumHeads, nullptr, PluginFieldType::kINT32, 1);
  field_names_.emplace_back(contract::kAttrKvNumHeads, nullptr, PluginFieldType::kINT32, 1);
  // 1: Q, K, V are each the packed (B, S, (Hq + 2*Hkv)*D) projection (3-D form only).
  field_names_.emplace_back(contract::kAttrPackedQkv, nullptr, PluginFieldType::kINT32, 1);
  field_collection_.nbFields = static_cast<int32_t>(field_names_.size());
  field_collection_.fields = field_names_.data();
}

nvinfer1::IPluginV3* FusedAttentionCreator::createPlugin(const char* name, const nvinfer1::PluginFieldCollection* fc,
                                                         nvinfer1::TensorRTPhase) noexcept {
  const std::string node = name ? name : "";
  try {
    AttentionAttributes attrs;
    int64_t workspace_budget = -1;
    const std::string err = parse_fields(fc, &attrs, &workspace_budget);
    if (!err.empty()) {
      log_error(std::string(contract::kOpName) + " node '" + node + "': " + err);
      return nullptr;
    }
    return new FusedAttentionPlugin(node, attrs, workspace_budget);
  } catch (const std::exception& e) {
    log_error(std::string(contract::kOpName) + " node '" + node + "': createPlugin failed: " + e.what());
  } catch (...) {
    log_error(std::string(contract::kOpName) + " node '" + node + "': createPlugin failed");
  }
  return nullptr;
}

const nvinfer1::PluginFieldCollection* FusedAttentionCreator::getFieldNames() noexcept { return &field_collection_; }
const char* FusedAttentionCreator::getPluginName() const noexcept { return contract::kOpName; }
const char* FusedAttentionCreator::getPluginVersion() const noexcept { return contract::kTrtPluginVersion; }
const char* FusedAttentionCreator::getPluginNamespace() const noexcept { return contract::kTrtPluginNamespace; }

}  // namespace opsfuse::trt
