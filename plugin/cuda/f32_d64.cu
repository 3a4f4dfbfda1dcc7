// Instantiation: float32 kernel (CUDA cores, no TF32), head-size bucket 64.
#include "flash_f32.cuh"

namespace opsfuse::cuda::detail {

cudaError_t run_f32_d64(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  constexpr TileShape t = kF32Tile64;
  return launch_flash_f32<64, t.block_m, t.block_n>(a, plan, stream);
}

}  // namespace opsfuse::cuda::detail
