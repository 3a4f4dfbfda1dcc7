// Internal to plugin/cuda/hopper: a block's first Q, K and V tiles copied by the producer
// warpgroup's 128 threads with cp.async instead of TMA (hopper_fwd.cuh, direct_first).
//
// Why: a TMA load's first use of a launch's tensor map fetches the descriptor before the tile
// itself -- ~875 SM clocks at the seed's 96 blocks (scripts/tma_latency.cu on the H200, session 26:
// 2,723 clocks for the first cold 16 KB tile against 1,849 for the next through the cached
// descriptor) -- and on a one-round launch that latency lies on the path to the first S = Q K^T.
// Plain 16-byte copies need no descriptor. They write the bytes TMA would: the 128-byte swizzle
// (the 16-byte chunk c of row r at chunk c ^ (r % 8) of its 128-byte row; tiles are 1 KB aligned)
// and zeros past the tensor's last row. Only whole 64-column regions (the launcher takes the path
// only where the head size is the bucket's).
#pragma once

#include <cstdint>

namespace opsfuse::cuda::detail {
namespace hopper {

// 16 bytes from global to shared memory through L2 (zero-filled where `bytes` is 0).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}

// One arrival on `bar` once every cp.async this thread has issued so far has landed; the pending
// count is raised now, so a later plain arrive cannot complete the phase before them.
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Thread t of 128 copies rows t / 8 + 16 j, chunk t % 8, of each 64-column region of a tile of
// kRows rows (kRegions regions of kRows x 128 bytes at `dst`). `src` is the tile's first row,
// `row_bytes` the tensor's row stride, `valid` its rows left from there (the rest are zeros).
// Every row a thread touches has the same r % 8, so its swizzled chunk is fixed.
template <int kRows, int kRegions>
__device__ __forceinline__ void copy_tile_swizzled(uint32_t dst, const char* src, int64_t row_bytes, int valid,
                                                   int t) {
  static_assert(kRows % 16 == 0, "16 rows per pass of 128 threads");
  const int row = t / 8, chunk = t % 8;
  const uint32_t dst0 = dst + row * 128 + ((chunk ^ (row % 8)) << 4);
  const char* src0 = src + row * row_bytes + chunk * 16;
#pragma unroll
  for (int c = 0; c < kRegions; ++c) {
#pragma unroll
    for (int j = 0; j < kRows / 16; ++j) {
      const bool in = row + 16 * j < valid;
      // Past the last row nothing is read: the tile's first row stands in as an address.
      cp_async_16(dst0 + c * kRows * 128 + j * 16 * 128, in ? src0 + 16 * j * row_bytes + c * 128 : src,
                  in ? 16u : 0u);
    }
  }
}

}  // namespace hopper
}  // namespace opsfuse::cuda::detail
