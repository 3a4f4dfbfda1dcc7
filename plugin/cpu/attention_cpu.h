// The CPU FusedAttention kernel: online softmax over key tiles, float32 accumulation,
// memory O(tile), work split over (batch, head, query tile).
#pragma once

#include <cstdint>
#include <functional>

#include "../common/attention_params.h"

namespace opsfuse::cpu {

// Runs body(i) for every i in [0, n), possibly concurrently. The ORT op passes the session's
// intra-op thread pool; tests and tools may pass a serial loop.
using ParallelFor = std::function<void(int64_t n, const std::function<void(int64_t)>& body)>;

// All pointers in `p` are host pointers; shapes were validated by check_inputs_and_fill and
// key_lengths by check_key_lengths. Biases must have been folded into copies first
// (bias_fold.h): with a bias pointer set it returns kInvalidArgument. Returns kOk or kUnsupported.
Status run_attention(const AttentionParams& p, const ParallelFor& parallel_for);

}  // namespace opsfuse::cpu
