// The CPU kernel for AVX-512 (F, BW, VL) + FMA + F16C: 16 float lanes. Compiled with -mavx512f -mavx512bw -mavx512vl -mavx2 -mfma -mf16c.
// attention_cpu.cc picks it at run time from what the CPU supports.
#include "attention_cpu_impl.h"

namespace opsfuse::cpu {

const CpuKernel* kernel_avx512() {
  static const CpuKernel k = {"avx512", kLB, &scratch_bytes, &run_item};
  return &k;
}

}  // namespace opsfuse::cpu
