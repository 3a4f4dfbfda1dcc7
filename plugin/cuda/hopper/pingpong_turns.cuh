// Internal to plugin/cuda/hopper: the two consumer warpgroups' pingpong turns (FlashAttention-3's
// inter-warpgroup schedule), shared by the prefill kernel (hopper_fwd.cuh) and the three-consumer
// kernel (hopper_seq3.cuh).
#pragma once

namespace opsfuse::cuda::detail::hopper {

// Consumer warpgroups 0 and 1 (256 threads) take turns: named barrier 2 + cw is "my turn", passed
// by the other warpgroup (cw: the calling thread's consumer warpgroup). Warpgroup 1 opens (an arrive
// on warpgroup 0's barrier) and skips its last pass, so every arrive meets exactly one sync;
// `pass_last`: warpgroup 1 passes that last turn too (it has one batch less than warpgroup 0, whose
// last turn it then waits out). Threads whose `on` is false (a third warpgroup) take no turns.
__device__ __forceinline__ void pingpong_open(bool on, int cw) {
  if (on && cw == 1) asm volatile("bar.arrive 2, 256;\n" ::: "memory");
}
__device__ __forceinline__ void pingpong_wait(bool on, int cw) {
  if (!on) return;
  if (cw == 0) asm volatile("bar.sync 2, 256;\n" ::: "memory");
  else asm volatile("bar.sync 3, 256;\n" ::: "memory");
}
__device__ __forceinline__ void pingpong_pass(bool on, int cw, bool last, bool pass_last) {
  if (!on) return;
  if (cw == 0) asm volatile("bar.arrive 3, 256;\n" ::: "memory");
  else if (!last || pass_last) asm volatile("bar.arrive 2, 256;\n" ::: "memory");
}

}  // namespace opsfuse::cuda::detail::hopper
