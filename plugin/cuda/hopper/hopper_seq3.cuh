// Internal to plugin/cuda: the Hopper prefill kernel's three-consumer layout (hopper::kPlainSeq3),
// for one-round launches at D = 64 whose 128-key tiles are all whole and visible: the seed grid's
// B=1 H=12 S=1024, 96 items of 128 rows on 132 SMs. There the block's time is its item's chain of
// key-tile steps, and hopper_fwd.cuh's two consumer warpgroups each walk all of the item's tiles for
// their 64 rows (8 narrow steps, or 4 wide ones in kPlainSeqWide, ~7.7 narrow). Here a third
// consumer warpgroup takes the last n_tail tiles (1 or 2) of both 64-row strips, so that the
// first two walk T - n_tail tiles: 6 steps of 8 at S=1024. Its partial (O, max, sum) per strip goes
// to shared memory and the strip's warpgroup folds it in before it stores the rows.
//
// 512 threads, four warpgroups:
//  - warpgroup 0, the producer (setmaxnreg.dec 24): one thread issues every TMA load of the block's
//    one item -- Q (128 rows), the strips' tiles 0 .. A - 1 (A = T - n_tail) into a kStages-deep ring
//    that both strip warpgroups release, and the tail tiles A .. T - 1 into buffers of their own,
//    loaded once and read by the third warpgroup for both strips.
//  - warpgroups 1 and 2 (consumers cw 0 and 1, setmaxnreg.inc 160): rows 64 cw .. 64 cw + 63, tiles
//    0 .. A - 1 in sequence (S, softmax, P V, as kPlainSeq's step), then the fold and the store.
//  - warpgroup 3 (consumer cw 2): strip 0's tail tiles, its partial out (named barrier 8), then
//    strip 1's (named barrier 9).
//  Named barriers: 2 and 3 the strip warpgroups' pingpong turns, 4 and 5 their stores, 8 and 9 the
//  partials.
// 24 x 128 + 160 x 384 registers fit the SM's 65,536; the narrow step keeps S (64), O (32) and P
// (32) live, within 160 (a probe kernel held 150 live floats per thread without spilling, session 50).
// No masks, softcap, key_lengths, causal, biases or splits: launch_hopper takes this kernel only where
// none of them is asked for, every key tile is whole and visible, and Y takes TMA stores.
#pragma once

#include <cstdint>

#include <cuda.h>  // CUtensorMap (types only)

#include "../kernel_common.cuh"
#include "hopper_config.h"
#include "pingpong_turns.cuh"
#include "ptx_ops.cuh"
#include "tma_ops.cuh"

namespace opsfuse::cuda::detail::hopper {

struct Seq3 {
  static constexpr int kThreads = 512;
  static constexpr int kD = 64;
  static constexpr int kStages = 3;   // the strips' K/V ring
  static constexpr int kMaxTail = 2;  // the third warpgroup's tiles per strip
  static constexpr int kQBytes = kBM * kD * 2;         // 16 KB; also the output's staging (per strip)
  static constexpr int kTileBytes = hopper::kBN * kD * 2;  // one K or V tile: 16 KB
  static constexpr int kPartChunks = kD / 8 + 1;       // float4s per thread: O, then (m0, m1, l0, l1)
  static constexpr int kPartBytes = kPartChunks * 128 * 16;  // one strip's partial: 18 KB
  static constexpr int kSmem = kQBytes + (kStages + kMaxTail) * 2 * kTileBytes + 2 * kPartBytes + 1024;
  // The third warpgroup's tiles for an item of `tiles` key tiles: about a third of both strips'
  // work, so that it ends no later than the strip warpgroups (0: the layout does not apply).
  static constexpr int tail_tiles(int tiles) { return tiles < 3 ? 0 : (tiles / 3 < kMaxTail ? tiles / 3 : kMaxTail); }
};

template <typename T>
__global__ void __launch_bounds__(Seq3::kThreads, 1)
    hopper_seq3_kernel(const __grid_constant__ KernelArgs a, const __grid_constant__ CUtensorMap tm_q,
                       const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v,
                       const __grid_constant__ CUtensorMap tm_y, const int n_tail, const int pingpong) {
  constexpr int kStages = Seq3::kStages;
  constexpr int kTile = Seq3::kTileBytes;
  extern __shared__ uint8_t smem_raw[];
  // Q full; the ring's K / V full and empty; the tail tiles' K / V full.
  __shared__ __align__(8) uint64_t bars[1 + 4 * kStages + 2 * Seq3::kMaxTail];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = base;
  const uint32_t sK = sQ + Seq3::kQBytes;           // ring stage s at sK + s * kTile
  const uint32_t sV = sK + kStages * kTile;         // ... and its V
  const uint32_t sXK = sV + kStages * kTile;        // tail tile e at sXK + e * kTile
  const uint32_t sXV = sXK + Seq3::kMaxTail * kTile;
  const uint32_t sPart = sXV + Seq3::kMaxTail * kTile;  // strip z's partial at sPart + z * kPartBytes
  const uint32_t bar_q = smem_u32(&bars[0]);
  auto bar_kfull = [&](int s) { return smem_u32(&bars[1 + s]); };
  auto bar_vfull = [&](int s) { return smem_u32(&bars[1 + kStages + s]); };
  auto bar_kempty = [&](int s) { return smem_u32(&bars[1 + 2 * kStages + s]); };
  auto bar_vempty = [&](int s) { return smem_u32(&bars[1 + 3 * kStages + s]); };
  auto bar_xk = [&](int e) { return smem_u32(&bars[1 + 4 * kStages + e]); };
  auto bar_xv = [&](int e) { return smem_u32(&bars[1 + 4 * kStages + Seq3::kMaxTail + e]); };

  // The block's item: 128 rows of one (batch, query head); all of its Sk / 128 key tiles.
  const int row_tiles = (a.seq_q + kBM - 1) / kBM;
  const int bh = static_cast<int>(blockIdx.x) / row_tiles;
  const int b = bh / a.heads_q, h = bh % a.heads_q;
  const int row0 = (static_cast<int>(blockIdx.x) % row_tiles) * kBM;
  const int n_tiles = a.seq_k / hopper::kBN;
  const int n_strip = n_tiles - n_tail;  // tiles 0 .. n_strip - 1: the strips' ring

  const int tid = threadIdx.x;
  if (tid == 0) {
    prefetch_tensormap(&tm_q);
    prefetch_tensormap(&tm_k);
    prefetch_tensormap(&tm_v);
    prefetch_tensormap(&tm_y);
    mbar_init(bar_q, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bar_kfull(s), 1);
      mbar_init(bar_vfull(s), 1);
      mbar_init(bar_kempty(s), kConsumerWarps);  // the two strip warpgroups' 8 warps
      mbar_init(bar_vempty(s), kConsumerWarps);
    }
    for (int e = 0; e < Seq3::kMaxTail; ++e) {
      mbar_init(bar_xk(e), 1);
      mbar_init(bar_xv(e), 1);
    }
    fence_mbarrier_init();
  }
  __syncthreads();
  grid_dependency_wait();  // a programmatic dependent launch: the previous kernel's results first
  launch_dependents();

  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
  if (wg == 0) {
    // ---- producer ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (tid == 0) {
      const int hk = h / a.group;
      mbar_expect_tx(bar_q, Seq3::kQBytes);
      tma_load_4d(sQ, &tm_q, bar_q, 0, row0, h, b);
      // Key tile `tile` of K or V (map) into dst, its bytes announced on `full`.
      auto load = [&](const CUtensorMap* map, uint32_t dst, uint32_t full, int tile) {
        mbar_expect_tx(full, kTile);
        tma_load_4d(dst, map, full, 0, tile * hopper::kBN, hk, b);
      };
      // Ring tile i beside tail tile i (while there is one), so that all three warpgroups' first
      // tiles are in flight at once.
      for (int i = 0; i < n_strip; ++i) {
        const int s = i % kStages;
        const uint32_t empty_parity = ((i / kStages) & 1) ^ 1;  // a stage's first use passes at once
        mbar_wait(bar_kempty(s), empty_parity);
        load(&tm_k, sK + s * kTile, bar_kfull(s), i);
        if (i < n_tail) load(&tm_k, sXK + i * kTile, bar_xk(i), n_strip + i);
        mbar_wait(bar_vempty(s), empty_parity);
        load(&tm_v, sV + s * kTile, bar_vfull(s), i);
        if (i < n_tail) load(&tm_v, sXV + i * kTile, bar_xv(i), n_strip + i);
      }
    }
    return;
  }

  // ---- consumers ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 160;\n" ::: "memory");
  const int cw = wg - 1;  // 0, 1: strip cw's ring tiles; 2: both strips' tail tiles
  const int t = tid % 128;
  const int warp = t / 32, lane = t % 32;
  float o[32];  // O: row 16 warp + lane / 4 + 8 hh, columns 8 i + 2 (lane % 4) + e at o[4 i + 2 hh + e]
  float s[64];  // S of one 128-key tile, then its exponentials
  uint32_t p[8][4];  // P as the A operand of O += P V
  float m_run[2], l_run[2];
  auto reset = [&] {
#pragma unroll
    for (int i = 0; i < 32; ++i) o[i] = 0.0f;
    m_run[0] = m_run[1] = -INFINITY;
    l_run[0] = l_run[1] = 0.0f;
  };
  // Pingpong between the strip warpgroups (`pingpong` != 0, kPlainSeq's turns, pingpong_turns.cuh):
  // their softmaxes take turns, each passing after its softmax, so that one's softmax runs beside
  // the other's products rather than in step with it. Both walk the same n_strip tiles. The third
  // warpgroup takes no turns.
  const bool pp = pingpong != 0 && cw < 2;
  auto turn_wait = [&] { pingpong_wait(pp, cw); };
  auto turn_pass = [&](bool last) { pingpong_pass(pp, cw, last, false); };
  pingpong_open(pp, cw);
  // One key tile for the strip whose Q rows start at q_strip: S = Q K^T, the online softmax (every
  // key visible: raw q.k, the scale folded into the exponent), O = O alpha + P V, each product
  // waited for. kempty / vempty: the ring stage's release (0: a tail tile, never released); last:
  // the warpgroup's last ring tile (its last turn).
  auto step = [&](uint32_t q_strip, uint32_t kb, uint32_t vb, uint32_t kfull, uint32_t vfull, uint32_t parity,
                  uint32_t kempty, uint32_t vempty, bool last) {
    mbar_wait(kfull, parity);
    __syncwarp();
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      mma_qk<T, hopper::kBN>(s, smem_desc(q_strip + kk * 32, 16, 1024), smem_desc(kb + kk * 32, 16, 1024),
                             kk == 0 ? 0u : 1u);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(s);
    if (kempty != 0 && lane == 0) mbar_arrive(kempty);
    turn_wait();
    const float c = a.scale_log2;
    float alpha[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      // The row max through 4 independent chains (the D = 64 step is latency-bound).
      float part[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) part[k] = fmaxf(s[k * 4 + 2 * hh], s[k * 4 + 2 * hh + 1]);
#pragma unroll
      for (int i = 4; i < 16; ++i) part[i % 4] = fmaxf(part[i % 4], fmaxf(s[i * 4 + 2 * hh], s[i * 4 + 2 * hh + 1]));
      float mx = fmaxf(m_run[hh], fmaxf(fmaxf(part[0], part[2]), fmaxf(part[1], part[3])) * c);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float mbase = mx == -INFINITY ? 0.0f : mx;  // -inf scores only: exp2(-inf) = 0, never NaN
      alpha[hh] = ex2(m_run[hh] - mbase);
      m_run[hh] = mx;
      float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        s[i * 4 + 2 * hh] = ex2(fmaf(s[i * 4 + 2 * hh], c, -mbase));
        s[i * 4 + 2 * hh + 1] = ex2(fmaf(s[i * 4 + 2 * hh + 1], c, -mbase));
        sum0 += s[i * 4 + 2 * hh];
        sum1 += s[i * 4 + 2 * hh + 1];
      }
      l_run[hh] = l_run[hh] * alpha[hh] + (sum0 + sum1);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      o[i * 4 + 0] *= alpha[0];
      o[i * 4 + 1] *= alpha[0];
      o[i * 4 + 2] *= alpha[1];
      o[i * 4 + 3] *= alpha[1];
    }
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      p[kk][0] = pack2<T>(s[(2 * kk) * 4 + 0], s[(2 * kk) * 4 + 1]);
      p[kk][1] = pack2<T>(s[(2 * kk) * 4 + 2], s[(2 * kk) * 4 + 3]);
      p[kk][2] = pack2<T>(s[(2 * kk + 1) * 4 + 0], s[(2 * kk + 1) * 4 + 1]);
      p[kk][3] = pack2<T>(s[(2 * kk + 1) * 4 + 2], s[(2 * kk + 1) * 4 + 3]);
    }
    turn_pass(last);
    mbar_wait(vfull, parity);
    __syncwarp();
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) mma_pv<T, 64>(o, p[kk], smem_desc(vb + kk * 16 * 128, hopper::kBN * 128, 1024));
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(o);
    reg_fence(p);
    if (vempty != 0 && lane == 0) mbar_arrive(vempty);
  };
  // A strip's partial (O, max, per-thread sum): float4 chunk c of thread t at c * 128 + t. The
  // third warpgroup's threads hold the same rows and columns as the strip warpgroup's (the
  // accumulator layout does not depend on the keys).
  auto part_addr = [&](int strip, int c) { return sPart + strip * Seq3::kPartBytes + (c * 128 + t) * 16; };
  mbar_wait(bar_q, 0);
  __syncwarp();

  if (cw == 2) {
#pragma unroll 1
    for (int strip = 0; strip < 2; ++strip) {
      reset();
#pragma unroll 1
      for (int e = 0; e < n_tail; ++e)
        step(sQ + strip * 64 * 128, sXK + e * kTile, sXV + e * kTile, bar_xk(e), bar_xv(e), 0u, 0u, 0u, false);
#pragma unroll
      for (int c = 0; c < 8; ++c)
        asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(part_addr(strip, c)), "f"(o[4 * c]),
                     "f"(o[4 * c + 1]), "f"(o[4 * c + 2]), "f"(o[4 * c + 3])
                     : "memory");
      asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(part_addr(strip, 8)), "f"(m_run[0]),
                   "f"(m_run[1]), "f"(l_run[0]), "f"(l_run[1])
                   : "memory");
      // The strip's warpgroup waits here (bar.sync) before it reads the partial.
      if (strip == 0) asm volatile("bar.arrive 8, 256;\n" ::: "memory");
      else asm volatile("bar.arrive 9, 256;\n" ::: "memory");
    }
    return;
  }

  const uint32_t q_strip = sQ + cw * 64 * 128;
  reset();
#pragma unroll 1
  for (int i = 0; i < n_strip; ++i) {
    const int st = i % kStages;
    step(q_strip, sK + st * kTile, sV + st * kTile, bar_kfull(st), bar_vfull(st),
         static_cast<uint32_t>((i / kStages) & 1), bar_kempty(st), bar_vempty(st), i == n_strip - 1);
  }
  if (cw == 0) asm volatile("bar.sync 8, 256;\n" ::: "memory");
  else asm volatile("bar.sync 9, 256;\n" ::: "memory");
  {
    // Fold the tail's partial in: max M, O = O 2^(m - M) + O' 2^(m' - M), l likewise (m = -inf:
    // weight 0).
    float4 ml;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(ml.x), "=f"(ml.y), "=f"(ml.z), "=f"(ml.w)
                 : "r"(part_addr(cw, 8))
                 : "memory");
    const float theirs_m[2] = {ml.x, ml.y}, theirs_l[2] = {ml.z, ml.w};
    float wo[2], wx[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float mx = fmaxf(m_run[hh], theirs_m[hh]);
      const float mb = mx == -INFINITY ? 0.0f : mx;
      wo[hh] = ex2(m_run[hh] - mb);
      wx[hh] = ex2(theirs_m[hh] - mb);
      l_run[hh] = wo[hh] * l_run[hh] + wx[hh] * theirs_l[hh];
    }
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      float4 v;
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                   : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                   : "r"(part_addr(cw, c))
                   : "memory");
      o[4 * c] = wo[0] * o[4 * c] + wx[0] * v.x;
      o[4 * c + 1] = wo[0] * o[4 * c + 1] + wx[0] * v.y;
      o[4 * c + 2] = wo[1] * o[4 * c + 2] + wx[1] * v.z;
      o[4 * c + 3] = wo[1] * o[4 * c + 3] + wx[1] * v.w;
    }
  }
  // O / l into the strip's Q rows (every S product that read them is done: this warpgroup's own,
  // and the third's before its arrive) in the TMA box layout -- 16-byte chunk k of row r at
  // k ^ (r % 8), the 128-byte swizzle -- then one TMA store of the strip's 64 rows (rows >= Sq and
  // columns >= Dv clipped by the tensor map). A row's l is the quad's sum (> 0: every key visible).
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    float l = l_run[hh];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = l > 0.0f ? rcp_approx(l) : 0.0f;
    const int r = warp * 16 + lane / 4 + hh * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t addr = q_strip + r * 128 + ((i ^ (r % 8)) << 4) + 4 * (lane % 4);
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(pack2<T>(o[i * 4 + 2 * hh] * inv, o[i * 4 + 2 * hh + 1] * inv))
                   : "memory");
    }
  }
  fence_proxy_async_smem();
  if (cw == 0) asm volatile("bar.sync 4, 128;\n" ::: "memory");
  else asm volatile("bar.sync 5, 128;\n" ::: "memory");
  if (t == 0) {
    tma_store_4d(&tm_y, q_strip, 0, row0 + cw * 64, h, b);
    bulk_commit();
    bulk_wait_read();  // the staged rows stay until the store has read them
  }
}

}  // namespace opsfuse::cuda::detail::hopper
