// Instantiation: tensor-core kernel, __nv_bfloat16, head-size bucket 64 (prefill tiles; decode: dec_*.cu).
// One file per (dtype, bucket) so that ninja compiles them in parallel.
#include "flash_tc.cuh"

namespace opsfuse::cuda::detail {

cudaError_t run_tc_bf16_d64(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  constexpr TileShape t = kTcTile64;
  return launch_flash_tc<__nv_bfloat16, 64, t.block_m, t.block_n, t.warps, t.per_sm_regs>(a, plan, stream);
}

}  // namespace opsfuse::cuda::detail
