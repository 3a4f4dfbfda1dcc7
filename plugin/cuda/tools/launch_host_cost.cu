// launch_host_cost: host microseconds per call of the CUDA launcher and of the runtime calls it
// makes, on the seed grid's shapes (B=1, H=12, D=64, fp16) and one decode shape. Through ONNX
// Runtime every microsecond the op spends on the host before its launch is on the session.run's
// critical path (the kernel cannot start earlier), so this is what the op's own share of a
// session.run is made of. Launches are timed without synchronizing (200 calls fit in the launch
// queue, so the host never waits for the GPU); pure host calls 20000 times.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <cuda_runtime.h>

#include "cuda/attention_cuda.h"
#include "cuda/kernel_args.h"
#include "tool_support.h"

#ifdef OPSFUSE_CUDA_HOPPER
#include "cuda/hopper/hopper_host.h"
#endif

extern char** environ;

namespace {

__global__ void empty_kernel(int) {}
__global__ void __cluster_dims__(2, 1, 1) empty_cluster_kernel(int) {}

template <typename Fn>
double us_per_call(int n, Fn&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) fn();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
}

// Launch timing: sync first so the queue is empty, time n asynchronous calls, then sync.
template <typename Fn>
double launch_us(cudaStream_t stream, int n, Fn&& fn) {
  CHECK_CUDA(cudaStreamSynchronize(stream));
  const double us = us_per_call(n, fn);
  CHECK_CUDA(cudaStreamSynchronize(stream));
  return us;
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int env_count = 0;
  for (char** e = environ; *e != nullptr; ++e) ++env_count;
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::printf("environment entries: %d\n", env_count);
  volatile int sink = 0;
  std::printf("getenv (unset name)            %6.3f us\n",
              us_per_call(20000, [&] { sink += std::getenv("OPSFUSE_CUDA_NOT_SET") != nullptr; }));
  int dev = 0;
  std::printf("cudaGetDevice                  %6.3f us\n", us_per_call(20000, [&] { cudaGetDevice(&dev); }));
  cudaStreamCaptureStatus cap;
  std::printf("cudaStreamIsCapturing          %6.3f us\n",
              us_per_call(20000, [&] { cudaStreamIsCapturing(stream, &cap); }));
  std::printf("cudaStreamGetDevice            %6.3f us\n", us_per_call(20000, [&] { cudaStreamGetDevice(stream, &dev); }));
  std::printf("empty kernel launch            %6.3f us\n",
              launch_us(stream, 200, [&] { empty_kernel<<<132, 128, 0, stream>>>(0); }));
  std::printf("empty cluster-kernel launch    %6.3f us\n",
              launch_us(stream, 200, [&] { empty_cluster_kernel<<<132, 128, 0, stream>>>(0); }));

  struct Shape { const char* name; int b, hq, hkv, sq, sk, d; };
  const Shape shapes[] = {{"seed S=128", 1, 12, 12, 128, 128, 64},
                          {"seed S=2048", 1, 12, 12, 2048, 2048, 64},
                          {"decode B=8 Hkv=8 Sk=1024", 8, 32, 8, 1, 1024, 128}};
  for (const Shape& s : shapes) {
    opsfuse::tools::DenseQkv buffers;
    const opsfuse::DType dtype = s.d == 128 ? opsfuse::DType::kBFloat16 : opsfuse::DType::kFloat16;
    opsfuse::AttentionParams p =
        opsfuse::tools::dense_params(&buffers, dtype, s.b, s.hq, s.hkv, s.sq, s.sk, s.d, 0, 0, 0);
    p.scale = 0.125f;
    const size_t wsb = opsfuse::cuda::workspace_size(p);
    void* ws = nullptr;
    if (wsb) CHECK_CUDA(cudaMalloc(&ws, wsb));
    if (opsfuse::cuda::launch(p, ws, wsb, stream) != opsfuse::Status::kOk) {
      std::printf("%s: launch failed: %s\n", s.name, opsfuse::cuda::last_error_message());
      return 1;
    }
    const double ws_us = us_per_call(20000, [&] { sink += opsfuse::cuda::workspace_size(p) > 0; });
#ifdef OPSFUSE_CUDA_HOPPER
    // One TMA tensor map, as the Hopper kernels encode three (Q, K, V) or two (K, V) per launch.
    CUtensorMap map;
    const double encode_us = us_per_call(20000, [&] {
      sink += opsfuse::cuda::detail::hopper_encode_map(&map, p.k, false, s.d, s.sk, s.hkv, s.b, p.k_stride, 128, 2)
                  ? 1
                  : 0;
    });
    std::printf("%-26s one tensor-map encode %6.3f us\n", s.name, encode_us);
#endif
    const double launch = launch_us(stream, 200, [&] { opsfuse::cuda::launch(p, ws, wsb, stream); });
    // The ORT op's path: scratch asked for by the launch's own plan (here: the preallocated buffer).
    auto hand_out = [](void* ctx, size_t) { return ctx; };
    const double launch_cb = launch_us(stream, 200, [&] { opsfuse::cuda::launch(p, hand_out, ws, stream); });
    std::printf("%-26s kernel kind %d: workspace_size %6.3f us, launch %6.3f us, launch with a scratch callback "
                "%6.3f us (workspace %zu bytes)\n",
                s.name, opsfuse::cuda::detail::last_launch_kind(), ws_us, launch, launch_cb, wsb);
    opsfuse::tools::free_dense(buffers);
    if (ws) CHECK_CUDA(cudaFree(ws));
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}
