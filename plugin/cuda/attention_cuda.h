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

// A human-readable description of the last error on this thread ("" after success).
const char* last_error_message();

}  // namespace opsfuse::cuda
