// run_attention: picks the kernel for this CPU, cuts the work into (batch, head, query block)
// items, gives every thread its own scratch and runs the items through the caller's
// parallel_for. Compiled for the x86-64 baseline; only the kernel files use wider instructions,
// and they are called only after the CPU has been checked.
#include "attention_cpu.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <thread>

#include "cpu_kernel.h"

namespace opsfuse::cpu {
namespace {

bool cpu_has_avx512() {
#if defined(OPSFUSE_CPU_AVX512) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

bool cpu_has_avx2() {
#if defined(OPSFUSE_CPU_AVX2) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

const CpuKernel* choose_kernel() {
  const char* forced = std::getenv("OPSFUSE_CPU_ISA");
  const bool want_baseline = forced != nullptr && std::strcmp(forced, "baseline") == 0;
  const bool want_avx2 = forced != nullptr && std::strcmp(forced, "avx2") == 0;
#if defined(OPSFUSE_CPU_AVX512)
  if (!want_baseline && !want_avx2 && cpu_has_avx512()) return kernel_avx512();
#endif
#if defined(OPSFUSE_CPU_AVX2)
  if (!want_baseline && cpu_has_avx2()) return kernel_avx2();
#endif
  return kernel_baseline();
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Rows per work item. An item is (batch, kv head, block of rows), the rows being the (query
// head, query position) pairs of the query heads that share the kv head (attention_cpu_impl.h).
// Blocks are large enough that a converted K/V tile serves many rows, small enough that every
// thread gets several items (the causal case needs them for balance).
Tiling make_tiling(const AttentionParams& p, int lane_block) {
  Tiling t;
  t.block_k = 64;
  const int64_t lb = lane_block;
  const int64_t rows = (p.heads_q / p.heads_kv) * p.seq_q;
  const int64_t heads = p.batch * p.heads_kv;
  int64_t bq = lb * ceil_div(128, lb);  // at most 4 lane blocks of 64 (kMaxLaneBlocks allows 64)
  const int64_t threads = static_cast<int64_t>(std::thread::hardware_concurrency() ? std::thread::hardware_concurrency() : 1);
  while (bq > lb && heads * ceil_div(rows, bq) < 4 * threads) bq -= lb;
  if (bq > rows) bq = ceil_div(rows, lb) * lb;  // one item per kv head covers every row
  t.block_q = bq;
  t.n_qblocks = ceil_div(rows, bq);
  t.n_items = heads * t.n_qblocks;
  return t;
}

// Per-thread scratch that only grows. Threads of ORT's pool live as long as the session, so
// after the first run no call allocates.
struct ThreadScratch {
  std::unique_ptr<float[]> buf;
  size_t bytes = 0;
  float* get(size_t need) {
    if (need > bytes) {
      const size_t n = need / sizeof(float) + 16;  // + 64 bytes to align the start
      buf.reset(new (std::nothrow) float[n]);
      bytes = buf ? need : 0;
    }
    if (!buf) return nullptr;
    auto addr = reinterpret_cast<uintptr_t>(buf.get());
    return reinterpret_cast<float*>((addr + 63) & ~static_cast<uintptr_t>(63));
  }
};

}  // namespace

const CpuKernel* selected_kernel() {
  static const CpuKernel* const k = choose_kernel();
  return k;
}

Status run_attention(const AttentionParams& p, const ParallelFor& parallel_for) {
  if (p.dtype != DType::kFloat32 && p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) {
    return Status::kUnsupported;
  }
  if (p.batch == 0 || p.heads_q == 0 || p.seq_q == 0 || p.head_dim_v == 0) return Status::kOk;
  if (p.heads_kv <= 0 || p.heads_q % p.heads_kv != 0) return Status::kInvalidArgument;
  if (has_bias(p)) return Status::kInvalidArgument;  // the caller folds them (bias_fold.h)

  const CpuKernel* kernel = selected_kernel();
  const Tiling t = make_tiling(p, kernel->lane_block);
  const size_t need = kernel->scratch_bytes(p, t);

  std::atomic<bool> out_of_memory{false};
  auto body = [&](int64_t item) {
    thread_local ThreadScratch scratch;
    float* s = scratch.get(need);
    if (s == nullptr) {
      out_of_memory.store(true, std::memory_order_relaxed);
      return;
    }
    kernel->run_item(p, t, item, s);
  };
  if (parallel_for) {
    parallel_for(t.n_items, body);
  } else {
    for (int64_t i = 0; i < t.n_items; ++i) body(i);
  }
  return out_of_memory.load() ? Status::kDeviceError : Status::kOk;
}

}  // namespace opsfuse::cpu
