// The CPU kernel for AVX2 + FMA + F16C: 8 float lanes. Compiled with -mavx2 -mfma -mf16c.
// attention_cpu.cc picks it at run time from what the CPU supports.
#include "attention_cpu_impl.h"

namespace opsfuse::cpu {

const CpuKernel* kernel_avx2() {
  static const CpuKernel k = {"avx2", kLB, &scratch_bytes, &run_item};
  return &k;
}

}  // namespace opsfuse::cpu
