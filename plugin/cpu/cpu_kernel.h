// Internal interface between attention_cpu.cc (scheduling, scratch, ISA choice; compiled for the
// x86-64 baseline) and the per-ISA kernel translation units (kernel_avx512.cc, kernel_avx2.cc,
// kernel_baseline.cc), which all compile attention_cpu_impl.h with different target flags.
// Only plain data and function pointers cross this boundary.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../common/attention_params.h"

namespace opsfuse::cpu {

// How the work is cut. One work item = (batch, kv head, block of `block_q` rows), where the rows
// of a kv head are the (query head, query position) pairs of the Hq / Hkv query heads that read
// it, position fastest (so for Hq = Hkv an item is a (batch, head, query block) as usual).
struct Tiling {
  int64_t block_q = 0;    // rows per work item; a multiple of the kernel's lane_block, <= 256
  int64_t block_k = 0;    // keys per tile of the online softmax
  int64_t n_qblocks = 0;  // ceil((Hq / Hkv) * Sq / block_q)
  int64_t n_items = 0;    // batch * heads_kv * n_qblocks
};

struct CpuKernel {
  const char* isa;  // "avx512", "avx2", "baseline"
  int lane_block;   // queries computed together: vector lanes x vectors per micro-kernel row
  // Float scratch one thread needs for any item of (p, t), in bytes (64-byte aligned by caller).
  size_t (*scratch_bytes)(const AttentionParams& p, const Tiling& t);
  // Computes work item `item` of (p, t) and writes its rows of Y. Never throws.
  void (*run_item)(const AttentionParams& p, const Tiling& t, int64_t item, float* scratch);
};

// One accessor per kernel file. kernel_avx512 / kernel_avx2 exist only when CMake compiled that
// file (it then defines OPSFUSE_CPU_AVX512 / OPSFUSE_CPU_AVX2 for attention_cpu.cc), and must be
// called only on a CPU that supports the instruction set.
const CpuKernel* kernel_avx512();
const CpuKernel* kernel_avx2();
const CpuKernel* kernel_baseline();

// The kernel run_attention uses on this CPU ("avx512", "avx2" or "baseline"). The environment
// variable OPSFUSE_CPU_ISA (avx512 | avx2 | baseline), read once, can force a lower one (tests,
// benchmarks); a request the CPU cannot run is ignored.
const CpuKernel* selected_kernel();

}  // namespace opsfuse::cpu
