// Instantiation: float32 kernel (CUDA cores, no TF32), head-size bucket 256 (one tile: kF32Small256
// is the prefill tile).
#include "flash_f32.cuh"

namespace opsfuse::cuda::detail {

cudaError_t run_f32_d256(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  constexpr TileShape big = kF32Tile256, small = kF32Small256;
  return launch_flash_f32_bucket<256, big.block_m, big.block_n, big.warps, small.block_m, small.block_n, small.warps>(
      a, plan, stream);
}

}  // namespace opsfuse::cuda::detail
