// Where a one-round Hopper launch's first ~1.3 µs go before its first tile arrives (the seed trace:
// Q 1.28 µs, K0 1.54 µs after the consumers' first stamp; docs/notes/cuda_kernel.md, session 25):
// the tensor map's descriptor fetch, or the tile's own trip to DRAM. One thread per block, at the
// kernel's start, as the prefill kernel's producer does:
//   first   prefetch.tensormap, then a 16 KB TMA load (a fresh descriptor: every launch's map
//           points at another buffer), data cold (L2 flushed before each launch)
//   nopref  the same without the prefetch
//   second  then another cold 16 KB tile through the same, now cached, descriptor
//   l2hit   then the first tile again (L2 hit, descriptor cached)
//   ldg     then one 16-byte ld.global of a cold line (DRAM latency through the LSU)
// SM clocks from clock64(), medians over launches and blocks; BLOCKS blocks per launch (the seed's
// one-round S=1024 launch has 96).
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Iplugin -Iplugin/cuda \
//     scripts/tma_latency.cu plugin/cuda/hopper/hopper_host.cu -o /tmp/tma_latency && /tmp/tma_latency [BLOCKS]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/hopper/hopper_host.h"  // hopper_encode_map
#include "cuda/hopper/tma_ops.cuh"
#include "cuda/tools/tool_support.h"  // CHECK_CUDA

namespace hop = opsfuse::cuda::detail::hopper;

constexpr int kCols = 64, kBoxRows = 128;   // one 16 KB box: 128 rows of 64 fp16 columns
constexpr int kTileBytes = kCols * kBoxRows * 2;
constexpr int kPhases = 4;                  // first (or nopref), second, l2hit, ldg

// One row of kPhases clock deltas per block. Block x reads its tiles at rows 2 x * kBoxRows (first,
// l2hit) and (2 x + 1) * kBoxRows (second); its cold line lies past every tile.
__global__ void tma_probe(const __grid_constant__ CUtensorMap map, const uint4* cold_lines, int prefetch,
                          long long* out) {
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bars[3];
  if (threadIdx.x != 0) return;
  const uint32_t tile = (hop::smem_u32(smem_raw) + 1023u) & ~1023u;  // 128-byte swizzle: 1 KB aligned
  const long long t0 = clock64();
  if (prefetch) hop::prefetch_tensormap(&map);
  for (int i = 0; i < 3; ++i) hop::mbar_init(hop::smem_u32(&bars[i]), 1);
  hop::fence_mbarrier_init();
  const int row_first = 2 * blockIdx.x * kBoxRows, row_second = row_first + kBoxRows;
  auto load = [&](int bar, int row) {
    const uint32_t b = hop::smem_u32(&bars[bar]);
    hop::mbar_expect_tx(b, kTileBytes);
    hop::tma_load_4d(tile, &map, b, 0, row, 0, 0);
    hop::mbar_wait(b, 0);
    return clock64();
  };
  const long long t1 = load(0, row_first);
  const long long t2 = load(1, row_second);
  const long long t3 = load(2, row_first);
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(cold_lines + blockIdx.x * 16)
               : "memory");
  if (v.x == 0xdeadbeefu) out[0] = -1;  // keeps the load; the buffer holds zeros
  const long long t4 = clock64();
  long long* row = out + blockIdx.x * kPhases;
  row[0] = t1 - t0, row[1] = t2 - t1, row[2] = t3 - t2, row[3] = t4 - t3;
}

int main(int argc, char** argv) {
  const int blocks = argc > 1 ? std::atoi(argv[1]) : 96;
  constexpr int kLaunches = 40;
  int dev = 0, clock_khz = 0;
  CHECK_CUDA(cudaGetDevice(&dev));
  CHECK_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, dev));
  const int64_t rows = 2LL * blocks * kBoxRows;
  const size_t region = static_cast<size_t>(rows) * kCols * 2;  // one launch's tiles
  // Every launch gets its own region (so its map is a new descriptor) and its own cold lines.
  uint8_t* data = nullptr;
  uint4* lines = nullptr;
  void* flush = nullptr;
  const size_t flush_bytes = size_t(256) << 20;  // > the H200's 60 MB L2
  CHECK_CUDA(cudaMalloc(&data, region * kLaunches));
  CHECK_CUDA(cudaMalloc(&lines, size_t(blocks) * 256 * kLaunches));
  CHECK_CUDA(cudaMalloc(&flush, flush_bytes));
  CHECK_CUDA(cudaMemset(data, 0, region * kLaunches));
  CHECK_CUDA(cudaMemset(lines, 0, size_t(blocks) * 256 * kLaunches));
  long long* d_out = nullptr;
  CHECK_CUDA(cudaMalloc(&d_out, size_t(blocks) * kPhases * sizeof(long long)));
  const int smem = kTileBytes + 1024;
  CHECK_CUDA(cudaFuncSetAttribute(tma_probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  std::printf("%s, %d blocks per launch, %d launches per row, SM clock %.0f MHz (nominal)\n", prop.name, blocks,
              kLaunches, clock_khz / 1e3);
  for (int prefetch : {1, 0}) {
    std::vector<long long> phase[kPhases];
    for (int l = 0; l < kLaunches; ++l) {
      CUtensorMap map;
      const int64_t strides[3] = {rows * kCols, rows * kCols, kCols};  // batch, head, row (elements)
      if (!opsfuse::cuda::detail::hopper_encode_map(&map, data + region * l, false, kCols, rows, 1, 1, strides,
                                                    kBoxRows))
        std::printf("the driver refused the tensor map\n"), std::exit(2);
      CHECK_CUDA(cudaMemset(flush, l, flush_bytes));  // evicts the previous launch's lines from L2
      tma_probe<<<blocks, 32, smem>>>(map, lines + size_t(blocks) * 16 * l, prefetch, d_out);
      CHECK_CUDA(cudaGetLastError());
      std::vector<long long> h(size_t(blocks) * kPhases);
      CHECK_CUDA(cudaMemcpy(h.data(), d_out, h.size() * sizeof(long long), cudaMemcpyDeviceToHost));
      if (l == 0) continue;  // the first launch also pays for the module's first use
      for (int b = 0; b < blocks; ++b)
        for (int p = 0; p < kPhases; ++p) phase[p].push_back(h[size_t(b) * kPhases + p]);
    }
    const char* names[kPhases] = {prefetch ? "first (prefetched descriptor)" : "first (no prefetch)   ",
                                  "second (cached desc.) ", "l2hit                 ", "ldg (cold line)       "};
    for (int p = 0; p < kPhases; ++p) {
      std::sort(phase[p].begin(), phase[p].end());
      const size_t n = phase[p].size();
      std::printf("  %s  median %6lld  p10 %6lld  p90 %6lld  SM clocks\n", names[p], phase[p][n / 2],
                  phase[p][n / 10], phase[p][n * 9 / 10]);
    }
  }
  CHECK_CUDA(cudaFree(data));
  CHECK_CUDA(cudaFree(lines));
  CHECK_CUDA(cudaFree(flush));
  CHECK_CUDA(cudaFree(d_out));
  return 0;
}
