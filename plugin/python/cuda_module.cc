// opsfuse._cuda: the pybind11 module over the CUDA launcher. A thin adapter: it reads each tensor
// through __cuda_array_interface__ (v2/v3) or DLPack (__dlpack__), validates with the shared
// shape_check (the same messages as every front end), fills AttentionParams with the tensors' own
// strides and enqueues opsfuse::cuda::launch on the caller's stream. The Python face
// (opsfuse/cuda.py) allocates the output and the workspace with the tensors' framework.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>  // std::optional arguments

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "common/contract.h"
#include "common/message.h"
#include "common/shape_check.h"
#include "cuda/attention_cuda.h"

namespace py = pybind11;

namespace {

// The DLPack ABI (stable C structs, dlpack.h v0.x "dltensor" capsules).
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
constexpr int32_t kDLCUDA = 2, kDLCUDAManaged = 13;
constexpr uint8_t kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6;

// Errors never cross into Python as C++ exceptions: each entry point returns (code, message, value)
// and opsfuse/cuda.py raises. (A C++ exception would walk every exception translator registered in
// the process -- PyTorch registers its own -- and one crash was seen on the H200 in that path.)
enum ErrorCode : int { kOk = 0, kInvalid = 1, kUnsupported = 2, kDevice = 3 };
struct Error {
  ErrorCode code;
  std::string message;
};

[[noreturn]] void invalid(const std::string& msg) { throw Error{kInvalid, "FusedAttention: " + msg}; }

// One tensor as the launcher sees it. Keeps a DLPack capsule's tensor alive until released.
struct View {
  bool present = false;
  void* data = nullptr;
  opsfuse::ElemType type = opsfuse::ElemType::kOther;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // elements
  DLManagedTensor* managed = nullptr;
  View() = default;
  View(const View&) = delete;
  View& operator=(const View&) = delete;
  ~View() {
    if (managed && managed->deleter) managed->deleter(managed);
  }
};

size_t elem_bytes(opsfuse::ElemType t) {
  switch (t) {
    case opsfuse::ElemType::kFloat32:
    case opsfuse::ElemType::kInt32: return 4;
    case opsfuse::ElemType::kInt64: return 8;
    case opsfuse::ElemType::kFloat16:
    case opsfuse::ElemType::kBFloat16: return 2;
    case opsfuse::ElemType::kBool: return 1;
    default: return 1;
  }
}

opsfuse::ElemType from_typestr(const std::string& ts) {
  const std::string t = ts.size() > 1 ? ts.substr(1) : ts;
  if (t == "f4") return opsfuse::ElemType::kFloat32;
  if (t == "f2") return opsfuse::ElemType::kFloat16;
  if (t == "b1") return opsfuse::ElemType::kBool;
  if (t == "i4") return opsfuse::ElemType::kInt32;
  if (t == "i8") return opsfuse::ElemType::kInt64;
  return opsfuse::ElemType::kOther;
}

opsfuse::ElemType from_dl(DLDataType d) {
  if (d.lanes != 1) return opsfuse::ElemType::kOther;
  if (d.code == kDLFloat && d.bits == 32) return opsfuse::ElemType::kFloat32;
  if (d.code == kDLFloat && d.bits == 16) return opsfuse::ElemType::kFloat16;
  if (d.code == kDLBfloat && d.bits == 16) return opsfuse::ElemType::kBFloat16;
  if ((d.code == kDLBool || d.code == kDLUInt) && d.bits == 8) return d.code == kDLBool ? opsfuse::ElemType::kBool : opsfuse::ElemType::kOther;
  if (d.code == kDLInt && d.bits == 32) return opsfuse::ElemType::kInt32;
  if (d.code == kDLInt && d.bits == 64) return opsfuse::ElemType::kInt64;
  return opsfuse::ElemType::kOther;
}

void dense(View& v) {
  v.strides.assign(v.shape.size(), 1);
  for (int i = static_cast<int>(v.shape.size()) - 2; i >= 0; --i) v.strides[i] = v.strides[i + 1] * v.shape[i + 1];
}

void read_view(const py::handle& obj, const char* name, int64_t stream, View& v) {
  if (obj.is_none()) return;
  v.present = true;
  // __cuda_array_interface__ first (torch and CuPy both have it; torch raises for bfloat16).
  if (py::hasattr(obj, "__cuda_array_interface__")) {
    py::object cai;
    bool ok = true;
    try {
      cai = obj.attr("__cuda_array_interface__");
    } catch (py::error_already_set&) {
      ok = false;  // e.g. torch bfloat16: use DLPack below
    }
    if (ok && from_typestr(cai.cast<py::dict>()["typestr"].cast<std::string>()) == opsfuse::ElemType::kOther &&
        py::hasattr(obj, "__dlpack__")) {
      ok = false;  // a type the interface cannot name (torch's bfloat16): DLPack says it exactly
    }
    if (ok) {
      py::dict d = cai.cast<py::dict>();
      v.type = from_typestr(d["typestr"].cast<std::string>());
      for (auto s : d["shape"].cast<py::tuple>()) v.shape.push_back(s.cast<int64_t>());
      v.data = reinterpret_cast<void*>(d["data"].cast<py::tuple>()[0].cast<uintptr_t>());
      if (d.contains("strides") && !d["strides"].is_none()) {
        const size_t eb = elem_bytes(v.type);
        for (auto s : d["strides"].cast<py::tuple>()) v.strides.push_back(s.cast<int64_t>() / static_cast<int64_t>(eb));
      } else {
        dense(v);
      }
      return;
    }
  }
  if (!py::hasattr(obj, "__dlpack__")) {
    invalid(std::string(name) + " must be a CUDA tensor exposing __cuda_array_interface__ or __dlpack__");
  }
  py::object cap;
  try {
    cap = obj.attr("__dlpack__")(py::arg("stream") = stream == 0 ? 1 : stream);
  } catch (py::error_already_set&) {
    cap = obj.attr("__dlpack__")();
  }
  PyObject* c = cap.ptr();
  if (!PyCapsule_IsValid(c, "dltensor")) invalid(std::string(name) + ": __dlpack__ did not return a 'dltensor' capsule");
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(c, "dltensor"));
  PyCapsule_SetName(c, "used_dltensor");  // consumed: we call the deleter
  v.managed = m;
  const DLTensor& t = m->dl_tensor;
  if (t.device.device_type != kDLCUDA && t.device.device_type != kDLCUDAManaged)
    invalid(std::string(name) + " is not on a CUDA device (DLPack device type " + std::to_string(t.device.device_type) + ")");
  v.type = from_dl(t.dtype);
  v.data = static_cast<char*>(t.data) + t.byte_offset;
  v.shape.assign(t.shape, t.shape + t.ndim);
  if (t.strides) v.strides.assign(t.strides, t.strides + t.ndim); else dense(v);
}

// Element strides of the (batch, head, sequence) dims; the last dim must be contiguous.
void strides3(const View& v, const char* name, int64_t out[3]) {
  if (v.shape[3] > 1 && v.strides[3] != 1) invalid(std::string(name) + " must be contiguous in its last dimension");
  for (int i = 0; i < 3; ++i) out[i] = v.strides[i];
}

struct Prepared {
  View in[5];
  View bias[3];  // q_bias, k_bias, v_bias
  opsfuse::AttentionParams p;
};

// The optional per-tensor biases (the ONNX op's qkv_bias, split): (heads * head size,) of Q's type.
struct Biases {
  py::handle q, k, v;
};

void read_biases(Prepared& pr, const Biases& b, int64_t stream) {
  static const char* const kNames[3] = {"q_bias", "k_bias", "v_bias"};
  const py::handle handles[3] = {b.q, b.k, b.v};
  opsfuse::AttentionParams& p = pr.p;
  const int64_t want[3] = {p.heads_q * p.head_dim, p.heads_kv * p.head_dim, p.heads_kv * p.head_dim_v};
  const void** ptr[3] = {&p.q_bias, &p.k_bias, &p.v_bias};
  for (int i = 0; i < 3; ++i) {
    View& bv = pr.bias[i];
    read_view(handles[i], kNames[i], stream, bv);
    if (!bv.present) continue;
    opsfuse::Message os;
    if (bv.shape.size() != 1 || bv.shape[0] != want[i]) {
      os << kNames[i] << " must have shape (" << want[i] << ",) (heads x head size), got rank "
         << static_cast<int64_t>(bv.shape.size()) << (bv.shape.size() == 1 ? " of length " + std::to_string(bv.shape[0]) : "");
      invalid(os.str());
    }
    if (bv.type != pr.in[0].type) invalid(std::string(kNames[i]) + " must have the element type of Q");
    if (bv.shape[0] > 1 && bv.strides[0] != 1) invalid(std::string(kNames[i]) + " must be contiguous");
    *ptr[i] = bv.data;
  }
}

void prepare(Prepared& pr, py::handle q, py::handle k, py::handle v, py::handle mask, py::handle kl,
             std::optional<float> scale, int64_t is_causal, float softcap, const Biases& biases, int64_t stream) {
  read_view(q, "Q", stream, pr.in[0]);
  read_view(k, "K", stream, pr.in[1]);
  read_view(v, "V", stream, pr.in[2]);
  read_view(mask, "attn_mask", stream, pr.in[3]);
  read_view(kl, "key_lengths", stream, pr.in[4]);
  for (int i = 0; i < 3; ++i)
    if (!pr.in[i].present) invalid("Q, K and V are required");
  // The binding reads each tensor's own strides as (batch, head, sequence): the graph op's 3-D
  // (B, S, H*D) form is a (B, H, S, D) view here (x.view(B, S, H, D).transpose(1, 2)).
  static const char* const kQkv[3] = {"Q", "K", "V"};
  for (int i = 0; i < 3; ++i) {
    if (pr.in[i].shape.size() == 4) continue;
    opsfuse::Message os;
    os << "input " << kQkv[i] << " must have rank 4 (batch, heads, sequence, head size) in "
       << "opsfuse.cuda.fused_attention, got rank " << static_cast<int64_t>(pr.in[i].shape.size())
       << "; pass a (B, S, H*D) tensor as its (B, H, S, D) view";
    invalid(os.str());
  }
  opsfuse::TensorDesc desc[opsfuse::contract::kNumInputs];  // qkv_bias: the ONNX input, not this module's
  for (int i = 0; i < 5; ++i) {
    desc[i].present = pr.in[i].present;
    desc[i].type = pr.in[i].type;
    desc[i].shape = pr.in[i].shape;
  }
  opsfuse::AttentionAttributes attrs;
  attrs.has_scale = scale.has_value();
  attrs.scale = scale.value_or(0.0f);
  attrs.is_causal = is_causal;
  attrs.softcap = softcap;
  const std::string err = opsfuse::check_inputs_and_fill(desc, attrs, &pr.p);
  if (!err.empty()) invalid(err);
  opsfuse::AttentionParams& p = pr.p;
  p.q = pr.in[0].data;
  p.k = pr.in[1].data;
  p.v = pr.in[2].data;
  strides3(pr.in[0], "Q", p.q_stride);
  strides3(pr.in[1], "K", p.k_stride);
  strides3(pr.in[2], "V", p.v_stride);
  if (pr.in[3].present) {
    const View& m = pr.in[3];
    const int rank = static_cast<int>(m.shape.size());
    for (int i = 0; i < 4; ++i) p.mask_stride[i] = 0;
    for (int i = 0; i < rank; ++i) p.mask_stride[4 - rank + i] = m.shape[i] == 1 ? 0 : m.strides[i];
    p.mask = m.data;
  }
  if (pr.in[4].present) {
    if (pr.in[4].shape[0] > 1 && pr.in[4].strides[0] != 1) invalid("key_lengths must be contiguous");
    p.key_lengths = pr.in[4].data;
  }
  read_biases(pr, biases, stream);
}

int64_t workspace_size_impl(py::handle q, py::handle k, py::handle v, py::handle mask, py::handle kl,
                          std::optional<float> scale, int64_t is_causal, float softcap, const Biases& biases) {
  Prepared pr;
  prepare(pr, q, k, v, mask, kl, scale, is_causal, softcap, biases, -1);
  return static_cast<int64_t>(opsfuse::cuda::workspace_size(pr.p));
}

// The launcher's plan for these inputs on a described device (opsfuse::cuda::describe_plan): the
// heuristic, testable without that GPU. The tensors' memory is never touched.
py::dict describe_plan_impl(py::handle q, py::handle k, py::handle v, py::handle mask, py::handle kl,
                            std::optional<float> scale, int64_t is_causal, float softcap, const Biases& biases,
                            int sms, int smem_per_sm, int cc) {
  Prepared pr;
  prepare(pr, q, k, v, mask, kl, scale, is_causal, softcap, biases, -1);
  opsfuse::cuda::PlanSummary s;
  if (!opsfuse::cuda::describe_plan(pr.p, sms, smem_per_sm, cc, &s))
    invalid(opsfuse::cuda::last_error_message());
  py::dict d;
  d["kernel"] = s.kernel;
  d["bucket"] = s.bucket;
  d["bucket_v"] = s.bucket_v;
  d["block_m"] = s.block_m;
  d["num_splits"] = s.num_splits;
  d["cluster"] = s.cluster;
  d["persistent"] = s.persistent;
  d["sched_heads"] = s.sched_heads;
  d["wg_split"] = s.wg_split;
  d["three_consumers"] = s.three_consumers;
  d["stream_k"] = s.stream_k;
  d["chain_tiles"] = s.chain_tiles;
  d["chain_tiles_causal"] = s.chain_tiles_causal;
  d["fast_plain"] = s.fast_plain;
  d["hopper_compiled"] = s.hopper_compiled;
  return d;
}

void fused_attention_impl(py::handle q, py::handle k, py::handle v, py::handle y, py::handle mask, py::handle kl,
                        std::optional<float> scale, int64_t is_causal, float softcap, const Biases& biases,
                        uintptr_t workspace, int64_t workspace_bytes, int64_t stream, int device) {
  Prepared pr;
  prepare(pr, q, k, v, mask, kl, scale, is_causal, softcap, biases, stream);
  View out;
  read_view(y, "Y", stream, out);
  // 4-D form only: this module takes no head counts, so 3-D inputs already failed in prepare().
  const std::vector<int64_t> want = opsfuse::output_shape(pr.p, 4);
  if (out.shape != want || out.type != pr.in[0].type) {
    opsfuse::Message os;
    os << "output Y must have shape (" << want[0] << ", " << want[1] << ", " << want[2] << ", " << want[3]
       << ") and the type of Q";
    invalid(os.str());
  }
  strides3(out, "Y", pr.p.y_stride);
  pr.p.y = out.data;
  // This module links its own CUDA runtime: make the tensors' device current in it (no stream
  // operation, so this is safe during CUDA graph capture).
  if (device >= 0) {
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != device && cudaSetDevice(device) != cudaSuccess) {
      cudaGetLastError();
      throw Error{kDevice, "FusedAttention: could not select CUDA device " + std::to_string(device)};
    }
  }
  opsfuse::Status st;
  {
    py::gil_scoped_release release;
    st = opsfuse::cuda::launch(pr.p, reinterpret_cast<void*>(workspace), static_cast<size_t>(workspace_bytes),
                               reinterpret_cast<void*>(static_cast<uintptr_t>(stream)));
  }
  if (st == opsfuse::Status::kOk) return;
  const std::string msg = std::string("FusedAttention: ") + opsfuse::status_name(st) + ": " +
                          opsfuse::cuda::last_error_message();
  throw Error{st == opsfuse::Status::kInvalidArgument ? kInvalid
              : st == opsfuse::Status::kUnsupported   ? kUnsupported
                                                      : kDevice,
              msg};
}

// Runs `fn`, turning every exception into (code, message).
template <typename Fn>
py::tuple guarded(Fn&& fn) {
  try {
    py::object value = fn();
    return py::make_tuple(static_cast<int>(kOk), std::string(), value);
  } catch (const Error& e) {
    return py::make_tuple(static_cast<int>(e.code), e.message, py::none());
  } catch (py::error_already_set& e) {
    std::string msg = std::string("FusedAttention: ") + e.what();
    return py::make_tuple(static_cast<int>(kInvalid), msg, py::none());
  } catch (const std::exception& e) {
    return py::make_tuple(static_cast<int>(kInvalid), std::string("FusedAttention: ") + e.what(), py::none());
  } catch (...) {
    return py::make_tuple(static_cast<int>(kDevice), std::string("FusedAttention: unknown error"), py::none());
  }
}

py::tuple py_workspace_size(py::handle q, py::handle k, py::handle v, py::handle mask, py::handle kl,
                            std::optional<float> scale, int64_t is_causal, float softcap, py::handle q_bias,
                            py::handle k_bias, py::handle v_bias) {
  return guarded([&] {
    return py::int_(workspace_size_impl(q, k, v, mask, kl, scale, is_causal, softcap, {q_bias, k_bias, v_bias}));
  });
}

py::tuple py_describe_plan(py::handle q, py::handle k, py::handle v, py::handle mask, py::handle kl,
                           std::optional<float> scale, int64_t is_causal, float softcap, py::handle q_bias,
                           py::handle k_bias, py::handle v_bias, int sms, int smem_per_sm, int cc) {
  return guarded([&] {
    return py::object(describe_plan_impl(q, k, v, mask, kl, scale, is_causal, softcap, {q_bias, k_bias, v_bias},
                                         sms, smem_per_sm, cc));
  });
}

py::tuple py_fused_attention(py::handle q, py::handle k, py::handle v, py::handle y, py::handle mask, py::handle kl,
                             std::optional<float> scale, int64_t is_causal, float softcap, uintptr_t workspace,
                             int64_t workspace_bytes, int64_t stream, int device, py::handle q_bias,
                             py::handle k_bias, py::handle v_bias) {
  return guarded([&] {
    fused_attention_impl(q, k, v, y, mask, kl, scale, is_causal, softcap, {q_bias, k_bias, v_bias}, workspace,
                         workspace_bytes, stream, device);
    return py::object(py::none());
  });
}

}  // namespace

PYBIND11_MODULE(_cuda, m) {
  m.doc() = "opsfuse CUDA FusedAttention launcher (use opsfuse.cuda.fused_attention)";
  m.def("workspace_size", &py_workspace_size, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("attn_mask") = py::none(), py::arg("key_lengths") = py::none(), py::arg("scale") = py::none(),
        py::arg("is_causal") = 0, py::arg("softcap") = 0.0f, py::arg("q_bias") = py::none(),
        py::arg("k_bias") = py::none(), py::arg("v_bias") = py::none(),
        "(code, message, bytes): the device workspace fused_attention needs (0: none). code 0: ok, 1: invalid "
        "argument, 2: unsupported, 3: device error.");
  m.def("fused_attention", &py_fused_attention, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("y"),
        py::arg("attn_mask") = py::none(), py::arg("key_lengths") = py::none(), py::arg("scale") = py::none(),
        py::arg("is_causal") = 0, py::arg("softcap") = 0.0f, py::arg("workspace") = 0,
        py::arg("workspace_bytes") = 0, py::arg("stream") = 0, py::arg("device") = -1,
        py::arg("q_bias") = py::none(), py::arg("k_bias") = py::none(), py::arg("v_bias") = py::none(),
        "Enqueues FusedAttention on `stream` (a cudaStream_t as int) of CUDA device `device`, writing into the "
        "preallocated y; `workspace` is a device pointer (int) to workspace_bytes bytes. Returns (code, message, "
        "None) as workspace_size does.");
  m.def("describe_plan", &py_describe_plan, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("attn_mask") = py::none(), py::arg("key_lengths") = py::none(), py::arg("scale") = py::none(),
        py::arg("is_causal") = 0, py::arg("softcap") = 0.0f, py::arg("q_bias") = py::none(),
        py::arg("k_bias") = py::none(), py::arg("v_bias") = py::none(), py::arg("sms") = 132,
        py::arg("smem_per_sm") = 233472, py::arg("cc") = 90,
        "(code, message, dict): the plan fused_attention would make for these inputs on a device of `sms` "
        "multiprocessors, `smem_per_sm` bytes of shared memory each and compute capability `cc` (default: an "
        "H100 / H200), under the current OPSFUSE_CUDA_* variables; no memory is touched.");
  m.attr("OP_NAME") = opsfuse::contract::kOpName;
}
