// Instantiation: Hopper (sm_90) decode kernel, __half, head-size bucket 128. One file per (dtype,
// bucket) so that ninja compiles them in parallel.
#include "hopper_decode.cuh"

namespace opsfuse::cuda::detail {

cudaError_t run_hopper_dec_f16_d128(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  return launch_hopper_decode<__half, 128>(a, plan, stream);
}

int clusters_hopper_dec_f16_d128(int cluster) { return hopper_decode_active_clusters<__half, 128>(cluster); }

}  // namespace opsfuse::cuda::detail
