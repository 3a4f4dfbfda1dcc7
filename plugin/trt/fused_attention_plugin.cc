#include "fused_attention_plugin.h"

#include <algorithm>
#include <exception>
#include <new>
#include <sstream>

#include "common/contract.h"
#include "cuda/attention_cuda.h"
#include "trt_runtime.h"

namespace opsfuse::trt {

using nvinfer1::DataType;
using nvinfer1::DimsExprs;
using nvinfer1::DynamicPluginTensorDesc;
using nvinfer1::IDimensionExpr;
using nvinfer1::PluginTensorDesc;
using nvinfer1::TensorFormat;

ElemType to_elem_type(DataType t) {
  switch (t) {
    case DataType::kFLOAT: return ElemType::kFloat32;
    case DataType::kHALF: return ElemType::kFloat16;
    case DataType::kBF16: return ElemType::kBFloat16;
    case DataType::kBOOL: return ElemType::kBool;
    case DataType::kINT32: return ElemType::kInt32;
    case DataType::kINT64: return ElemType::kInt64;
    default: return ElemType::kOther;
  }
}

namespace {

bool is_value_type(DataType t) { return t == DataType::kFLOAT || t == DataType::kHALF || t == DataType::kBF16; }

// Fills the TensorDescs of shape_check.h (one per contract input; those past nb_inputs absent)
// from TensorRT's per-input dims and types.
template <typename GetDims, typename GetType>
void make_descs(int32_t nb_inputs, GetDims dims_of, GetType type_of, TensorDesc (&descs)[contract::kNumInputs]) {
  for (int32_t i = 0; i < contract::kNumInputs; ++i) {
    descs[i] = TensorDesc();
    if (i >= nb_inputs) continue;
    const nvinfer1::Dims& d = dims_of(i);
    descs[i].present = true;
    descs[i].type = to_elem_type(type_of(i));
    descs[i].shape.assign(d.d, d.d + std::max<int32_t>(0, std::min<int32_t>(d.nbDims, nvinfer1::Dims::MAX_DIMS)));
  }
}

// Both expressions are build-time constants with different values.
bool known_to_differ(const IDimensionExpr* a, const IDimensionExpr* b) {
  return a->isConstant() && b->isConstant() && a->getConstantValue() != b->getConstantValue();
}

// The expression's value when it is a build-time constant, else -1.
int64_t constant_or_unknown(const IDimensionExpr* e) {
  return e->isConstant() ? static_cast<int64_t>(e->getConstantValue()) : -1;
}

// Q, K and V all rank 4 (B, H, S, D) or all rank 3 (B, S, H*D); "" or the problem.
std::string check_ranks(int32_t q, int32_t k, int32_t v) {
  if (q != contract::kTensorRank && q != contract::kPackedTensorRank) {
    return "input Q must have rank 4 (batch, heads, sequence, head size) or rank 3 (batch, sequence, "
           "heads*head size), got rank " + std::to_string(q);
  }
  if (k != q || v != q) {
    return "Q, K and V must all have rank 4 (B, H, S, D) or all rank 3 (B, S, H*D), got ranks " +
           std::to_string(q) + ", " + std::to_string(k) + ", " + std::to_string(v);
  }
  return std::string();
}

std::string qkv_bias_rank_error(int32_t rank) {
  return "qkv_bias must have shape ((q_num_heads + 2*kv_num_heads)*D,), got rank " + std::to_string(rank);
}

std::string fmt_float(float v) {
  std::ostringstream os;
  os.precision(9);
  os << v;
  return os.str();
}

}  // namespace

FusedAttentionPlugin::FusedAttentionPlugin(std::string node_name, const AttentionAttributes& attrs,
                                           int64_t workspace_budget)
    : node_name_(std::move(node_name)), attrs_(attrs), workspace_budget_(workspace_budget) {}

FusedAttentionPlugin::FusedAttentionPlugin(const FusedAttentionPlugin& other)
    : nvinfer1::IPluginV3(other),
      nvinfer1::IPluginV3OneCore(other),
      nvinfer1::IPluginV3OneBuild(other),
      nvinfer1::IPluginV3OneRuntime(other),
      node_name_(other.node_name_),
      attrs_(other.attrs_),
      nb_inputs_(other.nb_inputs_),
      workspace_budget_(other.workspace_budget_) {}

void FusedAttentionPlugin::report(const std::string& what) const noexcept {
  try {
    log_error(std::string(contract::kOpName) + " node '" + node_name_ + "': " + what);
  } catch (...) {
  }
}

std::string FusedAttentionPlugin::check_io_count(int32_t nb_inputs, int32_t nb_outputs) const {
  std::ostringstream os;
  if (nb_inputs < contract::kNumRequiredInputs || nb_inputs > contract::kNumInputs) {
    os << "expects 3 to 6 inputs (Q, K, V, optional attn_mask, optional key_lengths, optional qkv_bias), got "
       << nb_inputs;
  } else if (nb_outputs != 1) {
    os << "has exactly one output (Y), got " << nb_outputs;
  }
  return os.str();
}

// ---------------------------------------------------------------- IPluginV3

nvinfer1::IPluginCapability* FusedAttentionPlugin::getCapabilityInterface(
    nvinfer1::PluginCapabilityType type) noexcept {
  try {
    switch (type) {
      case nvinfer1::PluginCapabilityType::kCORE: return static_cast<nvinfer1::IPluginV3OneCore*>(this);
      case nvinfer1::PluginCapabilityType::kBUILD: return static_cast<nvinfer1::IPluginV3OneBuild*>(this);
      case nvinfer1::PluginCapabilityType::kRUNTIME: return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
    }
    report("unknown plugin capability type " + std::to_string(static_cast<int>(type)));
  } catch (...) {
  }
  return nullptr;
}

nvinfer1::IPluginV3* FusedAttentionPlugin::clone() noexcept {
  try {
    return new FusedAttentionPlugin(*this);
  } catch (const std::exception& e) {
    report(std::string("clone failed: ") + e.what());
  } catch (...) {
    report("clone failed");
  }
  return nullptr;
}

// ---------------------------------------------------------------- IPluginV3OneCore

const char* FusedAttentionPlugin::getPluginName() const noexcept { return contract::kOpName; }
const char* FusedAttentionPlugin::getPluginVersion() const noexcept { return contract::kTrtPluginVersion; }
const char* FusedAttentionPlugin::getPluginNamespace() const noexcept { return contract::kTrtPluginNamespace; }

// ---------------------------------------------------------------- IPluginV3OneBuild

int32_t FusedAttentionPlugin::getNbOutputs() const noexcept { return 1; }

int32_t FusedAttentionPlugin::getOutputDataTypes(DataType* output_types, int32_t nb_outputs,
                                                 const DataType* input_types, int32_t nb_inputs) const noexcept {
  try {
    const std::string err = check_io_count(nb_inputs, nb_outputs);
    if (!err.empty()) {
      report(err);
      return -1;
    }
    if (!is_value_type(input_types[contract::kInputQ])) {
      report(std::string("Q has element type ") + elem_type_name(to_elem_type(input_types[contract::kInputQ])) +
             "; supported: float32, float16, bfloat16");
      return -1;
    }
    output_types[contract::kOutputY] = input_types[contract::kInputQ];  // Y has Q's type
    return 0;
  } catch (...) {
    report("getOutputDataTypes failed");
    return -1;
  }
}

// The 4-D form: Y = (B, Hq, Sq, Dv), the inputs' own expressions, so dynamic dimensions stay
// symbolic. Mismatches visible at build time (both sides constant) are reported here, the rest
// at onShapeChange / enqueue by check_inputs_and_fill.
std::string FusedAttentionPlugin::output_shape_4d(const DimsExprs& q, const DimsExprs& k, const DimsExprs& v,
                                                  DimsExprs* y) const {
  const int64_t hq = constant_or_unknown(q.d[1]), hkv = constant_or_unknown(k.d[1]);
  if (known_to_differ(q.d[0], k.d[0]) || known_to_differ(q.d[0], v.d[0])) return "Q, K and V batch sizes differ";
  if (known_to_differ(k.d[1], v.d[1])) return "K and V must have the same number of heads";
  if (known_to_differ(k.d[2], v.d[2])) return "K and V must have the same sequence length";
  if (known_to_differ(q.d[3], k.d[3])) return "Q and K must have the same head size";
  if (hq >= 0 && hkv >= 0 && (hkv <= 0 || hq % hkv != 0)) {
    return "the number of query heads (" + std::to_string(hq) +
           ") must be a multiple of the number of key/value heads (" + std::to_string(hkv) + ")";
  }
  if (attrs_.q_num_heads > 0 && hq >= 0 && attrs_.q_num_heads != hq) {
    return "attribute q_num_heads = " + std::to_string(attrs_.q_num_heads) + " does not match Q's head dimension " +
           std::to_string(hq) + " (with 4-D inputs q_num_heads may only repeat it)";
  }
  if (attrs_.kv_num_heads > 0 && hkv >= 0 && attrs_.kv_num_heads != hkv) {
    return "attribute kv_num_heads = " + std::to_string(attrs_.kv_num_heads) +
           " does not match K's head dimension " + std::to_string(hkv) + " (with 4-D inputs kv_num_heads may only repeat it)";
  }
  for (const IDimensionExpr* d : {q.d[3], v.d[3]}) {
    const int64_t c = constant_or_unknown(d);
    if (d->isConstant() && (c < 1 || c > contract::kMaxHeadDim)) {
      return "unsupported head size " + std::to_string(c) + "; D and Dv must be in 1.." +
             std::to_string(contract::kMaxHeadDim);
    }
  }
  y->nbDims = contract::kTensorRank;
  y->d[0] = q.d[0];
  y->d[1] = q.d[1];
  y->d[2] = q.d[2];
  y->d[3] = v.d[3];
  return std::string();
}

// The 3-D form: Q (B, Sq, Hq*D), K (B, Sk, Hkv*D), V (B, Sk, Hkv*Dv) with the head counts from
// the attributes; Y = (B, Sq, Hq * (V's last dimension / Hkv)), an expression of V's.
std::string FusedAttentionPlugin::packed_output_shape(const DimsExprs& q, const DimsExprs& k, const DimsExprs& v,
                                                      nvinfer1::IExprBuilder& expr_builder, DimsExprs* y) const {
  const int64_t hq = attrs_.q_num_heads, hkv = attrs_.kv_num_heads;
  if (hq <= 0) return "Q is rank 3 (B, S, H*D), so attribute q_num_heads is required";
  if (hkv <= 0) return "K is rank 3 (B, S, H*D), so attribute kv_num_heads is required";
  if (known_to_differ(q.d[0], k.d[0]) || known_to_differ(q.d[0], v.d[0])) return "Q, K and V batch sizes differ";
  if (known_to_differ(k.d[1], v.d[1])) return "K and V must have the same sequence length";
  const struct {
    const char* input;
    const IDimensionExpr* hidden;
    const char* attr;
    int64_t heads;
  } parts[3] = {{"Q", q.d[2], contract::kAttrQNumHeads, hq},
                {"K", k.d[2], contract::kAttrKvNumHeads, hkv},
                {"V", v.d[2], contract::kAttrKvNumHeads, hkv}};
  int64_t head_size[3] = {-1, -1, -1};  // D of Q, D of K, Dv; -1 unknown at build time
  for (int i = 0; i < 3; ++i) {
    const int64_t c = constant_or_unknown(parts[i].hidden);
    if (c < 0) continue;
    if (c % parts[i].heads != 0) {
      return std::string(parts[i].input) + "'s last dimension " + std::to_string(c) + " is not a multiple of " +
             parts[i].attr + " " + std::to_string(parts[i].heads);
    }
    head_size[i] = c / parts[i].heads;
  }
  if (head_size[0] >= 0 && head_size[1] >= 0 && head_size[0] != head_size[1]) {
    return "Q and K must have the same head size, got " + std::to_string(head_size[0]) + " and " +
           std::to_string(head_size[1]) + " (last dimension / q_num_heads, / kv_num_heads)";
  }
  for (int i : {0, 2}) {
    if (head_size[i] >= 0 && (head_size[i] < 1 || head_size[i] > contract::kMaxHeadDim)) {
      return "unsupported head size " + std::to_string(head_size[i]) + "; D and Dv must be in 1.." +
             std::to_string(contract::kMaxHeadDim);
    }
  }
  y->nbDims = contract::kPackedTensorRank;
  y->d[0] = q.d[0];
  y->d[1] = q.d[1];
  if (hq == hkv) {
    y->d[2] = v.d[2];
  } else {
    const IDimensionExpr* dv = expr_builder.operation(nvinfer1::DimensionOperation::kFLOOR_DIV, *v.d[2],
                                                      *expr_builder.constant(hkv));
    y->d[2] = dv == nullptr ? nullptr
                            : expr_builder.operation(nvinfer1::DimensionOperation::kPROD, *expr_builder.constant(hq), *dv);
  }
  if (y->d[2] == nullptr) return "could not build the expression of Y's last dimension";
  return std::string();
}

// qkv_bias: only with packed_qkv = 1, rank 1, and (when both are build-time constants) as long as
// Q's packed last dimension W = (Hq + 2*Hkv)*D. Its element type is negotiated in
// supportsFormatCombination; the rest is check_inputs_and_fill's at onShapeChange / enqueue.
std::string FusedAttentionPlugin::check_qkv_bias_expr(const DimsExprs& bias, const DimsExprs& q) const {
  if (std::string err = check_qkv_bias_attribute(attrs_); !err.empty()) return err;
  if (bias.nbDims != 1) return qkv_bias_rank_error(bias.nbDims);
  if (q.nbDims == contract::kPackedTensorRank && known_to_differ(bias.d[0], q.d[2])) {
    return "qkv_bias must have shape ((q_num_heads + 2*kv_num_heads)*D,) = (" +
           std::to_string(q.d[2]->getConstantValue()) + ",), the packed last dimension of Q, got (" +
           std::to_string(bias.d[0]->getConstantValue()) + ",)";
  }
  return std::string();
}

// Packed Q/K/V: the three inputs are one (B, S, W) shape (normally one tensor three times), W a
// multiple of Hq + 2*Hkv; Y = (B, S, Hq * (W / (Hq + 2*Hkv))), an expression of Q's W.
std::string FusedAttentionPlugin::packed_qkv_output_shape(const DimsExprs& q, const DimsExprs& k, const DimsExprs& v,
                                                          nvinfer1::IExprBuilder& expr_builder, DimsExprs* y) const {
  const int64_t hq = attrs_.q_num_heads, hkv = attrs_.kv_num_heads;
  if (q.nbDims != contract::kPackedTensorRank) {
    return "attribute packed_qkv = 1 needs the 3-D form: Q, K and V must each be the packed (B, S, "
           "(q_num_heads + 2*kv_num_heads)*D) tensor, got rank " + std::to_string(q.nbDims);
  }
  if (hq <= 0 || hkv <= 0) return "attribute packed_qkv = 1 requires attributes q_num_heads and kv_num_heads";
  for (int i = 0; i < contract::kPackedTensorRank; ++i) {
    if (known_to_differ(q.d[i], k.d[i]) || known_to_differ(q.d[i], v.d[i])) {
      return "with packed_qkv = 1, Q, K and V must have the same shape (dimension " + std::to_string(i) + " differs)";
    }
  }
  const int64_t columns = hq + 2 * hkv;
  const int64_t width = constant_or_unknown(q.d[2]);
  if (width >= 0 && width % columns != 0) {
    return "with packed_qkv = 1, the packed last dimension " + std::to_string(width) +
           " must be a multiple of q_num_heads + 2*kv_num_heads = " + std::to_string(columns);
  }
  if (width >= 0 && (width / columns < 1 || width / columns > contract::kMaxHeadDim)) {
    return "unsupported head size " + std::to_string(width / columns) + "; D must be in 1.." +
           std::to_string(contract::kMaxHeadDim);
  }
  y->nbDims = contract::kPackedTensorRank;
  y->d[0] = q.d[0];
  y->d[1] = q.d[1];
  const IDimensionExpr* d = expr_builder.operation(nvinfer1::DimensionOperation::kFLOOR_DIV, *q.d[2],
                                                   *expr_builder.constant(columns));
  y->d[2] = d == nullptr ? nullptr
                         : expr_builder.operation(nvinfer1::DimensionOperation::kPROD, *expr_builder.constant(hq), *d);
  if (y->d[2] == nullptr) return "could not build the expression of Y's last dimension";
  return std::string();
}

int32_t FusedAttentionPlugin::getOutputShapes(const DimsExprs* inputs, int32_t nb_inputs, const DimsExprs*,
                                              int32_t nb_shape_inputs, DimsExprs* outputs, int32_t nb_outputs,
                                              nvinfer1::IExprBuilder& expr_builder) noexcept {
  try {
    std::string err = check_io_count(nb_inputs, nb_outputs);
    if (err.empty() && nb_shape_inputs != 0) err = "takes no shape inputs";
    if (!err.empty()) {
      report(err);
      return -1;
    }
    err = check_ranks(inputs[contract::kInputQ].nbDims, inputs[contract::kInputK].nbDims,
                      inputs[contract::kInputV].nbDims);
    if (!err.empty()) {
      report(err);
      return -1;
    }
    if (nb_inputs > contract::kInputMask &&
        (inputs[contract::kInputMask].nbDims < contract::kMinMaskRank ||
         inputs[contract::kInputMask].nbDims > contract::kMaxMaskRank)) {
      report("attn_mask must have rank 2 to 4, got rank " + std::to_string(inputs[contract::kInputMask].nbDims));
      return -1;
    }
    if (nb_inputs > contract::kInputKeyLengths && inputs[contract::kInputKeyLengths].nbDims != 1) {
      report("key_lengths must have shape (B,), got rank " + std::to_string(inputs[contract::kInputKeyLengths].nbDims));
      return -1;
    }
    if (nb_inputs > contract::kInputQkvBias) {
      err = check_qkv_bias_expr(inputs[contract::kInputQkvBias], inputs[contract::kInputQ]);
      if (!err.empty()) {
        report(err);
        return -1;
      }
    }
    const DimsExprs& q = inputs[contract::kInputQ];
    const DimsExprs& k = inputs[contract::kInputK];
    const DimsExprs& v = inputs[contract::kInputV];
    DimsExprs& y = outputs[contract::kOutputY];
    if (attrs_.packed_qkv == 1) {
      err = packed_qkv_output_shape(q, k, v, expr_builder, &y);
    } else if (q.nbDims == contract::kPackedTensorRank) {
      err = packed_output_shape(q, k, v, expr_builder, &y);
    } else {
      err = output_shape_4d(q, k, v, &y);
    }
    if (!err.empty()) {
      report(err);
      return -1;
    }
    return 0;
  } catch (...) {
    report("getOutputShapes failed");
    return -1;
  }
}

bool FusedAttentionPlugin::supportsFormatCombination(int32_t pos, const DynamicPluginTensorDesc* in_out,
                                                     int32_t nb_inputs, int32_t nb_outputs) noexcept {
  try {
    if (!check_io_count(nb_inputs, nb_outputs).empty() || pos < 0 || pos >= nb_inputs + nb_outputs) return false;
    const PluginTensorDesc& d = in_out[pos].desc;
    if (d.format != TensorFormat::kLINEAR) return false;
    const DataType t = in_out[contract::kInputQ].desc.type;  // decided at pos 0, read for later positions
    if (pos == contract::kInputQ) return is_value_type(d.type);
    if (pos == contract::kInputK || pos == contract::kInputV) return d.type == t;
    if (pos == contract::kInputMask && pos < nb_inputs) return d.type == DataType::kBOOL || d.type == t;
    if (pos == contract::kInputKeyLengths && pos < nb_inputs) {
      return d.type == DataType::kINT32 || d.type == DataType::kINT64;
    }
    return d.type == t;  // Y, and qkv_bias: Q's type
  } catch (...) {
    return false;
  }
}

int32_t FusedAttentionPlugin::configurePlugin(const DynamicPluginTensorDesc* in, int32_t nb_inputs,
                                              const DynamicPluginTensorDesc* out, int32_t nb_outputs) noexcept {
  try {
    std::string err = check_io_count(nb_inputs, nb_outputs);
    if (err.empty()) {
      // Shapes may hold wildcards (-1) here; check types and ranks, shapes at onShapeChange / enqueue.
      const DataType t = in[contract::kInputQ].desc.type;
      if (!is_value_type(t)) err = "Q must be float32, float16 or bfloat16";
      else if (in[contract::kInputK].desc.type != t || in[contract::kInputV].desc.type != t) {
        err = "Q, K and V must share one element type";
      } else if (out[contract::kOutputY].desc.type != t) {
        err = "Y must have the element type of Q";
      }
      if (err.empty()) {
        err = check_ranks(in[contract::kInputQ].desc.dims.nbDims, in[contract::kInputK].desc.dims.nbDims,
                          in[contract::kInputV].desc.dims.nbDims);
      }
      if (err.empty() && nb_inputs > contract::kInputQkvBias) {
        const PluginTensorDesc& b = in[contract::kInputQkvBias].desc;
        err = check_qkv_bias_attribute(attrs_);
        if (err.empty()) err = check_qkv_bias_type(to_elem_type(b.type), to_elem_type(t));
        if (err.empty() && b.dims.nbDims != 1) err = qkv_bias_rank_error(b.dims.nbDims);
      }
    }
    if (!err.empty()) {
      report(err);
      return -1;
    }
    nb_inputs_ = nb_inputs;
    return 0;
  } catch (...) {
    report("configurePlugin failed");
    return -1;
  }
}

size_t FusedAttentionPlugin::getWorkspaceSize(const DynamicPluginTensorDesc* inputs, int32_t nb_inputs,
                                              const DynamicPluginTensorDesc*, int32_t nb_outputs) const noexcept {
  try {
    if (!check_io_count(nb_inputs, nb_outputs).empty()) return 0;
    // The launcher's scratch space (split-KV partial results) depends on shapes only, but not
    // monotonically: its split heuristic fills the GPU, so a smaller problem may split more.
    // TensorRT needs one size for every shape of the profile; take the largest over the opt
    // shapes and over shapes between min and max (the same fraction of the range for every
    // dynamic dimension keeps the inputs consistent).
    static constexpr double kFractions[] = {0.0, 1.0 / 64, 1.0 / 16, 1.0 / 8, 1.0 / 4, 1.0 / 2, 1.0};
    size_t bytes = 0;
    bool any_valid = false;
    std::string last_err;
    for (int point = -1; point < static_cast<int>(sizeof(kFractions) / sizeof(kFractions[0])); ++point) {
      std::vector<nvinfer1::Dims> dims(static_cast<size_t>(nb_inputs));
      for (int32_t i = 0; i < nb_inputs; ++i) {
        nvinfer1::Dims d = point < 0 ? inputs[i].opt : inputs[i].min;
        if (point >= 0) {
          for (int32_t a = 0; a < d.nbDims && a < nvinfer1::Dims::MAX_DIMS; ++a) {
            const int64_t lo = inputs[i].min.d[a], hi = inputs[i].max.d[a];
            d.d[a] = lo + static_cast<int64_t>(static_cast<double>(hi - lo) * kFractions[point]);
          }
        }
        dims[static_cast<size_t>(i)] = d;
      }
      TensorDesc descs[contract::kNumInputs];
      make_descs(
          nb_inputs, [&](int32_t i) -> const nvinfer1::Dims& { return dims[static_cast<size_t>(i)]; },
          [&](int32_t i) { return inputs[i].desc.type; }, descs);
      AttentionParams p;
      const std::string err = check_inputs_and_fill(descs, attrs_, &p);
      if (!err.empty()) {
        last_err = err;
        continue;
      }
      any_valid = true;
      // No data exists at build time; present inputs get a placeholder address so the launcher
      // sees which optional inputs exist (it never dereferences them here).
      static const char kPlaceholder[16] = {};
      // The bias placeholder makes the launcher count the bias path's scratch (biased copies).
      const void* bias = nb_inputs > contract::kInputQkvBias ? kPlaceholder : nullptr;
      set_qkv_pointers(attrs_, kPlaceholder, kPlaceholder, kPlaceholder, bias, &p);  // packed windows: same offsets
      p.y = const_cast<char*>(kPlaceholder);
      if (nb_inputs > contract::kInputMask) p.mask = kPlaceholder;
      if (nb_inputs > contract::kInputKeyLengths) p.key_lengths = kPlaceholder;
      bytes = std::max(bytes, opsfuse::cuda::workspace_size(p));
    }
    workspace_budget_ = std::max<int64_t>(workspace_budget_, static_cast<int64_t>(bytes));
    if (!any_valid) {
      log_warning(std::string(contract::kOpName) + " node '" + node_name_ +
                  "': cannot size the workspace for the profile's shapes: " + last_err);
    }
    return bytes;
  } catch (...) {
    report("getWorkspaceSize failed");
    return 0;
  }
}

const char* FusedAttentionPlugin::getTimingCacheID() noexcept { return getMetadataString(); }

const char* FusedAttentionPlugin::getMetadataString() noexcept {
  try {
    metadata_ = std::string("scale=") + (attrs_.has_scale ? fmt_float(attrs_.scale) : std::string("1/sqrt(D)")) +
                ";is_causal=" + std::to_string(attrs_.is_causal) + ";softcap=" + fmt_float(attrs_.softcap) +
                ";q_num_heads=" + std::to_string(attrs_.q_num_heads) +
                ";kv_num_heads=" + std::to_string(attrs_.kv_num_heads) +
                ";packed_qkv=" + std::to_string(attrs_.packed_qkv);
    return metadata_.c_str();
  } catch (...) {
    return nullptr;
  }
}

// ---------------------------------------------------------------- IPluginV3OneRuntime

int32_t FusedAttentionPlugin::onShapeChange(const PluginTensorDesc* in, int32_t nb_inputs,
                                            const PluginTensorDesc* out, int32_t nb_outputs) noexcept {
  try {
    std::string err = check_io_count(nb_inputs, nb_outputs);
    AttentionParams p;
    if (err.empty()) {
      TensorDesc descs[contract::kNumInputs];
      make_descs(
          nb_inputs, [&](int32_t i) -> const nvinfer1::Dims& { return in[i].dims; },
          [&](int32_t i) { return in[i].type; }, descs);
      err = check_inputs_and_fill(descs, attrs_, &p);
    }
    if (err.empty()) {
      const std::vector<int64_t> y = output_shape(p, static_cast<size_t>(in[contract::kInputQ].dims.nbDims));
      const nvinfer1::Dims& od = out[contract::kOutputY].dims;
      if (od.nbDims != static_cast<int32_t>(y.size()) || !std::equal(y.begin(), y.end(), od.d)) {
        err = "output Y must have shape (B, Hq, Sq, Dv), or (B, Sq, Hq*Dv) for 3-D inputs (packed Q/K/V: Hq*D)";
      }
    }
    if (!err.empty()) {
      report(err);
      return -1;
    }
    nb_inputs_ = nb_inputs;
    return 0;
  } catch (...) {
    report("onShapeChange failed");
    return -1;
  }
}

int32_t FusedAttentionPlugin::enqueue(const PluginTensorDesc* input_desc, const PluginTensorDesc* output_desc,
                                      const void* const* inputs, void* const* outputs, void* workspace,
                                      cudaStream_t stream) noexcept {
  try {
    if (nb_inputs_ < contract::kNumRequiredInputs) {
      report("enqueue before configurePlugin / onShapeChange: the number of inputs is unknown");
      return -1;
    }
    TensorDesc descs[contract::kNumInputs];
    make_descs(
        nb_inputs_, [&](int32_t i) -> const nvinfer1::Dims& { return input_desc[i].dims; },
        [&](int32_t i) { return input_desc[i].type; }, descs);
    AttentionParams p;
    std::string err = check_inputs_and_fill(descs, attrs_, &p);
    if (err.empty()) {
      const std::vector<int64_t> y = output_shape(p, descs[contract::kInputQ].shape.size());
      const nvinfer1::Dims& od = output_desc[contract::kOutputY].dims;
      if (od.nbDims != static_cast<int32_t>(y.size()) || !std::equal(y.begin(), y.end(), od.d)) {
        err = "output Y must have shape (B, Hq, Sq, Dv), or (B, Sq, Hq*Dv) for 3-D inputs (packed Q/K/V: Hq*D)";
      } else if (output_desc[contract::kOutputY].type != input_desc[contract::kInputQ].type) {
        err = "output Y must have the element type of Q";
      }
    }
    if (!err.empty()) {
      report(err);
      return -1;
    }
    if (p.batch * p.heads_q * p.seq_q * p.head_dim_v == 0) return 0;  // empty output: nothing to write
    set_qkv_pointers(attrs_, inputs[contract::kInputQ], inputs[contract::kInputK], inputs[contract::kInputV],
                     nb_inputs_ > contract::kInputQkvBias ? inputs[contract::kInputQkvBias] : nullptr, &p);
    p.mask = nb_inputs_ > contract::kInputMask ? inputs[contract::kInputMask] : nullptr;
    p.key_lengths = nb_inputs_ > contract::kInputKeyLengths ? inputs[contract::kInputKeyLengths] : nullptr;
    p.y = outputs[contract::kOutputY];
    // TensorRT allocated getWorkspaceSize() bytes, sized over the profile's shapes; when the
    // engine recorded that size, a launch needing more is refused rather than overrunning it.
    const size_t need = opsfuse::cuda::workspace_size(p);
    if (need > 0 && (workspace == nullptr || (workspace_budget_ >= 0 && need > static_cast<size_t>(workspace_budget_)))) {
      report("the launch needs " + std::to_string(need) + " bytes of workspace but TensorRT reserved " +
             (workspace == nullptr ? std::string("none") : std::to_string(workspace_budget_)) +
             " for this shape's optimization profile");
      return -1;
    }
    const size_t available = workspace_budget_ >= 0 ? static_cast<size_t>(workspace_budget_) : need;
    const Status st = opsfuse::cuda::launch(p, workspace, workspace == nullptr ? 0 : available,
                                            static_cast<void*>(stream));
    if (st != Status::kOk) {
      report(std::string("CUDA launch failed (") + status_name(st) + "): " + opsfuse::cuda::last_error_message());
      return -1;
    }
    return 0;
  } catch (const std::exception& e) {
    report(std::string("enqueue failed: ") + e.what());
  } catch (...) {
    report("enqueue failed");
  }
  return -1;
}

nvinfer1::IPluginV3* FusedAttentionPlugin::attachToContext(nvinfer1::IPluginResourceContext*) noexcept {
  return clone();  // no per-context resources
}

const nvinfer1::PluginFieldCollection* FusedAttentionPlugin::getFieldsToSerialize() noexcept {
  try {
    // The creator's fields, written the way the ONNX parser passes node attributes
    // (FLOAT -> kFLOAT32, INT -> kINT32). An absent scale stays absent (default 1/sqrt(D)).
    fields_.clear();
    field_scale_ = attrs_.scale;
    field_is_causal_ = static_cast<int32_t>(attrs_.is_causal);
    field_softcap_ = attrs_.softcap;
    if (attrs_.has_scale) {
      fields_.emplace_back(contract::kAttrScale, &field_scale_, nvinfer1::PluginFieldType::kFLOAT32, 1);
    }
    fields_.emplace_back(contract::kAttrIsCausal, &field_is_causal_, nvinfer1::PluginFieldType::kINT32, 1);
    fields_.emplace_back(contract::kAttrSoftcap, &field_softcap_, nvinfer1::PluginFieldType::kFLOAT32, 1);
    // The head counts only when given (0 = absent), so a 4-D plan keeps its fields as before.
    field_q_num_heads_ = static_cast<int32_t>(attrs_.q_num_heads);
    field_kv_num_heads_ = static_cast<int32_t>(attrs_.kv_num_heads);
    if (attrs_.q_num_heads > 0) {
      fields_.emplace_back(contract::kAttrQNumHeads, &field_q_num_heads_, nvinfer1::PluginFieldType::kINT32, 1);
    }
    if (attrs_.kv_num_heads > 0) {
      fields_.emplace_back(contract::kAttrKvNumHeads, &field_kv_num_heads_, nvinfer1::PluginFieldType::kINT32, 1);
    }
    // packed_qkv only when set, so plans without it keep their fields as before.
    field_packed_qkv_ = static_cast<int32_t>(attrs_.packed_qkv);
    if (attrs_.packed_qkv != 0) {
      fields_.emplace_back(contract::kAttrPackedQkv, &field_packed_qkv_, nvinfer1::PluginFieldType::kINT32, 1);
    }
    if (workspace_budget_ >= 0) {
      field_workspace_ = workspace_budget_;
      fields_.emplace_back(kFieldWorkspaceBytes, &field_workspace_, nvinfer1::PluginFieldType::kINT64, 1);
    }
    field_collection_.nbFields = static_cast<int32_t>(fields_.size());
    field_collection_.fields = fields_.data();
    return &field_collection_;
  } catch (...) {
    report("getFieldsToSerialize failed");
    return nullptr;
  }
}

}  // namespace opsfuse::trt
