// Q/K/V biases on the CPU (AttentionParams::q_bias, k_bias, v_bias; the ONNX input qkv_bias):
// each biased tensor is copied once into a dense (B, H, S, D) buffer with its bias added (float32
// sum, rounded to the tensor's type, as the graph's Add that the input replaced did), and the
// kernel then reads the copies. One streaming pass over Q/K/V, small beside the attention's own
// work on the CPU, and it keeps the bias out of every instruction-set variant of the kernel.
#pragma once

#include <cstddef>

#include "../common/attention_params.h"
#include "attention_cpu.h"

namespace opsfuse::cpu {

// Bytes of host scratch that fold_biases() needs for `p` (0 without biases; 64-byte aligned parts).
size_t folded_bytes(const AttentionParams& p);

// Writes the biased copies into `buffer` (folded_bytes(p) bytes, 64-byte aligned) and returns `p`
// reading them: the biased tensors' pointers and strides replaced, the bias pointers cleared.
AttentionParams fold_biases(const AttentionParams& p, void* buffer, const ParallelFor& parallel_for);

}  // namespace opsfuse::cpu
