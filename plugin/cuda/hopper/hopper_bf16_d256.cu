// Instantiation: Hopper (sm_90a) kernel, __nv_bfloat16, D, Dv <= 256 (64-key tiles). One file per (dtype, head
// size) so that ninja compiles them in parallel.
#include "hopper_launch.cuh"

namespace opsfuse::cuda::detail {

cudaError_t run_hopper_bf16_d256(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  return launch_hopper<__nv_bfloat16, 256>(a, plan, stream);
}

}  // namespace opsfuse::cuda::detail
