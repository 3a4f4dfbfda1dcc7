// Instantiation: Hopper (sm_90) decode kernel, __nv_bfloat16, head-size bucket 64. One file per (dtype,
// bucket) so that ninja compiles them in parallel.
#include "hopper_decode.cuh"

namespace opsfuse::cuda::detail {

cudaError_t run_hopper_dec_bf16_d64(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  return launch_hopper_decode<__nv_bfloat16, 64>(a, plan, stream);
}

int clusters_hopper_dec_bf16_d64(int cluster) { return hopper_decode_active_clusters<__nv_bfloat16, 64>(cluster); }

}  // namespace opsfuse::cuda::detail
