// Internal to plugin/cuda: the float32 FusedAttention kernel. True float32 arithmetic on the CUDA
// cores (no TF32): the contract asks float32 inputs to keep float32 accuracy.
//
// One block = kBM query rows of one (batch, kv head) x one KV split, 128 threads as a 16 x 8 grid:
// thread (ti, tj) owns rows ti*RM..+RM; of S it owns keys tj*RN..+RN, of O columns tj*RD..+RD.
// Q and K are kept transposed in shared memory ([d][row]) so each thread reads float4 vectors;
// P goes through shared memory ([key][row]) between the two products. Same row packing, score
// contract, online softmax and split-KV epilogue as the tensor-core kernel.
#pragma once

#include "kernel_common.cuh"

namespace opsfuse::cuda::detail {

template <int kD, int kBM, int kBN>
struct F32Layout {
  static constexpr int kThreads = 128;
  static constexpr int RM = kBM / 16, RN = kBN / 8, RD = kD / 8;
  static constexpr int kQP = kBM + 4;  // pitch of sQt [kD][kQP]
  static constexpr int kKP = kBN + 4;  // pitch of sKt [kD][kKP]
  static constexpr int kVP = kD + 4;   // pitch of sV  [kBN][kVP]
  static constexpr int kPP = kBM + 4;  // pitch of sP  [kBN][kPP]
  static constexpr int kFloats = kD * kQP + kD * kKP + kBN * kVP + kBN * kPP;
  static constexpr int kSmemBytes = kFloats * 4;
};

template <int kD, int kBM, int kBN>
__global__ void __launch_bounds__(128) flash_f32_kernel(const KernelArgs a) {
  using L = F32Layout<kD, kBM, kBN>;
  constexpr int RM = L::RM, RN = L::RN, RD = L::RD;
  extern __shared__ __align__(16) float fsm[];
  float* sQt = fsm;
  float* sKt = sQt + kD * L::kQP;
  float* sV = sKt + kD * L::kKP;
  float* sP = sV + kBN * L::kVP;

  const int tid = threadIdx.x, ti = tid / 8, tj = tid % 8;
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

  RowInfo ri[RM];
#pragma unroll
  for (int x = 0; x < RM; ++x) ri[x] = make_row(a, b, hk, row0 + ti * RM + x, len);

  // Q^T into shared memory (zero beyond D and beyond the last row).
  const float* qb = static_cast<const float*>(a.q);
  for (int idx = tid; idx < kBM * kD; idx += 128) {
    const int r = idx / kD, d = idx % kD;
    const int gr = row0 + r;
    float val = 0.0f;
    if (gr < a.rows && d < D) {
      const int g = gr / a.seq_q, i = gr - g * a.seq_q;
      val = qb[b * a.q_stride[0] + (hk * a.group + g) * a.q_stride[1] + i * a.q_stride[2] + d];
    }
    sQt[d * L::kQP + r] = val;
  }
  const float* kb = static_cast<const float*>(a.k) + b * a.k_stride[0] + hk * a.k_stride[1];
  const float* vb = static_cast<const float*>(a.v) + b * a.v_stride[0] + hk * a.v_stride[1];

  float o[RM][RD];
  float m_run[RM], l_run[RM];
#pragma unroll
  for (int x = 0; x < RM; ++x) {
    m_run[x] = -INFINITY;
    l_run[x] = 0.0f;
#pragma unroll
    for (int c = 0; c < RD; ++c) o[x][c] = 0.0f;
  }
  const bool elementwise = a.mask_kind != 0 || a.softcap > 0.0f;

  for (int t = t_begin; t < t_end; ++t) {
    const int n0 = t * kBN;
    __syncthreads();  // previous tile's K, V, P fully consumed
    for (int idx = tid; idx < kBN * kD; idx += 128) {
      const int r = idx / kD, d = idx % kD;
      const bool ok = n0 + r < kr.n_end;
      sKt[d * L::kKP + r] = (ok && d < D) ? kb[(n0 + r) * a.k_stride[2] + d] : 0.0f;
      sV[r * L::kVP + d] = (ok && d < Dv) ? vb[(n0 + r) * a.v_stride[2] + d] : 0.0f;
    }
    __syncthreads();

    float s[RM][RN];
#pragma unroll
    for (int x = 0; x < RM; ++x)
#pragma unroll
      for (int y = 0; y < RN; ++y) s[x][y] = 0.0f;
    for (int d = 0; d < D; ++d) {
      float qa[RM], kv[RN];
#pragma unroll
      for (int x = 0; x < RM; ++x) qa[x] = sQt[d * L::kQP + ti * RM + x];
#pragma unroll
      for (int y = 0; y < RN; ++y) kv[y] = sKt[d * L::kKP + tj * RN + y];
#pragma unroll
      for (int x = 0; x < RM; ++x)
#pragma unroll
        for (int y = 0; y < RN; ++y) s[x][y] = fmaf(qa[x], kv[y], s[x][y]);
    }

    const bool slow = elementwise || n0 + kBN > kr.all_visible;
#pragma unroll
    for (int x = 0; x < RM; ++x) {
#pragma unroll
      for (int y = 0; y < RN; ++y) {
        const int j = n0 + tj * RN + y;
        s[x][y] = slow ? full_score<float>(a, s[x][y], ri[x], j) : s[x][y] * a.scale_log2;
      }
      float mx = m_run[x];
#pragma unroll
      for (int y = 0; y < RN; ++y) mx = fmaxf(mx, s[x][y]);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      const float base = mx == -INFINITY ? 0.0f : mx;
      const float alpha = exp2f(m_run[x] - base);
      m_run[x] = mx;
      float sum = 0.0f;
#pragma unroll
      for (int y = 0; y < RN; ++y) {
        const float p = exp2f(s[x][y] - base);
        sum += p;
        sP[(tj * RN + y) * L::kPP + ti * RM + x] = p;
      }
      l_run[x] = l_run[x] * alpha + sum;
#pragma unroll
      for (int c = 0; c < RD; ++c) o[x][c] *= alpha;
    }
    __syncthreads();

    const int n_valid = min(kBN, kr.n_end - n0);
    for (int j = 0; j < n_valid; ++j) {
      float pa[RM], vv[RD];
#pragma unroll
      for (int x = 0; x < RM; ++x) pa[x] = sP[j * L::kPP + ti * RM + x];
#pragma unroll
      for (int c = 0; c < RD; ++c) vv[c] = sV[j * L::kVP + tj * RD + c];
#pragma unroll
      for (int x = 0; x < RM; ++x)
#pragma unroll
        for (int c = 0; c < RD; ++c) o[x][c] = fmaf(pa[x], vv[c], o[x][c]);
    }
  }

#pragma unroll
  for (int x = 0; x < RM; ++x) {
    float l = l_run[x];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    l += __shfl_xor_sync(0xffffffffu, l, 4);
    const RowInfo& r = ri[x];
    if (!r.valid) continue;
    const int64_t grow = (static_cast<int64_t>(b) * a.heads_q + r.head) * a.seq_q + r.pos;
    if (a.num_splits == 1) {
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      float* yrow = static_cast<float*>(a.y) + b * a.y_stride[0] + r.head * a.y_stride[1] + r.pos * a.y_stride[2];
#pragma unroll
      for (int c = 0; c < RD; ++c)
        if (tj * RD + c < Dv) yrow[tj * RD + c] = o[x][c] * inv;
    } else {
      float* orow = split_o_row(a, grow);
#pragma unroll
      for (int c = 0; c < RD; ++c)
        if (tj * RD + c < Dv) orow[tj * RD + c] = o[x][c];
      if (tj == 0) store_split_ml(a, grow, m_run[x], l);
    }
  }
}

template <int kD, int kBM, int kBN>
cudaError_t launch_flash_f32(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  constexpr int kSmem = F32Layout<kD, kBM, kBN>::kSmemBytes;
  static int smem_done[64] = {};
  auto kernel = flash_f32_kernel<kD, kBM, kBN>;
  cudaError_t err = ensure_smem(kernel, kSmem, smem_done);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(plan.row_tiles) * a.batch * a.heads_kv, 1, plan.num_splits);
  kernel<<<grid, 128, kSmem, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace opsfuse::cuda::detail
