// Where the dense biased copies of Q / K / V go (AttentionParams::q_bias, k_bias, v_bias), for the
// kernels that do not add the biases themselves: the CPU kernel (plugin/cpu/bias_fold.cc) and the
// CUDA plans other than the Hopper prefill kernel's (plugin/cuda/bias_fold.cu). Pure arithmetic:
// nothing is read or written, so planning may pass a placeholder base.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attention_params.h"

namespace opsfuse {

// One biased tensor: its (B, H, S, D) view, its bias (H*D,), and its dense (B, H, S, D) copy.
struct BiasedCopy {
  const void* src;
  int64_t src_stride[3];  // element strides of (B, H, S)
  const void* bias;
  void* dst;
  int64_t heads, seq, dim;
  int64_t rows;  // B * heads * seq
};

struct BiasedCopies {
  BiasedCopy copy[3];       // the first `count` are used, in the order Q, K, V
  int count = 0;
  size_t bytes = 0;         // all copies, each starting `align`-aligned from base
  AttentionParams reading;  // p reading the copies: their pointers and dense strides, no biases but
                            // V's when it is not copied
};

// The copies of `p`'s biased tensors laid out from `base` (itself `align`-aligned), one after the
// other, each rounded up to `align` bytes. A null base gives the sizes. copy_v = false leaves V and
// its bias to a kernel that adds the bias in its epilogue (O / l + b: no copy, and its sums keep V's
// own magnitude instead of V + b's).
inline BiasedCopies plan_biased_copies(const AttentionParams& p, void* base, size_t align, bool copy_v = true) {
  BiasedCopies out;
  out.reading = p;
  const size_t elem = p.dtype == DType::kFloat32 ? 4 : 2;
  auto add = [&](const void* src, const int64_t* stride, const void* bias, int64_t heads, int64_t seq, int64_t dim,
                 const void** ptr, int64_t* dense_stride) {
    if (bias == nullptr) return;
    BiasedCopy& c = out.copy[out.count++];
    c.src = src;
    for (int i = 0; i < 3; ++i) c.src_stride[i] = stride[i];
    c.bias = bias;
    c.dst = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(base) + out.bytes);  // base may be null (sizes only)
    c.heads = heads;
    c.seq = seq;
    c.dim = dim;
    c.rows = p.batch * heads * seq;
    *ptr = c.dst;
    dense_stride[0] = heads * seq * dim;
    dense_stride[1] = seq * dim;
    dense_stride[2] = dim;
    out.bytes += (static_cast<size_t>(c.rows * dim) * elem + align - 1) / align * align;
  };
  AttentionParams& r = out.reading;
  add(p.q, p.q_stride, p.q_bias, p.heads_q, p.seq_q, p.head_dim, &r.q, r.q_stride);
  add(p.k, p.k_stride, p.k_bias, p.heads_kv, p.seq_k, p.head_dim, &r.k, r.k_stride);
  if (copy_v) add(p.v, p.v_stride, p.v_bias, p.heads_kv, p.seq_k, p.head_dim_v, &r.v, r.v_stride);
  r.q_bias = r.k_bias = nullptr;
  if (copy_v) r.v_bias = nullptr;
  return out;
}

}  // namespace opsfuse
