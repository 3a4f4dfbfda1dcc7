#include "bias_fold.h"

#include <cstdint>

#include "../common/biased_copies.h"
#include "half_convert.h"

namespace opsfuse::cpu {
namespace {

constexpr size_t kAlign = 64;

// Row r = (b * H + h) * S + s of the dense copy.
void fold_row(const BiasedCopy& c, int64_t r, DType t) {
  const int64_t s = r % c.seq, bh = r / c.seq, h = bh % c.heads, b = bh / c.heads;
  const int64_t src = b * c.src_stride[0] + h * c.src_stride[1] + s * c.src_stride[2];
  const int64_t bias = h * c.dim, dst = r * c.dim;
  for (int64_t d = 0; d < c.dim; ++d)
    store_elem(c.dst, dst + d, t, load_elem(c.src, src + d, t) + load_elem(c.bias, bias + d, t));
}

}  // namespace

size_t folded_bytes(const AttentionParams& p) { return plan_biased_copies(p, nullptr, kAlign).bytes; }

AttentionParams fold_biases(const AttentionParams& p, void* buffer, const ParallelFor& parallel_for) {
  const BiasedCopies copies = plan_biased_copies(p, buffer, kAlign);
  // Work items of ~64 rows, numbered across the copies.
  constexpr int64_t kRowsPerItem = 64;
  int64_t first_item[4] = {0, 0, 0, 0};
  for (int i = 0; i < copies.count; ++i)
    first_item[i + 1] = first_item[i] + (copies.copy[i].rows + kRowsPerItem - 1) / kRowsPerItem;
  auto body = [&](int64_t item) {
    int j = 0;
    while (item >= first_item[j + 1]) ++j;
    const BiasedCopy& c = copies.copy[j];
    const int64_t r0 = (item - first_item[j]) * kRowsPerItem;
    for (int64_t r = r0; r < c.rows && r < r0 + kRowsPerItem; ++r) fold_row(c, r, p.dtype);
  };
  const int64_t items = first_item[copies.count];
  if (parallel_for) {
    parallel_for(items, body);
  } else {
    for (int64_t i = 0; i < items; ++i) body(i);
  }
  return copies.reading;
}

}  // namespace opsfuse::cpu
