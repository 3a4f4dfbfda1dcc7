// Internal to plugin/cuda: the float32 FusedAttention kernel. True float32 arithmetic on the CUDA
// cores (no TF32): the contract asks float32 inputs to keep float32 accuracy.
//
// One block = kBM query rows of one (batch, kv head) x one KV split, kWarps warps. A warp is a
// 4 x 8 grid of threads (ti, tj), lane = 4 * tj + ti % 4; the block's threads form a TI x 8 grid,
// TI = 4 * kWarps. Thread (ti, tj) owns rows ti + TI*x (x < RM), keys tj + 8*y of S (y < RN) and
// the float4 column groups tj*4 + 32*g of O (g < RG). Q, K and V stay row-major in shared memory
// (cp.async, no transposition): with the interleaved ownership a warp's float4 reads of Q rows
// (4 rows, pitch D+4), K rows (8 consecutive rows, pitch D+4), V rows (32 consecutive floats) and
// P rows (pitch BN+8) are free of bank conflicts, and each product step is RM x RN (or RM x 4*RG)
// x 4 FFMAs per RM + RN (RM + 4*RG) float4 reads. The limit is shared memory's return rate
// (128 B/clk/SM): a float4 read costs 4 clk, 2 when lane pairs share the address (K, V), so a
// 4 x 8 step is 128 FFMA per 32 clk of one warp's reads. P goes through shared memory only within
// a warp (the 8 threads of a row group are 8 lanes of one warp). K(j+1) loads during P.V(j),
// V(j+1) during Q.K(j+1), one buffer each. Same row packing, score contract, online softmax (log2
// domain, ex2.approx.ftz) and split-KV epilogue as the tensor-core kernel.
#pragma once

#include "kernel_common.cuh"

namespace opsfuse::cuda::detail {

template <int kD, int kBM, int kBN, int kWarps>
struct F32Layout {
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int TI = 4 * kWarps;
  static constexpr int RM = kBM / TI, RN = kBN / 8, RG = kD / 32;
  static constexpr int kQP = kD + 4;   // pitch of sQ [kBM][kQP]: 4 consecutive rows -> 4 bank groups
  static constexpr int kKP = kD + 4;   // pitch of sK [kBN][kKP]: 8 consecutive rows -> 32 banks
  static constexpr int kVP = kD;       // pitch of sV [kBN][kVP]: read along a row
  static constexpr int kPP = kBN + 8;  // pitch of sP [kBM][kPP]: scalar writes of 4 rows x 8 keys conflict-free
  static constexpr int kQOff = 0;
  static constexpr int kKOff = kQOff + kBM * kQP;
  static constexpr int kVOff = kKOff + kBN * kKP;
  static constexpr int kPOff = kVOff + kBN * kVP;
  static constexpr int kFloats = kPOff + kBM * kPP;
  static constexpr int kSmemBytes = kFloats * 4;
  static_assert(kBM % TI == 0 && kBN % 32 == 0 && kD % 32 == 0, "f32 tile shape");
  static_assert(kSmemBytes == f32_smem_bytes(kD, kBM, kBN), "keep f32_smem_bytes in step");
};

// 16-byte cp.async; bytes beyond src_bytes (0..16) are zero-filled.
__device__ __forceinline__ void f32_cp_async16(float* dst, const float* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void f32_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void f32_cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// 2^x, ~2 ulp, flushes subnormal results to 0; 2^-inf = 0.
__device__ __forceinline__ float f32_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Copies `nrows` rows of `ncols` floats (row r at src + r * stride) into smem rows of pitch kPitch,
// kD columns: columns >= ncols and rows >= nrows are zero. vec: 16-byte cp.async (16-byte aligned
// rows), else element loads and plain stores (visible after the next barrier, like cp.async after
// its wait).
template <int kD, int kRows, int kPitch, int kThreads>
__device__ __forceinline__ void f32_load_rows(float* smem, const float* src, int64_t stride, int nrows,
                                              int ncols, bool vec, int tid) {
  constexpr int kChunks = kD / 4;
  if (vec) {
#pragma unroll 4
    for (int i = 0; i < (kRows * kChunks + kThreads - 1) / kThreads; ++i) {
      const int idx = tid + i * kThreads;
      if ((kRows * kChunks) % kThreads != 0 && idx >= kRows * kChunks) break;
      const int r = idx / kChunks, c = (idx % kChunks) * 4;
      const int n = r < nrows ? max(0, min(4, ncols - c)) : 0;
      f32_cp_async16(smem + r * kPitch + c, n ? src + r * stride + c : src, n * 4);
    }
  } else {
#pragma unroll 4
    for (int idx = tid; idx < kRows * kD; idx += kThreads) {
      const int r = idx / kD, c = idx % kD;
      smem[r * kPitch + c] = (r < nrows && c < ncols) ? src[r * stride + c] : 0.0f;
    }
  }
}

template <int kD, int kBM, int kBN, int kWarps>
__global__ void __launch_bounds__(32 * kWarps, kWarps == 4 ? (kD == 64 ? 3 : 2) : 1) flash_f32_kernel(const KernelArgs a) {
  using L = F32Layout<kD, kBM, kBN, kWarps>;
  constexpr int TI = L::TI, RM = L::RM, RN = L::RN, RG = L::RG, kThreads = L::kThreads;
  extern __shared__ __align__(16) float fsm[];
  float* sQ = fsm + L::kQOff;
  float* sK = fsm + L::kKOff;
  float* sV = fsm + L::kVOff;
  float* sP = fsm + L::kPOff;

  const int tid = threadIdx.x, lane = tid % 32;
  // Lanes 4k..4k+3 share tj: their K and V reads have one address per lane pair, which shared
  // memory returns at twice the rate of 32 distinct float4s (the reads of Q and P are the others).
  const int ti = (tid / 32) * 4 + lane % 4, tj = lane / 4;
  const int n_rt = (a.rows + kBM - 1) / kBM;
  const int bh = blockIdx.x / n_rt;
  const int rt = n_rt - 1 - static_cast<int>(blockIdx.x % n_rt);
  const int b = bh / a.heads_kv, hk = bh % a.heads_kv;
  const int row0 = rt * kBM;
  const int len = key_length_of(a, b);
  const KeyRange kr = key_range(a, row0, min(row0 + kBM, a.rows) - 1, len);
  const int n_tiles = (kr.n_end + kBN - 1) / kBN;
  const int per_split = (n_tiles + a.num_splits - 1) / a.num_splits;
  const int t_begin = min(n_tiles, static_cast<int>(blockIdx.z) * per_split);
  const int t_end = min(n_tiles, t_begin + per_split);
  const int D = a.head_dim, Dv = a.head_dim_v;
  const bool vec = a.vec_loads != 0;

  const float* kb = static_cast<const float*>(a.k) + b * a.k_stride[0] + hk * a.k_stride[1];
  const float* vb = static_cast<const float*>(a.v) + b * a.v_stride[0] + hk * a.v_stride[1];
  auto load_k = [&](int t) {
    const int n0 = t * kBN;
    f32_load_rows<kD, kBN, L::kKP, kThreads>(sK, kb + n0 * a.k_stride[2], a.k_stride[2], kr.n_end - n0, D, vec, tid);
  };
  auto load_v = [&](int t) {
    const int n0 = t * kBN;
    f32_load_rows<kD, kBN, L::kVP, kThreads>(sV, vb + n0 * a.v_stride[2], a.v_stride[2], kr.n_end - n0, Dv, vec, tid);
  };

  if (t_begin < t_end) {
    // Q rows (zero beyond D and beyond the last row); the packed row r is query head
    // hk * group + r / Sq at position r % Sq, so rows are not equally spaced across heads.
    const float* qb = static_cast<const float*>(a.q) + b * a.q_stride[0];
    constexpr int kChunks = kD / 4;
    for (int idx = tid; idx < kBM * kChunks; idx += kThreads) {
      const int r = idx / kChunks, c = (idx % kChunks) * 4;
      const int gr = row0 + r;
      const float* src = qb;
      int n = 0;
      if (gr < a.rows) {
        const int g = gr / a.seq_q, i = gr - g * a.seq_q;
        src = qb + (hk * a.group + g) * a.q_stride[1] + i * a.q_stride[2];
        n = max(0, min(4, D - c));
      }
      if (vec) {
        f32_cp_async16(sQ + r * L::kQP + c, n ? src + c : qb, n * 4);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) sQ[r * L::kQP + c + e] = e < n ? src[c + e] : 0.0f;
      }
    }
    load_k(t_begin);
    f32_cp_commit();
    load_v(t_begin);
    f32_cp_commit();
  }

  float o[RM][RG * 4];
  float m_run[RM], l_run[RM];
#pragma unroll
  for (int x = 0; x < RM; ++x) {
    m_run[x] = -INFINITY;
    l_run[x] = 0.0f;
#pragma unroll
    for (int c = 0; c < RG * 4; ++c) o[x][c] = 0.0f;
  }
  const bool elementwise = a.mask_kind != 0 || a.softcap > 0.0f;
  const int d_lim = (D + 3) & ~3;  // columns past D are zero in sQ / sK
  const float* q_th = sQ + ti * L::kQP;
  const float* k_th = sK + tj * L::kKP;
  float* p_th = sP + ti * L::kPP;
  const float* v_th = sV + tj * 4;

  for (int t = t_begin; t < t_end; ++t) {
    const int n0 = t * kBN;
    f32_cp_wait<1>();  // K(t) (and Q) landed; V(t) may still be in flight
    __syncthreads();

    // S = Q K^T over float4 steps of d.
    float s[RM][RN];
#pragma unroll
    for (int x = 0; x < RM; ++x)
#pragma unroll
      for (int y = 0; y < RN; ++y) s[x][y] = 0.0f;
#pragma unroll 2
    for (int d = 0; d < d_lim; d += 4) {
      float4 qa[RM], kv[RN];
#pragma unroll
      for (int x = 0; x < RM; ++x) qa[x] = *reinterpret_cast<const float4*>(q_th + x * TI * L::kQP + d);
#pragma unroll
      for (int y = 0; y < RN; ++y) kv[y] = *reinterpret_cast<const float4*>(k_th + y * 8 * L::kKP + d);
#pragma unroll
      for (int x = 0; x < RM; ++x)
#pragma unroll
        for (int y = 0; y < RN; ++y) {
          float acc = s[x][y];
          acc = fmaf(qa[x].x, kv[y].x, acc);
          acc = fmaf(qa[x].y, kv[y].y, acc);
          acc = fmaf(qa[x].z, kv[y].z, acc);
          acc = fmaf(qa[x].w, kv[y].w, acc);
          s[x][y] = acc;
        }
    }

    // Scores in the log2 domain: the element-wise contract only where the tile needs it.
    if (elementwise || n0 + kBN > kr.all_visible) {
#pragma unroll
      for (int x = 0; x < RM; ++x) {
        const RowInfo ri = make_row(a, b, hk, row0 + ti + TI * x, len);
#pragma unroll
        for (int y = 0; y < RN; ++y) s[x][y] = full_score<float>(a, s[x][y], ri, n0 + tj + 8 * y);
      }
    } else {
#pragma unroll
      for (int x = 0; x < RM; ++x)
#pragma unroll
        for (int y = 0; y < RN; ++y) s[x][y] *= a.scale_log2;
    }

    // Online softmax; a row's 8 key owners are lanes k, k+4, ..., k+28 of one warp.
#pragma unroll
    for (int x = 0; x < RM; ++x) {
      float mx = m_run[x];
#pragma unroll
      for (int y = 0; y < RN; ++y) mx = fmaxf(mx, s[x][y]);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
      const float base = mx == -INFINITY ? 0.0f : mx;  // fully masked so far: p = 2^-inf = 0
      const float alpha = f32_exp2(m_run[x] - base);
      m_run[x] = mx;
      float sum = 0.0f;
#pragma unroll
      for (int y = 0; y < RN; ++y) {
        const float p = f32_exp2(s[x][y] - base);
        sum += p;
        p_th[x * TI * L::kPP + tj + 8 * y] = p;
      }
      l_run[x] = l_run[x] * alpha + sum;
#pragma unroll
      for (int c = 0; c < RG * 4; ++c) o[x][c] *= alpha;
    }

    f32_cp_wait<0>();  // V(t) landed
    __syncthreads();   // V(t) visible, K(t) free, P visible within each warp
    if (t + 1 < t_end) load_k(t + 1);
    f32_cp_commit();

    // O += P V over float4 steps of keys (V rows and P past the key range are zero).
    const int j_lim = (min(kBN, kr.n_end - n0) + 3) & ~3;
#pragma unroll 2
    for (int j = 0; j < j_lim; j += 4) {
      float4 pa[RM];
#pragma unroll
      for (int x = 0; x < RM; ++x) pa[x] = *reinterpret_cast<const float4*>(p_th + x * TI * L::kPP + j);
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        float4 vv[RG];
#pragma unroll
        for (int g = 0; g < RG; ++g) vv[g] = *reinterpret_cast<const float4*>(v_th + (j + jj) * L::kVP + 32 * g);
#pragma unroll
        for (int x = 0; x < RM; ++x) {
          const float p = jj == 0 ? pa[x].x : (jj == 1 ? pa[x].y : (jj == 2 ? pa[x].z : pa[x].w));
#pragma unroll
          for (int g = 0; g < RG; ++g) {
            o[x][4 * g + 0] = fmaf(p, vv[g].x, o[x][4 * g + 0]);
            o[x][4 * g + 1] = fmaf(p, vv[g].y, o[x][4 * g + 1]);
            o[x][4 * g + 2] = fmaf(p, vv[g].z, o[x][4 * g + 2]);
            o[x][4 * g + 3] = fmaf(p, vv[g].w, o[x][4 * g + 3]);
          }
        }
      }
    }
    __syncthreads();  // V(t) free
    if (t + 1 < t_end) load_v(t + 1);
    f32_cp_commit();
  }
  f32_cp_wait<0>();

#pragma unroll
  for (int x = 0; x < RM; ++x) {
    float l = l_run[x];
    l += __shfl_xor_sync(0xffffffffu, l, 4);
    l += __shfl_xor_sync(0xffffffffu, l, 8);
    l += __shfl_xor_sync(0xffffffffu, l, 16);
    const RowInfo r = make_row(a, b, hk, row0 + ti + TI * x, len);
    if (!r.valid) continue;
    if (a.v_bias != nullptr) {  // V's bias as O + l b (kernel_args.h)
      const float* vb = static_cast<const float*>(a.v_bias) + hk * Dv;
#pragma unroll
      for (int c = 0; c < RG * 4; ++c) {
        const int col = tj * 4 + 32 * (c / 4) + c % 4;
        if (col < Dv) o[x][c] = fmaf(l, vb[col], o[x][c]);
      }
    }
    const int64_t grow = (static_cast<int64_t>(b) * a.heads_q + r.head) * a.seq_q + r.pos;
    float* dst;
    float mul;
    if (a.num_splits == 1) {
      dst = static_cast<float*>(a.y) + b * a.y_stride[0] + r.head * a.y_stride[1] + r.pos * a.y_stride[2];
      mul = l > 0.0f ? 1.0f / l : 0.0f;  // fully masked row -> 0
    } else {
      dst = split_o_row(a, grow);
      mul = 1.0f;
      if (tj == 0) store_split_ml(a, grow, m_run[x], l);
    }
#pragma unroll
    for (int g = 0; g < RG; ++g) {
      const int c = tj * 4 + 32 * g;
      float* p = dst + c;
      if (c + 4 <= Dv && (reinterpret_cast<uintptr_t>(p) & 15) == 0) {
        *reinterpret_cast<float4*>(p) = make_float4(o[x][4 * g] * mul, o[x][4 * g + 1] * mul,
                                                    o[x][4 * g + 2] * mul, o[x][4 * g + 3] * mul);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (c + e < Dv) p[e] = o[x][4 * g + e] * mul;
      }
    }
  }
}

template <int kD, int kBM, int kBN, int kWarps>
cudaError_t launch_flash_f32(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  constexpr int kSmem = F32Layout<kD, kBM, kBN, kWarps>::kSmemBytes;
  // choose_plan() counts resident blocks with all of L1 as shared memory (the tiles load through
  // cp.async.cg, which does not use L1): ask for that carveout rather than the driver's default.
  static int smem_done[64] = {};
  static int carveout_done[64] = {};
  auto kernel = flash_f32_kernel<kD, kBM, kBN, kWarps>;
  cudaError_t err = ensure_smem(kernel, kSmem, smem_done);
  if (err != cudaSuccess) return err;
  err = ensure_max_shared_carveout(kernel, carveout_done);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(plan.row_tiles) * a.batch * a.heads_kv, 1, plan.num_splits);
  kernel<<<grid, 32 * kWarps, kSmem, stream>>>(a);
  return cudaGetLastError();
}

// The launch of one head-size bucket: the tile that choose_plan() picked (block_m tells them apart).
template <int kD, int kBigM, int kBigN, int kBigWarps, int kSmallM, int kSmallN, int kSmallWarps>
cudaError_t launch_flash_f32_bucket(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  if (plan.block_m == kSmallM && plan.block_n == kSmallN)
    return launch_flash_f32<kD, kSmallM, kSmallN, kSmallWarps>(a, plan, stream);
  return launch_flash_f32<kD, kBigM, kBigN, kBigWarps>(a, plan, stream);
}

}  // namespace opsfuse::cuda::detail
