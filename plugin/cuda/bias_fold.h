// Internal to plugin/cuda: Q/K/V biases (AttentionParams::q_bias, k_bias, v_bias) for the kernels
// that do not add them themselves. The Hopper prefill kernel adds them as it goes (Q's into its
// shared-memory tile, V's in the epilogue, K's dropped: softmax is invariant to a per-row constant);
// every other plan reads dense copies of Q and K (softcap with a K bias too), and V's bias is added
// in the epilogue by the float32 kernel and copied for the mma.sync and decode kernels. One
// launch writes the copies into the workspace first (float32 sum rounded to T, as the graph's Add
// that the ONNX input replaced did). Their layout: common/biased_copies.h.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "common/biased_copies.h"

namespace opsfuse::cuda::detail {

// Each copy starts 256-byte aligned from a 256-byte aligned base.
constexpr size_t kBiasedCopyAlign = 256;

// Enqueues one launch on `stream` that writes `copies` (planned from `p` with plan_biased_copies).
cudaError_t launch_fold_biases(const AttentionParams& p, const BiasedCopies& copies, cudaStream_t stream);

}  // namespace opsfuse::cuda::detail
