#include "bias_fold.h"

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace opsfuse::cuda::detail {
namespace {

size_t elem_bytes(DType t) { return t == DType::kFloat32 ? 4 : 2; }
size_t align256(size_t n) { return (n + 255) & ~size_t{255}; }

// One biased tensor: its (B, H, S, D) view, its bias, and its dense copy.
struct FoldJob {
  const void* src;
  int64_t stride[3];  // element strides of (B, H, S)
  const void* bias;   // (H*D,)
  void* dst;
  int64_t heads, seq, dim, elems;  // elems = B*H*S*D
};
struct FoldJobs {
  FoldJob job[3];
};

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// blockIdx.y: the job; a grid-stride loop over its elements (a streaming copy: one pass, no reuse).
template <typename T>
__global__ void fold_biases_kernel(const FoldJobs jobs) {
  const FoldJob& j = jobs.job[blockIdx.y];
  const T* src = static_cast<const T*>(j.src);
  const T* bias = static_cast<const T*>(j.bias);
  T* dst = static_cast<T*>(j.dst);
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < j.elems;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t d = e % j.dim, row = e / j.dim;
    const int64_t s = row % j.seq, bh = row / j.seq, h = bh % j.heads, b = bh / j.heads;
    const float x = to_float(src[b * j.stride[0] + h * j.stride[1] + s * j.stride[2] + d]);
    dst[e] = from_float<T>(x + to_float(bias[h * j.dim + d]));
  }
}

// The jobs of `p`'s biased tensors, their copies at `base` (null: sizes only).
int make_jobs(const AttentionParams& p, char* base, FoldJob (&jobs)[3]) {
  int n = 0;
  auto add = [&](const void* src, const int64_t* stride, const void* bias, int64_t heads, int64_t seq, int64_t dim) {
    if (bias == nullptr) return;
    FoldJob& j = jobs[n++];
    j.src = src;
    for (int i = 0; i < 3; ++i) j.stride[i] = stride[i];
    j.bias = bias;
    j.dst = base;
    j.heads = heads;
    j.seq = seq;
    j.dim = dim;
    j.elems = p.batch * heads * seq * dim;
    base += align256(static_cast<size_t>(j.elems) * elem_bytes(p.dtype));
  };
  add(p.q, p.q_stride, p.q_bias, p.heads_q, p.seq_q, p.head_dim);
  add(p.k, p.k_stride, p.k_bias, p.heads_kv, p.seq_k, p.head_dim);
  add(p.v, p.v_stride, p.v_bias, p.heads_kv, p.seq_k, p.head_dim_v);
  return n;
}

}  // namespace

size_t folded_bytes(const AttentionParams& p) {
  FoldJob jobs[3];
  const int n = make_jobs(p, nullptr, jobs);
  size_t bytes = 0;
  for (int i = 0; i < n; ++i) bytes += align256(static_cast<size_t>(jobs[i].elems) * elem_bytes(p.dtype));
  return bytes;
}

AttentionParams folded_params(const AttentionParams& p, void* base) {
  AttentionParams out = p;
  char* next = static_cast<char*>(base);
  auto dense = [&](const void* bias, int64_t heads, int64_t seq, int64_t dim, const void** ptr, int64_t* stride) {
    if (bias == nullptr) return;
    *ptr = next;
    stride[0] = heads * seq * dim;
    stride[1] = seq * dim;
    stride[2] = dim;
    next += align256(static_cast<size_t>(p.batch * heads * seq * dim) * elem_bytes(p.dtype));
  };
  dense(p.q_bias, p.heads_q, p.seq_q, p.head_dim, &out.q, out.q_stride);
  dense(p.k_bias, p.heads_kv, p.seq_k, p.head_dim, &out.k, out.k_stride);
  dense(p.v_bias, p.heads_kv, p.seq_k, p.head_dim_v, &out.v, out.v_stride);
  out.q_bias = out.k_bias = out.v_bias = nullptr;
  return out;
}

cudaError_t launch_fold_biases(const AttentionParams& p, const AttentionParams& folded, cudaStream_t stream) {
  FoldJobs jobs{};
  // The copies' addresses: the first biased tensor's in `folded`, the rest packed after it.
  char* base = static_cast<char*>(const_cast<void*>(p.q_bias != nullptr ? folded.q
                                                    : p.k_bias != nullptr ? folded.k
                                                                          : folded.v));
  const int n = make_jobs(p, base, jobs.job);
  int64_t most = 0;
  for (int i = 0; i < n; ++i) most = jobs.job[i].elems > most ? jobs.job[i].elems : most;
  if (most == 0) return cudaSuccess;  // nothing to copy (e.g. Sk = 0): no empty grid
  constexpr int kThreads = 256;
  const int64_t blocks = (most + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned>(blocks < 4096 ? blocks : 4096), static_cast<unsigned>(n));
  switch (p.dtype) {
    case DType::kFloat32: fold_biases_kernel<float><<<grid, kThreads, 0, stream>>>(jobs); break;
    case DType::kFloat16: fold_biases_kernel<__half><<<grid, kThreads, 0, stream>>>(jobs); break;
    case DType::kBFloat16: fold_biases_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(jobs); break;
  }
  return cudaGetLastError();
}

}  // namespace opsfuse::cuda::detail
