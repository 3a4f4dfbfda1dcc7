// Internal to plugin/cuda/hopper: the Hopper prefill kernel's PTX wrappers for the warpgroup matrix
// instructions (fences, commit / wait, wgmma descriptors, the S = Q K^T and O += P V products) and
// the register-level helpers around them (approximate reciprocal and exp2, 16-bit pair packing).
// TMA and mbarrier wrappers: tma_ops.cuh.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "wgmma_ops.inc"

namespace opsfuse::cuda::detail::hopper {

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving register reads/writes across the asynchronous wgmma boundaries.
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void reg_fence(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// Gives the registers new, unknown values, so that their old ones are dead: before an S product that
// overwrites them (scale-d 0 on its first k-step), which the wgmma's read-write operands would
// otherwise keep live through the previous tile's P V (kPlainSeqWide: 128 S registers beside P's 64).
template <int N>
__device__ __forceinline__ void reg_define(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "=f"(r[i])::"memory");
}

__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// kUniform: x through a lane-0 shuffle, which ptxas takes as warp-uniform and cannot recompute
// from its sources elsewhere; otherwise x itself, the same code as without the call.
template <bool kUniform>
__device__ __forceinline__ uint32_t uniform_if(uint32_t x) {
  if constexpr (kUniform) return __shfl_sync(0xffffffffu, x, 0);
  else return x;
}
// wgmma shared-memory matrix descriptor, 128-byte swizzle (mode 1 in bits 62-63), base offset 0.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32) | (1ull << 62);
}

// The descriptor of `desc`'s matrix `offset` bytes (a multiple of 16) further on: the address
// field is the byte address / 16 in bits 0-13, and shared memory (< 2^18 bytes) never carries out
// of it, so one add on the low word does it, instead of smem_desc()'s and, shift and or.
__device__ __forceinline__ uint64_t desc_plus(uint64_t desc, uint32_t offset) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (offset >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}

template <typename T, int kN>
__device__ __forceinline__ void mma_qk(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b, uint32_t scale_d) {
  if constexpr (kN == 256) {
    if constexpr (std::is_same_v<T, __half>) {
      OPSFUSE_WGMMA_SS_N256(".f16.f16");
    } else {
      OPSFUSE_WGMMA_SS_N256(".bf16.bf16");
    }
  } else if constexpr (kN == 128) {
    if constexpr (std::is_same_v<T, __half>) {
      OPSFUSE_WGMMA_SS_N128(".f16.f16");
    } else {
      OPSFUSE_WGMMA_SS_N128(".bf16.bf16");
    }
  } else {
    static_assert(kN == 64, "S tiles are 64, 128 or 256 keys wide");
    if constexpr (std::is_same_v<T, __half>) {
      OPSFUSE_WGMMA_SS_N64(".f16.f16");
    } else {
      OPSFUSE_WGMMA_SS_N64(".bf16.bf16");
    }
  }
}
template <typename T, int kN>
__device__ __forceinline__ void mma_pv(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t desc_b) {
  const uint32_t scale_d = 1;
  if constexpr (kN == 256) {
    if constexpr (std::is_same_v<T, __half>) {
      OPSFUSE_WGMMA_RS_N256(".f16.f16");
    } else {
      OPSFUSE_WGMMA_RS_N256(".bf16.bf16");
    }
  } else if constexpr (kN == 128) {
    if constexpr (std::is_same_v<T, __half>) {
      OPSFUSE_WGMMA_RS_N128(".f16.f16");
    } else {
      OPSFUSE_WGMMA_RS_N128(".bf16.bf16");
    }
  } else if constexpr (kN == 72) {  // O at D = 64 and the row sums' column group (kSumOnTensor)
    if constexpr (std::is_same_v<T, __half>) {
      OPSFUSE_WGMMA_RS_N72(".f16.f16");
    } else {
      OPSFUSE_WGMMA_RS_N72(".bf16.bf16");
    }
  } else {
    if constexpr (std::is_same_v<T, __half>) {
      OPSFUSE_WGMMA_RS_N64(".f16.f16");
    } else {
      OPSFUSE_WGMMA_RS_N64(".bf16.bf16");
    }
  }
}

// Two floats -> one register of two 16-bit values (x0 in the low half), one cvt instruction.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float x0, float x1) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(x0, x1);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

// One register of two 16-bit values -> two floats (the low half first).
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t r) {
  if constexpr (std::is_same_v<T, __half>) return __half22float2(*reinterpret_cast<const __half2*>(&r));
  else return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r));
}

}  // namespace opsfuse::cuda::detail::hopper
