#include "bias_fold.h"

#include <cstdint>

#include "kernel_common.cuh"

namespace opsfuse::cuda::detail {
namespace {

struct FoldJobs {
  BiasedCopy copy[3];
};

// blockIdx.y: the copy; a grid-stride loop over its elements (a streaming copy: one pass, no reuse).
template <typename T>
__global__ void fold_biases_kernel(const FoldJobs jobs) {
  const BiasedCopy& c = jobs.copy[blockIdx.y];
  const T* src = static_cast<const T*>(c.src);
  const T* bias = static_cast<const T*>(c.bias);
  T* dst = static_cast<T*>(c.dst);
  const int64_t elems = c.rows * c.dim;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < elems;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t d = e % c.dim, row = e / c.dim;
    const int64_t s = row % c.seq, bh = row / c.seq, h = bh % c.heads, b = bh / c.heads;
    const float x = to_float<T>(src[b * c.src_stride[0] + h * c.src_stride[1] + s * c.src_stride[2] + d]);
    dst[e] = from_float<T>(x + to_float<T>(bias[h * c.dim + d]));
  }
}

}  // namespace

cudaError_t launch_fold_biases(const AttentionParams& p, const BiasedCopies& copies, cudaStream_t stream) {
  FoldJobs jobs{};
  int64_t most = 0;
  for (int i = 0; i < copies.count; ++i) {
    jobs.copy[i] = copies.copy[i];
    most = copies.copy[i].rows * copies.copy[i].dim > most ? copies.copy[i].rows * copies.copy[i].dim : most;
  }
  if (most == 0) return cudaSuccess;  // nothing to copy (e.g. Sk = 0): no empty grid
  constexpr int kThreads = 256;
  const int64_t blocks = (most + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned>(blocks < 4096 ? blocks : 4096), static_cast<unsigned>(copies.count));
  switch (p.dtype) {
    case DType::kFloat32: fold_biases_kernel<float><<<grid, kThreads, 0, stream>>>(jobs); break;
    case DType::kFloat16: fold_biases_kernel<__half><<<grid, kThreads, 0, stream>>>(jobs); break;
    case DType::kBFloat16: fold_biases_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(jobs); break;
  }
  return cudaGetLastError();
}

}  // namespace opsfuse::cuda::detail
