// The CPU kernel for The x86-64 baseline (SSE2, 4 float lanes), or plain floats off x86. No extra flags.
// attention_cpu.cc picks it at run time from what the CPU supports.
#include "attention_cpu_impl.h"

namespace opsfuse::cpu {

const CpuKernel* kernel_baseline() {
  static const CpuKernel k = {"baseline", kLB, &scratch_bytes, &run_item};
  return &k;
}

}  // namespace opsfuse::cpu
