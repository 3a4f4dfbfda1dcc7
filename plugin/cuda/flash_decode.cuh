// Internal to plugin/cuda: the portable decode kernel for float16 / bfloat16 (at most 16 query rows
// per (batch, kv head): Sq small, the GQA group's heads packed into one m16 tile, D and Dv <= 128).
// On sm_90 the launcher takes hopper/hopper_decode.cuh instead (TMA loads) where it covers a launch.
//
// Decode is memory bound: every byte of K and V is read once and used by <= 16 rows, so what
// matters is how many bytes each multiprocessor keeps in flight (Little's law: ~4 TB/s x ~1-2 us
// of loaded latency spread over 132 SMs -> 32-64 KB per SM). The kernel therefore runs one block of
// 4 warps per (batch, kv head, KV split); the block streams key tiles of kBN = 64 keys (K and V,
// 16-byte cp.async, coalesced: 16 consecutive threads read one row) through a ring of `stages`
// (2..4, chosen by the launcher from the device's shared memory) buffers, so stages-1 tiles are in
// flight while one is computed. What each warp does with a tile, and the merge of the warps, is
// decode_warp.cuh (shared with the sm_90 decode kernel).
// sm_90 only (compiled under __CUDA_ARCH__ >= 900, asked for by choose_plan through plan.cluster;
// sm_80/86/89 and PTX JIT from older virtual archs take the workspace path): a split grid whose
// splits form thread-block clusters merges the splits' (max, sum, O) through distributed shared
// memory and writes Y (no workspace, no combine launch).
#pragma once

#include <climits>

#include "decode_warp.cuh"

namespace opsfuse::cuda::detail {
namespace dec {

constexpr int kMaxStages = kDecodeMaxStages;

// Shared memory of one block: Q (kBM rows) + `stages` x (K and V tiles of kBN rows), pitch kD + 8.
__host__ __device__ constexpr int smem_bytes(int d_bucket, int stages) { return decode_smem_bytes(d_bucket, stages); }

// 16-byte async copy global -> shared; bytes beyond `src_bytes` (0..16) are zero-filled.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
  // L2::256B: the rows of a tile are 256-byte runs of one 16 KB block, so let L2 fetch whole 256-byte
  // blocks from HBM at once (a hint; the copy itself stays 16 bytes).
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(src_bytes));
}
// Waits until at most `pending` (0..kMaxStages-2) of this thread's groups are still in flight.
__device__ __forceinline__ void cp_async_wait(int pending) {
  if (pending >= 2)
    asm volatile("cp.async.wait_group 2;\n" ::: "memory");
  else if (pending == 1)
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
  else
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}
static_assert(kMaxStages - 2 <= 2, "cp_async_wait covers at most 2 pending groups");

// Copies kRows rows of kD 16-bit elements to shared memory (pitch kD + 8). Row r comes from
// base + (n0 + r) * stride when n0 + r < n_end, else it is zero-filled; columns >= ncols are
// zero-filled. vec: 16-byte cp.async (aligned rows); else synchronous element loads.
template <int kD, int kRows>
__device__ __forceinline__ void load_rows(uint16_t* smem, const uint16_t* base, int64_t stride, int n0, int n_end,
                                          int ncols, bool vec) {
  constexpr int kChunks = kD / 8;                 // 16-byte chunks per row
  constexpr int kRowsPerPass = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0 && kRows % kRowsPerPass == 0, "load shape");
  constexpr int kPitch = kD + 8;
  const int c = (threadIdx.x % kChunks) * 8;
  const int r0 = threadIdx.x / kChunks;
  int n = ncols - c;
  n = n < 0 ? 0 : (n > 8 ? 8 : n);
  if (vec) {
#pragma unroll
    for (int p = 0; p < kRows / kRowsPerPass; ++p) {
      const int r = r0 + p * kRowsPerPass;
      const bool in = n0 + r < n_end && n > 0;
      const uint16_t* src = in ? base + static_cast<int64_t>(n0 + r) * stride + c : base;
      cp_async_16(smem + r * kPitch + c, src, in ? n * 2 : 0);
    }
  } else {
    for (int p = 0; p < kRows / kRowsPerPass; ++p) {
      const int r = r0 + p * kRowsPerPass;
      const bool in = n0 + r < n_end;
      const uint16_t* src = base + static_cast<int64_t>(in ? n0 + r : 0) * stride + c;
      uint16_t* dst = smem + r * kPitch + c;
#pragma unroll
      for (int e = 0; e < 8; ++e) dst[e] = (in && e < n) ? src[e] : uint16_t(0);
    }
  }
}

// grid (batch * heads_kv, 1, num_splits), kThreads threads, smem_bytes(kD, stages) dynamic bytes.
// cluster > 1 (sm_90, launched with cluster dims (1, 1, num_splits) == cluster): the splits of one
// (batch, kv head) are one thread-block cluster and merge their partials through distributed shared
// memory, writing Y themselves (no workspace, no combine launch).
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads, 2) flash_decode_kernel(const KernelArgs a, const int stages,
                                                                const int cluster) {
  constexpr int kPitch = kD + 8;  // +16 bytes per row: ldmatrix's 8 row addresses hit distinct banks
  constexpr int kStage = 2 * kBN * kPitch;  // elements of one ring stage (K then V)
  static_assert(kD % 16 == 0 && kD <= 128, "decode head-size bucket");

  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* sQ = smem;                // [kBM][kPitch]
  uint16_t* sRing = smem + kBM * kPitch;  // stages x {K [kBN][kPitch], V [kBN][kPitch]}

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int bh = blockIdx.x;
  const int b = bh / a.heads_kv, hk = bh % a.heads_kv;
  const int n_rows = a.rows < kBM ? a.rows : kBM;  // the launcher guarantees a.rows <= kBM
  // The loads below zero-fill every row past the key range: no V rows to zero in registers.
  const TileContext ctx = make_tile_context(a, b, hk, n_rows, lane, INT_MAX);
  const int n_tiles = (ctx.kr.n_end + kBN - 1) / kBN;
  // Even split of the tiles: split z takes [z * n / S, (z + 1) * n / S).
  const int t_begin = static_cast<int>(static_cast<int64_t>(blockIdx.z) * n_tiles / a.num_splits);
  const int t_end = static_cast<int>(static_cast<int64_t>(blockIdx.z + 1) * n_tiles / a.num_splits);

  const uint16_t* kbase = static_cast<const uint16_t*>(a.k) + b * a.k_stride[0] + hk * a.k_stride[1];
  const uint16_t* vbase = static_cast<const uint16_t*>(a.v) + b * a.v_stride[0] + hk * a.v_stride[1];
  const bool vec = a.vec_loads != 0;

  auto load_tile = [&](int t) {
    uint16_t* sK = sRing + ((t - t_begin) % stages) * kStage;
    const int n0 = t * kBN;
    load_rows<kD, kBN>(sK, kbase, a.k_stride[2], n0, ctx.kr.n_end, a.head_dim, vec);
    load_rows<kD, kBN>(sK + kBN * kPitch, vbase, a.v_stride[2], n0, ctx.kr.n_end, a.head_dim_v, vec);
  };
  // Prologue: stages-1 tiles in flight (empty groups keep the count).
  for (int s = 0; s < stages - 1; ++s) {
    if (t_begin + s < t_end) load_tile(t_begin + s);
    cp_async_commit();
  }
  load_q<kD>(sQ, a, b, hk, n_rows, tid, kThreads);  // visible to all after the first __syncthreads

  WarpState<kD> st;
  st.init();
  uint32_t qf[kD / 16][4];
  for (int t = t_begin; t < t_end; ++t) {
    cp_async_wait(stages - 2);  // tile t landed for this thread's copies
    __syncthreads();            // ... for every thread's; everyone is done with tile t-1's stage
    if (t + stages - 1 < t_end) load_tile(t + stages - 1);
    cp_async_commit();
    if (t == t_begin) load_q_fragments<kD>(qf, sQ, lane);
    const uint16_t* sK = sRing + ((t - t_begin) % stages) * kStage;
    const uint16_t* sV = sK + kBN * kPitch;
    warp_tile_step<T, kD>(
        a, st, qf, ctx, t, warp, lane, [&](int r, int ch) { return sK + r * kPitch + ch * 8; },
        [&](int r, int ch) { return sV + r * kPitch + ch * 8; });
  }
  cp_async_wait(0);

  // The ring is free after merge_warps' first barrier: reuse it (and sQ) for the merge.
  static_assert(MergeSmem<kD>::kBytes <= smem_bytes(kD, 2), "the merge fits in the smallest ring");
  const MergeSmem<kD> m(smem);
  merge_warps<T, kD>(m, st, a, b, hk, n_rows, tid, cluster > 1, [] { __syncthreads(); });
  if (cluster > 1) cluster_merge_store<T, kD>(m, a, b, hk, n_rows, tid, cluster, true);
}

// Sets the kernel's shared-memory limit for a `stages` deep ring and its carveout, once per device.
// The ring depth is a function of the device (decode_stages), so one size per device; the carveout
// asks for all of L1 as shared memory (cp.async.cg does not use L1), so that the two blocks per SM
// that decode_stages counted on are resident (and the cluster occupancy query sees them).
template <typename T, int kD>
cudaError_t prepare_kernel(int stages) {
  static int smem_done[kMaxStages + 1][64] = {};
  static int carveout_done[64] = {};
  auto kernel = flash_decode_kernel<T, kD>;
  cudaError_t err = ensure_smem(kernel, smem_bytes(kD, stages), smem_done[stages]);
  if (err != cudaSuccess) return err;
  err = ensure_max_shared_carveout(kernel, carveout_done);
  if (err != cudaSuccess) return err;
  return cudaSuccess;
}

template <typename T, int kD>
cudaError_t launch_flash_decode(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  if (a.rows > kBM || plan.stages < 2 || plan.stages > kMaxStages) return cudaErrorInvalidValue;
  const int bytes = smem_bytes(kD, plan.stages);
  auto kernel = flash_decode_kernel<T, kD>;
  cudaError_t err = prepare_kernel<T, kD>(plan.stages);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(a.batch) * a.heads_kv, 1, plan.num_splits);
  // cluster > 1: choose_plan() found room for the whole grid's clusters in one wave.
  return launch_decode_grid(kernel, grid, kThreads, bytes, plan.cluster, stream, a, plan.stages, plan.cluster);
}

// How many clusters of `cluster` (2..8) blocks (the splits of one (batch, kv head)) of a `stages`
// deep decode kernel can be resident at once on the current device (max_active_clusters_cached).
template <typename T, int kD>
int max_active_clusters(int stages, int cluster) {
  if (stages < 2 || stages > kMaxStages || cluster < 2 || cluster > 8) return 0;
  static int cache[kMaxStages + 1][9][64] = {};
  if (prepare_kernel<T, kD>(stages) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return max_active_clusters_cached(cache[stages][cluster], flash_decode_kernel<T, kD>, kThreads, smem_bytes(kD, stages),
                                    cluster);
}

}  // namespace dec
}  // namespace opsfuse::cuda::detail
