// Internal to plugin/cuda: Q/K/V biases (AttentionParams::q_bias, k_bias, v_bias) for the kernels
// that do not add them themselves. The Hopper prefill kernel adds them as it goes (Q's into its
// shared-memory tile, V's in the epilogue, K's dropped: softmax is invariant to a per-row constant);
// every other plan -- the portable kernels, decode, softcap with a K bias -- reads dense biased
// copies that one launch writes into the workspace first (float32 sum rounded to T, as the graph's
// Add that the ONNX input replaced did).
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "common/attention_params.h"

namespace opsfuse::cuda::detail {

// Bytes of workspace the biased copies of `p` take (0 without biases), 256-byte aligned parts.
size_t folded_bytes(const AttentionParams& p);

// `p` reading the copies placed at `base` (256-byte aligned, folded_bytes(p) bytes): the biased
// tensors' pointers and strides are the dense (B, H, S, D) copies', the bias pointers cleared.
// Pure arithmetic: planning may call it with a placeholder base.
AttentionParams folded_params(const AttentionParams& p, void* base);

// Enqueues one launch on `stream` that writes the copies `folded` describes from `p`.
cudaError_t launch_fold_biases(const AttentionParams& p, const AttentionParams& folded, cudaStream_t stream);

}  // namespace opsfuse::cuda::detail
