// A minimal float SIMD vector for the CPU kernel, one definition per instruction set. The
// instruction set is the one this translation unit is compiled for (see CMakeLists.txt):
//   __AVX512F__          16 lanes (zmm), FMA, F16C-equivalent conversions
//   __AVX2__ + __FMA__   8 lanes (ymm), FMA, F16C conversions
//   x86-64 baseline      4 lanes (xmm, SSE2), multiply + add instead of FMA
//   anything else        1 lane (plain float), so the kernel still builds off x86
//
// Every function here is `static inline` inside an anonymous namespace: each per-ISA translation
// unit gets its own private copy, so the linker can never substitute an AVX-512 body for a
// baseline one (a weak inline symbol shared between translation units built with different
// flags would do exactly that).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace {

#if defined(__AVX512F__)

struct Vec {
  static constexpr int kLanes = 16;
  __m512 v;
};
static inline Vec vload(const float* p) { return {_mm512_loadu_ps(p)}; }
static inline void vstore(float* p, Vec a) { _mm512_storeu_ps(p, a.v); }
static inline Vec vset1(float x) { return {_mm512_set1_ps(x)}; }
static inline Vec vzero() { return {_mm512_setzero_ps()}; }
static inline Vec vadd(Vec a, Vec b) { return {_mm512_add_ps(a.v, b.v)}; }
static inline Vec vsub(Vec a, Vec b) { return {_mm512_sub_ps(a.v, b.v)}; }
static inline Vec vmul(Vec a, Vec b) { return {_mm512_mul_ps(a.v, b.v)}; }
static inline Vec vdiv(Vec a, Vec b) { return {_mm512_div_ps(a.v, b.v)}; }
static inline Vec vmax(Vec a, Vec b) { return {_mm512_max_ps(a.v, b.v)}; }
// a * b + c
static inline Vec vfma(Vec a, Vec b, Vec c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
// Round to nearest (even) integer value.
static inline Vec vround(Vec a) {
  return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
// 2^n for integer-valued n in [-127, 127], as float bits ((n + 127) << 23); n = -127 gives 0.
static inline Vec vpow2i(Vec n) {
  __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n.v), _mm512_set1_epi32(127));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(e, 23))};
}
// 2^n from y = n + 1.5*2^23 (n in [-127, 127] sits in y's low mantissa bits): (bits(y) + 127) << 23.
static inline Vec vpow2_bits(Vec y) {
  const __m512i e = _mm512_add_epi32(_mm512_castps_si512(y.v), _mm512_set1_epi32(127));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(e, 23))};
}
// x where x > -inf, else 0.
static inline Vec vneginf_to_zero(Vec x) {
  __mmask16 m = _mm512_cmp_ps_mask(x.v, _mm512_set1_ps(-__builtin_inff()), _CMP_EQ_OQ);
  return {_mm512_mask_mov_ps(x.v, m, _mm512_setzero_ps())};
}
// Sum of the lanes (pairwise tree).
static inline float vhsum(Vec a) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a.v),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1)));
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
  return _mm_cvtss_f32(x);
}
static inline Vec vload_f16(const uint16_t* p) {
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
static inline Vec vload_bf16(const uint16_t* p) {
  __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(w, 16))};
}
// r[i] lane j <- r[j] lane i: a 16 x 16 transpose in four rounds of shuffles (pairs of rows,
// quads within 128-bit lanes, then the 128-bit lanes across groups of four rows), 64 in all.
static inline void vtranspose(Vec (&r)[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i].v, r[i + 1].v);
    t[i + 1] = _mm512_unpackhi_ps(r[i].v, r[i + 1].v);
  }
  // u[4g + j], 128-bit lane L: column 4L + j of rows 4g .. 4g + 3.
  for (int g = 0; g < 16; g += 4) {
    u[g] = _mm512_shuffle_ps(t[g], t[g + 2], 0x44);
    u[g + 1] = _mm512_shuffle_ps(t[g], t[g + 2], 0xEE);
    u[g + 2] = _mm512_shuffle_ps(t[g + 1], t[g + 3], 0x44);
    u[g + 3] = _mm512_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512 even01 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x88);  // lanes 0, 2 of groups 0, 1
    const __m512 odd01 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xDD);   // lanes 1, 3
    const __m512 even23 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x88);
    const __m512 odd23 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xDD);
    r[j].v = _mm512_shuffle_f32x4(even01, even23, 0x88);       // column j: lane 0 of each group
    r[8 + j].v = _mm512_shuffle_f32x4(even01, even23, 0xDD);   // column 8 + j: lane 2
    r[4 + j].v = _mm512_shuffle_f32x4(odd01, odd23, 0x88);     // column 4 + j: lane 1
    r[12 + j].v = _mm512_shuffle_f32x4(odd01, odd23, 0xDD);    // column 12 + j: lane 3
  }
}
#define OPSFUSE_HAS_VEC_HALF 1

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

struct Vec {
  static constexpr int kLanes = 8;
  __m256 v;
};
static inline Vec vload(const float* p) { return {_mm256_loadu_ps(p)}; }
static inline void vstore(float* p, Vec a) { _mm256_storeu_ps(p, a.v); }
static inline Vec vset1(float x) { return {_mm256_set1_ps(x)}; }
static inline Vec vzero() { return {_mm256_setzero_ps()}; }
static inline Vec vadd(Vec a, Vec b) { return {_mm256_add_ps(a.v, b.v)}; }
static inline Vec vsub(Vec a, Vec b) { return {_mm256_sub_ps(a.v, b.v)}; }
static inline Vec vmul(Vec a, Vec b) { return {_mm256_mul_ps(a.v, b.v)}; }
static inline Vec vdiv(Vec a, Vec b) { return {_mm256_div_ps(a.v, b.v)}; }
static inline Vec vmax(Vec a, Vec b) { return {_mm256_max_ps(a.v, b.v)}; }
static inline Vec vfma(Vec a, Vec b, Vec c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
static inline Vec vround(Vec a) { return {_mm256_round_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
static inline Vec vpow2i(Vec n) {
  __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n.v), _mm256_set1_epi32(127));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(e, 23))};
}
static inline Vec vpow2_bits(Vec y) {
  const __m256i e = _mm256_add_epi32(_mm256_castps_si256(y.v), _mm256_set1_epi32(127));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(e, 23))};
}
static inline Vec vneginf_to_zero(Vec x) {
  __m256 m = _mm256_cmp_ps(x.v, _mm256_set1_ps(-__builtin_inff()), _CMP_EQ_OQ);
  return {_mm256_andnot_ps(m, x.v)};
}
// Sum of the lanes (pairwise tree).
static inline float vhsum(Vec a) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
  return _mm_cvtss_f32(x);
}
static inline Vec vload_f16(const uint16_t* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
}
static inline Vec vload_bf16(const uint16_t* p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(w, 16))};
}
// r[i] lane j <- r[j] lane i: an 8 x 8 transpose (pairs, quads within 128-bit halves, halves).
static inline void vtranspose(Vec (&r)[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i].v, r[i + 1].v);
    t[i + 1] = _mm256_unpackhi_ps(r[i].v, r[i + 1].v);
  }
  for (int g = 0; g < 8; g += 4) {
    u[g] = _mm256_shuffle_ps(t[g], t[g + 2], 0x44);
    u[g + 1] = _mm256_shuffle_ps(t[g], t[g + 2], 0xEE);
    u[g + 2] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0x44);
    u[g + 3] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
  }
  for (int j = 0; j < 4; ++j) {
    r[j].v = _mm256_permute2f128_ps(u[j], u[4 + j], 0x20);
    r[4 + j].v = _mm256_permute2f128_ps(u[j], u[4 + j], 0x31);
  }
}
#define OPSFUSE_HAS_VEC_HALF 1

#elif defined(__SSE2__)

struct Vec {
  static constexpr int kLanes = 4;
  __m128 v;
};
static inline Vec vload(const float* p) { return {_mm_loadu_ps(p)}; }
static inline void vstore(float* p, Vec a) { _mm_storeu_ps(p, a.v); }
static inline Vec vset1(float x) { return {_mm_set1_ps(x)}; }
static inline Vec vzero() { return {_mm_setzero_ps()}; }
static inline Vec vadd(Vec a, Vec b) { return {_mm_add_ps(a.v, b.v)}; }
static inline Vec vsub(Vec a, Vec b) { return {_mm_sub_ps(a.v, b.v)}; }
static inline Vec vmul(Vec a, Vec b) { return {_mm_mul_ps(a.v, b.v)}; }
static inline Vec vdiv(Vec a, Vec b) { return {_mm_div_ps(a.v, b.v)}; }
static inline Vec vmax(Vec a, Vec b) { return {_mm_max_ps(a.v, b.v)}; }
static inline Vec vfma(Vec a, Vec b, Vec c) { return {_mm_add_ps(_mm_mul_ps(a.v, b.v), c.v)}; }
// SSE2 has no roundps: convert with the default (round-to-nearest-even) mode and back.
static inline Vec vround(Vec a) { return {_mm_cvtepi32_ps(_mm_cvtps_epi32(a.v))}; }
static inline Vec vpow2i(Vec n) {
  __m128i e = _mm_add_epi32(_mm_cvtps_epi32(n.v), _mm_set1_epi32(127));
  return {_mm_castsi128_ps(_mm_slli_epi32(e, 23))};
}
static inline Vec vpow2_bits(Vec y) {
  const __m128i e = _mm_add_epi32(_mm_castps_si128(y.v), _mm_set1_epi32(127));
  return {_mm_castsi128_ps(_mm_slli_epi32(e, 23))};
}
static inline Vec vneginf_to_zero(Vec x) {
  __m128 m = _mm_cmpeq_ps(x.v, _mm_set1_ps(-__builtin_inff()));
  return {_mm_andnot_ps(m, x.v)};
}
// Sum of the lanes (pairwise tree).
static inline float vhsum(Vec a) {
  __m128 x = _mm_add_ps(a.v, _mm_movehl_ps(a.v, a.v));
  x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
  return _mm_cvtss_f32(x);
}
// r[i] lane j <- r[j] lane i (4 x 4).
static inline void vtranspose(Vec (&r)[4]) { _MM_TRANSPOSE4_PS(r[0].v, r[1].v, r[2].v, r[3].v); }

#else

struct Vec {
  static constexpr int kLanes = 1;
  float v;
};
static inline Vec vload(const float* p) { return {*p}; }
static inline void vstore(float* p, Vec a) { *p = a.v; }
static inline Vec vset1(float x) { return {x}; }
static inline Vec vzero() { return {0.0f}; }
static inline Vec vadd(Vec a, Vec b) { return {a.v + b.v}; }
static inline Vec vsub(Vec a, Vec b) { return {a.v - b.v}; }
static inline Vec vmul(Vec a, Vec b) { return {a.v * b.v}; }
static inline Vec vdiv(Vec a, Vec b) { return {a.v / b.v}; }
static inline Vec vmax(Vec a, Vec b) { return {a.v > b.v ? a.v : b.v}; }
static inline Vec vfma(Vec a, Vec b, Vec c) { return {a.v * b.v + c.v}; }
static inline Vec vround(Vec a) { return {__builtin_nearbyintf(a.v)}; }
static inline Vec vpow2i(Vec n) {
  uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n.v) + 127) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return {f};
}
static inline Vec vpow2_bits(Vec y) {
  uint32_t bits;
  std::memcpy(&bits, &y.v, sizeof bits);
  bits = (bits + 127u) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return {f};
}
static inline Vec vneginf_to_zero(Vec x) { return {x.v == -__builtin_inff() ? 0.0f : x.v}; }
static inline float vhsum(Vec a) { return a.v; }
static inline void vtranspose(Vec (&)[1]) {}

#endif

// exp(x) for x <= 0 (x = -inf gives exactly 0). n = round(x / ln 2); r = x - n ln 2 in two steps
// (ln 2 = hi + lo, hi with few enough bits that n * hi is exact), so r in [-ln2/2, ln2/2] carries
// no rounding error from the reduction; exp(r) by a degree-6 polynomial (Chebyshev interpolation
// on that interval, monomial form); result = 2^n exp(r). Max relative error 1.2e-7 over
// [-88, 0]. Arguments below -127 ln 2 (~ -88.03) flush to 0. NaN is not propagated (becomes 0).
static inline Vec vexp_nonpos(Vec x) {
  x = vmax(x, vset1(-88.02969193111305f));
  const Vec n = vround(vmul(x, vset1(1.44269504088896341f)));
  Vec r = vfma(n, vset1(-0.693359375f), x);
  r = vfma(n, vset1(2.1219444170128554e-4f), r);
  Vec p = vset1(1.3941108481958508e-3f);
  p = vfma(p, r, vset1(8.37512593716383e-3f));
  p = vfma(p, r, vset1(4.166635125875473e-2f));
  p = vfma(p, r, vset1(1.6666415333747864e-1f));
  p = vfma(p, r, vset1(0.5f));
  p = vfma(p, r, vset1(1.0f));
  p = vfma(p, r, vset1(1.0f));
  return vmul(p, vpow2i(n));
}

// 2^t for t <= 0 (t = -inf gives exactly 0). t + 1.5*2^23 rounds t to the nearest integer n in
// the low mantissa bits (no round / convert instructions); f = t - n in [-1/2, 1/2] is exact;
// 2^f by a degree-6 polynomial (Chebyshev interpolation of 2^f on [-1/2, 1/2], monomial form;
// max relative error 1.1e-7); 2^n = (n + 127) << 23 from those same bits. Arguments below -127
// flush to 0; NaN becomes 0.
static inline Vec vexp2_nonpos(Vec t) {
  t = vmax(t, vset1(-127.0f));
  const Vec magic = vset1(12582912.0f);
  const Vec y = vadd(t, magic);
  const Vec f = vsub(t, vsub(y, magic));
  Vec p = vset1(1.5461444854736328e-4f);
  p = vfma(p, f, vset1(1.3400427997112274e-3f));
  p = vfma(p, f, vset1(9.618056938052177e-3f));
  p = vfma(p, f, vset1(5.550327152013779e-2f));
  p = vfma(p, f, vset1(2.4022650718688965e-1f));
  p = vfma(p, f, vset1(6.931471824645996e-1f));
  p = vfma(p, f, vset1(1.0f));
  return vmul(p, vpow2_bits(y));
}

// tanh(x), relative error ~2e-7 everywhere. |x| < 0.625: x * Q(x^2), Q a degree-5 polynomial
// (Chebyshev interpolation of tanh(x)/x in x^2 on [0, 0.625^2], monomial form). Elsewhere
// (1 - e) / (1 + e) with e = exp(-2|x|) <= 0.29, so no cancellation and no overflow; the sign of
// x is copied onto the result.
static inline Vec vtanh(Vec x) {
  const Vec neg = vsub(vzero(), x);
  const Vec ax = vmax(x, neg);
  const Vec u = vmul(x, x);
  Vec small = vset1(-5.657135043293238e-3f);
  small = vfma(small, u, vset1(2.0588191226124763e-2f));
  small = vfma(small, u, vset1(-5.372010916471481e-2f));
  small = vfma(small, u, vset1(1.3331113755702972e-1f));
  small = vfma(small, u, vset1(-3.333325982093811e-1f));
  small = vfma(small, u, vset1(1.0f));
  small = vmul(small, x);
  const Vec e = vexp_nonpos(vmul(ax, vset1(-2.0f)));
  const Vec one = vset1(1.0f);
  Vec r = vdiv(vsub(one, e), vadd(one, e));
#if defined(__AVX512F__)
  // copy the sign of x (integer ops: the float and/or forms need AVX512DQ)
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  r.v = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(r.v),
                                            _mm512_and_si512(_mm512_castps_si512(x.v), sign)));
  const __mmask16 use_small = _mm512_cmp_ps_mask(ax.v, _mm512_set1_ps(0.625f), _CMP_LT_OQ);
  r.v = _mm512_mask_mov_ps(r.v, use_small, small.v);
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  r.v = _mm256_or_ps(r.v, _mm256_and_ps(x.v, _mm256_set1_ps(-0.0f)));
  r.v = _mm256_blendv_ps(r.v, small.v, _mm256_cmp_ps(ax.v, _mm256_set1_ps(0.625f), _CMP_LT_OQ));
#elif defined(__SSE2__)
  r.v = _mm_or_ps(r.v, _mm_and_ps(x.v, _mm_set1_ps(-0.0f)));
  const __m128 use_small = _mm_cmplt_ps(ax.v, _mm_set1_ps(0.625f));
  r.v = _mm_or_ps(_mm_and_ps(use_small, small.v), _mm_andnot_ps(use_small, r.v));
#else
  if (x.v < 0.0f) r.v = -r.v;
  if (ax.v < 0.625f) r.v = small.v;
#endif
  return r;
}

}  // namespace
