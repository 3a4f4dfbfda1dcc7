// Scalar float16 / bfloat16 <-> float32 conversions (IEEE binary16; bfloat16 = the top half of a
// float32). float -> half rounds to nearest, ties to even; NaN stays NaN, overflow gives inf.
// Like simd.h, everything is private to the including translation unit (anonymous namespace).
#pragma once

#include <cstdint>
#include <cstring>

#include "../common/attention_params.h"

namespace {

static inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

static inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

static inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0x1Fu) return f32_from_bits(sign | 0x7F800000u | (mant << 13));  // inf, NaN
  if (exp == 0) {
    // zero or subnormal: mant * 2^-24, exact in float32
    const float mag = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return f32_from_bits(sign | f32_bits(mag));
  }
  return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

static inline uint16_t f32_to_f16(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7FFFFFFFu;
  if (ax >= 0x7F800000u) {  // inf or NaN (NaN keeps a payload bit so it stays NaN)
    return static_cast<uint16_t>(sign | 0x7C00u | (ax > 0x7F800000u ? 0x200u | ((ax >> 13) & 0x3FFu) : 0u));
  }
  if (ax >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520: rounds to inf
  if (ax < 0x38800000u) {
    // Below the smallest normal half (2^-14): the result is subnormal or zero, in steps of 2^-24.
    // Adding 0.5 (whose float ulp is 2^-24) rounds |f| to that step, ties to even, in hardware.
    const float r = f32_from_bits(ax) + 0.5f;
    return static_cast<uint16_t>(sign | (f32_bits(r) - 0x3F000000u));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  const uint32_t odd = (ax >> 13) & 1u;
  ax += 0xC8000FFFu + odd;  // - (112 << 23) + 0xFFF + odd, modulo 2^32
  return static_cast<uint16_t>(sign | (ax >> 13));
}

static inline float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

static inline uint16_t f32_to_bf16(float f) {
  const uint32_t x = f32_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

// One element of a tensor of type `t` as float, and back (rounded to nearest even).
static inline float load_elem(const void* base, int64_t idx, opsfuse::DType t) {
  switch (t) {
    case opsfuse::DType::kFloat16: return f16_to_f32(static_cast<const uint16_t*>(base)[idx]);
    case opsfuse::DType::kBFloat16: return bf16_to_f32(static_cast<const uint16_t*>(base)[idx]);
    default: return static_cast<const float*>(base)[idx];
  }
}

static inline void store_elem(void* base, int64_t idx, opsfuse::DType t, float x) {
  switch (t) {
    case opsfuse::DType::kFloat16: static_cast<uint16_t*>(base)[idx] = f32_to_f16(x); break;
    case opsfuse::DType::kBFloat16: static_cast<uint16_t*>(base)[idx] = f32_to_bf16(x); break;
    default: static_cast<float*>(base)[idx] = x; break;
  }
}

}  // namespace
