// Instantiation: float32 kernel (CUDA cores, no TF32), head-size bucket 256.
#include "flash_f32.cuh"

namespace opsfuse::cuda::detail {

cudaError_t run_f32_d256(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  constexpr TileShape t = kF32Tile256;
  return launch_flash_f32<256, t.block_m, t.block_n>(a, plan, stream);
}

}  // namespace opsfuse::cuda::detail
