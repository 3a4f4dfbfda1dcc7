// Instantiation: decode kernel (flash_decode.cuh), __nv_bfloat16, head-size bucket 64.
// One file per (dtype, bucket) so that ninja compiles them in parallel.
#include "flash_decode.cuh"

namespace opsfuse::cuda::detail {

cudaError_t run_tcdec_bf16_d64(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  return dec::launch_flash_decode<__nv_bfloat16, 64>(a, plan, stream);
}

int clusters_tcdec_bf16_d64(int stages, int cluster) { return dec::max_active_clusters<__nv_bfloat16, 64>(stages, cluster); }

}  // namespace opsfuse::cuda::detail
