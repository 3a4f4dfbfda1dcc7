// The CUDA FusedAttention launcher: the one entry point that the ORT CUDA op, the TensorRT
// plugin and the pybind11 module call. Plain C++ header (no CUDA headers needed to include it):
// the stream is passed as an opaque pointer (a cudaStream_t).
#pragma once

#include <cstddef>

#include "../common/attention_params.h"

namespace opsfuse::cuda {

// Bytes of device scratch space the launch needs for `p` (e.g. split-KV partial results);
// 0 when none. Depends only on shapes and attributes, never on data.
size_t workspace_size(const AttentionParams& p);

// Enqueues the attention on `stream`. Device pointers in `p`; `workspace` holds at least
// workspace_size(p) bytes (may be null when that is 0). Never synchronizes, never allocates.
// key_lengths values outside [0, Sk] are clamped on the device (they cannot be checked
// without a synchronization). Returns kOk, kInvalidArgument, kUnsupported or kDeviceError;
// last_error_message() then says more.
Status launch(const AttentionParams& p, void* workspace, size_t workspace_bytes, void* stream);

// The same launch with scratch space from `alloc`, asked (alloc(alloc_ctx, bytes), returning null
// when it cannot) only when the plan chosen for this call needs some — at most twice (the TMA
// fallback). The caller frees what it handed out once launch returns (every later user of the
// memory runs on `stream`). One plan per call where workspace_size() + launch() make two: the
// ONNX Runtime op's path, where each microsecond before the launch is on session.run's critical
// path.
using ScratchAlloc = void* (*)(void* ctx, size_t bytes);
Status launch(const AttentionParams& p, ScratchAlloc alloc, void* alloc_ctx, void* stream);

// The plan the launcher would make for `p` on a device of `sms` multiprocessors with `smem_per_sm`
// bytes of shared memory each and compute capability `cc` (major * 10 + minor), under this
// process's OPSFUSE_CUDA_* switches: so that the heuristic can be tested where no such GPU exists
// (no CUDA call is made for prefill shapes; decode shapes ask the local device how many clusters
// fit, which is none without one). False (last_error_message() says why) for invalid `p`.
struct PlanSummary {
  const char* kernel = "";  // "tensor_core", "tensor_core_decode", "float32", "hopper", "hopper_decode"
  int bucket = 0;           // compiled head size D and Dv are rounded up to
  int bucket_v = 0;         // Dv's: = bucket, but 128 for the Hopper kernel's latent attention (D > 128 >= Dv)
  int block_m = 0;          // query rows per block (64 with the Hopper warpgroup key split)
  int num_splits = 1;       // key splits merged by a combine pass (portable kernels)
  int cluster = 1;          // Hopper: key splits per cluster, or 2 = the tail split of a persistent grid
  int persistent = 0;       // Hopper: blocks of a persistent grid (0: one block per item)
  int sched_heads = 0;      // Hopper persistent: > 0 = the dynamic order's section of heads
  bool wg_split = false;    // Hopper: the two consumer warpgroups split each 64-row item's keys
  bool stream_k = false;    // Hopper persistent: stream-K units
  int chain_tiles = 0;      // Hopper: item chaining from this many key tiles where the launch allows it
                            // (launch_hopper: persistent plain launches at D = 128); 0 never
  int chain_tiles_causal = 0;  // the same for causal launches
  bool fast_plain = false;  // Hopper: plain D = 128 launches whose key tiles are all whole and visible
                            // take the kernel without the code they never run (launch_hopper)
  bool three_consumers = false;  // Hopper: a one-round launch that the three-consumer kernel may take
                                 // (launch_hopper: no Q / V bias in the kernel, TMA stores)
  bool hopper_compiled = false;  // whether this build holds the sm_90a kernels at all
};
bool describe_plan(const AttentionParams& p, int sms, int smem_per_sm, int cc, PlanSummary* out);

// A human-readable description of the last error on this thread ("" after success).
const char* last_error_message();

}  // namespace opsfuse::cuda
