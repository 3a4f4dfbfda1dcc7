// Instantiation: decode kernel (flash_decode.cuh), __half, head-size bucket 128.
// One file per (dtype, bucket) so that ninja compiles them in parallel.
#include "flash_decode.cuh"

namespace opsfuse::cuda::detail {

cudaError_t run_tcdec_f16_d128(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  return dec::launch_flash_decode<__half, 128>(a, plan, stream);
}

int clusters_tcdec_f16_d128(int stages, int cluster) { return dec::max_active_clusters<__half, 128>(stages, cluster); }

}  // namespace opsfuse::cuda::detail
