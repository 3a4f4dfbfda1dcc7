// Instantiation: Hopper (sm_90a) kernel, __nv_bfloat16, D = Dv = 64. One file per (dtype, head size) so
// that ninja compiles them in parallel.
#include "hopper_launch.cuh"

namespace opsfuse::cuda::detail {

cudaError_t run_hopper_bf16_d64(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  return launch_hopper<__nv_bfloat16, 64>(a, plan, stream);
}

}  // namespace opsfuse::cuda::detail
