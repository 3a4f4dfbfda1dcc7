// Internal to plugin/cuda: the host side of the Hopper kernels (hopper_host.cu), callable from plain
// host code (the kernels' launch functions, tools/launch_host_cost).
#pragma once

#include <cstdint>

#include <cuda.h>  // CUtensorMap (types only: nothing links libcuda)

namespace opsfuse::cuda::detail {

// Encodes a 4-D (columns, rows, heads, batch) 16-bit tensor map with 128-byte swizzle and a
// (64, box_rows, 1, 1) box. strides: elements, KernelArgs order (batch, head, row). l2_promotion:
// the size of the L2 fetch a miss asks DRAM for (0: none, 1: 128 bytes, 2: 256 bytes). Returns
// false when the driver refuses the layout.
bool hopper_encode_map(CUtensorMap* map, const void* base, bool bf16, int64_t cols, int64_t rows, int64_t heads,
                       int64_t batch, const int64_t strides[3], int box_rows, int l2_promotion = 2);

}  // namespace opsfuse::cuda::detail
