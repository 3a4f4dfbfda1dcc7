// Instantiation: Hopper (sm_90a) kernel, __half, 128 < D <= 192 with Dv <= 128 (latent attention,
// DeepSeek-V3's 192 / 128: Q and K over three 64-column regions, V, O and the P V product at 128
// columns; 128-key tiles). One file per (dtype, head sizes) so that ninja compiles them in parallel.
#include "hopper_launch.cuh"

namespace opsfuse::cuda::detail {

cudaError_t run_hopper_f16_d192_v128(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  return launch_hopper<__half, 192, 128>(a, plan, stream);
}

}  // namespace opsfuse::cuda::detail
