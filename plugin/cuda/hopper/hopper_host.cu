// Host side of the Hopper kernel: TMA tensor maps. cuTensorMapEncodeTiled is a driver API
// function; it is looked up once through the runtime (cudaGetDriverEntryPointByVersion), so the
// library never links libcuda.
#include <cstdint>

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include "../kernel_args.h"
#include "hopper_host.h"

namespace opsfuse::cuda::detail {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = []() -> PFN_cuTensorMapEncodeTiled_v12000 {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &status) !=
            cudaSuccess ||
        status != cudaDriverEntryPointSuccess)
      return nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

}  // namespace

bool hopper_encode_map(CUtensorMap* map, const void* base, bool bf16, int64_t cols, int64_t rows, int64_t heads,
                       int64_t batch, const int64_t strides[3], int box_rows, int l2_promotion) {
  const PFN_cuTensorMapEncodeTiled_v12000 fn = encode_fn();
  if (fn == nullptr) return false;
  // Dimensions innermost first: (columns, rows, heads, batch); strides in bytes of dims 1..3.
  // A dimension of extent 1 is never stepped over: its stride is replaced by a dense one so that
  // broadcast (0) or odd strides there do not make the driver refuse the map (hopper_layout_ok()
  // in attention_cuda.cu applies the same rule).
  cuuint64_t dims[4] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows < 1 ? 1 : rows),
                        static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  const int64_t elem_strides[3] = {strides[2], strides[1], strides[0]};  // row, head, batch
  cuuint64_t gstrides[3];
  int64_t dense = ((cols * 2 + 15) / 16) * 16;
  for (int i = 0; i < 3; ++i) {
    gstrides[i] = static_cast<cuuint64_t>(dims[i + 1] == 1 ? dense : elem_strides[i] * 2);
    dense = static_cast<int64_t>(gstrides[i]) * static_cast<int64_t>(dims[i + 1]);
  }
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t estr[4] = {1, 1, 1, 1};
  const CUresult r = fn(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
                        const_cast<void*>(base), dims, gstrides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        CU_TENSOR_MAP_SWIZZLE_128B,
                        l2_promotion == 0   ? CU_TENSOR_MAP_L2_PROMOTION_NONE
                        : l2_promotion == 1 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                                            : CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

}  // namespace opsfuse::cuda::detail
