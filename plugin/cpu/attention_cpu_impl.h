// The fused CPU attention kernel, written once against the Vec type of simd.h and compiled once
// per instruction set (kernel_avx512.cc, kernel_avx2.cc, kernel_baseline.cc). Everything here is
// in an anonymous namespace; the including file defines the one exported accessor.
//
// Layout: the kernel works on transposed tiles so that every vector lane is one query row.
//   qT  (D,  LB) per lane block: Q rows, packed once per work item
//   sT  (BN, LB): scores of BN keys for LB queries, then probabilities
//   oT  (Dv, LB) per lane block: the un-normalized output accumulator
// S^T = K . Q^T broadcasts one K element and multiplies a vector of queries; O^T += V^T . P^T
// broadcasts one V element and multiplies a vector of probabilities. K and V are read in place
// (float32) or converted tile by tile (float16 / bfloat16), never transposed. The softmax
// statistics (running max m, running sum l) are per lane, so the online-softmax update is plain
// vertical vector arithmetic with no horizontal reductions.
// Scores are kept in log2 units (scale * log2(e) * Q.K^T, masks times log2(e)) so that the
// softmax needs 2^x, the cheapest exponential; softmax is invariant to that change of base.
// Items of at most half a vector of rows (MHA decoding) take a row formulation instead, with
// vectors along D and Dv (run_item_rows below).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu_kernel.h"
#include "half_convert.h"
#include "simd.h"

namespace {

using opsfuse::AttentionParams;
using opsfuse::DType;
using opsfuse::MaskKind;
using opsfuse::cpu::Tiling;

constexpr int kW = Vec::kLanes;
// Vectors of queries per micro-kernel row (lane block = kW * kMaxNV queries).
#if defined(__AVX512F__)
constexpr int kMaxNV = 4;
#elif defined(__AVX2__)
constexpr int kMaxNV = 2;
#elif defined(__SSE2__)
constexpr int kMaxNV = 2;
#else
constexpr int kMaxNV = 4;
#endif
constexpr int kLB = kW * kMaxNV;

// Rows (keys for Q.K^T, value columns for P.V) per micro-kernel block for NV query vectors:
// fewer query vectors leave room for more rows. AVX2 blocks are 4 x 2 (8 of 16 registers
// accumulate, enough to cover the FMA latency on both pipes): at 6 x 2 the compiler runs out of
// registers for the operands; measured on Zen 3, best of 300 bursts, Q.K^T 6 x 2 ~84% of the FMA
// peak, 4 x 2 ~92-95%; P.V 6 x 2 ~92%, 4 x 2 ~88-97% (and no tail block when Dv % 4 == 0).
template <int NV>
constexpr int qk_rows() {
#if defined(__AVX512F__)
  return NV == 1 ? 12 : NV == 2 ? 8 : 6;
#elif defined(__AVX2__)
  return NV == 1 ? 8 : 4;
#else
  return 4;
#endif
}

template <int NV>
constexpr int pv_rows() {
#if defined(__AVX512F__)
  return NV == 1 ? 12 : NV == 2 ? 8 : 6;
#elif defined(__AVX2__)
  return NV == 1 ? 8 : 4;
#else
  return 4;
#endif
}

constexpr float kNegInf = -__builtin_inff();
constexpr float kFloatMax = 3.40282347e38f;
constexpr double kLog2e = 1.4426950408889634;

static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline size_t align16(size_t n) { return (n + 15) & ~static_cast<size_t>(15); }

// ---------------------------------------------------------------------------------------------
// Micro-kernels.

// out[r][lanes] = scale * sum_d k[r][d] * q[d][lanes] for R keys and NV query vectors.
// k: R rows at stride kst (floats); q: (D, kLB) lane block; out: (R, kLB).
// The sum over d runs in chunks of kDChunk that start from zero and are then added up
// (blocked summation: rounding error grows with kDChunk + D / kDChunk terms instead of D); the
// scale multiplies the finished dot product, as scale * (Q K^T) is written in the contract.
constexpr int64_t kDChunk = 16;

template <int NV, int R>
static inline void qk_step(const float* k, int64_t kst, const float* q, int64_t d, Vec (&acc)[R][NV]) {
  Vec qv[NV];
#pragma GCC unroll 4
  for (int c = 0; c < NV; ++c) qv[c] = vload(q + d * kLB + c * kW);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const Vec kb = vset1(k[r * kst + d]);
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) acc[r][c] = vfma(kb, qv[c], acc[r][c]);
  }
}

template <int NV, int R>
static inline void qk_block(const float* k, int64_t kst, const float* q, int64_t d_len, Vec scale, float* out) {
  for (int64_t d0 = 0; d0 < d_len; d0 += kDChunk) {
    const int64_t d1 = imin(d0 + kDChunk, d_len);
    Vec acc[R][NV];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int c = 0; c < NV; ++c) acc[r][c] = vzero();
    if (d1 - d0 == kDChunk) {
      // Full chunk: a fixed trip count, unrolled, so no loop-exit branch to mispredict.
#pragma GCC unroll 16
      for (int64_t d = d0; d < d0 + kDChunk; ++d) qk_step<NV, R>(k, kst, q, d, acc);
    } else {
      for (int64_t d = d0; d < d1; ++d) qk_step<NV, R>(k, kst, q, d, acc);
    }
    const bool last = d1 == d_len;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int c = 0; c < NV; ++c) {
        float* dst = out + r * kLB + c * kW;
        Vec x = d0 == 0 ? acc[r][c] : vadd(vload(dst), acc[r][c]);
        vstore(dst, last ? vmul(x, scale) : x);
      }
  }
}

// o[r][lanes] = o[r][lanes] * alpha[lanes] + sum_j v[j][r] * p[j][lanes] for R value columns.
// v: value rows at stride vst, already offset to the first of the R columns; p: (nk, kLB);
// o: (R, kLB) rows of the (Dv, kLB) accumulator. The tile's sum starts from zero and is added
// to the rescaled accumulator at the end (blocked summation: rounding error grows with
// block_k + Sk / block_k terms instead of Sk).
template <int NV, int R>
static inline void pv_block(const float* v, int64_t vst, const float* p, int64_t nk, float* o, const Vec* alpha) {
  Vec acc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) acc[r][c] = vzero();
#pragma GCC unroll 4
  for (int64_t j = 0; j < nk; ++j) {
    Vec pv[NV];
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) pv[c] = vload(p + j * kLB + c * kW);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const Vec vb = vset1(v[j * vst + r]);
#pragma GCC unroll 4
      for (int c = 0; c < NV; ++c) acc[r][c] = vfma(vb, pv[c], acc[r][c]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) {
      float* dst = o + r * kLB + c * kW;
      vstore(dst, vfma(vload(dst), alpha[c], acc[r][c]));
    }
}

// Runtime row count (1..R) -> compile-time block, for the tail of a key or value range.
template <int NV, int R>
static inline void qk_tail(int rows, const float* k, int64_t kst, const float* q, int64_t d_len, Vec scale,
                           float* out) {
  if constexpr (R > 0) {
    if (rows == R) {
      qk_block<NV, R>(k, kst, q, d_len, scale, out);
    } else {
      qk_tail<NV, R - 1>(rows, k, kst, q, d_len, scale, out);
    }
  }
}

template <int NV, int R>
static inline void pv_tail(int rows, const float* v, int64_t vst, const float* p, int64_t nk, float* o,
                           const Vec* alpha) {
  if constexpr (R > 0) {
    if (rows == R) {
      pv_block<NV, R>(v, vst, p, nk, o, alpha);
    } else {
      pv_tail<NV, R - 1>(rows, v, vst, p, nk, o, alpha);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Element access: load_elem / store_elem (half_convert.h).

// Converts `rows` rows of `len` half / bfloat16 elements (row stride `src_stride` elements) into
// dense float rows of stride `len`.
static void convert_rows(const uint16_t* src, int64_t src_stride, int64_t rows, int64_t len, DType t, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* s = src + r * src_stride;
    float* o = dst + r * len;
    int64_t x = 0;
#if defined(OPSFUSE_HAS_VEC_HALF)
    if (t == DType::kFloat16) {
      for (; x + kW <= len; x += kW) vstore(o + x, vload_f16(s + x));
    } else {
      for (; x + kW <= len; x += kW) vstore(o + x, vload_bf16(s + x));
    }
#endif
    if (t == DType::kFloat16) {
      for (; x < len; ++x) o[x] = f16_to_f32(s[x]);
    } else {
      for (; x < len; ++x) o[x] = bf16_to_f32(s[x]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// One work item.

struct Scratch {
  float* qT;  // (n_lb, D, kLB)
  float* oT;  // (n_lb, Dv, kLB)
  float* m;   // (n_lb, kLB) running max
  float* l;   // (n_lb, kLB) running sum
  float* sT;  // (n_lb, BN, kLB) scores, then probabilities, of every lane block
  float* alpha;  // (n_lb, kLB) rescale factor of the current tile
  float* kt;  // (BN, D) converted K tile (half / bfloat16 only)
  float* vt;  // (BN, Dv) converted V tile
};

static size_t scratch_layout(const AttentionParams& p, const Tiling& t, float* base, Scratch* s) {
  const int64_t n_lb = ceil_div(t.block_q, kLB);
  const bool convert = p.dtype != DType::kFloat32;
  const size_t sizes[8] = {
      align16(static_cast<size_t>(n_lb * p.head_dim * kLB)),
      align16(static_cast<size_t>(n_lb * p.head_dim_v * kLB)),
      align16(static_cast<size_t>(n_lb * kLB)),
      align16(static_cast<size_t>(n_lb * kLB)),
      align16(static_cast<size_t>(n_lb * t.block_k * kLB)),
      align16(static_cast<size_t>(n_lb * kLB)),
      convert ? align16(static_cast<size_t>(t.block_k * p.head_dim)) : 0,
      convert ? align16(static_cast<size_t>(t.block_k * p.head_dim_v)) : 0,
  };
  size_t off = 0;
  float** slots[8] = {&s->qT, &s->oT, &s->m, &s->l, &s->sT, &s->alpha, &s->kt, &s->vt};
  for (int i = 0; i < 8; ++i) {
    if (base != nullptr) *slots[i] = base + off;
    off += sizes[i];
  }
  return off * sizeof(float);
}

static size_t scratch_bytes(const AttentionParams& p, const Tiling& t) { return scratch_layout(p, t, nullptr, nullptr); }

// A work item is (batch b, kv head hk, block of rows). Its rows are the (query head, query
// position) pairs of the `group` query heads that share kv head hk, position fastest:
// row r -> head hk * group + r / Sq, position r % Sq. For Sq >= a block the rows of a block
// belong to one head, as in plain (batch, head, query block) items; for decoding (Sq = 1) the
// group's heads fill the vector lanes and K / V are read once per kv head instead of per head.
// The K and V rows of the key tile [t0, t0 + nk) of one (batch, kv head) (k_off / v_off): float32
// is read in place with the tensors' row strides, float16 / bfloat16 are converted into the
// scratch tiles (rows of d_len / dv_len floats).
struct KvTile {
  const float* k;
  const float* v;
  int64_t k_stride, v_stride;
};
static inline KvTile kv_tile(const AttentionParams& p, const Scratch& s, int64_t k_off, int64_t v_off, int64_t t0,
                             int64_t nk, int64_t d_len, int64_t dv_len) {
  if (p.dtype == DType::kFloat32) {
    return {static_cast<const float*>(p.k) + k_off + t0 * p.k_stride[2],
            static_cast<const float*>(p.v) + v_off + t0 * p.v_stride[2], p.k_stride[2], p.v_stride[2]};
  }
  convert_rows(static_cast<const uint16_t*>(p.k) + k_off + t0 * p.k_stride[2], p.k_stride[2], nk, d_len, p.dtype,
               s.kt);
  convert_rows(static_cast<const uint16_t*>(p.v) + v_off + t0 * p.v_stride[2], p.v_stride[2], nk, dv_len, p.dtype,
               s.vt);
  return {s.kt, s.vt, d_len, dv_len};
}

struct ItemCtx {
  const AttentionParams* p;
  int64_t b, hk, group;
  int64_t klen;         // keys visible through key_lengths
  int64_t causal_off;   // row i sees keys j <= i + causal_off (when causal)
  int64_t t0;           // first key of the current tile
  int64_t block_k;
  float qk_scale;       // multiplies Q.K^T: scale, times log2(e) unless softcap needs natural units
};

// An additive mask value in the log2 units the softmax works in. A finite value stays finite
// (a row of float-min masks is the softmax of finite values, not a masked row); -inf, +inf and
// NaN pass through. Branch-free, so the per-row mask loop below vectorizes.
static inline float to_log2_units(float m) {
  const float x = m * static_cast<float>(kLog2e);
  const float clamped = x > kFloatMax ? kFloatMax : (x < -kFloatMax ? -kFloatMax : x);
  return __builtin_fabsf(m) <= kFloatMax ? clamped : x;
}

// One past the last key query position i may attend.
static inline int64_t row_end(const ItemCtx& c, int64_t i) {
  if (c.p->is_causal == 0) return c.klen;
  return imax(0, imin(c.klen, i + c.causal_off + 1));
}

static inline int64_t row_head(const ItemCtx& c, int64_t r) { return c.hk * c.group + r / c.p->seq_q; }
static inline int64_t row_pos(const ItemCtx& c, int64_t r) { return r % c.p->seq_q; }

// Scores -> softcap -> mask -> causal for the (nk, lanes) block in sT, then the online-softmax
// update and O^T += V^T P^T for lane block `lb`.
template <int NV>
static void process_block(int phase, const ItemCtx& c, const Scratch& s, int64_t lb, int64_t r_first,
                          int64_t n_rows, int64_t end_min, const float* kp, int64_t kst, const float* vp,
                          int64_t vst, int64_t nk) {
  const AttentionParams& p = *c.p;
  const int64_t d_len = p.head_dim;
  const int64_t dv_len = p.head_dim_v;
  const float* q = s.qT + lb * d_len * kLB;
  float* sT = s.sT + lb * c.block_k * kLB;
  Vec alpha[NV];
  if (phase == 1) {

  // S^T = K Q^T
  {
    constexpr int R = qk_rows<NV>();
    const Vec scale = vset1(c.qk_scale);
    int64_t j = 0;
    for (; j + R <= nk; j += R) qk_block<NV, R>(kp + j * kst, kst, q, d_len, scale, sT + j * kLB);
    if (j < nk) qk_tail<NV, R - 1>(static_cast<int>(nk - j), kp + j * kst, kst, q, d_len, scale, sT + j * kLB);
  }

  if (p.softcap > 0.0f) {
    // s = scale * QK^T here; softcap * tanh(s / softcap), then into log2 units.
    const Vec cap = vset1(p.softcap);
    const Vec cap_log2e = vset1(static_cast<float>(p.softcap * kLog2e));
    for (int64_t j = 0; j < nk; ++j)
      for (int cc = 0; cc < NV; ++cc) {
        float* x = sT + j * kLB + cc * kW;
        vstore(x, vmul(cap_log2e, vtanh(vdiv(vload(x), cap))));
      }
  }

  if (p.mask_kind != MaskKind::kNone && p.mask_stride[1] == 0 && p.mask_stride[2] == 0) {
    // A padding-style mask (one value per key, the same for every head and query row, e.g.
    // (B, 1, 1, Sk)): every lane of a key's row of sT gets the same value, so whole vectors.
    const int64_t* ms = p.mask_stride;
    const int64_t row = c.b * ms[0] + c.t0 * ms[3];
    for (int64_t j = 0; j < nk; ++j) {
      if (p.mask_kind == MaskKind::kBool) {
        if (static_cast<const uint8_t*>(p.mask)[row + j * ms[3]] != 0) continue;
        const Vec hidden = vset1(kNegInf);
        for (int cc = 0; cc < NV; ++cc) vstore(sT + j * kLB + cc * kW, hidden);
        continue;
      }
      const int64_t at = row + j * ms[3];
      const float add = to_log2_units(p.dtype == DType::kFloat32 ? static_cast<const float*>(p.mask)[at]
                                                                  : load_elem(p.mask, at, p.dtype));
      const Vec a = vset1(add);
      for (int cc = 0; cc < NV; ++cc) {
        float* x = sT + j * kLB + cc * kW;
        vstore(x, vadd(vload(x), a));
      }
    }
  } else if (p.mask_kind != MaskKind::kNone) {
    // A mask that varies per row: keys outer and rows inner, so each key's row of sT is written
    // contiguously and the compiler can gather a vector of rows at once.
    const int64_t* ms = p.mask_stride;
    const int64_t base = c.b * ms[0] + c.t0 * ms[3];
    int64_t row_offset[kLB];
    for (int64_t r = 0; r < n_rows; ++r)
      row_offset[r] = base + row_head(c, r_first + r) * ms[1] + row_pos(c, r_first + r) * ms[2];
    for (int64_t j = 0; j < nk; ++j) {
      float* dst = sT + j * kLB;
      const int64_t key = j * ms[3];
      if (p.mask_kind == MaskKind::kBool) {
        const uint8_t* m = static_cast<const uint8_t*>(p.mask) + key;
        for (int64_t r = 0; r < n_rows; ++r) dst[r] = m[row_offset[r]] != 0 ? dst[r] : kNegInf;
      } else if (p.dtype == DType::kFloat32) {
        const float* m = static_cast<const float*>(p.mask) + key;
        for (int64_t r = 0; r < n_rows; ++r) dst[r] += to_log2_units(m[row_offset[r]]);
      } else {
        for (int64_t r = 0; r < n_rows; ++r) dst[r] += to_log2_units(load_elem(p.mask, row_offset[r] + key, p.dtype));
      }
    }
  }

  if (p.is_causal != 0 && end_min < c.t0 + nk) {
    for (int64_t r = 0; r < n_rows; ++r) {
      const int64_t first_hidden = imax(0, row_end(c, row_pos(c, r_first + r)) - c.t0);
      for (int64_t j = first_hidden; j < nk; ++j) sT[j * kLB + r] = kNegInf;
    }
  }

  // Online softmax, one lane per query row. Two independent max / sum chains per vector keep
  // the loops bound by throughput rather than by the latency of one long chain.
  float* mrow = s.m + lb * kLB;
  float* lrow = s.l + lb * kLB;
  Vec m_use[NV], mx0[NV], mx1[NV];
#pragma GCC unroll 4
  for (int cc = 0; cc < NV; ++cc) mx0[cc] = mx1[cc] = vload(mrow + cc * kW);
  {
    int64_t j = 0;
    for (; j + 2 <= nk; j += 2) {
#pragma GCC unroll 4
      for (int cc = 0; cc < NV; ++cc) {
        mx0[cc] = vmax(mx0[cc], vload(sT + j * kLB + cc * kW));
        mx1[cc] = vmax(mx1[cc], vload(sT + (j + 1) * kLB + cc * kW));
      }
    }
    if (j < nk) {
#pragma GCC unroll 4
      for (int cc = 0; cc < NV; ++cc) mx0[cc] = vmax(mx0[cc], vload(sT + j * kLB + cc * kW));
    }
  }
#pragma GCC unroll 4
  for (int cc = 0; cc < NV; ++cc) {
    const Vec m_old = vload(mrow + cc * kW);
    const Vec mx = vmax(mx0[cc], mx1[cc]);
    // Rows with every key so far masked keep mx = -inf; subtracting 0 then gives p = 0.
    m_use[cc] = vneginf_to_zero(mx);
    alpha[cc] = vexp2_nonpos(vsub(m_old, m_use[cc]));
    vstore(mrow + cc * kW, mx);
  }
  Vec sum0[NV], sum1[NV];
#pragma GCC unroll 4
  for (int cc = 0; cc < NV; ++cc) sum0[cc] = sum1[cc] = vzero();
  {
    int64_t j = 0;
    for (; j + 2 <= nk; j += 2) {
#pragma GCC unroll 4
      for (int cc = 0; cc < NV; ++cc) {
        float* x0 = sT + j * kLB + cc * kW;
        float* x1 = x0 + kLB;
        const Vec p0 = vexp2_nonpos(vsub(vload(x0), m_use[cc]));
        const Vec p1 = vexp2_nonpos(vsub(vload(x1), m_use[cc]));
        vstore(x0, p0);
        vstore(x1, p1);
        sum0[cc] = vadd(sum0[cc], p0);
        sum1[cc] = vadd(sum1[cc], p1);
      }
    }
    if (j < nk) {
#pragma GCC unroll 4
      for (int cc = 0; cc < NV; ++cc) {
        float* x0 = sT + j * kLB + cc * kW;
        const Vec p0 = vexp2_nonpos(vsub(vload(x0), m_use[cc]));
        vstore(x0, p0);
        sum0[cc] = vadd(sum0[cc], p0);
      }
    }
  }
#pragma GCC unroll 4
  for (int cc = 0; cc < NV; ++cc)
    vstore(lrow + cc * kW, vfma(vload(lrow + cc * kW), alpha[cc], vadd(sum0[cc], sum1[cc])));

#pragma GCC unroll 4
  for (int cc = 0; cc < NV; ++cc) vstore(s.alpha + lb * kLB + cc * kW, alpha[cc]);
  return;
  }

  // Phase 2: O^T = O^T * alpha + V^T P^T
#pragma GCC unroll 4
  for (int cc = 0; cc < NV; ++cc) alpha[cc] = vload(s.alpha + lb * kLB + cc * kW);
  {
    constexpr int R = pv_rows<NV>();
    float* o = s.oT + lb * dv_len * kLB;
    int64_t d = 0;
    for (; d + R <= dv_len; d += R) pv_block<NV, R>(vp + d, vst, sT, nk, o + d * kLB, alpha);
    if (d < dv_len) pv_tail<NV, R - 1>(static_cast<int>(dv_len - d), vp + d, vst, sT, nk, o + d * kLB, alpha);
  }
}

template <int NV>
static inline void dispatch_block(int phase, int nv, const ItemCtx& c, const Scratch& s, int64_t lb,
                                  int64_t r_first, int64_t n_rows, int64_t end_min, const float* kp, int64_t kst,
                                  const float* vp, int64_t vst, int64_t nk) {
  if constexpr (NV > 0) {
    if (nv == NV) {
      process_block<NV>(phase, c, s, lb, r_first, n_rows, end_min, kp, kst, vp, vst, nk);
    } else {
      dispatch_block<NV - 1>(phase, nv, c, s, lb, r_first, n_rows, end_min, kp, kst, vp, vst, nk);
    }
  }
}

// Causal work grows with the query position; visiting blocks as 0, n-1, 1, n-2, ... puts a
// light and a heavy block next to each other, so any contiguous share of items (ORT hands each
// thread one) carries about the same work.
static inline int64_t balanced_block(int64_t k, int64_t n) { return (k % 2 == 0) ? k / 2 : n - 1 - k / 2; }

constexpr int64_t kMaxLaneBlocks = 64;  // block_q / kLB; make_tiling keeps block_q <= 4 * 64

// ---------------------------------------------------------------------------------------------
// Row formulation, for items with few rows (MHA decoding: Sq = 1 and Hq = Hkv gives one row per
// item, which would fill 1 lane of a vector in the transposed layout above). Here the vectors
// run along D and Dv instead: per row, s_j = q . K[j] is a dot product over d (several keys at
// once, independent accumulators, one horizontal sum per key), then O += p_j V[j, :] with p_j
// broadcast. Scale, log2 units, softcap, masks, causal / key_lengths, empty rows and the
// half / bfloat16 tile conversion are the same as in the lane path.

constexpr int kRowKeys = 4;          // keys per dot-product block
constexpr int kRowPvVecs = 8;        // value vectors (8 x kW columns) accumulated per pass over a tile
constexpr int64_t kRowPad = kW;      // score buffer slack so the tile's vector loops need no tail

// Row path for items of at most half a vector of rows. Each row costs the row path its own pass
// over the K / V tile, while the lane path's cost does not grow until the lanes are full.
// Measured (AVX2, B=1, H=12, D=64, 2 threads; docs/notes/cpu_kernel.md, version 10): at Sk=1024
// the row path is 2-2.5x faster at 1 row, about equal at 4, slower from 6; at Sk=4096 faster up
// to 6 rows.
static inline bool use_row_path(int64_t rows) { return rows * 2 <= kW; }

// out[r] = scale * (q . k[r]) for R keys at stride kst. Blocked like qk_block: each chunk of
// kDChunk elements of d starts from zero (kDChunk / kW products per lane) and is then added to
// the running per-lane total; the lanes are summed in a tree at the end.
template <int R>
static inline void row_dots(const float* k, int64_t kst, const float* q, int64_t d_len, float scale, float* out) {
  constexpr int kCV = static_cast<int>(kDChunk) / kW;  // vectors per chunk
  Vec tot[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) tot[r] = vzero();
  int64_t d0 = 0;
  for (; d0 + kDChunk <= d_len; d0 += kDChunk) {
    Vec qv[kCV];
#pragma GCC unroll 16
    for (int i = 0; i < kCV; ++i) qv[i] = vload(q + d0 + i * kW);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const float* kr = k + r * kst + d0;
      Vec cvec = vmul(vload(kr), qv[0]);
#pragma GCC unroll 16
      for (int i = 1; i < kCV; ++i) cvec = vfma(vload(kr + i * kW), qv[i], cvec);
      tot[r] = vadd(tot[r], cvec);
    }
  }
  float tail[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) tail[r] = 0.0f;
  if (d0 < d_len) {
    // The last, partial chunk: whole vectors, then single elements.
    Vec cvec[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) cvec[r] = vzero();
    int64_t d = d0;
    for (; d + kW <= d_len; d += kW) {
      const Vec qv = vload(q + d);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) cvec[r] = vfma(vload(k + r * kst + d), qv, cvec[r]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) tot[r] = vadd(tot[r], cvec[r]);
    for (; d < d_len; ++d)
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) tail[r] += k[r * kst + d] * q[d];
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) out[r] = (vhsum(tot[r]) + tail[r]) * scale;
}

// o[0 .. NVC*kW) = o * alpha + sum_j p[j] v[j][0 .. NVC*kW); the tile's sum starts from zero
// (blocked summation, as pv_block).
template <int NVC>
static inline void row_pv_block(const float* v, int64_t vst, const float* p, int64_t nk, float* o, Vec alpha) {
  Vec acc[NVC];
#pragma GCC unroll 16
  for (int i = 0; i < NVC; ++i) acc[i] = vzero();
  for (int64_t j = 0; j < nk; ++j) {
    const Vec pb = vset1(p[j]);
    const float* vj = v + j * vst;
#pragma GCC unroll 16
    for (int i = 0; i < NVC; ++i) acc[i] = vfma(vload(vj + i * kW), pb, acc[i]);
  }
#pragma GCC unroll 16
  for (int i = 0; i < NVC; ++i) vstore(o + i * kW, vfma(vload(o + i * kW), alpha, acc[i]));
}

template <int NVC>
static inline void row_pv_tail(int nvc, const float* v, int64_t vst, const float* p, int64_t nk, float* o,
                               Vec alpha) {
  if constexpr (NVC > 0) {
    if (nvc == NVC) {
      row_pv_block<NVC>(v, vst, p, nk, o, alpha);
    } else {
      row_pv_tail<NVC - 1>(nvc, v, vst, p, nk, o, alpha);
    }
  }
}

// One key tile for one row: scores of keys [c.t0, c.t0 + nk) into sc, softmax update of (m, l),
// o = o * alpha + P V.
static void row_tile(const ItemCtx& c, int64_t head, int64_t pos, const float* q, const float* kp, int64_t kst,
                     const float* vp, int64_t vst, int64_t nk, float* sc, float* m, float* l, float* o) {
  const AttentionParams& p = *c.p;
  const int64_t d_len = p.head_dim;
  const int64_t dv_len = p.head_dim_v;
  {
    int64_t j = 0;
    for (; j + kRowKeys <= nk; j += kRowKeys) row_dots<kRowKeys>(kp + j * kst, kst, q, d_len, c.qk_scale, sc + j);
    for (; j < nk; ++j) row_dots<1>(kp + j * kst, kst, q, d_len, c.qk_scale, sc + j);
  }
  const int64_t n_pad = ceil_div(nk, kW) * kW;
  for (int64_t j = nk; j < n_pad; ++j) sc[j] = 0.0f;

  if (p.softcap > 0.0f) {
    const Vec cap = vset1(p.softcap);
    const Vec cap_log2e = vset1(static_cast<float>(p.softcap * kLog2e));
    for (int64_t j = 0; j < n_pad; j += kW) vstore(sc + j, vmul(cap_log2e, vtanh(vdiv(vload(sc + j), cap))));
  }
  if (p.mask_kind != MaskKind::kNone) {
    const int64_t* ms = p.mask_stride;
    const int64_t base = c.b * ms[0] + head * ms[1] + pos * ms[2] + c.t0 * ms[3];
    if (p.mask_kind == MaskKind::kBool) {
      const uint8_t* mk = static_cast<const uint8_t*>(p.mask) + base;
      for (int64_t j = 0; j < nk; ++j) sc[j] = mk[j * ms[3]] != 0 ? sc[j] : kNegInf;
    } else if (p.dtype == DType::kFloat32) {
      const float* mk = static_cast<const float*>(p.mask) + base;
      for (int64_t j = 0; j < nk; ++j) sc[j] += to_log2_units(mk[j * ms[3]]);
    } else {
      for (int64_t j = 0; j < nk; ++j) sc[j] += to_log2_units(load_elem(p.mask, base + j * ms[3], p.dtype));
    }
  }
  for (int64_t j = nk; j < n_pad; ++j) sc[j] = kNegInf;

  // Online softmax for the one row: vectors along the keys, two max / sum chains.
  Vec mx0 = vset1(*m), mx1 = mx0;
  {
    int64_t j = 0;
    for (; j + 2 * kW <= n_pad; j += 2 * kW) {
      mx0 = vmax(mx0, vload(sc + j));
      mx1 = vmax(mx1, vload(sc + j + kW));
    }
    if (j < n_pad) mx0 = vmax(mx0, vload(sc + j));
  }
  float lanes[kW];
  vstore(lanes, vmax(mx0, mx1));
  float mx = lanes[0];
  for (int x = 1; x < kW; ++x) mx = lanes[x] > mx ? lanes[x] : mx;
  // A row with every key so far masked keeps mx = -inf; subtracting 0 then gives p = 0.
  const Vec m_use = vneginf_to_zero(vset1(mx));
  const Vec alpha = vexp2_nonpos(vsub(vset1(*m), m_use));
  *m = mx;
  Vec sum0 = vzero(), sum1 = vzero();
  {
    int64_t j = 0;
    for (; j + 2 * kW <= n_pad; j += 2 * kW) {
      const Vec p0 = vexp2_nonpos(vsub(vload(sc + j), m_use));
      const Vec p1 = vexp2_nonpos(vsub(vload(sc + j + kW), m_use));
      vstore(sc + j, p0);
      vstore(sc + j + kW, p1);
      sum0 = vadd(sum0, p0);
      sum1 = vadd(sum1, p1);
    }
    if (j < n_pad) {
      const Vec p0 = vexp2_nonpos(vsub(vload(sc + j), m_use));
      vstore(sc + j, p0);
      sum0 = vadd(sum0, p0);
    }
  }
  vstore(lanes, alpha);
  *l = *l * lanes[0] + vhsum(vadd(sum0, sum1));

  // O = O * alpha + P V, kRowPvVecs vectors of columns per pass, then the columns past the last
  // whole vector one by one.
  int64_t d = 0;
  for (; d + kRowPvVecs * kW <= dv_len; d += kRowPvVecs * kW) row_pv_block<kRowPvVecs>(vp + d, vst, sc, nk, o + d, alpha);
  if (d + kW <= dv_len) {
    const int nvc = static_cast<int>((dv_len - d) / kW);
    row_pv_tail<kRowPvVecs - 1>(nvc, vp + d, vst, sc, nk, o + d, alpha);
    d += nvc * kW;
  }
  for (; d < dv_len; ++d) {
    float acc = 0.0f;
    for (int64_t j = 0; j < nk; ++j) acc += sc[j] * vp[j * vst + d];
    o[d] = o[d] * lanes[0] + acc;
  }
}

// The whole item in the row formulation: rows r0 .. r0 + rn of the item's kv head.
// Kept out of line so that run_item's lane path compiles as it did before this path existed.
__attribute__((noinline)) static void run_item_rows(ItemCtx& c, const Scratch& s, int64_t r0, int64_t rn) {
  const AttentionParams& p = *c.p;
  const int64_t d_len = p.head_dim;
  const int64_t dv_len = p.head_dim_v;
  const int64_t sc_stride = c.block_k + kRowPad;
  // Scratch: q rows in qT, O rows in oT, scores in sT, (m, l) in m / l.
  int64_t row_end_[kLB];
  int64_t kv_end = 0;
  for (int64_t x = 0; x < rn; ++x) {
    const int64_t r = r0 + x;
    row_end_[x] = row_end(c, row_pos(c, r));
    kv_end = imax(kv_end, row_end_[x]);
    const int64_t row = c.b * p.q_stride[0] + row_head(c, r) * p.q_stride[1] + row_pos(c, r) * p.q_stride[2];
    float* q = s.qT + x * d_len;
    if (p.dtype == DType::kFloat32) {
      std::memcpy(q, static_cast<const float*>(p.q) + row, sizeof(float) * static_cast<size_t>(d_len));
    } else {
      for (int64_t d = 0; d < d_len; ++d) q[d] = load_elem(p.q, row + d, p.dtype);
    }
    s.m[x] = kNegInf;
    s.l[x] = 0.0f;
  }
  std::memset(s.oT, 0, sizeof(float) * static_cast<size_t>(rn * dv_len));

  const int64_t k_off = c.b * p.k_stride[0] + c.hk * p.k_stride[1];
  const int64_t v_off = c.b * p.v_stride[0] + c.hk * p.v_stride[1];
  for (int64_t t0 = 0; t0 < kv_end; t0 += c.block_k) {
    const int64_t nk = imin(c.block_k, kv_end - t0);
    c.t0 = t0;
    const KvTile kv = kv_tile(p, s, k_off, v_off, t0, nk, d_len, dv_len);
    const float* kp = kv.k;
    const float* vp = kv.v;
    const int64_t kst = kv.k_stride;
    const int64_t vst = kv.v_stride;
    for (int64_t x = 0; x < rn; ++x) {
      const int64_t nb = imin(nk, row_end_[x] - t0);
      if (nb <= 0) continue;
      const int64_t r = r0 + x;
      row_tile(c, row_head(c, r), row_pos(c, r), s.qT + x * d_len, kp, kst, vp, vst, nb, s.sT + x * sc_stride,
               s.m + x, s.l + x, s.oT + x * dv_len);
    }
  }

  for (int64_t x = 0; x < rn; ++x) {
    const int64_t r = r0 + x;
    const int64_t row = c.b * p.y_stride[0] + row_head(c, r) * p.y_stride[1] + row_pos(c, r) * p.y_stride[2];
    const float* o = s.oT + x * dv_len;
    const bool empty = !(s.l[x] > 0.0f);
    const float lsum = empty ? 1.0f : s.l[x];
    if (p.dtype == DType::kFloat32) {
      float* y = static_cast<float*>(p.y) + row;
      for (int64_t d = 0; d < dv_len; ++d) y[d] = empty ? 0.0f : o[d] / lsum;
    } else {
      for (int64_t d = 0; d < dv_len; ++d) store_elem(p.y, row + d, p.dtype, empty ? 0.0f : o[d] / lsum);
    }
  }
}

// Q^T of one lane block: rows r_first .. r_first + n_rows - 1 into lanes 0 .. n_rows - 1 of qT
// (d_len x kLB), lanes past them zero. Groups of kW rows go through kW x kW register transposes
// (float32 loaded directly, float16 / bfloat16 converted on load where the ISA converts vectors),
// the other rows and columns element by element: at S=128 the element loop (a strided store per
// element) was ~10 % of the kernel's time.
static void pack_qT(const ItemCtx& c, int64_t r_first, int64_t n_rows, int64_t d_len, float* qT) {
  const AttentionParams& p = *c.p;
  auto row_of = [&](int64_t x) {
    const int64_t r = r_first + x;
    return c.b * p.q_stride[0] + row_head(c, r) * p.q_stride[1] + row_pos(c, r) * p.q_stride[2];
  };
  bool vec_loads = p.dtype == DType::kFloat32;
#if defined(OPSFUSE_HAS_VEC_HALF)
  vec_loads = true;
#endif
  int64_t x = 0;
  for (; vec_loads && x + kW <= n_rows; x += kW) {
    int64_t rows[kW];
    for (int i = 0; i < kW; ++i) rows[i] = row_of(x + i);
    int64_t d = 0;
    for (; d + kW <= d_len; d += kW) {
      Vec v[kW];
      for (int i = 0; i < kW; ++i) {
        if (p.dtype == DType::kFloat32) v[i] = vload(static_cast<const float*>(p.q) + rows[i] + d);
#if defined(OPSFUSE_HAS_VEC_HALF)
        else if (p.dtype == DType::kFloat16) v[i] = vload_f16(static_cast<const uint16_t*>(p.q) + rows[i] + d);
        else v[i] = vload_bf16(static_cast<const uint16_t*>(p.q) + rows[i] + d);
#endif
      }
      vtranspose(v);
      for (int j = 0; j < kW; ++j) vstore(qT + (d + j) * kLB + x, v[j]);
    }
    for (; d < d_len; ++d)
      for (int i = 0; i < kW; ++i) qT[d * kLB + x + i] = load_elem(p.q, rows[i] + d, p.dtype);
  }
  for (; x < kLB; ++x) {
    if (x < n_rows) {
      const int64_t row = row_of(x);
      for (int64_t d = 0; d < d_len; ++d) qT[d * kLB + x] = load_elem(p.q, row + d, p.dtype);
    } else {
      for (int64_t d = 0; d < d_len; ++d) qT[d * kLB + x] = 0.0f;
    }
  }
}

// Y rows r_first .. r_first + n_rows - 1 from lanes of oT (dv_len x kLB, already divided by l);
// rows whose keys were all masked (l = 0) get zeros. Float32 groups of kW rows with none of them
// empty go through kW x kW register transposes, the rest element by element (pack_qT's reason).
static void unpack_oT(const ItemCtx& c, int64_t r_first, int64_t n_rows, int64_t dv_len, const float* oT,
                      const float* l) {
  const AttentionParams& p = *c.p;
  auto row_of = [&](int64_t x) {
    const int64_t r = r_first + x;
    return c.b * p.y_stride[0] + row_head(c, r) * p.y_stride[1] + row_pos(c, r) * p.y_stride[2];
  };
  auto copy_row = [&](int64_t x) {
    const int64_t row = row_of(x);
    const bool empty = !(l[x] > 0.0f);
    for (int64_t d = 0; d < dv_len; ++d) store_elem(p.y, row + d, p.dtype, empty ? 0.0f : oT[d * kLB + x]);
  };
  int64_t x = 0;
  for (; x + kW <= n_rows; x += kW) {
    bool whole = p.dtype == DType::kFloat32;
    for (int i = 0; i < kW; ++i) whole = whole && l[x + i] > 0.0f;
    if (!whole) {
      for (int i = 0; i < kW; ++i) copy_row(x + i);
      continue;
    }
    float* rows[kW];
    for (int i = 0; i < kW; ++i) rows[i] = static_cast<float*>(p.y) + row_of(x + i);
    int64_t d = 0;
    for (; d + kW <= dv_len; d += kW) {
      Vec v[kW];
      for (int j = 0; j < kW; ++j) v[j] = vload(oT + (d + j) * kLB + x);
      vtranspose(v);
      for (int i = 0; i < kW; ++i) vstore(rows[i] + d, v[i]);
    }
    for (; d < dv_len; ++d)
      for (int i = 0; i < kW; ++i) rows[i][d] = oT[d * kLB + x + i];
  }
  for (; x < n_rows; ++x) copy_row(x);
}

static void run_item(const AttentionParams& p, const Tiling& t, int64_t item, float* scratch_base) {
  Scratch s;
  scratch_layout(p, t, scratch_base, &s);

  ItemCtx c;
  c.p = &p;
  c.group = p.heads_q / p.heads_kv;
  const int64_t qb_raw = item % t.n_qblocks;
  const int64_t bk = item / t.n_qblocks;
  c.hk = bk % p.heads_kv;
  c.b = bk / p.heads_kv;
  c.klen = p.seq_k;
  if (p.key_lengths != nullptr) {
    c.klen = p.key_lengths_int64 ? static_cast<const int64_t*>(p.key_lengths)[c.b]
                                 : static_cast<const int32_t*>(p.key_lengths)[c.b];
    c.klen = imax(0, imin(c.klen, p.seq_k));
  }
  c.causal_off = p.is_causal == 2 ? p.seq_k - p.seq_q : 0;
  c.t0 = 0;
  c.block_k = t.block_k;
  c.qk_scale = p.softcap > 0.0f ? p.scale : static_cast<float>(p.scale * kLog2e);

  const int64_t d_len = p.head_dim;
  const int64_t dv_len = p.head_dim_v;
  const int64_t qb = p.is_causal != 0 ? balanced_block(qb_raw, t.n_qblocks) : qb_raw;
  const int64_t r0 = qb * t.block_q;
  const int64_t rn = imin(t.block_q, c.group * p.seq_q - r0);
  if (use_row_path(rn)) {
    run_item_rows(c, s, r0, rn);
    return;
  }
  const int64_t n_lb = imin(ceil_div(rn, kLB), kMaxLaneBlocks);

  // Per lane block: the fewest and the most keys any of its rows may attend.
  int64_t end_min[kMaxLaneBlocks], end_max[kMaxLaneBlocks];
  int64_t kv_end = 0;
  for (int64_t lb = 0; lb < n_lb; ++lb) {
    const int64_t r_first = r0 + lb * kLB;
    const int64_t n_rows = imin(kLB, r0 + rn - r_first);
    end_min[lb] = c.klen;
    end_max[lb] = 0;
    for (int64_t x = 0; x < n_rows; ++x) {
      const int64_t e = row_end(c, row_pos(c, r_first + x));
      end_min[lb] = imin(end_min[lb], e);
      end_max[lb] = imax(end_max[lb], e);
    }
    kv_end = imax(kv_end, end_max[lb]);
  }

  // Pack Q^T per lane block; lanes past the last row are zero.
  for (int64_t lb = 0; lb < n_lb; ++lb)
    pack_qT(c, r0 + lb * kLB, imin(kLB, rn - lb * kLB), d_len, s.qT + lb * d_len * kLB);
  std::memset(s.oT, 0, sizeof(float) * static_cast<size_t>(n_lb * dv_len * kLB));
  for (int64_t x = 0; x < n_lb * kLB; ++x) {
    s.m[x] = kNegInf;
    s.l[x] = 0.0f;
  }

  const int64_t k_off = c.b * p.k_stride[0] + c.hk * p.k_stride[1];
  const int64_t v_off = c.b * p.v_stride[0] + c.hk * p.v_stride[1];
  for (int64_t t0 = 0; t0 < kv_end; t0 += t.block_k) {
    const int64_t nk = imin(t.block_k, kv_end - t0);
    c.t0 = t0;
    const KvTile kv = kv_tile(p, s, k_off, v_off, t0, nk, d_len, dv_len);
    const float* kp = kv.k;
    const float* vp = kv.v;
    const int64_t kst = kv.k_stride;
    const int64_t vst = kv.v_stride;
    // float32 K/V are read in place: prefetch the next tile, spread over the lane blocks
    // (+2-4% in a streaming micro-benchmark of the Q.K / P.V blocks).
    const int64_t next_rows = p.dtype == DType::kFloat32 ? imin(t.block_k, kv_end - t0 - nk) : 0;
    const int64_t rows_per_lb = ceil_div(next_rows, n_lb);
    // Phase 1 computes every lane block's scores and probabilities while the K tile stays in
    // L1; phase 2 accumulates P.V for every lane block while the V tile does.
    for (int phase = 1; phase <= 2; ++phase) {
      for (int64_t lb = 0; lb < n_lb; ++lb) {
        if (phase == 1) {
          for (int64_t j = lb * rows_per_lb; j < imin(next_rows, (lb + 1) * rows_per_lb); ++j) {
            const float* kn = kp + (nk + j) * kst;
            const float* vn = vp + (nk + j) * vst;
            for (int64_t x = 0; x < d_len; x += 16) __builtin_prefetch(kn + x);
            for (int64_t x = 0; x < dv_len; x += 16) __builtin_prefetch(vn + x);
          }
        }
        const int64_t r_first = r0 + lb * kLB;
        const int64_t n_rows = imin(kLB, r0 + rn - r_first);
        // Keys of this tile that the block's most-seeing row may attend.
        const int64_t nb = imin(nk, end_max[lb] - t0);
        if (nb <= 0) continue;
        const int nv = static_cast<int>(ceil_div(n_rows, kW));
        dispatch_block<kMaxNV>(phase, nv, c, s, lb, r_first, n_rows, end_min[lb], kp, kst, vp, vst, nb);
      }
    }
  }

  // Y = O * (1 / l), on whole lane vectors in place, then rows copied out; rows whose keys were
  // all masked (l = 0) get zeros. One division per row: a vector division per element cost ~8 %
  // of the kernel at S=128 (AVX-512 divisions issue every ~10 cycles); the reciprocal adds at most
  // one rounding to the output.
  float* inv_l = s.sT;  // free now; holds kLB floats
  for (int64_t lb = 0; lb < n_lb; ++lb) {
    float* o = s.oT + lb * dv_len * kLB;
    const float* l = s.l + lb * kLB;
    const int64_t n_rows = imin(kLB, r0 + rn - (r0 + lb * kLB));
    const int64_t nv = ceil_div(n_rows, kW);
    for (int64_t x = 0; x < kLB; ++x) inv_l[x] = l[x] > 0.0f ? l[x] : 1.0f;
    for (int64_t cc = 0; cc < nv; ++cc) vstore(inv_l + cc * kW, vdiv(vset1(1.0f), vload(inv_l + cc * kW)));
    for (int64_t d = 0; d < dv_len; ++d)
      for (int64_t cc = 0; cc < nv; ++cc) {
        float* x = o + d * kLB + cc * kW;
        vstore(x, vmul(vload(x), vload(inv_l + cc * kW)));
      }
    unpack_oT(c, r0 + lb * kLB, n_rows, dv_len, o, l);
  }
}

}  // namespace
