// Internal to plugin/cuda/hopper: how the Hopper prefill kernel's masked modes read a mask -- aligned
// column pairs per thread (mask_pair_load, mask_row_loads) and, for masks shared by every query row,
// one class per key tile voted on by each warp (tile_class_load, tile_class_vote).
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include <cuda_fp16.h>

namespace opsfuse::cuda::detail::hopper {

// One pair of mask elements (column c = kCol of a tile row, and c + 1) into `v` when c < rem (the
// pair's first element is below the caller's key limit), else v = 0; the second element is read
// whether or not it is below the limit (the scoring and the class vote ignore keys past it): it is
// inside the row, since pair masks have rows of even length (hopper_mode) and pairs start at even
// columns. One load per pair: with a second, narrower load for a pair cut by the limit, both loads
// had the same destination register and ptxas made the second wait for the first one's data (a
// write-after-write dependency) -- at the top of every key-tile step of the masked kernels, before
// the step's products were issued (Nsight Compute, session 9). kBytes: 1 (bool) or 2 (T); `base`
// points at column 0 of the tile row and is aligned to a pair.
template <int kBytes, int kCol>
__device__ __forceinline__ void mask_pair_load(uint32_t& v, const char* base, int rem) {
  v = 0;
  if constexpr (kBytes == 2) {
    asm volatile("{\n.reg .pred p;\nsetp.gt.s32 p, %1, %3;\n@p ld.global.nc.u32 %0, [%2+%4];\n}\n"
                 : "+r"(v)
                 : "r"(rem), "l"(base), "n"(kCol), "n"(kCol * kBytes));
  } else {
    asm volatile("{\n.reg .pred p;\nsetp.gt.s32 p, %1, %3;\n@p ld.global.nc.u16 %0, [%2+%4];\n}\n"
                 : "+r"(v)
                 : "r"(rem), "l"(base), "n"(kCol), "n"(kCol * kBytes));
  }
}

// The pairs of one tile row: columns I * 8 (+ 1) of `base` into v[I].
template <int kBytes, int... I>
__device__ __forceinline__ void mask_row_loads(uint32_t (&v)[sizeof...(I)], const char* base, int rem,
                                               std::integer_sequence<int, I...>) {
  (mask_pair_load<kBytes, I * 8>(v[I], base, rem), ...);
}

// Key-tile classes of a mask that is the same for every query row (mask_stride[2] == 0: padding
// masks). Over the tile's keys below the batch's key length `len` (keys >= len are invisible to
// every row anyway), a tile whose visible keys are exactly its first p (bool: byte != 0, additive:
// +0 / -0 -- bits, so x + mask == x; the others bool 0 / additive -inf) has class p, 0 <= p <= kBN:
// 0 = all masked, kBN = all visible, else a visible prefix (a padding mask's tile that holds the
// sequence's end). Anything else (a visible key after a masked one, an additive value other than
// +-0 / -inf) is kTileMixed. Each lane reads the tile's keys 4 lane .. 4 lane + 3 as two pairs
// (aligned like the pair loads); every consumer warp reads the same bytes and reaches the same
// class, so branches on it are uniform across the warpgroups (wgmma needs that).
constexpr int kTileMixed = -1;

template <int kBytes>
__device__ __forceinline__ void tile_class_load(uint32_t (&w)[2], const char* row, int n0, int len, int lane) {
  const int k = n0 + 4 * lane;
  const char* base = row + static_cast<int64_t>(k) * kBytes;
  mask_pair_load<kBytes, 0>(w[0], base, len - k);
  mask_pair_load<kBytes, 2>(w[1], base, len - k);
}

template <typename T, int kBytes>
__device__ __forceinline__ int tile_class_vote(const uint32_t (&w)[2], int n0, int len, int lane) {
  const int rem = len - (n0 + 4 * lane);  // this lane's keys below len
  uint32_t vis = 0;                        // bit e: key 4 lane + e visible
  bool known = true;                       // every key read is visible or masked
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if (e >= rem) continue;
    if constexpr (kBytes == 1) {
      vis |= (((w[e >> 1] >> (8 * (e & 1))) & 0xffu) != 0 ? 1u : 0u) << e;
    } else {
      constexpr uint32_t kNegInf = std::is_same_v<T, __half> ? 0xfc00u : 0xff80u;
      const uint32_t bits = (w[e >> 1] >> (16 * (e & 1))) & 0xffffu;
      const bool zero = (bits & 0x7fffu) == 0;
      vis |= (zero ? 1u : 0u) << e;
      known = known && (zero || bits == kNegInf);
    }
  }
  const int p = static_cast<int>(__reduce_add_sync(0xffffffffu, static_cast<unsigned>(__popc(vis))));
  const int mine = min(max(p - 4 * lane, 0), 4);  // a prefix of p keys gives this lane its first `mine`
  const bool prefix = known && vis == (1u << mine) - 1u;
  return __all_sync(0xffffffffu, prefix) ? p : kTileMixed;
}

}  // namespace opsfuse::cuda::detail::hopper
