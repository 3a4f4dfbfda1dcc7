// Internal to plugin/cuda: the tensor-core FusedAttention kernel for float16 / bfloat16.
//
// One block = kBM query rows of one (batch, kv head) x one KV split; kWarps warps, each owning
// kBM / kWarps rows (kMT m16 tiles). Per key tile of kBN keys:
//   S = Q K^T   mma.sync m16n8k16, float32 accumulators, Q and K fragments via ldmatrix
//   score       scale, softcap, mask, causal, key_lengths (only on tiles that need it)
//   softmax     online, in registers (running max / sum per row, log2 domain)
//   O += P V    P re-packed from the S accumulators as A fragments, V via ldmatrix.trans
// K and V tiles are staged through shared memory with cp.async in a ring of two stages: K(j+1)
// and V(j+1) are issued at the top of tile j and land during all of tile j's math, one barrier per
// tile (one stage, without that overlap, where shared memory is short). D and Dv are rounded up
// to the compiled bucket kD with zero-filled loads.
#pragma once

#include "kernel_common.cuh"
#include "mma_sync.cuh"

namespace opsfuse::cuda::detail {

// --- PTX wrappers -------------------------------------------------------------------------------

// 16-byte async copy global -> shared; bytes beyond `src_bytes` (0..16) are zero-filled.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// 2^x on the special function unit, denormal results flushed to 0; ex2(-inf) = +0 (masked keys).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Copies kRows rows of kD 16-bit elements into shared memory (row pitch kPitch elements).
// row_src(r) gives the global row or nullptr (row outside the tensor: zero-filled). Columns at or
// beyond `ncols` are zero-filled. `vec`: 16-byte cp.async (aligned rows), else element loads.
// Chunk idx (8 elements) is row idx / kChunks, column (idx % kChunks) * 8. kFixedColumn: as
// kThreads is a multiple of kChunks, a thread keeps one column and steps kThreads / kChunks rows
// (fewer instructions per chunk; its hoisted column state costs registers the 255-register tile
// does not have).
template <int kD, int kPitch, int kRows, int kThreads, bool kFixedColumn, typename RowSrc>
__device__ __forceinline__ void load_tile(uint16_t* smem, RowSrc row_src, int ncols, bool vec,
                                          const void* any_valid) {
  constexpr int kChunks = kD / 8;
  if (vec && kFixedColumn) {
    static_assert(!kFixedColumn || (kThreads % kChunks == 0 && kRows % (kThreads / kChunks) == 0), "tile");
    constexpr int kRowStep = kFixedColumn ? kThreads / kChunks : 1;
    const int c = (threadIdx.x % kChunks) * 8, r0 = threadIdx.x / kChunks;
    int n = ncols - c;
    n = n < 0 ? 0 : (n > 8 ? 8 : n);
#pragma unroll
    for (int i = 0; i < kRows / kRowStep; ++i) {
      const int r = r0 + i * kRowStep;
      const uint16_t* src = row_src(r);
      const int nr = src == nullptr ? 0 : n;
      cp_async_16(smem + r * kPitch + c, nr ? static_cast<const void*>(src + c) : any_valid, nr * 2);
    }
  } else if (vec) {
#pragma unroll 4
    for (int idx = threadIdx.x; idx < kRows * kChunks; idx += kThreads) {
      const int r = idx / kChunks, c = (idx % kChunks) * 8;
      const uint16_t* src = row_src(r);
      int n = ncols - c;
      n = src == nullptr ? 0 : (n < 0 ? 0 : (n > 8 ? 8 : n));
      cp_async_16(smem + r * kPitch + c, n ? static_cast<const void*>(src + c) : any_valid, n * 2);
    }
  } else {
    for (int idx = threadIdx.x; idx < kRows * kChunks; idx += kThreads) {
      const int r = idx / kChunks, c = (idx % kChunks) * 8;
      const uint16_t* src = row_src(r);
      uint16_t* dst = smem + r * kPitch + c;
#pragma unroll
      for (int e = 0; e < 8; ++e) dst[e] = (src != nullptr && c + e < ncols) ? src[c + e] : uint16_t(0);
    }
  }
}

// `stages` (run time, from the plan): 2 = a K/V ring of two stages: K(j+1) and V(j+1) are issued
// at the top of tile j into the other stage and land during all of tile j's math (one barrier per
// tile). 1 = one K/V stage, loaded after the tile's math (no overlap within the block): only for
// devices whose shared memory cannot hold two stages (sm_86/89 at D >= 128).
// kMinBlocks: resident blocks per multiprocessor that the register allocation must allow.
template <typename T, int kD, int kBM, int kBN, int kWarps, int kMinBlocks>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks) flash_tc_kernel(const KernelArgs a, int stages) {
  constexpr int kThreads = kWarps * 32;
  constexpr int kMT = kBM / (16 * kWarps);  // m16 tiles per warp
  constexpr int kNT = kBN / 8;              // n8 tiles of S per warp
  constexpr int kOT = kD / 8;               // n8 tiles of O per warp
  constexpr int kPitch = kD + 8;            // +16 bytes per row: ldmatrix rows hit distinct banks
  constexpr bool kQInRegs = kMT * (kD / 16) * 4 <= 32;
  constexpr bool kFoldScale = kMT == 1;
  constexpr bool kFixedColumn = kMT == 1;  // load_tile: not at 2 m16 tiles per warp (registers)
  static_assert(kBM % (16 * kWarps) == 0 && kBN % 16 == 0 && kD % 16 == 0, "tile shape");

  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* const sQ = smem;                  // [kBM][kPitch]
  uint16_t* const sKV = sQ + kBM * kPitch;    // per stage: K [kBN][kPitch], then V [kBN][kPitch]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int n_rt = (a.rows + kBM - 1) / kBM;
  const int bh = blockIdx.x / n_rt;
  const int rt = n_rt - 1 - static_cast<int>(blockIdx.x % n_rt);  // heavier (causal) tiles first
  const int b = bh / a.heads_kv, hk = bh % a.heads_kv;
  const int row0 = rt * kBM;
  const int len = key_length_of(a, b);
  const int r_hi = min(row0 + kBM, a.rows) - 1;
  const KeyRange kr = key_range(a, row0, r_hi, len);
  const int n_tiles = (kr.n_end + kBN - 1) / kBN;
  const int per_split = (n_tiles + a.num_splits - 1) / a.num_splits;
  const int t_begin = min(n_tiles, static_cast<int>(blockIdx.z) * per_split);
  const int t_end = min(n_tiles, t_begin + per_split);

  // Rows this thread owns in the mma C layout: (mt, h) -> warp row mt*16 + h*8 + lane/4. Only the
  // key limit stays in registers; the rest of RowInfo is recomputed where needed (registers).
  const int warp_row = warp * (16 * kMT);
  auto row_of = [&](int mt, int h) { return row0 + warp_row + mt * 16 + h * 8 + lane / 4; };
  int key_limit[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) key_limit[mt][h] = make_row(a, b, hk, row_of(mt, h), len).key_limit;

  const uint16_t* qbase = static_cast<const uint16_t*>(a.q);
  const uint16_t* kbase = static_cast<const uint16_t*>(a.k) + b * a.k_stride[0] + hk * a.k_stride[1];
  const uint16_t* vbase = static_cast<const uint16_t*>(a.v) + b * a.v_stride[0] + hk * a.v_stride[1];
  const bool vec = a.vec_loads != 0;

  auto q_row = [&](int r) -> const uint16_t* {
    const int gr = row0 + r;
    if (gr >= a.rows) return nullptr;
    const int g = gr / a.seq_q, i = gr - g * a.seq_q;
    return qbase + b * a.q_stride[0] + (hk * a.group + g) * a.q_stride[1] + i * a.q_stride[2];
  };
  auto stage_k = [&](int st) { return sKV + st * (2 * kBN * kPitch); };
  auto stage_v = [&](int st) { return sKV + st * (2 * kBN * kPitch) + kBN * kPitch; };
  auto load_k = [&](int t, int st) {
    const int n0 = t * kBN;
    load_tile<kD, kPitch, kBN, kThreads, kFixedColumn>(
        stage_k(st), [&](int r) -> const uint16_t* { return n0 + r < kr.n_end ? kbase + (n0 + r) * a.k_stride[2] : nullptr; },
        a.head_dim, vec, a.k);
  };
  auto load_v = [&](int t, int st) {
    const int n0 = t * kBN;
    load_tile<kD, kPitch, kBN, kThreads, kFixedColumn>(
        stage_v(st), [&](int r) -> const uint16_t* { return n0 + r < kr.n_end ? vbase + (n0 + r) * a.v_stride[2] : nullptr; },
        a.head_dim_v, vec, a.v);
  };

  load_tile<kD, kPitch, kBM, kThreads, kFixedColumn>(sQ, q_row, a.head_dim, vec, a.q);
  if (t_begin < t_end) {
    load_k(t_begin, 0);
    load_v(t_begin, 0);
  }
  cp_async_commit();

  float o[kMT][kOT][4];
  float m_run[kMT][2], l_run[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kOT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][nt][e] = 0.0f;
    m_run[mt][0] = m_run[mt][1] = -INFINITY;
    l_run[mt][0] = l_run[mt][1] = 0.0f;
  }

  const int d_steps = (a.head_dim + 15) / 16;   // k-steps of Q K^T that hold real columns
  const int dv_pairs = (a.head_dim_v + 15) / 16;  // pairs of n8 output tiles that hold real columns
  const bool elementwise = a.mask_kind != 0 || a.softcap > 0.0f;

  uint32_t qf[kQInRegs ? kMT : 1][kQInRegs ? kD / 16 : 1][4];

  for (int t = t_begin; t < t_end; ++t) {
    const int st = stages == 2 ? (t - t_begin) & 1 : 0;
    const uint16_t* const sK = stage_k(st);
    const uint16_t* const sV = stage_v(st);
    // One load site for both forms. 2 stages: wait for tile t (issued one tile ago), then issue
    // t+1 into the other stage. 1 stage: once every warp is done with tile t-1, issue t and wait.
    if (stages == 2 || t > t_begin) {
      if (stages == 2) cp_async_wait_all();
      __syncthreads();  // 2: K(t), V(t), Q visible; both: every warp is done with tile t-1's stage
    }
    if (stages == 2 ? t + 1 < t_end : t > t_begin) {
      const int tl = stages == 2 ? t + 1 : t;
      load_k(tl, st ^ (stages == 2));
      load_v(tl, st ^ (stages == 2));
      cp_async_commit();
    }
    if (stages == 1) {
      cp_async_wait_all();
      __syncthreads();  // K(t), V(t), Q visible
    }

    if constexpr (kQInRegs) {
      if (t == t_begin) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int kk = 0; kk < kD / 16; ++kk)
            ldmatrix_x4(qf[mt][kk], sQ + (warp_row + mt * 16 + lane % 16) * kPitch + kk * 16 + (lane / 16) * 8);
      }
    }

    // S = Q K^T for this warp's rows and the tile's kBN keys.
    float s[kMT][kNT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      if (kk < d_steps) {
        uint32_t af[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          if constexpr (kQInRegs) {
#pragma unroll
            for (int x = 0; x < 4; ++x) af[mt][x] = qf[mt][kk][x];
          } else {
            ldmatrix_x4(af[mt], sQ + (warp_row + mt * 16 + lane % 16) * kPitch + kk * 16 + (lane / 16) * 8);
          }
        }
#pragma unroll
        for (int np = 0; np < kBN / 16; ++np) {
          uint32_t bf[4];
          ldmatrix_x4(bf, sK + (np * 16 + (lane / 16) * 8 + lane % 8) * kPitch + kk * 16 + ((lane / 8) % 2) * 8);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma_16816<T>(s[mt][2 * np], af[mt], bf[0], bf[1]);
            mma_16816<T>(s[mt][2 * np + 1], af[mt], bf[2], bf[3]);
          }
        }
      }
    }

    // Scores in the log2 domain; the contract element by element only where a tile needs it.
    // Tiles without masking keep the raw scores and fold the scale into the exponent's FFMA
    // (`mul`; a positive scale commutes with the max exactly); others are scaled here (mul = 1).
    // Not with 2 m16 tiles per warp: there it costs 464 bytes of spill at 255 registers.
    const int n0 = t * kBN;
    float mul = 1.0f;
    if (elementwise) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const RowInfo ri = make_row(a, b, hk, row_of(mt, h), len);
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int e = 2 * h; e < 2 * h + 2; ++e)
              s[mt][nt][e] = full_score<T>(a, s[mt][nt][e], ri, n0 + nt * 8 + (lane % 4) * 2 + (e & 1));
        }
    } else if (n0 + kBN > kr.all_visible) {  // causal / key_lengths boundary tile
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int j = n0 + nt * 8 + (lane % 4) * 2 + (e & 1);
            s[mt][nt][e] = j < key_limit[mt][e >> 1] ? s[mt][nt][e] * a.scale_log2 : -INFINITY;
          }
    } else if (kFoldScale && a.scale_log2 > 0.0f) {
      mul = a.scale_log2;
    } else {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][nt][e] *= a.scale_log2;
    }

    // Online softmax: rows (mt, h) are spread over the 4 lanes of a quad.
    uint32_t pf[kMT][kBN / 16][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
        mx = fmaxf(m_run[mt][h], mx * mul);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float base = mx == -INFINITY ? 0.0f : mx;  // fully masked so far: exp2(-inf) = 0
        const float alpha = fast_exp2(m_run[mt][h] - base);
        m_run[mt][h] = mx;
        const float neg_base = -base;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          s[mt][nt][2 * h] = fast_exp2(fmaf(s[mt][nt][2 * h], mul, neg_base));
          s[mt][nt][2 * h + 1] = fast_exp2(fmaf(s[mt][nt][2 * h + 1], mul, neg_base));
          sum += s[mt][nt][2 * h] + s[mt][nt][2 * h + 1];
        }
        l_run[mt][h] = l_run[mt][h] * alpha + sum;
        if (alpha != 1.0f) {  // the running max moved (most tiles after the first few: it did not)
#pragma unroll
          for (int nt = 0; nt < kOT; ++nt) {
            o[mt][nt][2 * h] *= alpha;
            o[mt][nt][2 * h + 1] *= alpha;
          }
        }
      }
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        pf[mt][kk][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pf[mt][kk][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pf[mt][kk][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pf[mt][kk][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
    }

    // O += P V
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < kD / 16; ++np) {
        if (np < dv_pairs) {
          uint32_t bf[4];
          ldmatrix_x4_trans(bf, sV + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kPitch + np * 16 + (lane / 16) * 8);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma_16816<T>(o[mt][2 * np], pf[mt][kk], bf[0], bf[1]);
            mma_16816<T>(o[mt][2 * np + 1], pf[mt][kk], bf[2], bf[3]);
          }
        }
      }
    }
  }
  cp_async_wait_all();

  // Epilogue: finish the row sums across the quad, then store Y or the split partials.
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = l_run[mt][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const RowInfo r = make_row(a, b, hk, row_of(mt, h), len);
      if (!r.valid) continue;
      const int64_t grow = (static_cast<int64_t>(b) * a.heads_q + r.head) * a.seq_q + r.pos;
      if (a.num_splits == 1) {
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // fully masked row -> 0
        T* yrow = static_cast<T*>(a.y) + b * a.y_stride[0] + r.head * a.y_stride[1] + r.pos * a.y_stride[2];
#pragma unroll
        for (int nt = 0; nt < kOT; ++nt) {
          const int c = nt * 8 + (lane % 4) * 2;
          if (c < a.head_dim_v)
            store_pair<T>(yrow + c, o[mt][nt][2 * h] * inv, o[mt][nt][2 * h + 1] * inv, c + 1 < a.head_dim_v,
                          a.vec_store != 0);
        }
      } else {
        float* orow = split_o_row(a, grow);
#pragma unroll
        for (int nt = 0; nt < kOT; ++nt) {
          const int c = nt * 8 + (lane % 4) * 2;
          if (c < a.head_dim_v) {
            orow[c] = o[mt][nt][2 * h];
            if (c + 1 < a.head_dim_v) orow[c + 1] = o[mt][nt][2 * h + 1];
          }
        }
        if (lane % 4 == 0) store_split_ml(a, grow, m_run[mt][h], l);
      }
    }
  }
}

template <typename T, int kD, int kBM, int kBN, int kWarps, int kMinBlocks>
cudaError_t launch_flash_tc(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  const int stages = plan.stages == 1 ? 1 : 2;
  const int smem = tc_smem_bytes(kD, kBM, kBN, stages);
  // Per device (a device always gets the same `stages`): the shared-memory limit, and all of L1
  // as shared memory (K/V go through cp.async.cg, which bypasses L1), so that the kMinBlocks
  // blocks per SM the plan counts on are resident.
  static int smem_done[64] = {};
  static int carveout_done[64] = {};
  auto kernel = flash_tc_kernel<T, kD, kBM, kBN, kWarps, kMinBlocks>;
  cudaError_t err = ensure_smem(kernel, smem, smem_done);
  if (err != cudaSuccess) return err;
  err = ensure_max_shared_carveout(kernel, carveout_done);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(plan.row_tiles) * a.batch * a.heads_kv, 1, plan.num_splits);
  kernel<<<grid, kWarps * 32, smem, stream>>>(a, stages);
  return cudaGetLastError();
}

}  // namespace opsfuse::cuda::detail
