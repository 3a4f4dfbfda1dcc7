// Internal to plugin/cuda: the decode kernel for float16 / bfloat16 (at most 16 query rows per
// (batch, kv head): Sq small, the GQA group's heads packed into one m16 tile, D and Dv <= 128).
//
// Decode is memory bound: every byte of K and V is read once and used by <= 16 rows, so what
// matters is how many bytes each multiprocessor keeps in flight (Little's law: ~4 TB/s x ~1-2 us
// of loaded latency spread over 132 SMs -> 32-64 KB per SM). The kernel therefore:
//  - runs one block of 4 warps per (batch, kv head, KV split); the block streams key tiles of
//    kBN = 64 keys (K and V, 16-byte cp.async, coalesced: 16 consecutive threads read one row)
//    through a ring of `stages` (2..4, chosen by the launcher from the device's shared memory)
//    buffers, so stages-1 tiles are in flight while one is computed;
//  - splits every tile between the warps (warp w takes keys [16w, 16w + 16)): each warp keeps its
//    own online-softmax state (running max / sum of its 16 rows, O in registers) and does
//    S = Q K^T (m16n8k16, Q fragments in registers) and O += P V on its 16 keys;
//  - merges the 4 warps' states through shared memory at the end, in a fixed order
//    (deterministic), and writes Y or the split partials that combine_splits_kernel reads
//    (part_o unnormalized relative to part_ml's max in the log2 domain, part_ml = (max, sum)).
// sm_90 only (compiled under __CUDA_ARCH__ >= 900, asked for by choose_plan through plan.bulk and
// plan.cluster; sm_80/86/89 and PTX JIT from older virtual archs take the paths above):
//  - bulk loads: warp 0 copies every K and V row of a tile with one cp.async.bulk (the TMA engine,
//    no tensor map; one copy per row keeps the padded, ldmatrix-conflict-free layout) completing on
//    the stage's mbarrier, so the bytes in flight are not bounded by the LSU's cp.async tracking;
//    taken where rows are 16-byte aligned with D and Dv multiples of 8, else the cp.async ring;
//  - cluster merge: a split grid whose splits form thread-block clusters merges the splits'
//    (max, sum, O) through distributed shared memory and writes Y (no workspace, no combine launch).
// The score contract (scale, softcap, mask, causal, key_lengths) and the GQA row packing are the
// ones of kernel_common.cuh; rows past a.rows are computed on zero Q and never stored.
#pragma once

#include "kernel_common.cuh"
#include "mma_sync.cuh"

namespace opsfuse::cuda::detail {
namespace dec {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kBM = 16;             // rows of the tile (one m16 tile)
constexpr int kBN = kWarps * 16;    // keys per pipeline stage, 16 per warp
constexpr int kMaxStages = kDecodeMaxStages;
static_assert(kBM == kTcDecodeTile.block_m && kBN == kTcDecodeTile.block_n && kWarps == kTcDecodeTile.warps,
              "kTcDecodeTile (kernel_args.h) must describe this kernel");

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

// sm_90 only (cluster_rank / cluster_sync / map_cluster_rank: kernel_common.cuh).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// mbarriers and bulk (TMA engine, no tensor map) copies global -> shared, completing on an mbarrier.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_barrier_init_and_async_proxy() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
#endif

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
                                                                const int cluster, const int bulk) {
  constexpr int kPitch = kD + 8;  // +16 bytes per row: ldmatrix's 8 row addresses hit distinct banks
  constexpr int kKS = kD / 16;    // k-steps of Q K^T
  constexpr int kOT = kD / 8;     // n8 tiles of O
  constexpr int kStage = 2 * kBN * kPitch;  // elements of one ring stage (K then V)
  static_assert(kD % 16 == 0 && kD <= 128, "decode head-size bucket");

  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* sQ = smem;                // [kBM][kPitch]
  uint16_t* sRing = smem + kBM * kPitch;  // stages x {K [kBN][kPitch], V [kBN][kPitch]}

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int bh = blockIdx.x;
  const int b = bh / a.heads_kv, hk = bh % a.heads_kv;
  const int len = key_length_of(a, b);
  const int n_rows = a.rows < kBM ? a.rows : kBM;  // the launcher guarantees a.rows <= kBM
  const KeyRange kr = key_range(a, 0, n_rows - 1, len);
  const int n_tiles = (kr.n_end + kBN - 1) / kBN;
  // Even split of the tiles: split z takes [z * n / S, (z + 1) * n / S).
  const int t_begin = static_cast<int>(static_cast<int64_t>(blockIdx.z) * n_tiles / a.num_splits);
  const int t_end = static_cast<int>(static_cast<int64_t>(blockIdx.z + 1) * n_tiles / a.num_splits);

  const uint16_t* kbase = static_cast<const uint16_t*>(a.k) + b * a.k_stride[0] + hk * a.k_stride[1];
  const uint16_t* vbase = static_cast<const uint16_t*>(a.v) + b * a.v_stride[0] + hk * a.v_stride[1];
  const bool vec = a.vec_loads != 0;

  // Q: row r is query head hk * group + r / Sq at position r % Sq; rows >= n_rows are zero.
  {
    constexpr int kChunks = kD / 8;
    const uint16_t* qbase = static_cast<const uint16_t*>(a.q) + b * a.q_stride[0];
    for (int idx = tid; idx < kBM * kChunks; idx += kThreads) {
      const int r = idx / kChunks, c = (idx % kChunks) * 8;
      int n = a.head_dim - c;
      n = r < n_rows ? (n < 0 ? 0 : (n > 8 ? 8 : n)) : 0;
      const int g = r < n_rows ? r / a.seq_q : 0, i = r < n_rows ? r - g * a.seq_q : 0;
      const uint16_t* src = qbase + (hk * a.group + g) * a.q_stride[1] + i * a.q_stride[2] + c;
      uint16_t* dst = sQ + r * kPitch + c;
      if (vec) {
        cp_async_16(dst, n > 0 ? static_cast<const void*>(src) : a.q, n * 2);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) dst[e] = e < n ? src[e] : uint16_t(0);
      }
    }
  }
  auto load_tile = [&](int t) {
    uint16_t* sK = sRing + ((t - t_begin) % stages) * kStage;
    const int n0 = t * kBN;
    load_rows<kD, kBN>(sK, kbase, a.k_stride[2], n0, kr.n_end, a.head_dim, vec);
    load_rows<kD, kBN>(sK + kBN * kPitch, vbase, a.v_stride[2], n0, kr.n_end, a.head_dim_v, vec);
  };
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // sm_90 bulk path: warp 0 copies each K and V row of a tile with one cp.async.bulk (16-byte
  // aligned rows of a multiple of 16 bytes) into the padded layout, completing on the stage's
  // mbarrier; the other warps issue no loads. Columns past D / Dv are zeroed once (never copied),
  // rows past n_end of the last tile by the producer (stale rows of an earlier tile would be finite
  // and masked, but a first use of the stage is uninitialized memory).
  const bool use_bulk = bulk != 0 && vec && a.head_dim % 8 == 0 && a.head_dim_v % 8 == 0;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kBM * kPitch + stages * kStage);
  if (use_bulk) {
    if (a.head_dim < kD || a.head_dim_v < kD) {
      uint4* z = reinterpret_cast<uint4*>(sRing);
      for (int i = tid; i < stages * kStage / 8; i += kThreads) z[i] = make_uint4(0, 0, 0, 0);
    }
    if (tid == 0)
      for (int s = 0; s < stages; ++s) mbar_init(bars + s, 1);
    fence_barrier_init_and_async_proxy();
    __syncthreads();
  }
  auto load_tile_bulk = [&](int t) {  // warp 0, all lanes
    const int st = (t - t_begin) % stages;
    uint16_t* sK = sRing + st * kStage;
    uint16_t* sV = sK + kBN * kPitch;
    const int n0 = t * kBN;
    const int rows = kr.n_end - n0 < kBN ? kr.n_end - n0 : kBN;
    const uint32_t kb = static_cast<uint32_t>(a.head_dim) * 2, vb = static_cast<uint32_t>(a.head_dim_v) * 2;
    if (rows < kBN) {  // zero the rows that are not copied (generic stores, never async-written here)
      for (int i = lane; i < (kBN - rows) * (kPitch / 8); i += 32) {
        const int r = rows + i / (kPitch / 8), c = (i % (kPitch / 8)) * 8;
        *reinterpret_cast<uint4*>(sK + r * kPitch + c) = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(sV + r * kPitch + c) = make_uint4(0, 0, 0, 0);
      }
    }
    if (lane == 0) mbar_arrive_expect_tx(bars + st, static_cast<uint32_t>(rows) * (kb + vb));
    __syncwarp();
    for (int r = lane; r < rows; r += 32) {
      bulk_copy(sK + r * kPitch, kbase + static_cast<int64_t>(n0 + r) * a.k_stride[2], kb, bars + st);
      bulk_copy(sV + r * kPitch, vbase + static_cast<int64_t>(n0 + r) * a.v_stride[2], vb, bars + st);
    }
  };
#else
  constexpr bool use_bulk = false;
  (void)bulk;
  auto load_tile_bulk = [&](int) {};
#endif
  // Prologue: Q joins the first group; stages-1 tiles in flight (empty groups keep the count).
  if (use_bulk) {
    cp_async_commit();  // Q alone
    if (warp == 0)
      for (int s = 0; s < stages - 1; ++s)
        if (t_begin + s < t_end) load_tile_bulk(t_begin + s);
  } else {
    for (int s = 0; s < stages - 1; ++s) {
      if (t_begin + s < t_end) load_tile(t_begin + s);
      cp_async_commit();
    }
  }

  // This thread's rows in the mma C layout: h -> row lane / 4 + 8 h.
  int key_limit[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) key_limit[h] = make_row(a, b, hk, lane / 4 + 8 * h, len).key_limit;

  float o[kOT][4];
#pragma unroll
  for (int nt = 0; nt < kOT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[nt][e] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

  const int d_steps = (a.head_dim + 15) / 16;     // k-steps of Q K^T that hold real columns
  const int dv_pairs = (a.head_dim_v + 15) / 16;  // pairs of n8 output tiles that hold real columns
  const bool elementwise = a.mask_kind != 0 || a.softcap > 0.0f;
  const int kw = warp * 16;  // this warp's first key within a tile

  uint32_t qf[kKS][4];
  for (int t = t_begin; t < t_end; ++t) {
    if (use_bulk) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      if (t == t_begin) cp_async_wait(0);  // Q
      mbar_wait(bars + (t - t_begin) % stages, static_cast<uint32_t>(((t - t_begin) / stages) & 1));
      __syncthreads();  // Q of every thread's copies; everyone is done with tile t-1's stage
      if (warp == 0 && t + stages - 1 < t_end) load_tile_bulk(t + stages - 1);
#endif
    } else {
      cp_async_wait(stages - 2);  // tile t (and Q) landed for this thread's copies
      __syncthreads();            // ... for every thread's; everyone is done with tile t-1's stage
      if (t + stages - 1 < t_end) load_tile(t + stages - 1);
      cp_async_commit();
    }

    if (t == t_begin) {
#pragma unroll
      for (int kk = 0; kk < kKS; ++kk)
        ldmatrix_x4(qf[kk], sQ + (lane % 16) * kPitch + kk * 16 + (lane / 16) * 8);
    }
    const uint16_t* sK = sRing + ((t - t_begin) % stages) * kStage;
    const uint16_t* sV = sK + kBN * kPitch;

    // S = Q K^T on this warp's 16 keys: s[nt][e] is row lane/4 + 8(e/2), key kw + 8 nt + 2(lane%4) + e%2.
    float s[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kKS; ++kk) {
      if (kk < d_steps) {
        uint32_t bf[4];
        ldmatrix_x4(bf, sK + (kw + (lane / 16) * 8 + lane % 8) * kPitch + kk * 16 + ((lane / 8) % 2) * 8);
        mma_16816<T>(s[0], qf[kk], bf[0], bf[1]);
        mma_16816<T>(s[1], qf[kk], bf[2], bf[3]);
      }
    }

    // Scores in the log2 domain; the contract element by element only where the tile needs it.
    const int j0 = t * kBN + kw + (lane % 4) * 2;
    if (elementwise) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const RowInfo ri = make_row(a, b, hk, lane / 4 + 8 * h, len);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 2 * h; e < 2 * h + 2; ++e) s[nt][e] = full_score<T>(a, s[nt][e], ri, j0 + nt * 8 + (e & 1));
      }
    } else if ((t + 1) * kBN > kr.all_visible) {  // causal / key_lengths boundary tile
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          s[nt][e] = j0 + nt * 8 + (e & 1) < key_limit[e >> 1] ? s[nt][e] * a.scale_log2 : -INFINITY;
    } else {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] *= a.scale_log2;
    }

    // Online softmax of this warp's 16 keys: row h is spread over the 4 lanes of a quad.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = fmaxf(m_run[h], fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]), fmaxf(s[1][2 * h], s[1][2 * h + 1])));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float base = mx == -INFINITY ? 0.0f : mx;  // fully masked so far: exp2(-inf) = 0
      const float alpha = exp2f(m_run[h] - base);
      m_run[h] = mx;
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        s[nt][2 * h] = exp2f(s[nt][2 * h] - base);
        s[nt][2 * h + 1] = exp2f(s[nt][2 * h + 1] - base);
        sum += s[nt][2 * h] + s[nt][2 * h + 1];
      }
      l_run[h] = l_run[h] * alpha + sum;
#pragma unroll
      for (int nt = 0; nt < kOT; ++nt) {
        o[nt][2 * h] *= alpha;
        o[nt][2 * h + 1] *= alpha;
      }
    }
    uint32_t pf[4];
    pf[0] = pack2<T>(s[0][0], s[0][1]);
    pf[1] = pack2<T>(s[0][2], s[0][3]);
    pf[2] = pack2<T>(s[1][0], s[1][1]);
    pf[3] = pack2<T>(s[1][2], s[1][3]);

    // O += P V on this warp's 16 keys.
#pragma unroll
    for (int np = 0; np < kD / 16; ++np) {
      if (np < dv_pairs) {
        uint32_t bf[4];
        ldmatrix_x4_trans(bf, sV + (kw + lane % 8 + ((lane / 8) % 2) * 8) * kPitch + np * 16 + (lane / 16) * 8);
        mma_16816<T>(o[2 * np], pf, bf[0], bf[1]);
        mma_16816<T>(o[2 * np + 1], pf, bf[2], bf[3]);
      }
    }
  }
  cp_async_wait(0);
  __syncthreads();  // the ring is free: reuse it (and sQ) for the merge of the warps

  // Merge the 4 warps' (max, sum, O) in a fixed order. Floats: sO [kWarps][kBM][kD + 8], then
  // sM, sL, sW [kWarps][kBM], then the row's max and sum [kBM] each, then (cluster merge) the
  // block's unnormalized O [kBM][kD].
  constexpr int kOPitch = kD + 8;  // float2 stores of a half warp (4 rows) hit 32 distinct banks
  static_assert((kWarps * kBM * kOPitch + 3 * kWarps * kBM + 2 * kBM + kBM * kD) * 4 <= smem_bytes(kD, 2),
                "the merge fits in the smallest ring");
  float* sO = reinterpret_cast<float*>(smem);
  float* sM = sO + kWarps * kBM * kOPitch;
  float* sL = sM + kWarps * kBM;
  float* sW = sL + kWarps * kBM;
  float* sRowM = sW + kWarps * kBM;
  float* sRowL = sRowM + kBM;
  float* sY = sRowL + kBM;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_run[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int r = lane / 4 + 8 * h;
    if (lane % 4 == 0) {
      sM[warp * kBM + r] = m_run[h];
      sL[warp * kBM + r] = l;
    }
    float* orow = sO + (warp * kBM + r) * kOPitch + (lane % 4) * 2;
#pragma unroll
    for (int nt = 0; nt < kOT; ++nt)
      *reinterpret_cast<float2*>(orow + nt * 8) = make_float2(o[nt][2 * h], o[nt][2 * h + 1]);
  }
  __syncthreads();
  if (tid < kBM) {
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sM[w * kBM + tid]);
    const float base = mx == -INFINITY ? 0.0f : mx;
    float l = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float wt = exp2f(sM[w * kBM + tid] - base);
      sW[w * kBM + tid] = wt;
      l += wt * sL[w * kBM + tid];
    }
    sRowM[tid] = mx;
    sRowL[tid] = l;
  }
  __syncthreads();

  const int dv = a.head_dim_v;
  for (int idx = tid; idx < n_rows * kD; idx += kThreads) {
    const int r = idx / kD, c = idx % kD;
    if (c >= dv) continue;
    float acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) acc += sW[w * kBM + r] * sO[(w * kBM + r) * kOPitch + c];
    if (cluster > 1) {
      sY[r * kD + c] = acc;
      continue;
    }
    const int g = r / a.seq_q, i = r - g * a.seq_q, head = hk * a.group + g;
    if (a.num_splits == 1) {
      const float l = sRowL[r];
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // fully masked row -> 0
      T* yrow = static_cast<T*>(a.y) + b * a.y_stride[0] + head * a.y_stride[1] + i * a.y_stride[2];
      yrow[c] = from_float<T>(acc * inv);
    } else {
      const int64_t grow = (static_cast<int64_t>(b) * a.heads_q + head) * a.seq_q + i;
      split_o_row(a, grow)[c] = acc;
      if (c == 0) store_split_ml(a, grow, sRowM[r], sRowL[r]);
    }
  }
  if (cluster > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Every split's (sRowM, sRowL, sY) is complete and visible cluster-wide after the barrier.
    // Block `rank` finishes rows rank, rank + cluster, ...: the splits are merged in rank order
    // 0..cluster-1 whichever block does it (deterministic, the order of combine_splits_kernel).
    cluster_sync();
    const int rank = static_cast<int>(cluster_rank());
    const int my_rows = n_rows > rank ? (n_rows - rank + cluster - 1) / cluster : 0;
    for (int idx = tid; idx < my_rows * kD; idx += kThreads) {
      const int r = rank + (idx / kD) * cluster, c = idx % kD;
      if (c >= dv) continue;
      float mx = -INFINITY;
      for (int z = 0; z < cluster; ++z) mx = fmaxf(mx, *map_cluster_rank(sRowM + r, z));
      const float base = mx == -INFINITY ? 0.0f : mx;
      float l = 0.0f, acc = 0.0f;
      for (int z = 0; z < cluster; ++z) {
        const float wt = exp2f(*map_cluster_rank(sRowM + r, z) - base);
        l += wt * *map_cluster_rank(sRowL + r, z);
        acc += wt * *map_cluster_rank(sY + r * kD + c, z);
      }
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // fully masked row -> 0
      const int g = r / a.seq_q, i = r - g * a.seq_q, head = hk * a.group + g;
      T* yrow = static_cast<T*>(a.y) + b * a.y_stride[0] + head * a.y_stride[1] + i * a.y_stride[2];
      yrow[c] = from_float<T>(acc * inv);
    }
    cluster_sync();  // no block leaves (freeing its shared memory) while another still reads it
#else
    __trap();  // unreachable: choose_plan() asks for clusters only where this code is compiled (ptxVersion >= 90)
#endif
  }
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
  if (plan.cluster > 1) {
    // choose_plan() set cluster == num_splits only where max_active_clusters() found room for the
    // whole grid in one wave.
    if (plan.cluster != plan.num_splits) return cudaErrorInvalidValue;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = static_cast<unsigned>(plan.cluster);
    cfg.gridDim = grid;
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = static_cast<size_t>(bytes);
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    err = cudaLaunchKernelEx(&cfg, kernel, a, plan.stages, plan.cluster, plan.bulk);
    if (err != cudaSuccess) return err;
    return cudaGetLastError();
  }
  kernel<<<grid, kThreads, bytes, stream>>>(a, plan.stages, 1, plan.bulk);
  return cudaGetLastError();
}

// How many clusters of `cluster` (2..8) blocks (the splits of one (batch, kv head)) of a `stages`
// deep decode kernel can be resident at once on the current device (cudaOccupancyMaxActiveClusters:
// blocks of a cluster share one GPC), 0 where the kernel has no cluster merge compiled (binary or PTX
// older than sm_90) or the query fails. Cached per device (host-side attribute and occupancy queries
// only: no synchronization, no stream work).
template <typename T, int kD>
int max_active_clusters(int stages, int cluster) {
  if (stages < 2 || stages > kMaxStages || cluster < 2 || cluster > 8) return 0;
  static int cache[kMaxStages + 1][9][64] = {};  // value + 1, 0 = not asked yet
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 0;
  if (dev < 64) {
    const int c = __atomic_load_n(&cache[stages][cluster][dev], __ATOMIC_ACQUIRE);
    if (c > 0) return c - 1;
  }
  auto kernel = flash_decode_kernel<T, kD>;
  cudaFuncAttributes fa{};
  if (cudaFuncGetAttributes(&fa, kernel) != cudaSuccess) return 0;
  int n = 0;
  if (fa.ptxVersion >= 90 && fa.binaryVersion >= 90) {
    const int bytes = smem_bytes(kD, stages);
    if (prepare_kernel<T, kD>(stages) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = static_cast<unsigned>(cluster);
    cfg.gridDim = dim3(1, 1, static_cast<unsigned>(cluster));
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = static_cast<size_t>(bytes);
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: clear it so that the next launch does not report it
      return 0;
    }
  }
  if (dev < 64) __atomic_store_n(&cache[stages][cluster][dev], n + 1, __ATOMIC_RELEASE);
  return n;
}

}  // namespace dec
}  // namespace opsfuse::cuda::detail
