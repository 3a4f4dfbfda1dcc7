// Instantiation: Hopper (sm_90a) kernel, __half, D, Dv <= 256 (64-key tiles). One file per (dtype, head
// size) so that ninja compiles them in parallel.
#include "hopper_launch.cuh"

namespace opsfuse::cuda::detail {

cudaError_t run_hopper_f16_d256(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  return launch_hopper<__half, 256>(a, plan, stream);
}

}  // namespace opsfuse::cuda::detail
