#include "bias_fold.h"

#include <cstdint>

#include "half_convert.h"

namespace opsfuse::cpu {
namespace {

size_t elem_bytes(DType t) { return t == DType::kFloat32 ? 4 : 2; }
size_t align64(size_t n) { return (n + 63) & ~size_t{63}; }

// One biased tensor: its logical (B, H, S, D) view and where its dense copy goes.
struct FoldJob {
  const void* src;
  const int64_t* stride;  // element strides of (B, H, S)
  const void* bias;       // (H*D,)
  int64_t heads, seq, dim;
  void* dst;
};

float load(const void* base, int64_t i, DType t) {
  switch (t) {
    case DType::kFloat16: return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::kBFloat16: return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

void store(void* base, int64_t i, float x, DType t) {
  switch (t) {
    case DType::kFloat16: static_cast<uint16_t*>(base)[i] = f32_to_f16(x); break;
    case DType::kBFloat16: static_cast<uint16_t*>(base)[i] = f32_to_bf16(x); break;
    default: static_cast<float*>(base)[i] = x;
  }
}

// Row r = (b * H + h) * S + s of the dense copy.
void fold_row(const FoldJob& j, int64_t r, DType t) {
  const int64_t s = r % j.seq, bh = r / j.seq, h = bh % j.heads, b = bh / j.heads;
  const int64_t src = b * j.stride[0] + h * j.stride[1] + s * j.stride[2];
  const int64_t bias = h * j.dim, dst = r * j.dim;
  for (int64_t d = 0; d < j.dim; ++d) store(j.dst, dst + d, load(j.src, src + d, t) + load(j.bias, bias + d, t), t);
}

}  // namespace

size_t folded_bytes(const AttentionParams& p) {
  const size_t e = elem_bytes(p.dtype);
  size_t n = 0;
  if (p.q_bias != nullptr) n += align64(static_cast<size_t>(p.batch * p.heads_q * p.seq_q * p.head_dim) * e);
  if (p.k_bias != nullptr) n += align64(static_cast<size_t>(p.batch * p.heads_kv * p.seq_k * p.head_dim) * e);
  if (p.v_bias != nullptr) n += align64(static_cast<size_t>(p.batch * p.heads_kv * p.seq_k * p.head_dim_v) * e);
  return n;
}

AttentionParams fold_biases(const AttentionParams& p, void* buffer, const ParallelFor& parallel_for) {
  AttentionParams out = p;
  FoldJob jobs[3];
  int n_jobs = 0;
  char* next = static_cast<char*>(buffer);
  auto add = [&](const void* src, const int64_t* stride, const void* bias, int64_t heads, int64_t seq, int64_t dim,
                 const void** ptr, int64_t* new_stride) {
    if (bias == nullptr) return;
    jobs[n_jobs++] = {src, stride, bias, heads, seq, dim, next};
    *ptr = next;
    new_stride[0] = heads * seq * dim;
    new_stride[1] = seq * dim;
    new_stride[2] = dim;
    next += align64(static_cast<size_t>(p.batch * heads * seq * dim) * elem_bytes(p.dtype));
  };
  add(p.q, p.q_stride, p.q_bias, p.heads_q, p.seq_q, p.head_dim, &out.q, out.q_stride);
  add(p.k, p.k_stride, p.k_bias, p.heads_kv, p.seq_k, p.head_dim, &out.k, out.k_stride);
  add(p.v, p.v_stride, p.v_bias, p.heads_kv, p.seq_k, p.head_dim_v, &out.v, out.v_stride);
  out.q_bias = out.k_bias = out.v_bias = nullptr;

  // Work items of ~64 rows, numbered across the jobs.
  constexpr int64_t kRowsPerItem = 64;
  int64_t first_item[4] = {0, 0, 0, 0};
  for (int i = 0; i < n_jobs; ++i) {
    const int64_t rows = p.batch * jobs[i].heads * jobs[i].seq;
    first_item[i + 1] = first_item[i] + (rows + kRowsPerItem - 1) / kRowsPerItem;
  }
  auto body = [&](int64_t item) {
    int j = 0;
    while (item >= first_item[j + 1]) ++j;
    const int64_t rows = p.batch * jobs[j].heads * jobs[j].seq;
    const int64_t r0 = (item - first_item[j]) * kRowsPerItem;
    for (int64_t r = r0; r < rows && r < r0 + kRowsPerItem; ++r) fold_row(jobs[j], r, p.dtype);
  };
  const int64_t items = first_item[n_jobs];
  if (parallel_for) {
    parallel_for(items, body);
  } else {
    for (int64_t i = 0; i < items; ++i) body(i);
  }
  return out;
}

}  // namespace opsfuse::cpu
