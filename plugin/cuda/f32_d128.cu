// Instantiation: float32 kernel (CUDA cores, no TF32), head-size bucket 128.
#include "flash_f32.cuh"

namespace opsfuse::cuda::detail {

cudaError_t run_f32_d128(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  constexpr TileShape t = kF32Tile128;
  return launch_flash_f32<128, t.block_m, t.block_n>(a, plan, stream);
}

}  // namespace opsfuse::cuda::detail
