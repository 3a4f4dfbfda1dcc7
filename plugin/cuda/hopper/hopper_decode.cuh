// Internal to plugin/cuda: the sm_90 decode kernel for float16 / bfloat16 (at most 16 query rows per
// (batch, kv head), D and Dv <= 128, TMA-addressable K and V). Compiled in the sm_90a object
// library with the Hopper prefill kernel; the launcher (choose_plan) takes it on compute capability
// 9.0 devices for the decode shapes the portable decode kernel (flash_decode.cuh) would run.
//
// Why a second decode kernel: the portable one loads every tile with 16 cp.async per thread and
// synchronizes the block per tile; profiled on the H200 (ncu, B=8 Hq=32 Hkv=8 Sk=8192) it issued
// ~1300 instructions per warp per 64-key tile and streamed K/V at 67 % of DRAM bandwidth. Here:
//  - a producer warpgroup (warps 4-7, registers given away with setmaxnreg; one thread works) loads
//    each tile's K and V with TMA (one cp.async.bulk.tensor per 64-column region: 2 per tensor at
//    D = 128; 128-byte L2 promotion and an evict-first policy, see launch_hopper_decode) into a
//    kStages-deep ring of 128-byte-swizzled stages, each with a "full" mbarrier (transaction bytes)
//    and an "empty" mbarrier the 4 compute warps release -- no per-tile block barrier, no per-thread
//    copies;
//  - the 4 compute warps do decode_warp.cuh's work on each tile (the same as the portable kernel),
//    reading the swizzled layout: chunk c of row r of a region sits at r * 128 + ((c ^ r % 8) * 16),
//    so ldmatrix's 8 rows of one column chunk hit 8 distinct bank groups;
//  - the ring holds ~96 KB (3 stages at D = 128, 6 at D = 64) so that two blocks fit per SM with
//    ~64 KB of loads in flight each.
// Keys past Sk arrive as zeros (TMA out-of-bounds fill); keys in [key_lengths[b], Sk) arrive as
// whatever memory holds and are masked (scores) and zeroed (V fragments) by warp_tile_step.
// Splits write the workspace partials that the launcher's combine kernel merges, or, where the
// splits of every (batch, kv head) fit on the device as thread-block clusters at once (choose_plan,
// cluster > 1), merge through distributed shared memory and write Y (no second launch).
#pragma once

#include <cstdlib>
#include <type_traits>

#include <cuda.h>  // CUtensorMap (types only: nothing links libcuda)

#include "../decode_warp.cuh"
#include "tma_ops.cuh"

namespace opsfuse::cuda::detail {
namespace hopper_dec {

using dec::kBM;
using dec::kBN;
using dec::kWarps;
// The 4 compute warps (warpgroup 0) and a producer warpgroup: a whole warpgroup so that it can hand
// its registers to the compute warps (setmaxnreg works per warpgroup). Two blocks per SM put 4
// warps on each SM sub-partition, whose 16384 registers then allow 24 + 232 per thread pair; a
// 5-warp block (one producer warp) was capped by ptxas at 168 registers per thread and spilled, or
// without the cap (179 registers) fit only one block per SM (measured: 1.4-3.9 TB/s).
constexpr int kThreads = 2 * dec::kThreads;
constexpr int kProducerWarp = kWarps;
constexpr int kComputeRegs = 232;
constexpr int kProducerRegs = 24;
static_assert(2 * (kComputeRegs + kProducerRegs) * 128 <= 65536, "two blocks per SM fit the register file");

template <int kD>
struct Config {
  static constexpr int kRegions = kD / 64;          // 128-byte column regions of a tile row
  static constexpr int kTileBytes = kBN * kD * 2;   // K (or V) of one tile: regions of kBN x 128 bytes
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr int kStages = 96 * 1024 / kStageBytes;  // 3 at D = 128, 6 at D = 64
  static constexpr int kQBytes = kBM * (kD + 8) * 2;
  static constexpr int kSmem = 1024 + kStages * kStageBytes + kQBytes;  // + alignment slack
  static_assert(kD == 64 || kD == 128, "decode head-size bucket");
  static_assert(dec::MergeSmem<kD>::kBytes <= kStages * kStageBytes, "the merge fits in the ring");
};

// Compute warps' barrier (named barrier 1; the producer warp has returned by then).
__device__ __forceinline__ void compute_warps_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(dec::kThreads) : "memory"); }

// grid (batch * heads_kv, 1, num_splits), kThreads threads, Config<kD>::kSmem dynamic bytes.
// 128 registers per thread at launch (two blocks per SM), rebalanced by setmaxnreg.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads, 2)
    hopper_decode_kernel(const __grid_constant__ KernelArgs a, const __grid_constant__ CUtensorMap tm_k,
                         const __grid_constant__ CUtensorMap tm_v, const int evict_first, const int cluster) {
  using Cfg = Config<kD>;
  constexpr int kStages = Cfg::kStages;

  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bars[2 * kStages];  // full[s], then empty[s]
  // The swizzle pattern repeats every 1024 bytes: each stage region starts 1024-byte aligned.
  uint8_t* ring = smem_raw + (((hopper::smem_u32(smem_raw) + 1023u) & ~1023u) - hopper::smem_u32(smem_raw));
  uint16_t* sQ = reinterpret_cast<uint16_t*>(ring + kStages * Cfg::kStageBytes);
  auto full = [&](int s) { return hopper::smem_u32(&bars[s]); };
  auto empty = [&](int s) { return hopper::smem_u32(&bars[kStages + s]); };

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int b = static_cast<int>(blockIdx.x) / a.heads_kv, hk = static_cast<int>(blockIdx.x) % a.heads_kv;
  const int n_rows = a.rows < kBM ? a.rows : kBM;  // the launcher guarantees a.rows <= kBM
  const int len = key_length_of(a, b);
  const KeyRange kr = key_range(a, 0, n_rows - 1, len);
  const int n_tiles = (kr.n_end + kBN - 1) / kBN;
  // Even split of the tiles: split z takes [z * n / S, (z + 1) * n / S).
  const int t_begin = static_cast<int>(static_cast<int64_t>(blockIdx.z) * n_tiles / a.num_splits);
  const int t_end = static_cast<int>(static_cast<int64_t>(blockIdx.z + 1) * n_tiles / a.num_splits);

  if (tid == kProducerWarp * 32) {
    hopper::prefetch_tensormap(&tm_k);
    hopper::prefetch_tensormap(&tm_v);
    for (int s = 0; s < kStages; ++s) {
      hopper::mbar_init(full(s), 1);
      hopper::mbar_init(empty(s), kWarps);
    }
    hopper::fence_mbarrier_init();
  }
  __syncthreads();

  if (warp >= kProducerWarp) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs) : "memory");
    if (tid == kProducerWarp * 32) {
      const uint64_t policy = hopper::l2_evict_first_policy();
      for (int t = t_begin, i = 0; t < t_end; ++t, ++i) {
        const int s = i % kStages;
        hopper::mbar_wait(empty(s), ((i / kStages) & 1) ^ 1);  // a stage's first use passes at once
        hopper::mbar_expect_tx(full(s), Cfg::kStageBytes);
        const uint32_t sk = hopper::smem_u32(ring + s * Cfg::kStageBytes);
        if (evict_first) {  // K and V are read once: let them leave L2 first
#pragma unroll
          for (int c = 0; c < Cfg::kRegions; ++c)
            hopper::tma_load_4d_hint(sk + c * kBN * 128, &tm_k, full(s), c * 64, t * kBN, hk, b, policy);
#pragma unroll
          for (int c = 0; c < Cfg::kRegions; ++c)
            hopper::tma_load_4d_hint(sk + Cfg::kTileBytes + c * kBN * 128, &tm_v, full(s), c * 64, t * kBN, hk, b,
                                     policy);
        } else {
#pragma unroll
          for (int c = 0; c < Cfg::kRegions; ++c)
            hopper::tma_load_4d(sk + c * kBN * 128, &tm_k, full(s), c * 64, t * kBN, hk, b);
#pragma unroll
          for (int c = 0; c < Cfg::kRegions; ++c)
            hopper::tma_load_4d(sk + Cfg::kTileBytes + c * kBN * 128, &tm_v, full(s), c * 64, t * kBN, hk, b);
        }
      }
    }
    if (cluster > 1) {  // the cluster merge's barriers count every thread of the cluster
      __syncwarp();
      dec::cluster_merge_store<T, kD>(dec::MergeSmem<kD>(ring), a, b, hk, n_rows, tid, cluster, false);
    }
    return;
  }

  // ---- compute warps ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kComputeRegs) : "memory");
  // Q while the first tiles are in flight.
  dec::load_q<kD>(sQ, a, b, hk, n_rows, tid, dec::kThreads);
  const dec::TileContext ctx = dec::make_tile_context(a, b, hk, n_rows, lane, len);
  compute_warps_sync();
  uint32_t qf[kD / 16][4];
  dec::load_q_fragments<kD>(qf, sQ, lane);

  dec::WarpState<kD> st;
  st.init();
  for (int t = t_begin, i = 0; t < t_end; ++t, ++i) {
    const int s = i % kStages;
    hopper::mbar_wait(full(s), (i / kStages) & 1);
    const uint8_t* sk = ring + s * Cfg::kStageBytes;
    const uint8_t* sv = sk + Cfg::kTileBytes;
    auto swizzled = [](const uint8_t* tile, int r, int ch) {
      return tile + (ch >> 3) * (kBN * 128) + r * 128 + (((ch & 7) ^ (r & 7)) << 4);
    };
    dec::warp_tile_step<T, kD>(
        a, st, qf, ctx, t, warp, lane, [&](int r, int ch) { return swizzled(sk, r, ch); },
        [&](int r, int ch) { return swizzled(sv, r, ch); });
    __syncwarp();
    if (lane == 0) hopper::mbar_arrive(empty(s));  // this warp is done reading stage s
  }

  // Every issued tile was waited for: no TMA write is pending, the ring is free for the merge.
  const dec::MergeSmem<kD> m(ring);
  dec::merge_warps<T, kD>(m, st, a, b, hk, n_rows, tid, cluster > 1, [] { compute_warps_sync(); });
  if (cluster > 1) dec::cluster_merge_store<T, kD>(m, a, b, hk, n_rows, tid, cluster, true);
}

}  // namespace hopper_dec

// The kernel's shared-memory limit and carveout (two ~100 KB blocks per SM), once per device.
template <typename T, int kD>
cudaError_t prepare_hopper_decode() {
  static int smem_done[64] = {};
  static int carveout_done[64] = {};
  auto kernel = hopper_dec::hopper_decode_kernel<T, kD>;
  const cudaError_t err = ensure_smem(kernel, hopper_dec::Config<kD>::kSmem, smem_done);
  if (err != cudaSuccess) return err;
  return ensure_max_shared_carveout(kernel, carveout_done);
}

template <typename T, int kD>
cudaError_t launch_hopper_decode(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  using Cfg = hopper_dec::Config<kD>;
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  if (a.rows > dec::kBM || plan.num_splits < 1) return cudaErrorInvalidValue;
  // K and V are streamed once: no L2 promotion beyond the 128-byte rows TMA asks for, and an
  // evict-first policy. Measured on the H200 (2026-11-29, run 4c, B=8 Hq=32 D=128 bf16): with the
  // prefill kernel's 256-byte promotion the stream stalled at ~4.1 TB/s (Hkv=32 Sk=32768: 1040 us);
  // with 128 bytes or none, 4.6 TB/s (942 us; cuDNN 929); evict-first adds 1-3 % at Hkv=8.
  // A/B switches, in the plan: OPSFUSE_CUDA_DECODE_L2_PROMOTION=0/1/2 (none / 128 / 256 bytes),
  // OPSFUSE_CUDA_DECODE_EVICT_FIRST=0/1.
  const int promo = plan.l2_promotion;
  const int evict_first = plan.evict_first ? 1 : 0;
  CUtensorMap tk, tv;
  if (!hopper_encode_map(&tk, a.k, kBf16, a.head_dim, a.seq_k, a.heads_kv, a.batch, a.k_stride, dec::kBN, promo) ||
      !hopper_encode_map(&tv, a.v, kBf16, a.head_dim_v, a.seq_k, a.heads_kv, a.batch, a.v_stride, dec::kBN, promo))
    return cudaErrorNotSupported;  // nothing launched: the launcher falls back to the portable kernel
  cudaError_t err = prepare_hopper_decode<T, kD>();
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(a.batch) * a.heads_kv, 1, static_cast<unsigned>(plan.num_splits));
  return dec::launch_decode_grid(hopper_dec::hopper_decode_kernel<T, kD>, grid, hopper_dec::kThreads, Cfg::kSmem,
                                 plan.cluster, stream, a, tk, tv, evict_first, plan.cluster);
}

// How many clusters of `cluster` (2..8) blocks of the kernel fit on the current device at once
// (max_active_clusters_cached).
template <typename T, int kD>
int hopper_decode_active_clusters(int cluster) {
  if (cluster < 2 || cluster > 8) return 0;
  static int cache[9][64] = {};
  if (prepare_hopper_decode<T, kD>() != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return max_active_clusters_cached(cache[cluster], hopper_dec::hopper_decode_kernel<T, kD>, hopper_dec::kThreads,
                                    hopper_dec::Config<kD>::kSmem, cluster);
}

}  // namespace opsfuse::cuda::detail
