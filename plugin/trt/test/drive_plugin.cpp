// Drives libopsfuse_trt.so through its IPluginV3 interfaces the way TensorRT does, WITHOUT
// TensorRT: TensorRT's libraries cannot be installed where opsfuse is built and tested, so this
// program plays TensorRT's part with small fakes of the runtime objects a plugin receives
// (IExprBuilder / IDimensionExpr, ILoggerFinder / ILogger, IPluginResourceContext, field
// collections). THIS IS NOT A TENSORRT ENGINE RUN: it checks the plugin's own logic (fields,
// validation, output types and shape expressions, format negotiation, clone, serialization,
// configure, enqueue on a stream) and the numbers the shared CUDA launcher produces through it.
//
// Sequence per case, as TensorRT's builder and runtime do it:
//   dlopen the library; setLoggerFinder; getCreators
//   createPlugin(fields as the ONNX parser passes them, kBUILD)
//   getNbOutputs, getOutputDataTypes, getOutputShapes (symbolic batch / sequence dimensions),
//   supportsFormatCombination (every type x format at every position), configurePlugin (profile
//   min / opt / max), getWorkspaceSize, clone
//   getFieldsToSerialize -> deep copy -> createPlugin(kRUNTIME) -> attachToContext
//   onShapeChange(runtime shape, smaller than the profile's max), enqueue on a non-default stream
//   into a NaN-poisoned output; compare with a float64 CPU reference.
// Cases cover the 4-D form and packed Q/K/V (packed_qkv = 1: one (B, S, (Hq + 2*Hkv)*D) tensor bound
// as Q, K and V), the latter also with the optional qkv_bias input (index 5; the reference adds it
// exactly, the baseline as the graph's Add would: float32 sum rounded to the element type).
// Tolerance ("2x rule" style): max |kernel - ref64| <= 2 * max |baseline - ref64| + a rounding
// floor (tests/accuracy.py's: 0.5 ulp of max |ref| for float16 / bfloat16, 4 ulps for float32), where the baseline is attention computed on the CPU at the kernel's precision
// the way a framework does it (float32 arithmetic, scores / probabilities / output rounded to
// the element type). NaN never passes.
//
// Usage: opsfuse_trt_driver [--no-gpu] [--library PATH]
//   --no-gpu  everything except the enqueue numerics (for machines without a GPU)
// Exit status: 0 all checks passed, 1 a check failed, 2 setup error.

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "NvInferRuntime.h"
#include "common/contract.h"

#ifndef OPSFUSE_TRT_LIBRARY_PATH
#define OPSFUSE_TRT_LIBRARY_PATH "libopsfuse_trt.so"
#endif

using nvinfer1::DataType;
using nvinfer1::Dims;
using nvinfer1::DimsExprs;
using nvinfer1::DynamicPluginTensorDesc;
using nvinfer1::IDimensionExpr;
using nvinfer1::IPluginCreatorV3One;
using nvinfer1::IPluginV3;
using nvinfer1::IPluginV3OneBuild;
using nvinfer1::IPluginV3OneCore;
using nvinfer1::IPluginV3OneRuntime;
using nvinfer1::PluginCapabilityType;
using nvinfer1::PluginField;
using nvinfer1::PluginFieldCollection;
using nvinfer1::PluginFieldType;
using nvinfer1::PluginTensorDesc;
using nvinfer1::TensorFormat;
using nvinfer1::TensorRTPhase;

namespace {

// ------------------------------------------------------------------ check bookkeeping

int g_failures = 0;
int g_checks = 0;
int g_workspace_refusals = 0;  // launches refused for want of workspace (step 10)

bool check(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok) {
    ++g_failures;
    std::printf("  FAIL: %s\n", what.c_str());
  }
  return ok;
}

// ------------------------------------------------------------------ fake logger

class CapturingLogger final : public nvinfer1::ILogger {
 public:
  void log(Severity severity, const char* msg) noexcept override {
    messages.emplace_back(severity, msg ? msg : "");
    if (severity <= Severity::kWARNING) std::printf("    [plugin log] %s\n", msg ? msg : "");
  }
  // True when a message at error severity since `from` contains every word of `words`.
  bool has_error(size_t from, std::initializer_list<const char*> words) const {
    for (size_t i = from; i < messages.size(); ++i) {
      if (messages[i].first > Severity::kERROR) continue;
      bool all = true;
      for (const char* w : words) all = all && messages[i].second.find(w) != std::string::npos;
      if (all) return true;
    }
    return false;
  }
  std::vector<std::pair<Severity, std::string>> messages;
};

class FakeLoggerFinder final : public nvinfer1::ILoggerFinder {
 public:
  nvinfer1::ILogger* findLogger() override { return &logger; }
  ~FakeLoggerFinder() override = default;
  CapturingLogger logger;
};

// ------------------------------------------------------------------ fake shape expressions

// An expression is a build-time constant or a symbol ("in0.d2", or a formula of symbols).
class FakeExprImpl final : public nvinfer1::apiv::VDimensionExpr {
 public:
  FakeExprImpl(bool is_constant, int64_t value, std::string symbol)
      : is_constant_(is_constant), value_(value), symbol_(std::move(symbol)) {}
  bool isConstant() const override { return is_constant_; }
  int64_t getConstantValue() const override {
    return is_constant_ ? value_ : std::numeric_limits<int64_t>::min();
  }
  bool isSizeTensor() const override { return false; }
  std::string describe() const { return is_constant_ ? std::to_string(value_) : symbol_; }

 private:
  bool is_constant_;
  int64_t value_;
  std::string symbol_;
};

class FakeExpr final : public IDimensionExpr {
 public:
  FakeExpr(bool is_constant, int64_t value, std::string symbol) : impl_(is_constant, value, std::move(symbol)) {
    mImpl = &impl_;
  }
  ~FakeExpr() noexcept override = default;
  std::string describe() const { return impl_.describe(); }

 private:
  FakeExprImpl impl_;
};

std::string describe(const IDimensionExpr* e) {
  if (e == nullptr) return "<null>";
  return static_cast<const FakeExpr*>(e)->describe();  // every expression here is a FakeExpr
}

class FakeExprBuilderImpl final : public nvinfer1::apiv::VExprBuilder {
 public:
  const IDimensionExpr* constant(int64_t value) override { return make(true, value, ""); }
  const IDimensionExpr* operation(nvinfer1::DimensionOperation op, const IDimensionExpr& a,
                                  const IDimensionExpr& b) override {
    using Op = nvinfer1::DimensionOperation;
    if (a.isConstant() && b.isConstant()) {
      const int64_t x = a.getConstantValue(), y = b.getConstantValue();
      switch (op) {
        case Op::kSUM: return make(true, x + y, "");
        case Op::kPROD: return make(true, x * y, "");
        case Op::kMAX: return make(true, std::max(x, y), "");
        case Op::kMIN: return make(true, std::min(x, y), "");
        case Op::kSUB: return make(true, x - y, "");
        case Op::kEQUAL: return make(true, x == y, "");
        case Op::kLESS: return make(true, x < y, "");
        case Op::kFLOOR_DIV: return y ? make(true, (x / y) - ((x % y != 0) && ((x < 0) != (y < 0))), "") : nullptr;
        case Op::kCEIL_DIV: return y ? make(true, (x + y - 1) / y, "") : nullptr;
      }
      return nullptr;
    }
    return make(false, 0, "op" + std::to_string(static_cast<int>(op)) + "(" + describe(&a) + "," + describe(&b) + ")");
  }
  const IDimensionExpr* declareSizeTensor(int32_t, const IDimensionExpr&, const IDimensionExpr&) override {
    return nullptr;  // FusedAttention has no size-tensor outputs
  }
  const IDimensionExpr* make(bool is_constant, int64_t value, std::string symbol) {
    pool_.push_back(std::make_unique<FakeExpr>(is_constant, value, std::move(symbol)));
    return pool_.back().get();
  }

 private:
  std::deque<std::unique_ptr<FakeExpr>> pool_;
};

class FakeExprBuilder final : public nvinfer1::IExprBuilder {
 public:
  FakeExprBuilder() { mImpl = &impl_; }
  ~FakeExprBuilder() noexcept override = default;
  FakeExprBuilderImpl& impl() { return impl_; }

 private:
  FakeExprBuilderImpl impl_;
};

class FakeResourceContext final : public nvinfer1::IPluginResourceContext {
 public:
  nvinfer1::IGpuAllocator* getGpuAllocator() const noexcept override { return nullptr; }
  nvinfer1::IErrorRecorder* getErrorRecorder() const noexcept override { return nullptr; }
};

// ------------------------------------------------------------------ element types

uint16_t float_to_half_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t exp = (x >> 23) & 0xFFu;
  uint32_t mant = x & 0x7FFFFFu;
  if (exp == 0xFF) return static_cast<uint16_t>(sign | 0x7C00u | (mant ? 0x200u : 0u));  // inf / nan
  int32_t e = static_cast<int32_t>(exp) - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7C00u);  // overflow -> inf
  if (e <= 0) {                                                // subnormal half (or zero)
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: correct
  return static_cast<uint16_t>(sign | h);
}

float half_bits_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    f = mant ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    f = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -f : f;
}

uint16_t float_to_bf16_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7F800000u) == 0x7F800000u && (x & 0x7FFFFFu)) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

float bf16_bits_to_float(uint16_t b) {
  const uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

float round_to(DataType t, float f) {
  if (t == DataType::kHALF) return half_bits_to_float(float_to_half_bits(f));
  if (t == DataType::kBF16) return bf16_bits_to_float(float_to_bf16_bits(f));
  return f;
}

size_t elem_size(DataType t) {
  switch (t) {
    case DataType::kFLOAT: return 4;
    case DataType::kHALF: return 2;
    case DataType::kBF16: return 2;
    case DataType::kBOOL: return 1;
    case DataType::kINT32: return 4;
    case DataType::kINT64: return 8;
    default: return 1;
  }
}

const char* type_name(DataType t) {
  switch (t) {
    case DataType::kFLOAT: return "float32";
    case DataType::kHALF: return "float16";
    case DataType::kBF16: return "bfloat16";
    case DataType::kBOOL: return "bool";
    case DataType::kINT32: return "int32";
    case DataType::kINT64: return "int64";
    case DataType::kINT8: return "int8";
    default: return "other";
  }
}

// Host bytes of `values` in element type t (float types only).
std::vector<uint8_t> encode(DataType t, const std::vector<float>& values) {
  std::vector<uint8_t> out(values.size() * elem_size(t));
  for (size_t i = 0; i < values.size(); ++i) {
    if (t == DataType::kFLOAT) {
      std::memcpy(&out[i * 4], &values[i], 4);
    } else {
      const uint16_t bits = t == DataType::kHALF ? float_to_half_bits(values[i]) : float_to_bf16_bits(values[i]);
      std::memcpy(&out[i * 2], &bits, 2);
    }
  }
  return out;
}

std::vector<float> decode(DataType t, const std::vector<uint8_t>& bytes) {
  const size_t n = bytes.size() / elem_size(t);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (t == DataType::kFLOAT) {
      std::memcpy(&out[i], &bytes[i * 4], 4);
    } else {
      uint16_t bits;
      std::memcpy(&bits, &bytes[i * 2], 2);
      out[i] = t == DataType::kHALF ? half_bits_to_float(bits) : bf16_bits_to_float(bits);
    }
  }
  return out;
}

// ------------------------------------------------------------------ cases and reference

enum class MaskKind { kNone, kBool, kAdditive };

struct Case {
  std::string name;
  DataType dtype;
  int64_t B, Hq, Hkv, Sq, Sk, D, Dv;
  MaskKind mask;
  std::vector<int64_t> mask_shape;  // rank 2..4, broadcastable to (B, Hq, Sq, Sk)
  DataType key_lengths;             // kINT32, kINT64, or kFLOAT meaning "absent"
  bool has_scale;
  float scale;
  int32_t is_causal;
  float softcap;
  // packed_qkv = 1: Q, K, V are one (B, S, (Hq + 2*Hkv)*D) tensor bound three times (Sq == Sk,
  // Dv == D). bias_scale > 0 adds qkv_bias, standard normal values times bias_scale; TensorRT
  // cannot pass the empty names before it, so such cases also have attn_mask and key_lengths.
  bool packed = false;
  float bias_scale = 0.0f;
};

struct HostData {
  std::vector<float> q, k, v;         // values already representable in the element type
  std::vector<float> mask_add;        // additive mask values (element type), mask_shape layout
  std::vector<uint8_t> mask_bool;     // bool mask, mask_shape layout
  std::vector<int64_t> key_lengths;   // (B,)
  std::vector<float> bias;            // qkv_bias ((Hq + 2*Hkv)*D,): Q's heads, then K's, then V's; or empty
};

// Index of mask element (b, h, i, j) under broadcasting.
size_t mask_index(const std::vector<int64_t>& shape, int64_t b, int64_t h, int64_t i, int64_t j) {
  const int64_t full[4] = {b, h, i, j};
  const int rank = static_cast<int>(shape.size());
  size_t idx = 0;
  for (int a = 0; a < rank; ++a) {
    const int64_t coord = shape[a] == 1 ? 0 : full[4 - rank + a];
    idx = idx * static_cast<size_t>(shape[a]) + static_cast<size_t>(coord);
  }
  return idx;
}

size_t numel(const std::vector<int64_t>& s) {
  size_t n = 1;
  for (int64_t d : s) n *= static_cast<size_t>(d);
  return n;
}

// Attention for one case. `low` = false: float64 throughout (the reference). `low` = true: the
// framework-style baseline at the element type: float32 arithmetic, scores, probabilities and
// output rounded to the element type.
std::vector<double> attention(const Case& c, const HostData& d, bool low) {
  const DataType t = c.dtype;
  const double scale = c.has_scale ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.D));
  const int64_t group = c.Hq / c.Hkv;
  std::vector<double> y(static_cast<size_t>(c.B * c.Hq * c.Sq * c.Dv), 0.0);
  std::vector<double> s(static_cast<size_t>(c.Sk));
  std::vector<char> visible(static_cast<size_t>(c.Sk));
  auto rnd = [&](double x) -> double { return low ? static_cast<double>(round_to(t, static_cast<float>(x))) : x; };
  // Q, K, V as the contract defines them: with qkv_bias, x + the bias of x's column of the packed
  // row (tensor (B, heads, S, width) here, its window starting `offset` columns into the row).
  // The reference takes the exact sum; the baseline the graph's Add: float32, rounded to T.
  auto biased = [&](const std::vector<float>& x, int64_t heads, int64_t seq, int64_t width, int64_t offset) {
    std::vector<double> out(x.begin(), x.end());
    if (d.bias.empty()) return out;
    for (size_t n = 0; n < x.size(); ++n) {
      const int64_t e = static_cast<int64_t>(n) % width;
      const int64_t h = (static_cast<int64_t>(n) / (seq * width)) % heads;
      const float b = d.bias[static_cast<size_t>(offset + h * width + e)];
      out[n] = low ? static_cast<double>(round_to(t, x[n] + b)) : static_cast<double>(x[n]) + b;
    }
    return out;
  };
  const std::vector<double> q = biased(d.q, c.Hq, c.Sq, c.D, 0);
  const std::vector<double> k = biased(d.k, c.Hkv, c.Sk, c.D, c.Hq * c.D);
  const std::vector<double> v = biased(d.v, c.Hkv, c.Sk, c.Dv, (c.Hq + c.Hkv) * c.D);
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t h = 0; h < c.Hq; ++h) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < c.Sq; ++i) {
        const double* qrow = &q[static_cast<size_t>(((b * c.Hq + h) * c.Sq + i) * c.D)];
        bool any = false;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < c.Sk; ++j) {
          const double* krow = &k[static_cast<size_t>(((b * c.Hkv + hk) * c.Sk + j) * c.D)];
          double dot;
          if (low) {
            float acc = 0.0f;
            for (int64_t e = 0; e < c.D; ++e) acc += static_cast<float>(qrow[e]) * static_cast<float>(krow[e]);
            dot = rnd(rnd(acc) * static_cast<float>(scale));
          } else {
            double acc = 0.0;
            for (int64_t e = 0; e < c.D; ++e) acc += qrow[e] * krow[e];
            dot = acc * scale;
          }
          if (c.softcap > 0.0f) dot = rnd(c.softcap * std::tanh(dot / c.softcap));
          bool vis = true;
          if (c.mask == MaskKind::kBool) vis = d.mask_bool[mask_index(c.mask_shape, b, h, i, j)] != 0;
          if (c.mask == MaskKind::kAdditive) dot = rnd(dot + d.mask_add[mask_index(c.mask_shape, b, h, i, j)]);
          if (c.is_causal == 1 && j > i) vis = false;
          if (c.is_causal == 2 && j > i + (c.Sk - c.Sq)) vis = false;
          if (c.key_lengths != DataType::kFLOAT && j >= d.key_lengths[static_cast<size_t>(b)]) vis = false;
          if (std::isinf(dot) && dot < 0) vis = false;
          visible[static_cast<size_t>(j)] = vis;
          s[static_cast<size_t>(j)] = dot;
          if (vis) {
            any = true;
            mx = std::max(mx, dot);
          }
        }
        double* yrow = &y[static_cast<size_t>(((b * c.Hq + h) * c.Sq + i) * c.Dv)];
        if (!any) continue;  // every key masked: zeros
        double denom = 0.0;
        for (int64_t j = 0; j < c.Sk; ++j) {
          const double p = visible[static_cast<size_t>(j)] ? std::exp(s[static_cast<size_t>(j)] - mx) : 0.0;
          s[static_cast<size_t>(j)] = low ? static_cast<double>(static_cast<float>(p)) : p;
          denom += s[static_cast<size_t>(j)];
        }
        for (int64_t j = 0; j < c.Sk; ++j) {
          if (!visible[static_cast<size_t>(j)]) continue;
          const double p = rnd(s[static_cast<size_t>(j)] / denom);
          const double* vrow = &v[static_cast<size_t>(((b * c.Hkv + hk) * c.Sk + j) * c.Dv)];
          for (int64_t e = 0; e < c.Dv; ++e) yrow[e] += p * vrow[e];
        }
        if (low) {
          for (int64_t e = 0; e < c.Dv; ++e) yrow[e] = rnd(static_cast<float>(yrow[e]));
        }
      }
    }
  }
  return y;
}

HostData make_data(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  HostData d;
  auto fill = [&](std::vector<float>& v, size_t n) {
    v.resize(n);
    for (auto& x : v) x = round_to(c.dtype, normal(rng));
  };
  fill(d.q, static_cast<size_t>(c.B * c.Hq * c.Sq * c.D));
  fill(d.k, static_cast<size_t>(c.B * c.Hkv * c.Sk * c.D));
  fill(d.v, static_cast<size_t>(c.B * c.Hkv * c.Sk * c.Dv));
  std::uniform_real_distribution<float> unif(0.0f, 1.0f);
  if (c.mask == MaskKind::kBool) {
    d.mask_bool.resize(numel(c.mask_shape));
    for (auto& m : d.mask_bool) m = unif(rng) < 0.8f ? 1 : 0;
  } else if (c.mask == MaskKind::kAdditive) {
    d.mask_add.resize(numel(c.mask_shape));
    for (auto& m : d.mask_add) {
      m = unif(rng) < 0.1f ? -std::numeric_limits<float>::infinity() : round_to(c.dtype, 2.0f * normal(rng));
    }
  }
  if (c.key_lengths != DataType::kFLOAT) {
    std::uniform_int_distribution<int64_t> len(0, c.Sk);
    d.key_lengths.resize(static_cast<size_t>(c.B));
    for (auto& l : d.key_lengths) l = len(rng);
    d.key_lengths[0] = c.Sk;                   // one full row
    if (c.B > 1) d.key_lengths[1] = 0;         // one row fully padded: zeros (not V's bias), never NaN
  }
  if (c.bias_scale > 0.0f) {  // drawn last: the other inputs stay those of the same case without a bias
    d.bias.resize(static_cast<size_t>((c.Hq + 2 * c.Hkv) * c.D));
    for (auto& x : d.bias) x = round_to(c.dtype, c.bias_scale * normal(rng));
  }
  return d;
}

// The packed (B, S, (Hq + 2*Hkv)*D) tensor whose column windows are the (B, H, S, D) Q, K and V.
std::vector<float> pack_qkv(const Case& c, const HostData& d) {
  const int64_t width = (c.Hq + 2 * c.Hkv) * c.D, S = c.Sq;
  std::vector<float> out(static_cast<size_t>(c.B * S * width));
  const struct {
    const std::vector<float>* x;
    int64_t heads, offset;
  } parts[3] = {{&d.q, c.Hq, 0}, {&d.k, c.Hkv, c.Hq * c.D}, {&d.v, c.Hkv, (c.Hq + c.Hkv) * c.D}};
  for (const auto& part : parts) {
    for (int64_t b = 0; b < c.B; ++b) {
      for (int64_t h = 0; h < part.heads; ++h) {
        for (int64_t i = 0; i < S; ++i) {
          for (int64_t e = 0; e < c.D; ++e) {
            out[static_cast<size_t>((b * S + i) * width + part.offset + h * c.D + e)] =
                (*part.x)[static_cast<size_t>(((b * part.heads + h) * S + i) * c.D + e)];
          }
        }
      }
    }
  }
  return out;
}

// ------------------------------------------------------------------ plugin plumbing helpers

struct Library {
  void* handle = nullptr;
  IPluginCreatorV3One* creator = nullptr;
  FakeLoggerFinder finder;
};

// Fields the way TensorRT's ONNX parser passes node attributes: FLOAT -> kFLOAT32, INT -> kINT32.
struct Fields {
  float scale = 0.0f;
  int32_t is_causal = 0;
  float softcap = 0.0f;
  int32_t q_num_heads = 0, kv_num_heads = 0, packed_qkv = 1;
  std::vector<PluginField> list;
  PluginFieldCollection fc{};
  explicit Fields(const Case& c)
      : scale(c.scale),
        is_causal(c.is_causal),
        softcap(c.softcap),
        q_num_heads(static_cast<int32_t>(c.Hq)),
        kv_num_heads(static_cast<int32_t>(c.Hkv)) {
    if (c.has_scale) list.emplace_back("scale", &scale, PluginFieldType::kFLOAT32, 1);
    list.emplace_back("is_causal", &is_causal, PluginFieldType::kINT32, 1);
    list.emplace_back("softcap", &softcap, PluginFieldType::kFLOAT32, 1);
    if (c.packed) {
      list.emplace_back("q_num_heads", &q_num_heads, PluginFieldType::kINT32, 1);
      list.emplace_back("kv_num_heads", &kv_num_heads, PluginFieldType::kINT32, 1);
      list.emplace_back("packed_qkv", &packed_qkv, PluginFieldType::kINT32, 1);
    }
    fc.nbFields = static_cast<int32_t>(list.size());
    fc.fields = list.data();
  }
};

// A deep copy of a field collection, as TensorRT stores it in the engine.
struct SerializedFields {
  std::deque<std::string> names;
  std::deque<std::vector<uint8_t>> data;
  std::vector<PluginField> list;
  PluginFieldCollection fc{};
  explicit SerializedFields(const PluginFieldCollection* src) {
    for (int32_t i = 0; src && i < src->nbFields; ++i) {
      const PluginField& f = src->fields[i];
      size_t width = 1;
      switch (f.type) {
        case PluginFieldType::kFLOAT32: case PluginFieldType::kINT32: width = 4; break;
        case PluginFieldType::kFLOAT64: case PluginFieldType::kINT64: width = 8; break;
        case PluginFieldType::kFLOAT16: case PluginFieldType::kINT16: case PluginFieldType::kBF16: width = 2; break;
        default: width = 1;
      }
      names.emplace_back(f.name ? f.name : "");
      const auto* p = static_cast<const uint8_t*>(f.data);
      data.emplace_back(p, p + width * static_cast<size_t>(std::max(0, f.length)));
      list.emplace_back(names.back().c_str(), data.back().data(), f.type, f.length);
    }
    fc.nbFields = static_cast<int32_t>(list.size());
    fc.fields = list.data();
  }
  const PluginField* find(const char* name) const {
    for (const auto& f : list) {
      if (std::strcmp(f.name, name) == 0) return &f;
    }
    return nullptr;
  }
};

struct Caps {
  IPluginV3OneCore* core = nullptr;
  IPluginV3OneBuild* build = nullptr;
  IPluginV3OneRuntime* runtime = nullptr;
};

Caps caps_of(IPluginV3* p) {
  Caps c;
  c.core = static_cast<IPluginV3OneCore*>(p->getCapabilityInterface(PluginCapabilityType::kCORE));
  c.build = static_cast<IPluginV3OneBuild*>(p->getCapabilityInterface(PluginCapabilityType::kBUILD));
  c.runtime = static_cast<IPluginV3OneRuntime*>(p->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
  return c;
}

struct Shapes {  // runtime shapes of the inputs present, in node order
  std::vector<std::vector<int64_t>> in;
  std::vector<DataType> types;
  std::vector<int64_t> out;
};

int64_t packed_width(const Case& c) { return (c.Hq + 2 * c.Hkv) * c.D; }

Shapes shapes_of(const Case& c) {
  Shapes s;
  if (c.packed) {
    for (int i = 0; i < 3; ++i) s.in.push_back({c.B, c.Sq, packed_width(c)});
  } else {
    s.in.push_back({c.B, c.Hq, c.Sq, c.D});
    s.in.push_back({c.B, c.Hkv, c.Sk, c.D});
    s.in.push_back({c.B, c.Hkv, c.Sk, c.Dv});
  }
  s.types = {c.dtype, c.dtype, c.dtype};
  const bool bias = c.bias_scale > 0.0f;
  if (c.mask != MaskKind::kNone || c.key_lengths != DataType::kFLOAT || bias) {
    // An optional input is expressible through TensorRT only with those before it (empty names
    // are null tensors, see the README), so the cases with key_lengths or qkv_bias have a mask.
    s.in.push_back(c.mask_shape);
    s.types.push_back(c.mask == MaskKind::kBool ? DataType::kBOOL : c.dtype);
  }
  if (c.key_lengths != DataType::kFLOAT || bias) {
    s.in.push_back({c.B});
    s.types.push_back(c.key_lengths);
  }
  if (bias) {
    s.in.push_back({packed_width(c)});
    s.types.push_back(c.dtype);
  }
  s.out = c.packed ? std::vector<int64_t>{c.B, c.Sq, c.Hq * c.Dv} : std::vector<int64_t>{c.B, c.Hq, c.Sq, c.Dv};
  return s;
}

Dims to_dims(const std::vector<int64_t>& v) {
  Dims d{};
  d.nbDims = static_cast<int32_t>(v.size());
  for (size_t i = 0; i < v.size(); ++i) d.d[i] = v[i];
  return d;
}

// Which dimensions of input `i` the "network" declares dynamic (-1): batch and sequence lengths.
bool is_dynamic(size_t input, size_t axis, const std::vector<int64_t>& shape) {
  const size_t rank = shape.size();
  if (input <= 2) return axis == 0 || axis == (rank == 3 ? 1u : 2u);  // (B, S, H*D) or (B, H, S, D)
  if (input == 4) return true;  // key_lengths (B,)
  if (input == 5) return false;  // qkv_bias: a weight of the model
  // mask: dims that equal B / Sq / Sk and are not broadcast 1s
  const size_t full_axis = 4 - rank + axis;
  if (shape[axis] == 1) return false;
  return full_axis == 0 || full_axis == 2 || full_axis == 3;
}

// Profile bounds: min 1 for dynamic dims, max = 2x runtime (so the runtime shape is not the max).
std::vector<int64_t> bound(size_t input, const std::vector<int64_t>& shape, int which) {
  std::vector<int64_t> out = shape;
  for (size_t a = 0; a < shape.size(); ++a) {
    if (!is_dynamic(input, a, shape)) continue;
    if (which == 0) out[a] = 1;
    if (which == 2) out[a] = shape[a] * 2;
  }
  return out;
}

bool load_library(const char* path, Library* lib) {
  std::printf("dlopen %s\n", path);
  lib->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib->handle) {
    std::printf("SETUP ERROR: dlopen failed: %s\n", dlerror());
    return false;
  }
  using SetLoggerFinder = void (*)(nvinfer1::ILoggerFinder*);
  using GetCreators = nvinfer1::IPluginCreatorInterface* const* (*)(int32_t&);
  auto set_finder = reinterpret_cast<SetLoggerFinder>(dlsym(lib->handle, "setLoggerFinder"));
  auto get_creators = reinterpret_cast<GetCreators>(dlsym(lib->handle, "getCreators"));
  if (!check(set_finder != nullptr, "the library exports setLoggerFinder") ||
      !check(get_creators != nullptr, "the library exports getCreators")) {
    return false;
  }
  set_finder(&lib->finder);
  int32_t n = -1;
  nvinfer1::IPluginCreatorInterface* const* creators = get_creators(n);
  if (!check(creators != nullptr && n == 1, "getCreators returns one creator")) return false;
  const nvinfer1::InterfaceInfo info = creators[0]->getInterfaceInfo();
  check(std::strcmp(info.kind, "PLUGIN CREATOR_V3ONE") == 0 && info.major == 1,
        std::string("creator interface is PLUGIN CREATOR_V3ONE 1.x, got ") + info.kind);
  lib->creator = static_cast<IPluginCreatorV3One*>(creators[0]);
  check(std::strcmp(lib->creator->getPluginName(), "FusedAttention") == 0, "creator name FusedAttention");
  check(std::strcmp(lib->creator->getPluginVersion(), opsfuse::contract::kTrtPluginVersion) == 0, "creator version 1");
  check(std::strcmp(lib->creator->getPluginNamespace(), opsfuse::contract::kTrtPluginNamespace) == 0,
        "creator namespace com.opsfuse");
  const PluginFieldCollection* names = lib->creator->getFieldNames();
  std::set<std::string> got;
  for (int32_t i = 0; names && i < names->nbFields; ++i) {
    got.insert(names->fields[i].name);
    const bool is_int = std::strcmp(names->fields[i].name, "is_causal") == 0 ||
                        std::strcmp(names->fields[i].name, "q_num_heads") == 0 ||
                        std::strcmp(names->fields[i].name, "kv_num_heads") == 0 ||
                        std::strcmp(names->fields[i].name, "packed_qkv") == 0;
    check(names->fields[i].type == (is_int ? PluginFieldType::kINT32 : PluginFieldType::kFLOAT32),
          std::string("field ") + names->fields[i].name + " advertised as int32 / float32");
  }
  check(got == std::set<std::string>{"scale", "is_causal", "softcap", "q_num_heads", "kv_num_heads", "packed_qkv"},
        "getFieldNames = {scale, is_causal, softcap, q_num_heads, kv_num_heads, packed_qkv}");
  return true;
}

// ------------------------------------------------------------------ one positive case

struct DeviceBuffer {
  void* ptr = nullptr;
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
};

bool cuda_ok(cudaError_t e, const char* what) {
  return check(e == cudaSuccess, std::string(what) + ": " + cudaGetErrorString(e));
}

void run_case(Library& lib, const Case& c, bool gpu, uint64_t seed) {
  char bias[32] = "none";
  if (c.bias_scale > 0.0f) std::snprintf(bias, sizeof(bias), "normal x %g", c.bias_scale);
  std::printf("case %s: %s B=%lld Hq=%lld Hkv=%lld Sq=%lld Sk=%lld D=%lld Dv=%lld mask=%s key_lengths=%s "
              "scale=%s is_causal=%d softcap=%g packed_qkv=%d qkv_bias=%s\n",
              c.name.c_str(), type_name(c.dtype), (long long)c.B, (long long)c.Hq, (long long)c.Hkv,
              (long long)c.Sq, (long long)c.Sk, (long long)c.D, (long long)c.Dv,
              c.mask == MaskKind::kNone ? "none" : (c.mask == MaskKind::kBool ? "bool" : "additive"),
              c.key_lengths == DataType::kFLOAT ? "none" : type_name(c.key_lengths),
              c.has_scale ? std::to_string(c.scale).c_str() : "default", c.is_causal, c.softcap, c.packed ? 1 : 0,
              bias);
  const size_t failures_before = static_cast<size_t>(g_failures);
  const std::string node = "node_" + c.name;
  const Shapes sh = shapes_of(c);
  const int32_t nb_in = static_cast<int32_t>(sh.in.size());

  // 1. create (build phase), as the ONNX parser does
  Fields fields(c);
  std::unique_ptr<IPluginV3> built(lib.creator->createPlugin(node.c_str(), &fields.fc, TensorRTPhase::kBUILD));
  if (!check(built != nullptr, "createPlugin(kBUILD)")) return;
  Caps bc = caps_of(built.get());
  if (!check(bc.core && bc.build && bc.runtime, "core, build and runtime capabilities")) return;
  check(std::strcmp(bc.core->getPluginName(), "FusedAttention") == 0 &&
            std::strcmp(bc.core->getPluginVersion(), "1") == 0 &&
            std::strcmp(bc.core->getPluginNamespace(), "com.opsfuse") == 0,
        "core: name / version / namespace");

  // 2. output count, types, shapes
  check(bc.build->getNbOutputs() == 1, "getNbOutputs() == 1");
  DataType out_type = DataType::kINT8;
  check(bc.build->getOutputDataTypes(&out_type, 1, sh.types.data(), nb_in) == 0 && out_type == c.dtype,
        "getOutputDataTypes: Y has Q's type");
  FakeExprBuilder eb;
  std::vector<DimsExprs> in_exprs(sh.in.size());
  for (size_t i = 0; i < sh.in.size(); ++i) {
    in_exprs[i].nbDims = static_cast<int32_t>(sh.in[i].size());
    for (size_t a = 0; a < sh.in[i].size(); ++a) {
      in_exprs[i].d[a] = is_dynamic(i, a, sh.in[i])
                             ? eb.impl().make(false, 0, "in" + std::to_string(i) + ".d" + std::to_string(a))
                             : eb.constant(sh.in[i][a]);
    }
  }
  DimsExprs out_expr{};
  const int32_t rc = bc.build->getOutputShapes(in_exprs.data(), nb_in, nullptr, 0, &out_expr, 1, eb);
  check(rc == 0, "getOutputShapes returns 0");
  if (rc == 0 && c.packed) {
    // Q's packed width is a build-time constant, so Hq * (W / (Hq + 2*Hkv)) folds to Hq*D.
    const std::string got = describe(out_expr.d[0]) + "," + describe(out_expr.d[1]) + "," + describe(out_expr.d[2]);
    const std::string want = "in0.d0,in0.d1," + std::to_string(c.Hq * c.D);
    check(out_expr.nbDims == 3 && got == want,
          "output shape expressions (B, S, Hq*D) = (" + want + "), got (" + got + ")");
  } else if (rc == 0) {
    const std::string got = describe(out_expr.d[0]) + "," + describe(out_expr.d[1]) + "," +
                            describe(out_expr.d[2]) + "," + describe(out_expr.d[3]);
    const std::string want = "in0.d0," + std::to_string(c.Hq) + ",in0.d2," + std::to_string(c.Dv);
    check(out_expr.nbDims == 4 && got == want, "output shape expressions (B, Hq, Sq, Dv) = (" + want + "), got (" + got + ")");
  }

  // 3. format negotiation: every type x format at every position, given the choices before it
  std::vector<DynamicPluginTensorDesc> io(sh.in.size() + 1);
  const DataType kTypes[] = {DataType::kFLOAT, DataType::kHALF, DataType::kBF16, DataType::kINT8,
                             DataType::kINT32, DataType::kINT64, DataType::kBOOL};
  const TensorFormat kFormats[] = {TensorFormat::kLINEAR, TensorFormat::kHWC8, TensorFormat::kCHW32};
  std::vector<DataType> chosen = sh.types;
  chosen.push_back(c.dtype);  // Y
  for (size_t pos = 0; pos < io.size(); ++pos) {
    std::set<int> accepted, expected;
    for (DataType t : kTypes) {
      for (TensorFormat f : kFormats) {
        io[pos].desc.type = t;
        io[pos].desc.format = f;
        io[pos].desc.dims = to_dims(pos < sh.in.size() ? sh.in[pos] : sh.out);
        if (bc.build->supportsFormatCombination(static_cast<int32_t>(pos), io.data(), nb_in, 1)) {
          accepted.insert(static_cast<int>(t) * 16 + static_cast<int>(f));
        }
      }
    }
    auto expect = [&](DataType t) { expected.insert(static_cast<int>(t) * 16 + static_cast<int>(TensorFormat::kLINEAR)); };
    if (pos == 0) {
      expect(DataType::kFLOAT), expect(DataType::kHALF), expect(DataType::kBF16);
    } else if (pos == 3 && pos < sh.in.size()) {
      expect(DataType::kBOOL), expect(c.dtype);
    } else if (pos == 4 && pos < sh.in.size()) {
      expect(DataType::kINT32), expect(DataType::kINT64);
    } else {
      expect(c.dtype);  // K, V, qkv_bias, Y tied to Q
    }
    check(accepted == expected, "supportsFormatCombination at position " + std::to_string(pos) +
                                    " accepts exactly the contract's linear types");
    io[pos].desc.type = chosen[pos];
    io[pos].desc.format = TensorFormat::kLINEAR;
  }

  // 4. configure for a profile (wildcards in desc.dims), workspace
  std::vector<DynamicPluginTensorDesc> in_desc(sh.in.size()), out_desc(1);
  for (size_t i = 0; i < sh.in.size(); ++i) {
    std::vector<int64_t> wild = sh.in[i];
    for (size_t a = 0; a < wild.size(); ++a) {
      if (is_dynamic(i, a, sh.in[i])) wild[a] = -1;
    }
    in_desc[i].desc.dims = to_dims(wild);
    in_desc[i].desc.type = sh.types[i];
    in_desc[i].desc.format = TensorFormat::kLINEAR;
    in_desc[i].min = to_dims(bound(i, sh.in[i], 0));
    in_desc[i].opt = to_dims(sh.in[i]);
    in_desc[i].max = to_dims(bound(i, sh.in[i], 2));
  }
  {
    const int64_t bmax = c.B * 2, sqmax = c.Sq * 2;
    out_desc[0].desc.type = c.dtype;
    out_desc[0].desc.format = TensorFormat::kLINEAR;
    out_desc[0].opt = to_dims(sh.out);
    if (c.packed) {
      out_desc[0].desc.dims = to_dims({-1, -1, c.Hq * c.Dv});
      out_desc[0].min = to_dims({1, 1, c.Hq * c.Dv});
      out_desc[0].max = to_dims({bmax, sqmax, c.Hq * c.Dv});
    } else {
      out_desc[0].desc.dims = to_dims({-1, c.Hq, -1, c.Dv});
      out_desc[0].min = to_dims({1, c.Hq, 1, c.Dv});
      out_desc[0].max = to_dims({bmax, c.Hq, sqmax, c.Dv});
    }
  }
  check(bc.build->configurePlugin(in_desc.data(), nb_in, out_desc.data(), 1) == 0, "configurePlugin returns 0");
  const size_t workspace_bytes = bc.build->getWorkspaceSize(in_desc.data(), nb_in, out_desc.data(), 1);
  std::printf("  workspace for the profile's max shapes: %zu bytes\n", workspace_bytes);

  // 5. clone (TensorRT clones the network's plugin for the engine), drop the original
  std::unique_ptr<IPluginV3> cloned(built->clone());
  if (!check(cloned != nullptr, "clone()")) return;
  built.reset();
  Caps cc = caps_of(cloned.get());
  if (!check(cc.runtime != nullptr, "clone has a runtime capability")) return;

  // 6. serialize fields, re-create at runtime from the copy, attach to a context
  SerializedFields ser(cc.runtime->getFieldsToSerialize());
  check((ser.find("scale") != nullptr) == c.has_scale, "'scale' serialized iff it was given");
  if (const PluginField* f = ser.find("scale")) {
    float v = 0;
    std::memcpy(&v, f->data, 4);
    check(f->type == PluginFieldType::kFLOAT32 && v == c.scale, "serialized scale value");
  }
  if (const PluginField* f = ser.find("is_causal")) {
    int32_t v = -1;
    std::memcpy(&v, f->data, 4);
    check(f->type == PluginFieldType::kINT32 && v == c.is_causal, "serialized is_causal value");
  } else {
    check(false, "is_causal serialized");
  }
  if (const PluginField* f = ser.find("softcap")) {
    float v = -1;
    std::memcpy(&v, f->data, 4);
    check(f->type == PluginFieldType::kFLOAT32 && v == c.softcap, "serialized softcap value");
  } else {
    check(false, "softcap serialized");
  }
  for (const char* name : {"q_num_heads", "kv_num_heads", "packed_qkv"}) {
    const PluginField* f = ser.find(name);
    if (!c.packed) {
      check(f == nullptr, std::string("'") + name + "' not serialized when not given");
      continue;
    }
    int32_t v = -1;
    if (f != nullptr) std::memcpy(&v, f->data, 4);
    const int64_t want =
        std::strcmp(name, "q_num_heads") == 0 ? c.Hq : (std::strcmp(name, "kv_num_heads") == 0 ? c.Hkv : 1);
    check(f != nullptr && f->type == PluginFieldType::kINT32 && v == want,
          std::string("serialized ") + name + " value");
  }
  if (const PluginField* f = ser.find("workspace_bytes")) {
    int64_t v = -1;
    std::memcpy(&v, f->data, 8);
    check(f->type == PluginFieldType::kINT64 && v == static_cast<int64_t>(workspace_bytes),
          "serialized workspace_bytes = getWorkspaceSize()");
  } else {
    check(false, "workspace_bytes serialized after getWorkspaceSize");
  }
  cloned.reset();
  std::unique_ptr<IPluginV3> runtime_plugin(lib.creator->createPlugin(node.c_str(), &ser.fc, TensorRTPhase::kRUNTIME));
  if (!check(runtime_plugin != nullptr, "createPlugin(kRUNTIME) from the serialized fields")) return;
  FakeResourceContext ctx;
  Caps rc0 = caps_of(runtime_plugin.get());
  if (!check(rc0.runtime != nullptr, "runtime plugin has a runtime capability")) return;
  std::unique_ptr<IPluginV3> attached(rc0.runtime->attachToContext(&ctx));
  if (!check(attached != nullptr, "attachToContext")) return;
  runtime_plugin.reset();
  Caps ac = caps_of(attached.get());
  if (!check(ac.runtime != nullptr, "attached plugin has a runtime capability")) return;

  // 7. runtime shapes
  std::vector<PluginTensorDesc> rin(sh.in.size()), rout(1);
  for (size_t i = 0; i < sh.in.size(); ++i) {
    rin[i].dims = to_dims(sh.in[i]);
    rin[i].type = sh.types[i];
    rin[i].format = TensorFormat::kLINEAR;
    rin[i].scale = -1.0f;
  }
  rout[0].dims = to_dims(sh.out);
  rout[0].type = c.dtype;
  rout[0].format = TensorFormat::kLINEAR;
  rout[0].scale = -1.0f;
  if (!check(ac.runtime->onShapeChange(rin.data(), nb_in, rout.data(), 1) == 0, "onShapeChange returns 0")) return;

  if (!gpu) {
    std::printf("  (--no-gpu: enqueue skipped)\n");
    std::printf("  %s\n", static_cast<size_t>(g_failures) == failures_before ? "ok" : "FAILED");
    return;
  }

  // 8. enqueue on a stream into a NaN-poisoned output
  const HostData host = make_data(c, seed);
  std::vector<std::vector<uint8_t>> bytes;
  if (c.packed) {  // one tensor bound as Q, K and V (below), as the rewrite's node does
    bytes.push_back(encode(c.dtype, pack_qkv(c, host)));
    bytes.emplace_back();
    bytes.emplace_back();
  } else {
    bytes.push_back(encode(c.dtype, host.q));
    bytes.push_back(encode(c.dtype, host.k));
    bytes.push_back(encode(c.dtype, host.v));
  }
  if (nb_in > 3) {
    if (c.mask == MaskKind::kBool) bytes.push_back(host.mask_bool);
    else bytes.push_back(encode(c.dtype, host.mask_add));
  }
  if (nb_in > 4) {
    std::vector<uint8_t> kl(static_cast<size_t>(c.B) * elem_size(c.key_lengths));
    for (int64_t b = 0; b < c.B; ++b) {
      if (c.key_lengths == DataType::kINT32) {
        const int32_t v = static_cast<int32_t>(host.key_lengths[static_cast<size_t>(b)]);
        std::memcpy(&kl[static_cast<size_t>(b) * 4], &v, 4);
      } else {
        std::memcpy(&kl[static_cast<size_t>(b) * 8], &host.key_lengths[static_cast<size_t>(b)], 8);
      }
    }
    bytes.push_back(kl);
  }
  if (nb_in > 5) bytes.push_back(encode(c.dtype, host.bias));
  std::vector<DeviceBuffer> dev(sh.in.size());
  std::vector<const void*> in_ptrs(sh.in.size());
  for (size_t i = 0; i < sh.in.size(); ++i) {
    if (c.packed && (i == 1 || i == 2)) {
      in_ptrs[i] = in_ptrs[0];
      continue;
    }
    if (!cuda_ok(cudaMalloc(&dev[i].ptr, std::max<size_t>(bytes[i].size(), 1)), "cudaMalloc input")) return;
    if (!cuda_ok(cudaMemcpy(dev[i].ptr, bytes[i].data(), bytes[i].size(), cudaMemcpyHostToDevice), "copy input")) return;
    in_ptrs[i] = dev[i].ptr;
  }
  const size_t y_bytes = numel(sh.out) * elem_size(c.dtype);
  DeviceBuffer y, ws;
  if (!cuda_ok(cudaMalloc(&y.ptr, y_bytes), "cudaMalloc Y")) return;
  if (!cuda_ok(cudaMemset(y.ptr, 0xFF, y_bytes), "poison Y with NaN")) return;
  if (workspace_bytes > 0 && !cuda_ok(cudaMalloc(&ws.ptr, workspace_bytes), "cudaMalloc workspace")) return;
  cudaStream_t stream = nullptr;
  if (!cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate")) return;
  void* out_ptrs[1] = {y.ptr};
  const int32_t erc = ac.runtime->enqueue(rin.data(), rout.data(), in_ptrs.data(), out_ptrs, ws.ptr, stream);
  const bool enq_ok = check(erc == 0, "enqueue returns 0");
  cuda_ok(cudaStreamSynchronize(stream), "stream synchronize after enqueue");
  cudaStreamDestroy(stream);
  if (!enq_ok) return;
  std::vector<uint8_t> y_host(y_bytes);
  if (!cuda_ok(cudaMemcpy(y_host.data(), y.ptr, y_bytes, cudaMemcpyDeviceToHost), "copy Y back")) return;
  std::vector<float> got = decode(c.dtype, y_host);
  if (c.packed) {  // (B, S, Hq*Dv) -> the reference's (B, Hq, S, Dv)
    const std::vector<float> rows = got;
    for (int64_t b = 0; b < c.B; ++b) {
      for (int64_t h = 0; h < c.Hq; ++h) {
        for (int64_t i = 0; i < c.Sq; ++i) {
          for (int64_t e = 0; e < c.Dv; ++e) {
            got[static_cast<size_t>(((b * c.Hq + h) * c.Sq + i) * c.Dv + e)] =
                rows[static_cast<size_t>((b * c.Sq + i) * c.Hq * c.Dv + h * c.Dv + e)];
          }
        }
      }
    }
  }

  // 9. compare with the float64 reference, against the precision baseline
  const std::vector<double> ref = attention(c, host, /*low=*/false);
  const std::vector<double> base = attention(c, host, /*low=*/true);
  double err = 0.0, base_err = 0.0;
  size_t nonfinite = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) {
      ++nonfinite;
      continue;
    }
    err = std::max(err, std::fabs(static_cast<double>(got[i]) - ref[i]));
    base_err = std::max(base_err, std::fabs(base[i] - ref[i]));
  }
  // Rounding-noise floor relative to the output's magnitude, as tests/accuracy.py: half an ulp
  // for float16 / bfloat16, 4 ulps for float32 (streaming softmax sums differently).
  double ref_max = 1.0;  // max(1, max |ref|), as tests/accuracy.py
  for (double r : ref) ref_max = std::max(ref_max, std::fabs(r));
  const double eps = c.dtype == DataType::kFLOAT ? 0x1p-23 : (c.dtype == DataType::kHALF ? 0x1p-10 : 0x1p-7);
  const double floor = (c.dtype == DataType::kFLOAT ? 4.0 : 0.5) * eps * ref_max;
  const double tol = 2.0 * base_err + floor;
  std::printf("  max |plugin - ref64| = %.3e, max |%s baseline - ref64| = %.3e, tolerance %.3e, non-finite %zu\n",
              err, type_name(c.dtype), base_err, tol, nonfinite);
  check(nonfinite == 0, "no NaN / inf in the output");
  check(err <= tol, "error within 2x the precision baseline");

  // 10. an engine that reserved less workspace than this launch needs: refused, never overrun
  if (workspace_bytes > 0) {
    SerializedFields small(&ser.fc);
    for (size_t i = 0; i < small.list.size(); ++i) {
      if (std::strcmp(small.list[i].name, "workspace_bytes") == 0) std::memset(small.data[i].data(), 0, 8);
    }
    std::unique_ptr<IPluginV3> starved(lib.creator->createPlugin(node.c_str(), &small.fc, TensorRTPhase::kRUNTIME));
    cudaStream_t s2 = nullptr;
    if (check(starved != nullptr, "createPlugin with workspace_bytes = 0") &&
        cuda_ok(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), "cudaStreamCreate")) {
      IPluginV3OneRuntime* rt = caps_of(starved.get()).runtime;
      const size_t mark = lib.finder.logger.messages.size();
      check(rt->onShapeChange(rin.data(), nb_in, rout.data(), 1) == 0, "onShapeChange (workspace_bytes = 0)");
      const int32_t src = rt->enqueue(rin.data(), rout.data(), in_ptrs.data(), out_ptrs, ws.ptr, s2);
      // This shape may need no workspace at all (the profile's other shapes did): then it runs.
      const bool refused = src != 0 && lib.finder.logger.has_error(mark, {"FusedAttention", "workspace"});
      check(src == 0 || refused, "a launch needing more workspace than the engine reserved is refused, never run");
      if (refused) ++g_workspace_refusals;
      cuda_ok(cudaStreamSynchronize(s2), "stream synchronize");
      cudaStreamDestroy(s2);
    }
  }
  std::printf("  %s\n", static_cast<size_t>(g_failures) == failures_before ? "ok" : "FAILED");
}

// ------------------------------------------------------------------ negative checks

void run_negative(Library& lib) {
  std::printf("negative checks (errors reported through the logger, never a crash)\n");
  CapturingLogger& log = lib.finder.logger;
  auto create = [&](std::vector<PluginField> f) -> IPluginV3* {
    PluginFieldCollection fc{static_cast<int32_t>(f.size()), f.data()};
    return lib.creator->createPlugin("bad_node", &fc, TensorRTPhase::kBUILD);
  };
  {
    const int32_t bad = 3;
    const size_t mark = log.messages.size();
    IPluginV3* p = create({PluginField("is_causal", &bad, PluginFieldType::kINT32, 1)});
    check(p == nullptr && log.has_error(mark, {"FusedAttention", "bad_node", "is_causal"}), "is_causal=3 rejected and logged");
    delete p;
  }
  {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const size_t mark = log.messages.size();
    IPluginV3* p = create({PluginField("scale", &nan, PluginFieldType::kFLOAT32, 1)});
    check(p == nullptr && log.has_error(mark, {"FusedAttention", "scale"}), "scale=NaN rejected and logged");
    delete p;
  }
  {
    const float one = 1.0f;
    const size_t mark = log.messages.size();
    IPluginV3* p = create({PluginField("is_causal", &one, PluginFieldType::kFLOAT32, 1)});
    check(p == nullptr && log.has_error(mark, {"FusedAttention", "is_causal", "int32"}), "is_causal as float32 rejected");
    delete p;
  }
  {
    const float neg = -1.0f;
    const size_t mark = log.messages.size();
    IPluginV3* p = create({PluginField("softcap", &neg, PluginFieldType::kFLOAT32, 1)});
    check(p == nullptr && log.has_error(mark, {"FusedAttention", "softcap"}), "softcap=-1 rejected");
    delete p;
  }
  {
    const int32_t x = 1;
    const size_t mark = log.messages.size();
    IPluginV3* p = create({PluginField("causal", &x, PluginFieldType::kINT32, 1)});
    check(p == nullptr && log.has_error(mark, {"FusedAttention", "unknown field", "causal"}), "unknown field rejected");
    delete p;
  }
  {
    const char version[] = "1";
    IPluginV3* p = create({PluginField("plugin_version", version, PluginFieldType::kCHAR, 2)});
    check(p != nullptr, "plugin_version field ignored, defaults used");
    if (p) {
      SerializedFields ser(caps_of(p).runtime->getFieldsToSerialize());
      check(ser.find("scale") == nullptr, "no scale field when none was given (default 1/sqrt(D) kept)");
    }
    delete p;
  }
  // Shape errors visible at build time, at runtime, and in enqueue.
  std::unique_ptr<IPluginV3> p(create({}));
  if (!check(p != nullptr, "createPlugin without fields")) return;
  Caps c = caps_of(p.get());
  FakeExprBuilder eb;
  {
    DimsExprs in[3];
    const int64_t shapes[3][4] = {{2, 4, 8, 64}, {2, 2, 8, 32}, {2, 2, 8, 32}};
    for (int i = 0; i < 3; ++i) {
      in[i].nbDims = 4;
      for (int a = 0; a < 4; ++a) in[i].d[a] = eb.constant(shapes[i][a]);
    }
    DimsExprs out{};
    const size_t mark = log.messages.size();
    check(c.build->getOutputShapes(in, 3, nullptr, 0, &out, 1, eb) != 0 &&
              log.has_error(mark, {"FusedAttention", "head size"}),
          "getOutputShapes: D of Q (64) != D of K (32) rejected");
    const size_t mark2 = log.messages.size();
    check(c.build->getOutputShapes(in, 2, nullptr, 0, &out, 1, eb) != 0 && log.has_error(mark2, {"3 to 6 inputs"}),
          "getOutputShapes: 2 inputs rejected");
  }
  {
    PluginTensorDesc in[3]{}, out[1]{};
    const std::vector<int64_t> shapes[3] = {{1, 3, 5, 16}, {1, 2, 7, 16}, {1, 2, 7, 16}};
    for (int i = 0; i < 3; ++i) {
      in[i].dims = to_dims(shapes[i]);
      in[i].type = DataType::kHALF;
      in[i].format = TensorFormat::kLINEAR;
    }
    out[0].dims = to_dims({1, 3, 5, 16});
    out[0].type = DataType::kHALF;
    const void* ins[3] = {nullptr, nullptr, nullptr};
    void* outs[1] = {nullptr};
    std::unique_ptr<IPluginV3> fresh(p->clone());
    const size_t mark0 = log.messages.size();
    check(caps_of(fresh.get()).runtime->enqueue(in, out, ins, outs, nullptr, nullptr) != 0 &&
              log.has_error(mark0, {"FusedAttention"}),
          "enqueue before onShapeChange rejected (no launch)");
    const size_t mark = log.messages.size();
    check(c.runtime->onShapeChange(in, 3, out, 1) != 0 && log.has_error(mark, {"FusedAttention", "multiple"}),
          "onShapeChange: Hq=3 with Hkv=2 rejected");
    in[0].dims = to_dims({1, 2, 5, 16});
    out[0].dims = to_dims({1, 2, 5, 16});
    check(c.runtime->onShapeChange(in, 3, out, 1) == 0, "onShapeChange: a valid shape accepted");
    in[1].dims = to_dims({2, 2, 7, 16});  // K batch 2 != Q batch 1
    const size_t mark3 = log.messages.size();
    check(c.runtime->enqueue(in, out, ins, outs, nullptr, nullptr) != 0 &&
              log.has_error(mark3, {"FusedAttention", "batch"}),
          "enqueue: mismatched batch rejected before any launch");
  }
  {
    DynamicPluginTensorDesc io[4]{};
    io[0].desc.type = DataType::kINT32;
    io[0].desc.format = TensorFormat::kLINEAR;
    check(!c.build->supportsFormatCombination(0, io, 3, 1), "int32 Q refused");
    check(!c.build->supportsFormatCombination(7, io, 3, 1), "position out of range refused");
  }
}

// qkv_bias (input 5): allowed only with packed_qkv = 1, of Q's type and shape ((Hq + 2*Hkv)*D,);
// each violation reported through the logger, naming the input, at build time and at run time.
void run_negative_qkv_bias(Library& lib) {
  std::printf("negative checks: qkv_bias\n");
  CapturingLogger& log = lib.finder.logger;
  const int32_t hq = 2, hkv = 1, one = 1;
  const int64_t B = 2, S = 8, D = 16, W = (hq + 2 * hkv) * D;
  std::vector<PluginField> packed_fields = {PluginField("q_num_heads", &hq, PluginFieldType::kINT32, 1),
                                            PluginField("kv_num_heads", &hkv, PluginFieldType::kINT32, 1),
                                            PluginField("packed_qkv", &one, PluginFieldType::kINT32, 1)};
  PluginFieldCollection packed_fc{static_cast<int32_t>(packed_fields.size()), packed_fields.data()};
  PluginFieldCollection plain_fc{0, nullptr};
  std::unique_ptr<IPluginV3> packed(lib.creator->createPlugin("bias_node", &packed_fc, TensorRTPhase::kBUILD));
  std::unique_ptr<IPluginV3> plain(lib.creator->createPlugin("plain_node", &plain_fc, TensorRTPhase::kBUILD));
  if (!check(packed != nullptr && plain != nullptr, "createPlugin for the qkv_bias checks")) return;
  const Caps pc = caps_of(packed.get()), nc = caps_of(plain.get());

  // Six inputs: Q, K, V (packed (B, S, W) or 4-D), a bool mask (1, 1), int32 key_lengths (B,), the bias.
  auto shapes = [&](bool packed_form, int64_t bias_len) {
    std::vector<std::vector<int64_t>> v;
    for (int i = 0; i < 3; ++i) {
      v.push_back(packed_form ? std::vector<int64_t>{B, S, W} : std::vector<int64_t>{B, hq, S, D});
    }
    v.push_back({1, 1});
    v.push_back({B});
    v.push_back({bias_len});
    return v;
  };
  auto exprs = [&](const std::vector<std::vector<int64_t>>& v, FakeExprBuilder& eb) {
    std::vector<DimsExprs> e(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      e[i].nbDims = static_cast<int32_t>(v[i].size());
      for (size_t a = 0; a < v[i].size(); ++a) e[i].d[a] = eb.constant(v[i][a]);
    }
    return e;
  };
  auto descs = [&](const std::vector<std::vector<int64_t>>& v, DataType bias_type) {
    std::vector<PluginTensorDesc> d(v.size());
    const DataType types[6] = {DataType::kHALF, DataType::kHALF, DataType::kHALF, DataType::kBOOL, DataType::kINT32,
                               bias_type};
    for (size_t i = 0; i < v.size(); ++i) {
      d[i].dims = to_dims(v[i]);
      d[i].type = types[i];
      d[i].format = TensorFormat::kLINEAR;
      d[i].scale = -1.0f;
    }
    return d;
  };
  PluginTensorDesc out[1]{};
  out[0].type = DataType::kHALF;
  out[0].format = TensorFormat::kLINEAR;
  FakeExprBuilder eb;
  DimsExprs out_expr{};

  {  // without packed_qkv: build time (getOutputShapes, configurePlugin) and run time (onShapeChange)
    const auto v = shapes(false, W);
    std::vector<DimsExprs> e = exprs(v, eb);
    size_t mark = log.messages.size();
    check(nc.build->getOutputShapes(e.data(), 6, nullptr, 0, &out_expr, 1, eb) != 0 &&
              log.has_error(mark, {"FusedAttention", "plain_node", "qkv_bias", "packed_qkv"}),
          "getOutputShapes: qkv_bias without packed_qkv rejected");
    std::vector<DynamicPluginTensorDesc> dyn(6), dyn_out(1);
    const std::vector<PluginTensorDesc> d = descs(v, DataType::kHALF);
    for (size_t i = 0; i < 6; ++i) dyn[i].desc = d[i];
    dyn_out[0].desc = out[0];
    dyn_out[0].desc.dims = to_dims({B, hq, S, D});
    mark = log.messages.size();
    check(nc.build->configurePlugin(dyn.data(), 6, dyn_out.data(), 1) != 0 &&
              log.has_error(mark, {"FusedAttention", "qkv_bias", "packed_qkv"}),
          "configurePlugin: qkv_bias without packed_qkv rejected");
    out[0].dims = to_dims({B, hq, S, D});
    mark = log.messages.size();
    check(nc.runtime->onShapeChange(d.data(), 6, out, 1) != 0 &&
              log.has_error(mark, {"FusedAttention", "qkv_bias", "packed_qkv"}),
          "onShapeChange: qkv_bias without packed_qkv rejected");
  }
  out[0].dims = to_dims({B, S, hq * D});
  {  // packed: the bias's rank and length, at build time
    std::vector<DimsExprs> e = exprs(shapes(true, W - 1), eb);
    size_t mark = log.messages.size();
    check(pc.build->getOutputShapes(e.data(), 6, nullptr, 0, &out_expr, 1, eb) != 0 &&
              log.has_error(mark, {"FusedAttention", "qkv_bias", "shape", std::to_string(W).c_str()}),
          "getOutputShapes: qkv_bias of length W - 1 rejected");
    e[5].nbDims = 2;
    e[5].d[1] = eb.constant(1);
    mark = log.messages.size();
    check(pc.build->getOutputShapes(e.data(), 6, nullptr, 0, &out_expr, 1, eb) != 0 &&
              log.has_error(mark, {"FusedAttention", "qkv_bias", "rank"}),
          "getOutputShapes: qkv_bias of rank 2 rejected");
    e = exprs(shapes(true, W), eb);
    check(pc.build->getOutputShapes(e.data(), 6, nullptr, 0, &out_expr, 1, eb) == 0 && out_expr.nbDims == 3 &&
              describe(out_expr.d[2]) == std::to_string(hq * D),
          "getOutputShapes: a valid qkv_bias leaves Y = (B, S, Hq*D)");
    std::vector<DimsExprs> seven = exprs(shapes(true, W), eb);
    seven.push_back(seven[5]);
    mark = log.messages.size();
    check(pc.build->getOutputShapes(seven.data(), 7, nullptr, 0, &out_expr, 1, eb) != 0 &&
              log.has_error(mark, {"3 to 6 inputs"}),
          "getOutputShapes: 7 inputs rejected");
  }
  {  // packed: format negotiation ties the bias to Q's type
    std::vector<DynamicPluginTensorDesc> io(7);
    for (auto& x : io) {
      x.desc.type = DataType::kHALF;
      x.desc.format = TensorFormat::kLINEAR;
    }
    io[3].desc.type = DataType::kBOOL;
    io[4].desc.type = DataType::kINT32;
    check(pc.build->supportsFormatCombination(5, io.data(), 6, 1), "float16 qkv_bias with float16 Q accepted");
    io[5].desc.type = DataType::kFLOAT;
    check(!pc.build->supportsFormatCombination(5, io.data(), 6, 1), "float32 qkv_bias with float16 Q refused");
    io[5].desc.type = DataType::kHALF;
    io[5].desc.format = TensorFormat::kHWC8;
    check(!pc.build->supportsFormatCombination(5, io.data(), 6, 1), "non-linear qkv_bias refused");
  }
  {  // packed: run time (onShapeChange, enqueue) with the real shapes
    std::vector<PluginTensorDesc> d = descs(shapes(true, W - 1), DataType::kHALF);
    size_t mark = log.messages.size();
    check(pc.runtime->onShapeChange(d.data(), 6, out, 1) != 0 &&
              log.has_error(mark, {"FusedAttention", "qkv_bias", "shape", std::to_string(W).c_str()}),
          "onShapeChange: qkv_bias of length W - 1 rejected");
    d = descs(shapes(true, W), DataType::kFLOAT);
    mark = log.messages.size();
    check(pc.runtime->onShapeChange(d.data(), 6, out, 1) != 0 &&
              log.has_error(mark, {"FusedAttention", "qkv_bias", "element type", "float32"}),
          "onShapeChange: float32 qkv_bias with float16 Q rejected");
    d = descs(shapes(true, W), DataType::kHALF);
    check(pc.runtime->onShapeChange(d.data(), 6, out, 1) == 0, "onShapeChange: a valid qkv_bias accepted");
    d[5].dims = to_dims({W + hq});  // between onShapeChange and enqueue: refused before any launch
    const void* ins[6] = {};
    void* outs[1] = {nullptr};
    mark = log.messages.size();
    check(pc.runtime->enqueue(d.data(), out, ins, outs, nullptr, nullptr) != 0 &&
              log.has_error(mark, {"FusedAttention", "qkv_bias", "shape"}),
          "enqueue: qkv_bias of the wrong length rejected before any launch");
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool gpu = true;
  const char* path = OPSFUSE_TRT_LIBRARY_PATH;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-gpu") == 0) {
      gpu = false;
    } else if (std::strcmp(argv[i], "--library") == 0 && i + 1 < argc) {
      path = argv[++i];
    } else {
      std::printf("usage: %s [--no-gpu] [--library PATH]\n", argv[0]);
      return 2;
    }
  }
  std::printf("NOTE: this is NOT a TensorRT engine run. TensorRT is not installed here; this program plays\n"
              "TensorRT's part (fake expression builder, logger finder, resource context) and drives the\n"
              "FusedAttention plugin through its IPluginV3 interfaces. Built against TensorRT %d.%d.%d headers.\n",
              NV_TENSORRT_MAJOR, NV_TENSORRT_MINOR, NV_TENSORRT_PATCH);
  if (gpu) {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      std::printf("SETUP ERROR: no CUDA device (%s); use --no-gpu to skip the enqueue numerics\n",
                  cudaGetErrorString(e));
      return 2;
    }
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    std::printf("GPU: %s\n", prop.name);
  }
  Library lib;
  if (!load_library(path, &lib)) {
    std::printf("SETUP ERROR: cannot use %s\n", path);
    return 2;
  }

  const DataType kNoKL = DataType::kFLOAT;  // "no key_lengths"
  const std::vector<Case> cases = {
      {"f32_gqa_causal_d40", DataType::kFLOAT, 2, 4, 2, 97, 97, 40, 40, MaskKind::kNone, {}, kNoKL, false, 0, 1, 0},
      {"f16_mqa_decode_d128", DataType::kHALF, 2, 8, 1, 1, 1025, 128, 128, MaskKind::kBool, {2, 1, 1, 1025},
       DataType::kINT32, false, 0, 2, 0},
      {"bf16_softcap_d80_dv96", DataType::kBF16, 2, 2, 2, 33, 257, 80, 96, MaskKind::kNone, {}, kNoKL, true, 0.125f, 0,
       30.0f},
      {"f16_boolmask_d256", DataType::kHALF, 1, 2, 2, 97, 130, 256, 256, MaskKind::kBool, {1, 1, 97, 130}, kNoKL, true,
       0.05f, 0, 0},
      {"f32_additive_kl64_d96", DataType::kFLOAT, 3, 3, 1, 17, 97, 96, 96, MaskKind::kAdditive, {17, 97},
       DataType::kINT64, false, 0, 0, 0},
      {"bf16_causal_s1025_d128", DataType::kBF16, 1, 2, 1, 1025, 1025, 128, 128, MaskKind::kNone, {}, kNoKL, false, 0,
       1, 0},
      {"f16_additive_lowerright_d80", DataType::kHALF, 2, 4, 4, 5, 97, 80, 80, MaskKind::kAdditive, {2, 4, 5, 97},
       kNoKL, false, 0, 2, 50.0f},
      // Packed Q/K/V (one tensor bound three times); with qkv_bias (six inputs), the fully padded
      // row of key_lengths must stay zeros rather than V's bias. float16 without softcap is the
      // Hopper kernel's own bias path on H100/H200; softcap with a K bias and float32 read biased copies.
      {"f16_packed_gqa_causal_d64", DataType::kHALF, 2, 4, 2, 97, 97, 64, 64, MaskKind::kNone, {}, kNoKL, false, 0, 1,
       0, true},
      {"f16_packed_bias_gqa_d64", DataType::kHALF, 2, 4, 2, 130, 130, 64, 64, MaskKind::kBool, {2, 1, 1, 130},
       DataType::kINT32, false, 0, 0, 0, true, 1.0f},
      {"bf16_packed_bias_softcap_d128", DataType::kBF16, 2, 2, 2, 257, 257, 128, 128, MaskKind::kAdditive, {257, 257},
       DataType::kINT64, false, 0, 0, 30.0f, true, 8.0f},
      {"f32_packed_bias_mqa_causal_d40", DataType::kFLOAT, 2, 4, 1, 33, 33, 40, 40, MaskKind::kBool, {2, 1, 33, 33},
       DataType::kINT32, true, 0.2f, 1, 0, true, 4.0f},
  };
  uint64_t seed = 1234;
  for (const Case& c : cases) run_case(lib, c, gpu, seed++);
  run_negative(lib);
  run_negative_qkv_bias(lib);
  if (gpu) {
    check(g_workspace_refusals > 0, "some case exercised the workspace refusal (a shape needing split-KV scratch)");
  }

  std::printf("\n%d checks, %d failed. %s\n", g_checks, g_failures, g_failures == 0 ? "ALL PASSED" : "FAILURES");
  std::printf("NOTE: not a TensorRT engine run (see plugin/trt/README.md, Known issues).\n");
  return g_failures == 0 ? 0 : 1;
}
