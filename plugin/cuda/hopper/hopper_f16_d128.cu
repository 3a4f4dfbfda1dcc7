// Instantiation: Hopper (sm_90a) kernel, __half, D = Dv = 128. One file per (dtype, head size) so
// that ninja compiles them in parallel.
#include "hopper_launch.cuh"

namespace opsfuse::cuda::detail {

cudaError_t run_hopper_f16_d128(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  return launch_hopper<__half, 128>(a, plan, stream);
}

}  // namespace opsfuse::cuda::detail
