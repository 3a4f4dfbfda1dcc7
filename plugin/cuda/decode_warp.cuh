// Internal to plugin/cuda: the per-warp work shared by the two decode kernels -- flash_decode.cuh
// (portable: a cp.async ring, every thread loads) and hopper/hopper_decode.cuh (sm_90: TMA tensor
// loads by a producer warp into a swizzled mbarrier ring). They differ only in how a tile reaches
// shared memory; what a warp does with it is here, once.
//
// A decode block works on one (batch, kv head, key split) with at most kBM = 16 rows (the GQA
// group's query heads times Sq, packed into one m16 tile). Each 64-key tile is split between the
// kWarps = 4 compute warps (warp w: keys 16w .. 16w + 15); each warp keeps its own online-softmax
// state (running max / sum of its 16 rows, O in registers) and does S = Q K^T (m16n8k16, Q
// fragments in registers) and O += P V on its 16 keys. At the end the warps merge through shared
// memory in a fixed order (deterministic) and write Y or the split partials that
// combine_splits_kernel reads (part_o unnormalized relative to part_ml's max in the log2 domain,
// part_ml = (max, sum)). The score contract and the GQA row packing are kernel_common.cuh's; rows
// past a.rows are computed on zero Q and never stored.
#pragma once

#include "kernel_common.cuh"
#include "mma_sync.cuh"

namespace opsfuse::cuda::detail {
namespace dec {

constexpr int kWarps = 4;           // compute warps of a block
constexpr int kThreads = kWarps * 32;
constexpr int kBM = 16;             // rows of the tile (one m16 tile)
constexpr int kBN = kWarps * 16;    // keys per tile, 16 per warp
static_assert(kBM == kTcDecodeTile.block_m && kBN == kTcDecodeTile.block_n && kWarps == kTcDecodeTile.warps,
              "kTcDecodeTile (kernel_args.h) must describe the decode kernels");

// Q in shared memory: kBM rows, pitch kD + 8 elements (+16 bytes: ldmatrix's 8 row addresses hit
// distinct banks); row r is query head hk * group + r / Sq at position r % Sq, rows >= n_rows and
// columns >= D are zero. Synchronous 16-byte loads (vec) or element loads, by `nthreads` threads.
template <int kD>
__device__ __forceinline__ void load_q(uint16_t* sQ, const KernelArgs& a, int b, int hk, int n_rows, int tid,
                                       int nthreads) {
  constexpr int kChunks = kD / 8;
  constexpr int kPitch = kD + 8;
  const uint16_t* qbase = static_cast<const uint16_t*>(a.q) + b * a.q_stride[0];
  for (int idx = tid; idx < kBM * kChunks; idx += nthreads) {
    const int r = idx / kChunks, c = (idx % kChunks) * 8;
    int n = a.head_dim - c;
    n = r < n_rows ? (n < 0 ? 0 : (n > 8 ? 8 : n)) : 0;
    const int g = r < n_rows ? r / a.seq_q : 0, i = r < n_rows ? r - g * a.seq_q : 0;
    const uint16_t* src = qbase + (hk * a.group + g) * a.q_stride[1] + i * a.q_stride[2] + c;
    uint16_t* dst = sQ + r * kPitch + c;
    if (n == 8 && a.vec_loads) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) dst[e] = e < n ? src[e] : uint16_t(0);
    }
  }
}

// This warp's A fragments of Q (all k-steps) from the padded sQ.
template <int kD>
__device__ __forceinline__ void load_q_fragments(uint32_t (&qf)[kD / 16][4], const uint16_t* sQ, int lane) {
  constexpr int kPitch = kD + 8;
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) ldmatrix_x4(qf[kk], sQ + (lane % 16) * kPitch + kk * 16 + (lane / 16) * 8);
}

// One warp's online-softmax state: rows lane / 4 and lane / 4 + 8 of the mma C layout (h = 0, 1).
template <int kD>
struct WarpState {
  float o[kD / 8][4];
  float m_run[2];
  float l_run[2];
  __device__ __forceinline__ void init() {
#pragma unroll
    for (int nt = 0; nt < kD / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[nt][e] = 0.0f;
    m_run[0] = m_run[1] = -INFINITY;
    l_run[0] = l_run[1] = 0.0f;
  }
};

// What every tile step of a block needs to know of its rows and keys.
struct TileContext {
  int b, hk, len;
  KeyRange kr;
  int key_limit[2];  // this thread's rows' key limits (causal, key_lengths)
  int d_steps;       // k-steps of Q K^T that hold real columns
  int dv_pairs;      // pairs of n8 output tiles that hold real columns
  bool elementwise;  // mask or softcap: every score through full_score()
  int v_zero_from;   // keys >= this arrive in shared memory as whatever memory holds (see below)
};

__device__ __forceinline__ TileContext make_tile_context(const KernelArgs& a, int b, int hk, int n_rows, int lane,
                                                         int v_zero_from) {
  TileContext c;
  c.b = b;
  c.hk = hk;
  c.len = key_length_of(a, b);
  c.kr = key_range(a, 0, n_rows - 1, c.len);
#pragma unroll
  for (int h = 0; h < 2; ++h) c.key_limit[h] = make_row(a, b, hk, lane / 4 + 8 * h, c.len).key_limit;
  c.d_steps = (a.head_dim + 15) / 16;
  c.dv_pairs = (a.head_dim_v + 15) / 16;
  c.elementwise = a.mask_kind != 0 || a.softcap > 0.0f;
  c.v_zero_from = v_zero_from;
  return c;
}

// One warp's share of key tile t (keys t * kBN + 16 warp .. + 15): S = Q K^T, the score contract,
// the online softmax, O += P V. k_at(row, chunk) / v_at(row, chunk) give the shared-memory address
// of 16-byte chunk `chunk` (columns 8 chunk .. 8 chunk + 7) of tile row `row` (the kernels' tile
// layouts differ). Keys >= ctx.v_zero_from have their V fragments zeroed in registers: a load
// that does not zero-fill rows past key_lengths (TMA fills only past Sk) brings in whatever a padded
// cache holds there, NaN included, and P = 0 times NaN is NaN.
template <typename T, int kD, class KAt, class VAt>
__device__ __forceinline__ void warp_tile_step(const KernelArgs& a, WarpState<kD>& st, const uint32_t (&qf)[kD / 16][4],
                                               const TileContext& ctx, int t, int warp, int lane, KAt k_at, VAt v_at) {
  constexpr int kKS = kD / 16;  // k-steps of Q K^T
  const int kw = warp * 16;     // this warp's first key within the tile

  // S on this warp's 16 keys: s[nt][e] is row lane/4 + 8(e/2), key kw + 8 nt + 2(lane%4) + e%2.
  float s[2][4];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kKS; ++kk) {
    if (kk < ctx.d_steps) {
      uint32_t bf[4];
      ldmatrix_x4(bf, k_at(kw + (lane / 16) * 8 + lane % 8, kk * 2 + (lane / 8) % 2));
      mma_16816<T>(s[0], qf[kk], bf[0], bf[1]);
      mma_16816<T>(s[1], qf[kk], bf[2], bf[3]);
    }
  }

  // Scores in the log2 domain; the contract element by element only where the tile needs it.
  const int j0 = t * kBN + kw + (lane % 4) * 2;
  if (ctx.elementwise) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const RowInfo ri = make_row(a, ctx.b, ctx.hk, lane / 4 + 8 * h, ctx.len);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) s[nt][e] = full_score<T>(a, s[nt][e], ri, j0 + nt * 8 + (e & 1));
    }
  } else if ((t + 1) * kBN > ctx.kr.all_visible) {  // causal / key_lengths boundary tile
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[nt][e] = j0 + nt * 8 + (e & 1) < ctx.key_limit[e >> 1] ? s[nt][e] * a.scale_log2 : -INFINITY;
  } else {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] *= a.scale_log2;
  }

  // Online softmax of this warp's 16 keys: row h is spread over the 4 lanes of a quad.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = fmaxf(st.m_run[h], fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]), fmaxf(s[1][2 * h], s[1][2 * h + 1])));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float base = mx == -INFINITY ? 0.0f : mx;  // fully masked so far: exp2(-inf) = 0
    const float alpha = exp2f(st.m_run[h] - base);
    st.m_run[h] = mx;
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      s[nt][2 * h] = exp2f(s[nt][2 * h] - base);
      s[nt][2 * h + 1] = exp2f(s[nt][2 * h + 1] - base);
      sum += s[nt][2 * h] + s[nt][2 * h + 1];
    }
    st.l_run[h] = st.l_run[h] * alpha + sum;
#pragma unroll
    for (int nt = 0; nt < kD / 8; ++nt) {
      st.o[nt][2 * h] *= alpha;
      st.o[nt][2 * h + 1] *= alpha;
    }
  }
  uint32_t pf[4];
  pf[0] = pack2<T>(s[0][0], s[0][1]);
  pf[1] = pack2<T>(s[0][2], s[0][3]);
  pf[2] = pack2<T>(s[1][0], s[1][1]);
  pf[3] = pack2<T>(s[1][2], s[1][3]);

  // V fragments (ldmatrix .trans): registers 0 and 2 hold keys kw + 2(lane%4) + {0, 1}, registers
  // 1 and 3 the same + 8 (low half: the even key). Zeroed at keys >= v_zero_from (tail tile only).
  const int vkey = t * kBN + kw + 2 * (lane % 4);
  const bool zero_tail = vkey + 9 >= ctx.v_zero_from;
  uint32_t keep[2] = {0xffffffffu, 0xffffffffu};
  if (zero_tail) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
      keep[r] = (vkey + 8 * r < ctx.v_zero_from ? 0x0000ffffu : 0u) | (vkey + 8 * r + 1 < ctx.v_zero_from ? 0xffff0000u : 0u);
  }

  // O += P V on this warp's 16 keys.
#pragma unroll
  for (int np = 0; np < kD / 16; ++np) {
    if (np < ctx.dv_pairs) {
      uint32_t bf[4];
      ldmatrix_x4_trans(bf, v_at(kw + lane % 8 + ((lane / 8) % 2) * 8, np * 2 + lane / 16));
      if (zero_tail) {
        bf[0] &= keep[0];
        bf[1] &= keep[1];
        bf[2] &= keep[0];
        bf[3] &= keep[1];
      }
      mma_16816<T>(st.o[2 * np], pf, bf[0], bf[1]);
      mma_16816<T>(st.o[2 * np + 1], pf, bf[2], bf[3]);
    }
  }
}

// The merge of the warps' states, in shared memory (floats): sO [kWarps][kBM][kD + 8], then sM,
// sL, sW [kWarps][kBM], then the row's max and sum [kBM] each, then (cluster merge) the block's
// unnormalized O [kBM][kD].
template <int kD>
struct MergeSmem {
  static constexpr int kOPitch = kD + 8;  // float2 stores of a half warp (4 rows) hit 32 distinct banks
  static constexpr int kBytes = (kWarps * kBM * kOPitch + 3 * kWarps * kBM + 2 * kBM + kBM * kD) * 4;
  float *sO, *sM, *sL, *sW, *sRowM, *sRowL, *sY;
  __device__ __forceinline__ explicit MergeSmem(void* base) {
    sO = static_cast<float*>(base);
    sM = sO + kWarps * kBM * kOPitch;
    sL = sM + kWarps * kBM;
    sW = sL + kWarps * kBM;
    sRowM = sW + kWarps * kBM;
    sRowL = sRowM + kBM;
    sY = sRowL + kBM;
  }
};

// Merges the kWarps warps' states (all kThreads compute threads call it; `sync` is their barrier,
// also called first: the caller's tiles may still be read when it returns from the last step) in a
// fixed order, then writes row r's Y (one split), its split partials (num_splits > 1), or, with
// `to_cluster`, its unnormalized O into m.sY for a cluster merge (m.sRowM / m.sRowL hold the row's
// max and sum for every case).
template <typename T, int kD, class Sync>
__device__ __forceinline__ void merge_warps(const MergeSmem<kD>& m, const WarpState<kD>& st, const KernelArgs& a, int b,
                                            int hk, int n_rows, int tid, bool to_cluster, Sync sync) {
  constexpr int kOPitch = MergeSmem<kD>::kOPitch;
  const int warp = tid / 32, lane = tid % 32;
  sync();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = st.l_run[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int r = lane / 4 + 8 * h;
    if (lane % 4 == 0) {
      m.sM[warp * kBM + r] = st.m_run[h];
      m.sL[warp * kBM + r] = l;
    }
    float* orow = m.sO + (warp * kBM + r) * kOPitch + (lane % 4) * 2;
#pragma unroll
    for (int nt = 0; nt < kD / 8; ++nt)
      *reinterpret_cast<float2*>(orow + nt * 8) = make_float2(st.o[nt][2 * h], st.o[nt][2 * h + 1]);
  }
  sync();
  if (tid < kBM) {
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, m.sM[w * kBM + tid]);
    const float base = mx == -INFINITY ? 0.0f : mx;
    float l = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float wt = exp2f(m.sM[w * kBM + tid] - base);
      m.sW[w * kBM + tid] = wt;
      l += wt * m.sL[w * kBM + tid];
    }
    m.sRowM[tid] = mx;
    m.sRowL[tid] = l;
  }
  sync();

  const int dv = a.head_dim_v;
  for (int idx = tid; idx < n_rows * kD; idx += kThreads) {
    const int r = idx / kD, c = idx % kD;
    if (c >= dv) continue;
    float acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) acc += m.sW[w * kBM + r] * m.sO[(w * kBM + r) * kOPitch + c];
    if (to_cluster) {
      m.sY[r * kD + c] = acc;
      continue;
    }
    const int g = r / a.seq_q, i = r - g * a.seq_q, head = hk * a.group + g;
    if (a.num_splits == 1) {
      const float l = m.sRowL[r];
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // fully masked row -> 0
      T* yrow = static_cast<T*>(a.y) + b * a.y_stride[0] + head * a.y_stride[1] + i * a.y_stride[2];
      yrow[c] = from_float<T>(acc * inv);
    } else {
      const int64_t grow = (static_cast<int64_t>(b) * a.heads_q + head) * a.seq_q + i;
      split_o_row(a, grow)[c] = acc;
      if (c == 0) store_split_ml(a, grow, m.sRowM[r], m.sRowL[r]);
    }
  }
}

// Cluster merge (sm_90; all threads of every block of the cluster call it, after merge_warps with
// to_cluster): the splits of one (batch, kv head) are the blocks of one thread-block cluster; each
// split's (sRowM, sRowL, sY) is complete and visible cluster-wide after the first barrier. Block
// `rank` finishes rows rank, rank + cluster, ...: the splits are merged in rank order 0..cluster-1
// whichever block does it (deterministic, the order of combine_splits_kernel). `compute` is false
// for threads that only take part in the barriers (a producer warp).
template <typename T, int kD>
__device__ __forceinline__ void cluster_merge_store(const MergeSmem<kD>& m, const KernelArgs& a, int b, int hk,
                                                    int n_rows, int tid, int cluster, bool compute) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cluster_sync();
  if (compute) {
    const int rank = static_cast<int>(cluster_rank());
    const int dv = a.head_dim_v;
    const int my_rows = n_rows > rank ? (n_rows - rank + cluster - 1) / cluster : 0;
    for (int idx = tid; idx < my_rows * kD; idx += kThreads) {
      const int r = rank + (idx / kD) * cluster, c = idx % kD;
      if (c >= dv) continue;
      float mx = -INFINITY;
      for (int z = 0; z < cluster; ++z) mx = fmaxf(mx, *map_cluster_rank(m.sRowM + r, z));
      const float base = mx == -INFINITY ? 0.0f : mx;
      float l = 0.0f, acc = 0.0f;
      for (int z = 0; z < cluster; ++z) {
        const float wt = exp2f(*map_cluster_rank(m.sRowM + r, z) - base);
        l += wt * *map_cluster_rank(m.sRowL + r, z);
        acc += wt * *map_cluster_rank(m.sY + r * kD + c, z);
      }
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // fully masked row -> 0
      const int g = r / a.seq_q, i = r - g * a.seq_q, head = hk * a.group + g;
      T* yrow = static_cast<T*>(a.y) + b * a.y_stride[0] + head * a.y_stride[1] + i * a.y_stride[2];
      yrow[c] = from_float<T>(acc * inv);
    }
  }
  cluster_sync();  // no block leaves (freeing its shared memory) while another still reads it
#else
  (void)m, (void)a, (void)b, (void)hk, (void)n_rows, (void)tid, (void)cluster, (void)compute;
  __trap();  // unreachable: choose_plan() asks for clusters only where this code is compiled (ptxVersion >= 90)
#endif
}

// Host side. A launch configuration whose clusters are `cluster` blocks along z (the splits of one
// (batch, kv head)); `attr` must outlive the configuration's use.
inline cudaLaunchConfig_t cluster_launch_config(dim3 grid, int threads, int smem, int cluster, cudaStream_t stream,
                                                cudaLaunchAttribute* attr) {
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = 1;
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = static_cast<unsigned>(cluster);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

// Launches a decode kernel on grid (batch * heads_kv, 1, splits), as clusters of the `cluster`
// splits of one (batch, kv head) when cluster > 1 (then cluster == splits: choose_plan).
template <typename Kernel, typename... Args>
cudaError_t launch_decode_grid(Kernel kernel, dim3 grid, int threads, int smem, int cluster, cudaStream_t stream,
                               Args... args) {
  if (cluster <= 1) {
    kernel<<<grid, threads, smem, stream>>>(args...);
    return cudaGetLastError();
  }
  if (static_cast<unsigned>(cluster) != grid.z) return cudaErrorInvalidValue;
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = cluster_launch_config(grid, threads, smem, cluster, stream, &attr);
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, args...);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

}  // namespace dec
}  // namespace opsfuse::cuda::detail
