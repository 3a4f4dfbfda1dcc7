// Internal to plugin/cuda: device helpers shared by the tensor-core and float32 kernels: element
// conversion, the per-score contract (scale, softcap, mask, causal, key_lengths), the per-row
// bookkeeping of the GQA row packing, and the epilogue (final store or split-KV partials).
#pragma once

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernel_args.h"

namespace opsfuse::cuda::detail {

constexpr float kLog2e = 1.4426950408889634f;

template <typename T> __device__ __forceinline__ float to_float(T x);
template <> __device__ __forceinline__ float to_float<float>(float x) { return x; }
template <> __device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Stores two adjacent outputs (columns c, c+1; the second only when `both`). `paired` when the
// address is aligned for one 2-element store.
template <typename T>
__device__ __forceinline__ void store_pair(T* dst, float x0, float x1, bool both, bool paired) {
  if (both && paired) {
    if constexpr (sizeof(T) == 2) {
      T tmp[2] = {from_float<T>(x0), from_float<T>(x1)};
      *reinterpret_cast<uint32_t*>(dst) = *reinterpret_cast<const uint32_t*>(tmp);
    } else {
      *reinterpret_cast<float2*>(dst) = make_float2(x0, x1);
    }
  } else {
    dst[0] = from_float<T>(x0);
    if (both) dst[1] = from_float<T>(x1);
  }
}

// One query row of a block: where it lives and which keys it may see.
struct RowInfo {
  int valid;        // row < rows
  int head;         // query head
  int pos;          // query position i
  int key_limit;    // keys j < key_limit pass causal and key_lengths
  int64_t mask_off; // element offset of (b, head, i, 0) in the mask
};

__device__ __forceinline__ int key_length_of(const KernelArgs& a, int b) {
  if (a.key_lengths == nullptr) return a.seq_k;
  long long len = a.key_lengths_int64 ? static_cast<const long long*>(a.key_lengths)[b]
                                      : static_cast<long long>(static_cast<const int*>(a.key_lengths)[b]);
  // Values outside [0, Sk] are clamped (they cannot be checked without a synchronization).
  return len < 0 ? 0 : (len > a.seq_k ? a.seq_k : static_cast<int>(len));
}

__device__ __forceinline__ RowInfo make_row(const KernelArgs& a, int b, int kv_head, int r, int len) {
  RowInfo ri;
  ri.valid = r < a.rows;
  const int rr = ri.valid ? r : 0;
  const int g = rr / a.seq_q;
  ri.pos = rr - g * a.seq_q;
  ri.head = kv_head * a.group + g;
  int lim = len;
  if (a.causal) {
    const int c = ri.pos + a.causal_offset + 1;
    lim = c < lim ? c : lim;
  }
  ri.key_limit = lim < 0 ? 0 : lim;
  ri.mask_off = b * a.mask_stride[0] + ri.head * a.mask_stride[1] + ri.pos * a.mask_stride[2];
  return ri;
}

// The block's key range: tiles [0, n_end) hold every key visible to some row of rows
// [r_lo, r_hi]; keys below `all_visible` pass causal / key_lengths for every row of the block.
struct KeyRange {
  int n_end;
  int all_visible;
};

__device__ __forceinline__ KeyRange key_range(const KernelArgs& a, int r_lo, int r_hi, int len) {
  const int g_lo = r_lo / a.seq_q, g_hi = r_hi / a.seq_q;
  int i_min, i_max;
  if (g_lo == g_hi) {
    i_min = r_lo - g_lo * a.seq_q;
    i_max = r_hi - g_hi * a.seq_q;
  } else {
    i_min = 0;
    i_max = a.seq_q - 1;
  }
  KeyRange kr{len, len};
  if (a.causal) {
    const int hi = i_max + a.causal_offset + 1, lo = i_min + a.causal_offset + 1;
    kr.n_end = hi < len ? hi : len;
    kr.all_visible = lo < len ? lo : len;
  }
  if (kr.n_end < 0) kr.n_end = 0;
  if (kr.all_visible < 0) kr.all_visible = 0;
  return kr;
}

// A masked-path score (natural units) in the log2 units the softmax works in. A finite score
// below -FLT_MAX / log2(e) -- bfloat16's and float32's lowest values, transformers' padding fill --
// would overflow to -inf and a row of them would read as fully masked (zeros); it is held at
// -FLT_MAX, so such a row attends uniformly as in float32 arithmetic. -inf stays -inf. float16
// masks and scores cannot get there (|q.k| of float16 operands is far below 2.36e38).
template <typename T>
__device__ __forceinline__ float to_log2_units(float x) {
  const float y = x * kLog2e;
  if constexpr (std::is_same_v<T, __half>) {
    return y;
  } else {
    return y == -INFINITY && x != -INFINITY ? -FLT_MAX : y;
  }
}

// The contract for one score, slow path: s = scale * qk -> softcap -> + mask (or -inf) ->
// causal / key_lengths. Returns the score in the log2 domain (times log2 e) or -inf.
template <typename T>
__device__ __forceinline__ float full_score(const KernelArgs& a, float qk, const RowInfo& ri, int j) {
  if (j >= ri.key_limit) return -INFINITY;
  float s = qk * a.scale;
  if (a.softcap > 0.0f) s = a.softcap * tanhf(s / a.softcap);
  if (a.mask_kind != 0) {
    const int64_t off = ri.mask_off + static_cast<int64_t>(j) * a.mask_stride[3];
    if (a.mask_kind == 1) {
      if (!static_cast<const uint8_t*>(a.mask)[off]) return -INFINITY;
    } else {
      s += to_float<T>(static_cast<const T*>(a.mask)[off]);
    }
  }
  return to_log2_units<T>(s);
}

// Writes one row's (max, sum) of a split (lane that owns the row; m in the log2 domain).
__device__ __forceinline__ void store_split_ml(const KernelArgs& a, int64_t grow, float m, float l) {
  const int64_t total = static_cast<int64_t>(a.batch) * a.heads_q * a.seq_q;
  float* dst = a.part_ml + (static_cast<int64_t>(blockIdx.z) * total + grow) * 2;
  dst[0] = m;
  dst[1] = l;
}

__device__ __forceinline__ float* split_o_row(const KernelArgs& a, int64_t grow) {
  const int64_t total = static_cast<int64_t>(a.batch) * a.heads_q * a.seq_q;
  return a.part_o + (static_cast<int64_t>(blockIdx.z) * total + grow) * a.head_dim_v;
}

// The shared-memory address of a generic pointer to shared memory (PTX operands).
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Sets the dynamic shared memory limit of `kernel` once per device (it is per device).
template <typename Kernel>
cudaError_t ensure_smem(Kernel kernel, int bytes, int* done_mask_per_device) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev < 64) {
    int* flag = done_mask_per_device + dev;
    if (__atomic_load_n(flag, __ATOMIC_ACQUIRE)) return cudaSuccess;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err == cudaSuccess) __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
    return err;
  }
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

// Asks, once per device, for all of L1 as shared memory: the kernels load their tiles with
// cp.async.cg, which bypasses L1, and choose_plan() counts resident blocks with that carveout.
template <typename Kernel>
cudaError_t ensure_max_shared_carveout(Kernel kernel, int* done_per_device) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev < 64 && __atomic_load_n(&done_per_device[dev], __ATOMIC_ACQUIRE)) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                             static_cast<int>(cudaSharedmemCarveoutMaxShared));
  if (err == cudaSuccess && dev < 64) __atomic_store_n(&done_per_device[dev], 1, __ATOMIC_RELEASE);
  return err;
}

// Host side: how many clusters of `cluster` blocks of `kernel` (threads, smem bytes; its shared-
// memory attributes already set) can be resident at once (cudaOccupancyMaxActiveClusters: a
// cluster's blocks share one GPC); 0 where the kernel has no sm_90 code (binary or PTX older than
// 9.0) or the query fails. Cached per device in `cache` (64 entries, value + 1, 0 = not asked yet):
// host-side attribute and occupancy queries only, no synchronization, no stream work.
template <typename Kernel>
int max_active_clusters_cached(int* cache, Kernel kernel, int threads, int smem, int cluster) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 0;
  if (dev < 64) {
    const int c = __atomic_load_n(&cache[dev], __ATOMIC_ACQUIRE);
    if (c > 0) return c - 1;
  }
  int n = 0;
  cudaFuncAttributes fa{};
  if (cudaFuncGetAttributes(&fa, kernel) != cudaSuccess) {
    (void)cudaGetLastError();
  } else if (fa.ptxVersion >= 90 && fa.binaryVersion >= 90) {
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = static_cast<unsigned>(cluster);
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(cluster));
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = static_cast<size_t>(smem);
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: clear it so that the next launch does not report it
      n = 0;
    }
  }
  if (dev < 64) __atomic_store_n(&cache[dev], n + 1, __ATOMIC_RELEASE);
  return n;
}

// Thread-block cluster (sm_90; the decode kernel's and the Hopper kernel's split merges): the rank
// of this block, a cluster-wide barrier (release / acquire: shared-memory writes before it are
// visible to every block of the cluster after it; every thread of every block must take part), and
// the address of a shared variable in another block of the cluster.
// Declared for every target (the host pass parses the kernels that call them); on devices below 9.0
// nothing may reach them (their callers are sm_90 code paths) and they trap.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define OPSFUSE_SM90_ASM(...) asm volatile(__VA_ARGS__)
#elif defined(__CUDA_ARCH__)
#define OPSFUSE_SM90_ASM(...) __trap()
#else
#define OPSFUSE_SM90_ASM(...) (void)0
#endif
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r = 0;
  OPSFUSE_SM90_ASM("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync() {
  OPSFUSE_SM90_ASM("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
  OPSFUSE_SM90_ASM("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The generic address of `p`'s counterpart in the shared memory of cluster block `rank`: plain
// loads through it read distributed shared memory, and the compiler can batch and widen them (a
// volatile asm load per value, used at once, pays the remote latency value after value).
template <typename T>
__device__ __forceinline__ const T* map_cluster_rank(const T* p, uint32_t rank) {
  uint64_t out = 0;
  OPSFUSE_SM90_ASM("mapa.u64 %0, %1, %2;\n" : "=l"(out) : "l"(reinterpret_cast<uint64_t>(p)), "r"(rank));
  return reinterpret_cast<const T*>(out);
}
#undef OPSFUSE_SM90_ASM

}  // namespace opsfuse::cuda::detail
