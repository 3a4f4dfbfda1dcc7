// Internal to plugin/cuda/tools: what the standalone tools (attention_cuda_check, launch_host_cost)
// share: a checked CUDA call, and contiguous 16-bit (B, H, S, D) Q/K/V/Y buffers with the params
// that address them.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#include "common/attention_params.h"

// A failed CUDA call ends the tool (exit status 2) with the call's place and the error.
#define CHECK_CUDA(x)                                                                       \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      std::printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, __LINE__, \
                  cudaGetErrorString(e_));                                                  \
      std::exit(2);                                                                         \
    }                                                                                       \
  } while (0)

namespace opsfuse::tools {

// Device buffers of one launch: Q and Y (B, Hq, Sq, D), K and V (B, Hkv, Sk, D), 2-byte elements.
struct DenseQkv {
  void *q = nullptr, *k = nullptr, *v = nullptr, *y = nullptr;
};

// Allocates `t`, fills Q, K and V with the byte values given (memset on the legacy stream) and
// returns params addressing them: no mask, scale left at its default, D = Dv.
inline AttentionParams dense_params(DenseQkv* t, DType dtype, int b, int hq, int hkv, int sq, int sk, int d,
                                    int fill_q, int fill_k, int fill_v) {
  const size_t nq = size_t(b) * hq * sq * d * 2, nkv = size_t(b) * hkv * sk * d * 2;
  CHECK_CUDA(cudaMalloc(&t->q, nq));
  CHECK_CUDA(cudaMalloc(&t->k, nkv));
  CHECK_CUDA(cudaMalloc(&t->v, nkv));
  CHECK_CUDA(cudaMalloc(&t->y, nq));
  CHECK_CUDA(cudaMemset(t->q, fill_q, nq));
  CHECK_CUDA(cudaMemset(t->k, fill_k, nkv));
  CHECK_CUDA(cudaMemset(t->v, fill_v, nkv));
  AttentionParams p;
  p.q = t->q, p.k = t->k, p.v = t->v, p.y = t->y;
  p.dtype = dtype;
  p.batch = b, p.heads_q = hq, p.heads_kv = hkv, p.seq_q = sq, p.seq_k = sk, p.head_dim = p.head_dim_v = d;
  const int64_t sq_stride[3] = {int64_t(hq) * sq * d, int64_t(sq) * d, d};
  const int64_t skv_stride[3] = {int64_t(hkv) * sk * d, int64_t(sk) * d, d};
  for (int i = 0; i < 3; ++i) {
    p.q_stride[i] = p.y_stride[i] = sq_stride[i];
    p.k_stride[i] = p.v_stride[i] = skv_stride[i];
  }
  return p;
}

inline void free_dense(const DenseQkv& t) {
  CHECK_CUDA(cudaFree(t.q));
  CHECK_CUDA(cudaFree(t.k));
  CHECK_CUDA(cudaFree(t.v));
  CHECK_CUDA(cudaFree(t.y));
}

}  // namespace opsfuse::tools
