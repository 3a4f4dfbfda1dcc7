// How fast one SM sub-partition's warps can issue MUFU.EX2 (ex2.approx.ftz.f32), by warps per
// sub-partition, alone and with FFMAs interleaved: the question behind the D = 64 key tile's pace
// (docs/notes/cuda_kernel.md, session 24). One block per SM; each thread runs 16 independent
// ex2 chains (enough to cover MUFU's latency), optionally with K independent FFMAs per ex2; the
// block's SM clocks come from clock64() around the loop.
//
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -Iplugin scripts/mufu_rate.cu -o /tmp/mufu_rate && /tmp/mufu_rate
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "cuda/tools/tool_support.h"  // CHECK_CUDA

constexpr int kChains = 16;

template <int kFfmaPerEx2>
__global__ void ex2_stream(float* sink, long long* cycles, int iters) {
  float x[kChains], f[kChains];
#pragma unroll
  for (int i = 0; i < kChains; ++i) {
    x[i] = -1e-3f * static_cast<float>(threadIdx.x + i);
    f[i] = 1.0f + 1e-6f * static_cast<float>(i);
  }
  __syncthreads();
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < kChains; ++i) {
      asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(x[i]));
#pragma unroll
      for (int k = 0; k < kFfmaPerEx2; ++k) asm volatile("fma.rn.f32 %0, %0, 0f3F7FF972, 0f3A83126F;" : "+f"(f[(i + k) % kChains]));
    }
  }
  __syncthreads();
  const long long t1 = clock64();
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < kChains; ++i) acc += x[i] + f[i];
  if (acc == 12345.0f) sink[threadIdx.x] = acc;  // keeps the work; never true in practice
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

template <int kFfmaPerEx2>
void measure(int sms, float* sink, long long* d_cycles, int warps) {
  const int iters = 2000;
  ex2_stream<kFfmaPerEx2><<<sms, 32 * warps>>>(sink, d_cycles, 10);  // warm-up
  CHECK_CUDA(cudaGetLastError());
  ex2_stream<kFfmaPerEx2><<<sms, 32 * warps>>>(sink, d_cycles, iters);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<long long> cyc(sms);
  CHECK_CUDA(cudaMemcpy(cyc.data(), d_cycles, sms * sizeof(long long), cudaMemcpyDeviceToHost));
  std::sort(cyc.begin(), cyc.end());
  const double median = static_cast<double>(cyc[sms / 2]);
  const double ex2_per_sm = 32.0 * warps * iters * kChains;
  const double lanes_per_clk = ex2_per_sm / median;
  // A sub-partition holds warps w, w + 4, ...: with fewer than 4 warps only `warps` are busy.
  const double busy_subpartitions = std::min(warps, 4);
  std::printf("ffma/ex2 %d  warps/block %2d (%.2f per sub-partition)  clocks %9.0f  ex2 lanes/clock: %5.2f per SM, "
              "%5.2f per busy sub-partition  (%.1f clocks per warp ex2 per sub-partition)\n",
              kFfmaPerEx2, warps, warps / 4.0, median, lanes_per_clk, lanes_per_clk / busy_subpartitions,
              32.0 / (lanes_per_clk / busy_subpartitions));
}

int main() {
  int dev = 0, sms = 0;
  CHECK_CUDA(cudaGetDevice(&dev));
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, dev));
  std::printf("%s, %d SMs\n", prop.name, sms);
  float* sink = nullptr;
  long long* d_cycles = nullptr;
  CHECK_CUDA(cudaMalloc(&sink, 1024 * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&d_cycles, sms * sizeof(long long)));
  for (int warps : {1, 4, 8, 12, 16}) measure<0>(sms, sink, d_cycles, warps);
  for (int warps : {4, 8}) measure<4>(sms, sink, d_cycles, warps);
  CHECK_CUDA(cudaFree(sink));
  CHECK_CUDA(cudaFree(d_cycles));
  return 0;
}
