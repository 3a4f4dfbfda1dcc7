// attention_cuda_check: runs the CUDA launcher on a representative set of cases (every dtype, mask
// kind, key_lengths, both causal modes, softcap, GQA, odd sizes, D != Dv, split-KV decode, fully
// masked rows, Q/K/V biases) against a float64 host reference, with NaN-poisoned outputs. Small on purpose: it
// is the program compute-sanitizer runs (memcheck, racecheck) in scripts/gpu_run.sh.
// Exit code 0 when every case is within tolerance, 1 otherwise.
//
// Hopper cases ("hop ..."): each runs twice on the same data, once as the launcher chooses (the
// sm_90a kernel on a compute capability 9.0 device when the library has it) and once with
// OPSFUSE_CUDA_DISABLE_HOPPER=1 (the portable kernel; the first run sets OPSFUSE_CUDA_FORCE_HOPPER=1
// so that small grids take the Hopper kernel too); both against the reference, and on a 9.0
// device with the Hopper objects built in, the first run must really have taken the Hopper kernel.
// `--bench`: kernel times with the Hopper kernel as chosen, its A/B alternative, and off (run_bench).
// `--quick`: the first generic cases and a few small Hopper ones (what compute-sanitizer runs).
// `--stress NAME N`: the Hopper run of one Hopper case N times on the same data, failures only.
// `--only TEXT`: the Hopper cases whose names contain TEXT (both runs and their checks), nothing else.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/attention_cuda.h"
#include "cuda/hopper/hopper_modes.h"
#include "cuda/kernel_args.h"
#include "tool_support.h"

using opsfuse::AttentionParams;
using opsfuse::DType;
using opsfuse::MaskKind;

namespace {

struct Case {
  const char* name;
  DType dtype;
  int B, Hq, Hkv, Sq, Sk, D, Dv;
  int causal;
  float softcap;
  MaskKind mask;
  int mask_rank;  // 2: (Sq, Sk); 4: (B, 1, Sq, Sk); 1: (B, 1, 1, Sk) (random elements);
                  // 3: (B, 1, 1, Sk) as padding masks are (pad_length(): visible prefix, masked tail);
                  // 5: as 3, with an additive mask's tail at the element type's lowest value
                  // (transformers' (1 - mask) * finfo.min; a row without a visible key is then a
                  // softmax over its scores, not zeros)
  int key_lengths;  // 0 none, 32 or 64 bits
  int persist = 0;  // Hopper cases: 1 = OPSFUSE_CUDA_HOPPER_PERSISTENT=1 (a persistent grid wherever
                    // there are more row tiles than SMs, dynamically scheduled where choose_plan
                    // would: causal grids the snake does not balance, key_lengths); 2 = that with
                    // OPSFUSE_CUDA_HOPPER_DYNAMIC=0 (the static snake order on any shape);
                    // > 2 = the dynamic order with OPSFUSE_CUDA_HOPPER_SCHED_HEADS = persist - 2
  int splits = 0;   // Hopper cases: > 0 = OPSFUSE_CUDA_HOPPER_SPLITS (key splits merged in a cluster)
  int tail = 0;     // Hopper cases: 1 = OPSFUSE_CUDA_HOPPER_TAIL_SPLIT=1 (a persistent grid's partial
                    // last round split by keys in clusters of 2, wherever it fits)
  int stream_k = 0;  // Hopper cases: 1 = OPSFUSE_CUDA_HOPPER_STREAM_K=1 (a persistent grid sharing
                     // (row tile, key tile) units, cut items merged through the workspace)
  int bias = 0;      // 1: random Q, K and V biases (AttentionParams::q_bias ...; the reference adds
                     // them exactly), which the Hopper kernel adds itself and the others read as copies
  int wg_split = 0;  // Hopper cases: 1 = OPSFUSE_CUDA_HOPPER_WG_SPLIT=1 (64-row items whose key tiles
                     // the two consumer warpgroups split, also beyond one round of them)
  int chain = 0;     // Hopper cases: 1 = the Hopper pass must have taken item chaining (kPlainChain,
                     // as choose_plan and launch_hopper decide on 132 SMs), and must not have where
                     // OPSFUSE_CUDA_HOPPER_TMA_STORE=0, _CHAIN=0 or _CHAIN=N beyond its key tiles;
                     // 0 = not checked
  int seq = 0;       // Hopper cases: 1 = the Hopper pass must have taken the in-sequence kernel for
                     // short items (kPlainSeq) where the case's key tiles are within its bucket's
                     // limit (OPSFUSE_CUDA_HOPPER_SEQ=N / _SEQ_D128=N, else the plan's default), and
                     // not beyond it (nor where the 256-key tiles take the case, see `wide`)
  int wide = 0;      // Hopper cases: > 0 = OPSFUSE_CUDA_HOPPER_SEQ_WIDE=wide (in sequence on 256-key
                     // tiles, kPlainSeqWide), which must have run exactly where its rule allows
                     // (wide_allowed)
  int fast = 0;      // Hopper cases: 1 = the Hopper pass must have taken the kernel for whole, visible
                     // key tiles (kPlainFast) exactly where its rule allows (fast_allowed)
  int seq3 = 0;      // Hopper cases: 1 = the three-consumer kernel (kPlainSeq3, by default) must have run
                     // exactly where its rule allows (seq3_allowed). The seq and wide cases run with
                     // OPSFUSE_CUDA_HOPPER_SEQ3=0, so that their kernels run at its shapes too.
};

size_t esize(DType t) { return t == DType::kFloat32 ? 4 : 2; }

// mask_rank 3: batch b's visible prefix, by b % 6, so that one launch has key tiles (128 keys) of
// every class of the Hopper kernel's padding-mask classification: all visible (Sk), all masked
// (0: every row of that batch is fully masked -> zeros), a visible prefix ending inside a tile
// (odd: a column pair split), ending at a tile edge (128), a single key (1); -1: random elements
// (a mixed tile: the pair loads).
int pad_length(int b, int Sk) {
  const int kinds[6] = {Sk, 0, (Sk * 3 / 5) | 1, std::min(128, Sk), 1, -1};
  return kinds[b % 6];
}


// Rounds through the element type and writes its bytes.
double store_elem(DType t, void* base, size_t i, double x) {
  if (t == DType::kFloat32) {
    static_cast<float*>(base)[i] = static_cast<float>(x);
    return static_cast<float>(x);
  }
  if (t == DType::kFloat16) {
    __half h = __float2half_rn(static_cast<float>(x));
    static_cast<__half*>(base)[i] = h;
    return __half2float(h);
  }
  __nv_bfloat16 h = __float2bfloat16_rn(static_cast<float>(x));
  static_cast<__nv_bfloat16*>(base)[i] = h;
  return __bfloat162float(h);
}

double load_elem(DType t, const void* base, size_t i) {
  if (t == DType::kFloat32) return static_cast<const float*>(base)[i];
  if (t == DType::kFloat16) return __half2float(static_cast<const __half*>(base)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
}

// `repeats` > 1 (--stress): the launch and the comparison again on the same data, Y re-poisoned
// each time (the float64 reference, the slow part, is computed once); false if any run failed.
bool run_case(const Case& c, std::mt19937& rng, cudaStream_t stream, int repeats = 1) {
  std::normal_distribution<double> nd(0.0, 1.0);
  const size_t nq = size_t(c.B) * c.Hq * c.Sq * c.D, nk = size_t(c.B) * c.Hkv * c.Sk * c.D,
               nv = size_t(c.B) * c.Hkv * c.Sk * c.Dv, ny = size_t(c.B) * c.Hq * c.Sq * c.Dv;
  const size_t es = esize(c.dtype);
  std::vector<uint8_t> hq(nq * es), hk(nk * es), hv(nv * es), hy(ny * es);
  std::vector<double> q(nq), k(nk), v(nv);
  for (size_t i = 0; i < nq; ++i) q[i] = store_elem(c.dtype, hq.data(), i, nd(rng));
  for (size_t i = 0; i < nk; ++i) k[i] = store_elem(c.dtype, hk.data(), i, nd(rng));
  for (size_t i = 0; i < nv; ++i) v[i] = store_elem(c.dtype, hv.data(), i, nd(rng));
  // Biases (c.bias): (H * D,) per tensor, added to the reference's inputs in float64.
  const size_t nbq = c.bias ? size_t(c.Hq) * c.D : 0, nbk = c.bias ? size_t(c.Hkv) * c.D : 0,
               nbv = c.bias ? size_t(c.Hkv) * c.Dv : 0;
  std::vector<uint8_t> hbq(nbq * es), hbk(nbk * es), hbv(nbv * es);
  auto add_bias = [&](std::vector<double>& x, std::vector<uint8_t>& hb, size_t nb, int heads, int seq, int dim) {
    std::vector<double> b(nb);
    for (size_t i = 0; i < nb; ++i) b[i] = store_elem(c.dtype, hb.data(), i, nd(rng));
    for (size_t i = 0; nb && i < x.size(); ++i) x[i] += b[(i / (size_t(seq) * dim)) % heads * dim + i % dim];
  };
  add_bias(q, hbq, nbq, c.Hq, c.Sq, c.D);
  add_bias(k, hbk, nbk, c.Hkv, c.Sk, c.D);
  add_bias(v, hbv, nbv, c.Hkv, c.Sk, c.Dv);

  // Mask viewed as (B, Hq, Sq, Sk) through strides.
  int64_t ms[4] = {0, 0, 0, 0};
  size_t nm = 0;
  if (c.mask != MaskKind::kNone) {
    if (c.mask_rank == 2) {
      ms[2] = c.Sk, ms[3] = 1, nm = size_t(c.Sq) * c.Sk;
    } else if (c.mask_rank == 1 || c.mask_rank == 3 || c.mask_rank == 5) {
      ms[0] = c.Sk, ms[3] = 1, nm = size_t(c.B) * c.Sk;
    } else {
      ms[0] = int64_t(c.Sq) * c.Sk, ms[2] = c.Sk, ms[3] = 1, nm = size_t(c.B) * c.Sq * c.Sk;
    }
  }
  std::vector<uint8_t> hm(nm * (c.mask == MaskKind::kBool ? 1 : es));
  std::vector<double> madd(nm, 0.0);
  std::vector<char> mvis(nm, 1);
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  for (size_t i = 0; i < nm; ++i) {
    int plen = c.mask_rank == 3 || c.mask_rank == 5 ? pad_length(int(i / c.Sk), c.Sk) : -1;
    if (plen >= 0) {
      // Padding: bool True / additive +0 or -0 (alternating: both are "no change") on the prefix,
      // False / -inf (rank 5: the lowest finite value) after it.
      const bool vis = int(i % c.Sk) < plen;
      mvis[i] = vis;
      const double lowest = c.dtype == DType::kFloat16    ? -65504.0
                            : c.dtype == DType::kBFloat16 ? -3.3895313892515355e38
                                                          : -3.4028234663852886e38;
      const double tail = c.mask_rank == 5 ? lowest : -INFINITY;
      if (c.mask == MaskKind::kBool) hm[i] = vis;
      else madd[i] = store_elem(c.dtype, hm.data(), i, vis ? (i % 2 ? -0.0 : 0.0) : tail);
    } else if (c.mask == MaskKind::kBool) {
      // Row 0 of every mask fully False: exercises the fully-masked-row -> 0 rule.
      const bool row0 = (i % (size_t(c.Sq) * c.Sk)) < size_t(c.Sk);
      mvis[i] = row0 ? 0 : (ud(rng) < 0.8);
      hm[i] = mvis[i];
    } else {
      const double x = ud(rng) < 0.1 ? -INFINITY : nd(rng);
      madd[i] = store_elem(c.dtype, hm.data(), i, x);
    }
  }
  std::vector<int64_t> lens(c.B);
  for (int b = 0; b < c.B; ++b) lens[b] = c.key_lengths ? (b == 0 ? 0 : (int64_t)(rng() % (c.Sk + 1))) : c.Sk;
  if (c.key_lengths && c.B > 1) lens[c.B - 1] = c.Sk + 5;  // clamped to Sk by the kernel

  // Reference (float64).
  std::vector<double> ref(ny, 0.0);
  const int G = c.Hq / c.Hkv;
  const double scale = 1.0 / std::sqrt(double(c.D));
  std::vector<double> s(c.Sk);
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.Hq; ++h)
      for (int i = 0; i < c.Sq; ++i) {
        const int hk = h / G;
        const int64_t len = std::min<int64_t>(std::max<int64_t>(lens[b], 0), c.Sk);
        double mx = -INFINITY;
        for (int j = 0; j < c.Sk; ++j) {
          double acc = 0;
          for (int d = 0; d < c.D; ++d)
            acc += q[((size_t(b) * c.Hq + h) * c.Sq + i) * c.D + d] * k[((size_t(b) * c.Hkv + hk) * c.Sk + j) * c.D + d];
          double x = acc * scale;
          if (c.softcap > 0) x = c.softcap * std::tanh(x / c.softcap);
          bool vis = true;
          if (c.mask != MaskKind::kNone) {
            const size_t mi = b * ms[0] + h * ms[1] + i * ms[2] + j * ms[3];
            if (c.mask == MaskKind::kBool) vis = mvis[mi]; else x += madd[mi];
          }
          if (c.causal == 1 && j > i) vis = false;
          if (c.causal == 2 && j > i + (c.Sk - c.Sq)) vis = false;
          if (j >= len) vis = false;
          s[j] = vis ? x : -INFINITY;
          mx = std::max(mx, s[j]);
        }
        double* out = &ref[((size_t(b) * c.Hq + h) * c.Sq + i) * c.Dv];
        if (mx == -INFINITY) continue;
        double den = 0;
        for (int j = 0; j < c.Sk; ++j) den += (s[j] = std::exp(s[j] - mx));
        for (int j = 0; j < c.Sk; ++j)
          for (int d = 0; d < c.Dv; ++d) out[d] += s[j] / den * v[((size_t(b) * c.Hkv + hk) * c.Sk + j) * c.Dv + d];
      }

  void *dq, *dk, *dv, *dy, *dm = nullptr, *dl = nullptr, *ws = nullptr, *dbias[3] = {nullptr, nullptr, nullptr};
  const std::vector<uint8_t>* hbias[3] = {&hbq, &hbk, &hbv};
  for (int i = 0; i < 3 && c.bias; ++i) {
    CHECK_CUDA(cudaMalloc(&dbias[i], hbias[i]->size()));
    CHECK_CUDA(cudaMemcpy(dbias[i], hbias[i]->data(), hbias[i]->size(), cudaMemcpyHostToDevice));
  }
  CHECK_CUDA(cudaMalloc(&dq, hq.size() + 16));
  CHECK_CUDA(cudaMalloc(&dk, hk.size() + 16));
  CHECK_CUDA(cudaMalloc(&dv, hv.size() + 16));
  CHECK_CUDA(cudaMalloc(&dy, hy.size() + 16));
  CHECK_CUDA(cudaMemcpy(dq, hq.data(), hq.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dk, hk.data(), hk.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dv, hv.data(), hv.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(dy, 0xff, hy.size()));  // NaN poison
  if (nm) {
    CHECK_CUDA(cudaMalloc(&dm, hm.size()));
    CHECK_CUDA(cudaMemcpy(dm, hm.data(), hm.size(), cudaMemcpyHostToDevice));
  }
  if (c.key_lengths == 32) {
    std::vector<int32_t> l32(lens.begin(), lens.end());
    CHECK_CUDA(cudaMalloc(&dl, l32.size() * 4));
    CHECK_CUDA(cudaMemcpy(dl, l32.data(), l32.size() * 4, cudaMemcpyHostToDevice));
  } else if (c.key_lengths == 64) {
    CHECK_CUDA(cudaMalloc(&dl, lens.size() * 8));
    CHECK_CUDA(cudaMemcpy(dl, lens.data(), lens.size() * 8, cudaMemcpyHostToDevice));
  }

  AttentionParams p;
  p.q = dq, p.k = dk, p.v = dv, p.y = dy, p.mask = dm, p.key_lengths = dl;
  p.key_lengths_int64 = c.key_lengths == 64;
  p.q_bias = dbias[0], p.k_bias = dbias[1], p.v_bias = dbias[2];
  p.dtype = c.dtype;
  p.mask_kind = c.mask;
  p.batch = c.B, p.heads_q = c.Hq, p.heads_kv = c.Hkv, p.seq_q = c.Sq, p.seq_k = c.Sk;
  p.head_dim = c.D, p.head_dim_v = c.Dv;
  const int64_t qs[3] = {int64_t(c.Hq) * c.Sq * c.D, int64_t(c.Sq) * c.D, c.D};
  const int64_t ks[3] = {int64_t(c.Hkv) * c.Sk * c.D, int64_t(c.Sk) * c.D, c.D};
  const int64_t vs[3] = {int64_t(c.Hkv) * c.Sk * c.Dv, int64_t(c.Sk) * c.Dv, c.Dv};
  const int64_t ys[3] = {int64_t(c.Hq) * c.Sq * c.Dv, int64_t(c.Sq) * c.Dv, c.Dv};
  for (int i = 0; i < 3; ++i) p.q_stride[i] = qs[i], p.k_stride[i] = ks[i], p.v_stride[i] = vs[i], p.y_stride[i] = ys[i];
  for (int i = 0; i < 4; ++i) p.mask_stride[i] = ms[i];
  p.scale = static_cast<float>(scale);
  p.softcap = c.softcap;
  p.is_causal = c.causal;
  const size_t wsb = opsfuse::cuda::workspace_size(p);
  if (wsb) CHECK_CUDA(cudaMalloc(&ws, wsb));
  bool all_ok = true;
  for (int run = 0; run < repeats; ++run) {
    if (run > 0) CHECK_CUDA(cudaMemset(dy, 0xff, hy.size()));
    // The uploads and the NaN poison went through the legacy default stream (cudaMemset is
    // asynchronous), which a non-blocking stream does not wait for: without this, a busy GPU can
    // land the poison after the kernel's stores (seen once under pytest's parallel GPU tests).
    CHECK_CUDA(cudaDeviceSynchronize());
    const opsfuse::Status st = opsfuse::cuda::launch(p, ws, wsb, stream);
    if (st != opsfuse::Status::kOk) {
      std::printf("FAIL %-28s launch: %s: %s\n", c.name, opsfuse::status_name(st),
                  opsfuse::cuda::last_error_message());
      all_ok = false;
      break;
    }
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaMemcpy(hy.data(), dy, hy.size(), cudaMemcpyDeviceToHost));

    double num = 0, den = 0, max_abs = 0;
    bool nan = false;
    for (size_t i = 0; i < ny; ++i) {
      const double y = load_elem(c.dtype, hy.data(), i);
      if (!std::isfinite(y)) nan = true;
      num += (y - ref[i]) * (y - ref[i]);
      den += ref[i] * ref[i];
      max_abs = std::max(max_abs, std::fabs(y - ref[i]));
    }
    const double rel = std::sqrt(num / std::max(den, 1e-30));
    const double tol = c.dtype == DType::kFloat32 ? 1e-5 : (c.dtype == DType::kFloat16 ? 2e-3 : 1.6e-2);
    const bool ok = !nan && rel <= tol;
    if (!ok || repeats == 1)
      std::printf("%s %-28s rel %.3e max_abs %.3e (tol %.1e) workspace %zu%s\n", ok ? "ok  " : "FAIL", c.name, rel,
                  max_abs, tol, wsb, nan ? " NaN/unwritten" : "");
    all_ok = all_ok && ok;
  }
  cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dy);
  if (dm) cudaFree(dm);
  if (dl) cudaFree(dl);
  if (ws) cudaFree(ws);
  for (void* b : dbias)
    if (b) cudaFree(b);
  return all_ok;
}

// The persistent-grid switches of a case (Case::persist).
void set_persistence(const Case& c) {
  if (c.persist == 0) return;
  setenv("OPSFUSE_CUDA_HOPPER_PERSISTENT", "1", 1);
  if (c.persist == 2) setenv("OPSFUSE_CUDA_HOPPER_DYNAMIC", "0", 1);
  if (c.persist > 2) setenv("OPSFUSE_CUDA_HOPPER_SCHED_HEADS", std::to_string(c.persist - 2).c_str(), 1);
}

// Every Hopper schedule switch a case asks for (persistence, key / tail / warpgroup splits, stream-K).
void set_schedule_switches(const Case& c) {
  set_persistence(c);
  if (c.splits > 0) setenv("OPSFUSE_CUDA_HOPPER_SPLITS", std::to_string(c.splits).c_str(), 1);
  if (c.tail) setenv("OPSFUSE_CUDA_HOPPER_TAIL_SPLIT", "1", 1);
  if (c.stream_k) setenv("OPSFUSE_CUDA_HOPPER_STREAM_K", "1", 1);
  if (c.wg_split) setenv("OPSFUSE_CUDA_HOPPER_WG_SPLIT", "1", 1);
  if (c.wide > 0) setenv("OPSFUSE_CUDA_HOPPER_SEQ_WIDE", std::to_string(c.wide).c_str(), 1);
  if (c.seq != 0 || c.wide > 0) setenv("OPSFUSE_CUDA_HOPPER_SEQ3", "0", 1);
}

// An environment variable's value as the caller set it ("" when unset), and putting it back.
std::string env_value(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}
void restore_env(const char* name, const std::string& value) {
  if (value.empty()) unsetenv(name);
  else setenv(name, value.c_str(), 1);
}

// Runs `c` twice on the same data (same rng seed): Hopper kernel allowed, then disabled.
bool run_hopper_pair(const Case& c, uint32_t seed, cudaStream_t stream, bool hopper_expected) {
  bool ok = true;
  int kinds[2] = {-1, -1};
  int modes[2] = {-1, -1};
  const std::string persist_env = env_value("OPSFUSE_CUDA_HOPPER_PERSISTENT");
  const std::string tail_env = env_value("OPSFUSE_CUDA_HOPPER_TAIL_SPLIT");
  const std::string sk_env = env_value("OPSFUSE_CUDA_HOPPER_STREAM_K");
  const std::string dyn_env = env_value("OPSFUSE_CUDA_HOPPER_DYNAMIC");
  const std::string sched_env = env_value("OPSFUSE_CUDA_HOPPER_SCHED_HEADS");
  const std::string wg_env = env_value("OPSFUSE_CUDA_HOPPER_WG_SPLIT");
  const std::string wide_env = env_value("OPSFUSE_CUDA_HOPPER_SEQ_WIDE");
  const std::string seq3_env = env_value("OPSFUSE_CUDA_HOPPER_SEQ3");
  for (int pass = 0; pass < 2; ++pass) {
    // Pass 0: the Hopper kernel also where the portable plan would split the keys (small grids).
    if (pass == 0) {
      unsetenv("OPSFUSE_CUDA_DISABLE_HOPPER");
      setenv("OPSFUSE_CUDA_FORCE_HOPPER", "1", 1);
      set_schedule_switches(c);
    } else {
      if (c.splits > 0) unsetenv("OPSFUSE_CUDA_HOPPER_SPLITS");
      // Back to the environment's own value: an OPSFUSE_CUDA_HOPPER_PERSISTENT given by the caller
      // (A/B runs) holds for every later case too.
      if (c.persist) {
        restore_env("OPSFUSE_CUDA_HOPPER_PERSISTENT", persist_env);
        restore_env("OPSFUSE_CUDA_HOPPER_DYNAMIC", dyn_env);
        restore_env("OPSFUSE_CUDA_HOPPER_SCHED_HEADS", sched_env);
      }
      if (c.tail) restore_env("OPSFUSE_CUDA_HOPPER_TAIL_SPLIT", tail_env);
      if (c.stream_k) restore_env("OPSFUSE_CUDA_HOPPER_STREAM_K", sk_env);
      if (c.wg_split) restore_env("OPSFUSE_CUDA_HOPPER_WG_SPLIT", wg_env);
      if (c.wide > 0) restore_env("OPSFUSE_CUDA_HOPPER_SEQ_WIDE", wide_env);
      if (c.seq != 0 || c.wide > 0) restore_env("OPSFUSE_CUDA_HOPPER_SEQ3", seq3_env);
      unsetenv("OPSFUSE_CUDA_FORCE_HOPPER");
      setenv("OPSFUSE_CUDA_DISABLE_HOPPER", "1", 1);
    }
    std::mt19937 rng(seed);
    std::printf("  [%s] ", pass == 0 ? "hopper  " : "portable");
    ok = run_case(c, rng, stream) && ok;
    kinds[pass] = opsfuse::cuda::detail::last_launch_kind();
    modes[pass] = opsfuse::cuda::detail::last_hopper_mode();
  }
  unsetenv("OPSFUSE_CUDA_DISABLE_HOPPER");
  const int hopper = static_cast<int>(opsfuse::cuda::detail::KernelKind::kHopper);
  if (kinds[1] == hopper || (hopper_expected && kinds[0] != hopper)) {
    std::printf("FAIL %-28s kernel kinds %d / %d (Hopper = %d expected on the first run only)\n", c.name, kinds[0],
                kinds[1], hopper);
    ok = false;
  }
  // A case that names a mode must have run in it exactly where the run's switches allow it.
  auto expect_mode = [&](bool asked, int mode, bool allowed, const char* what, const char* refused) {
    if (!hopper_expected || !asked || (modes[0] == mode) == allowed) return;
    std::printf("FAIL %-28s Hopper mode %d, %s (%d) %s\n", c.name, modes[0], what, mode,
                allowed ? "expected" : refused);
    ok = false;
  };
  const bool wide = std::max(c.D, c.Dv) > 64;
  // Whole, visible key tiles (kPlainFast's shapes): plain launches in the D = 128 bucket without
  // causal or key_lengths whose keys fill whole 128-key tiles, unsplit, without stream-K
  // (launch_hopper). Chaining leaves them to kPlainFast.
  const bool fast_shape = env_value("OPSFUSE_CUDA_HOPPER_FAST") != "0" && wide && std::max(c.D, c.Dv) <= 128 &&
                          c.causal == 0 && c.key_lengths == 0 && c.mask == MaskKind::kNone && !(c.softcap > 0.0f) &&
                          c.splits == 0 && c.tail == 0 && c.stream_k == 0 && c.wg_split == 0 && c.Sk % 128 == 0;
  // Chaining stores each item as the next one starts, through the TMA store's staging: the launcher
  // must not take it where the run asks for register stores or no chaining, or (CHAIN=N) chaining
  // from more key tiles than the case has, or where kPlainFast applies.
  const std::string chain_env = env_value("OPSFUSE_CUDA_HOPPER_CHAIN");
  const opsfuse::cuda::detail::Plan plan_defaults{};
  const int chain_default = c.causal != 0 ? plan_defaults.chain_tiles_causal : plan_defaults.chain_tiles;
  const int chain_from = chain_env.empty() || chain_env == "1" ? chain_default : std::atoi(chain_env.c_str());
  const bool chain_allowed = env_value("OPSFUSE_CUDA_HOPPER_TMA_STORE") != "0" && chain_from > 0 &&
                             static_cast<int64_t>(chain_from) * 128 <= c.Sk && !fast_shape;
  expect_mode(c.chain != 0, opsfuse::cuda::detail::hopper::kPlainChain, chain_allowed, "item chaining",
              "taken although TMA stores or chaining are off, or where kPlainFast applies");
  // Short items in sequence: up to the limit of the case's head-size bucket, OPSFUSE_CUDA_HOPPER_SEQ=N
  // (D <= 64) or _SEQ_D128=N (D <= 128) key tiles, else the plan's default.
  const std::string seq_env = env_value(wide ? "OPSFUSE_CUDA_HOPPER_SEQ_D128" : "OPSFUSE_CUDA_HOPPER_SEQ");
  const int seq_limit =
      !seq_env.empty() ? std::atoi(seq_env.c_str()) : wide ? plan_defaults.seq_tiles_d128 : plan_defaults.seq_tiles;
  // The 256-key tiles (kPlainSeqWide): D <= 64 plain launches without causal or key_lengths whose
  // keys fill 2 to the limit's 256-key tiles exactly (launch_hopper); they take the case first.
  const std::string wide_limit_env = c.wide > 0 ? std::to_string(c.wide) : env_value("OPSFUSE_CUDA_HOPPER_SEQ_WIDE");
  const int wide_limit = !wide_limit_env.empty() ? std::atoi(wide_limit_env.c_str()) : plan_defaults.seq_wide_tiles;
  const bool wide_allowed = !wide && c.causal == 0 && c.key_lengths == 0 && c.mask == MaskKind::kNone &&
                            !(c.softcap > 0.0f) && c.stream_k == 0 && c.wg_split == 0 && c.Sk % 256 == 0 &&
                            c.Sk >= 512 && c.Sk <= wide_limit * 256;
  expect_mode(c.seq != 0, opsfuse::cuda::detail::hopper::kPlainSeq, (c.Sk + 127) / 128 <= seq_limit && !wide_allowed,
              "short items in sequence", "taken beyond the OPSFUSE_CUDA_HOPPER_SEQ(_D128) limit or where 256-key tiles apply");
  expect_mode(c.wide != 0, opsfuse::cuda::detail::hopper::kPlainSeqWide, wide_allowed,
              "short items in sequence on 256-key tiles", "taken where its rule does not allow it");
  // kPlainFast: its shapes that the in-sequence kernel did not take. The cases that ask pick shapes
  // without a tail split (more than 1.5 rounds of items on 132 SMs, or one round).
  const bool fast_allowed = fast_shape && c.Sk / 128 > seq_limit;
  expect_mode(c.fast != 0, opsfuse::cuda::detail::hopper::kPlainFast, fast_allowed, "whole visible key tiles",
              "taken where its rule does not allow it");
  // Three consumer warpgroups (kPlainSeq3): plain D <= 64 launches without causal, key_lengths or
  // biases over 3 to 8 whole 128-key tiles, unsplit, whose 128-row items fit one round on the
  // device's SMs but whose 64-row items do not (those take the warpgroup split), with Y through TMA
  // stores (launch_hopper, choose_plan).
  int dev = 0, sms = 0;
  CHECK_CUDA(cudaGetDevice(&dev));
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t items = static_cast<int64_t>((c.Sq + 127) / 128) * c.B * c.Hq;
  const int64_t half_items = static_cast<int64_t>((c.Sq + 63) / 64) * c.B * c.Hq;
  const bool seq3_allowed = !wide && c.causal == 0 && c.key_lengths == 0 && c.mask == MaskKind::kNone &&
                            !(c.softcap > 0.0f) && c.bias == 0 && c.splits == 0 && c.tail == 0 && c.stream_k == 0 &&
                            c.wg_split == 0 && c.persist == 0 && c.Sk % 128 == 0 && c.Sk >= 3 * 128 &&
                            c.Sk <= 8 * 128 && items <= sms && half_items > sms && env_value("OPSFUSE_CUDA_HOPPER_TMA_STORE") != "0";
  expect_mode(c.seq3 != 0, opsfuse::cuda::detail::hopper::kPlainSeq3, seq3_allowed, "three consumer warpgroups",
              "taken where its rule does not allow it");
  return ok;
}

// --bench: kernel time (CUDA events, constant inputs) of the prefill grid (bf16, D = 128), the seed
// shapes (f16, D = 64) and BERT-base attention with HF's expanded (B,1,S,S) additive mask or the
// rewrite's (B,1,1,S) bool mask (all True, or padded as python -m opsfuse.bench.bert pads), each
// with the Hopper kernel as chosen ("hopper"), its alternative ("alt": persistent grid off for
// launches without a mask, or the Hopper kernel forced on small grids; masks through the general
// scoring), without the inter-warpgroup pingpong, and off.
int run_bench(cudaStream_t stream) {
  // mask: 0 none, 1 additive (B,1,S,S), 2 bool (B,1,1,S) all True, 3 bool (B,1,1,S) padded: row i
  // keeps S - round(i * 0.4 * S / (B - 1)) keys (bench.bert's 'padded' feeds)
  struct B { DType dt; int b, h, s, d, causal, mask; };
  const DType BF = DType::kBFloat16, H = DType::kFloat16;
  const B grid[] = {{BF, 8, 16, 1024, 128, 0, 0}, {BF, 8, 16, 4096, 128, 0, 0}, {BF, 2, 16, 16384, 128, 0, 0},
                    {BF, 8, 16, 1024, 128, 1, 0}, {BF, 8, 16, 4096, 128, 1, 0}, {BF, 2, 16, 16384, 128, 1, 0},
                    {H, 1, 12, 512, 64, 0, 0},    {H, 1, 12, 1024, 64, 0, 0},   {H, 1, 12, 2048, 64, 0, 0},
                    {H, 8, 12, 128, 64, 0, 1},
                    {H, 8, 12, 512, 64, 0, 1},    {H, 8, 12, 512, 64, 0, 0},    {H, 8, 12, 512, 64, 0, 2},
                    {H, 8, 12, 128, 64, 0, 0},    {H, 8, 12, 128, 64, 0, 3},    {H, 8, 12, 512, 64, 0, 3}};
  for (const B& g : grid) {
    const int D = g.d;
    opsfuse::tools::DenseQkv buffers;
    AttentionParams p = opsfuse::tools::dense_params(&buffers, g.dt, g.b, g.h, g.h, g.s, g.s, D, 0x3c, 0x3b, 0x3d);
    void* m = nullptr;
    if (g.mask == 1) {  // zeros: every key visible, the mask still read
      CHECK_CUDA(cudaMalloc(&m, size_t(g.b) * g.s * g.s * 2));
      CHECK_CUDA(cudaMemset(m, 0, size_t(g.b) * g.s * g.s * 2));
      p.mask_kind = MaskKind::kAdditive;
      p.mask_stride[0] = int64_t(g.s) * g.s, p.mask_stride[1] = 0, p.mask_stride[2] = g.s, p.mask_stride[3] = 1;
    } else if (g.mask == 2 || g.mask == 3) {
      CHECK_CUDA(cudaMalloc(&m, size_t(g.b) * g.s));
      std::vector<uint8_t> hm(size_t(g.b) * g.s, 1);
      for (int r = 0; g.mask == 3 && r < g.b && g.b > 1; ++r) {
        const int keep = std::max(1, g.s - int(std::nearbyint(r * 0.4 * g.s / (g.b - 1))));
        std::fill(hm.begin() + size_t(r) * g.s + keep, hm.begin() + size_t(r + 1) * g.s, uint8_t(0));
      }
      CHECK_CUDA(cudaMemcpy(m, hm.data(), hm.size(), cudaMemcpyHostToDevice));
      p.mask_kind = MaskKind::kBool;
      p.mask_stride[0] = g.s, p.mask_stride[1] = 0, p.mask_stride[2] = 0, p.mask_stride[3] = 1;
    }
    p.mask = m;
    p.scale = 1.0f / std::sqrt(float(D));
    p.is_causal = g.causal;
    const double flops = 4.0 * g.b * g.h * double(g.s) * g.s * D * (g.causal ? 0.5 : 1.0);
    std::printf("bench %s D=%d B=%d H=%d S=%d causal=%d mask=%s:", g.dt == BF ? "bf16" : "f16", D, g.b, g.h, g.s,
                g.causal,
                g.mask == 1 ? "add(B,1,S,S)" : (g.mask == 2 ? "bool(B,1,1,S)" : (g.mask == 3 ? "bool-padded" : "none")));
    // Small grids (e.g. seed S=512: 48 blocks, where the portable plan splits the keys and the
    // launcher keeps it): the alternative is the Hopper kernel forced.
    const bool small = int64_t(g.b) * g.h * ((g.s + 127) / 128) * 2 <= 132;
    const char* alt_env = g.mask ? "OPSFUSE_CUDA_HOPPER_MASK_PAIRS"
                                 : (small ? "OPSFUSE_CUDA_FORCE_HOPPER" : "OPSFUSE_CUDA_HOPPER_PERSISTENT");
    const char* alt_val = small && !g.mask ? "1" : "0";
    for (int pass = 0; pass < 4; ++pass) {
      if (pass == 1) setenv(alt_env, alt_val, 1);
      if (pass == 2) {
        unsetenv(alt_env);
        setenv("OPSFUSE_CUDA_HOPPER_PINGPONG", "0", 1);
      }
      if (pass == 3) {
        unsetenv("OPSFUSE_CUDA_HOPPER_PINGPONG");
        setenv("OPSFUSE_CUDA_DISABLE_HOPPER", "1", 1);
      }
      const size_t wsb = opsfuse::cuda::workspace_size(p);
      void* ws = nullptr;
      if (wsb) CHECK_CUDA(cudaMalloc(&ws, wsb));
      cudaEvent_t e0, e1;
      CHECK_CUDA(cudaEventCreate(&e0));
      CHECK_CUDA(cudaEventCreate(&e1));
      const int iters = g.s >= 16384 ? 5 : (g.s <= 1024 ? 50 : 20);
      CHECK_CUDA(cudaDeviceSynchronize());  // the memsets above ran on the legacy default stream
      bool ok = opsfuse::cuda::launch(p, ws, wsb, stream) == opsfuse::Status::kOk;  // warm-up
      const int kind = opsfuse::cuda::detail::last_launch_kind();
      CHECK_CUDA(cudaEventRecord(e0, stream));
      for (int i = 0; i < iters && ok; ++i) ok = opsfuse::cuda::launch(p, ws, wsb, stream) == opsfuse::Status::kOk;
      CHECK_CUDA(cudaEventRecord(e1, stream));
      CHECK_CUDA(cudaEventSynchronize(e1));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
      const double us = 1000.0 * ms / iters;
      const char* label = pass == 0 ? "hopper" : (pass == 1 ? "alt" : (pass == 2 ? "no-pingpong" : "portable"));
      if (ok) std::printf("  %s(kind %d) %.1f us %.0f TFLOP/s", label, kind, us, flops / us * 1e-6);
      else std::printf("  %s launch failed: %s", label, opsfuse::cuda::last_error_message());
      CHECK_CUDA(cudaEventDestroy(e0));
      CHECK_CUDA(cudaEventDestroy(e1));
      if (ws) CHECK_CUDA(cudaFree(ws));
    }
    unsetenv("OPSFUSE_CUDA_DISABLE_HOPPER");
    std::printf("\n");
    opsfuse::tools::free_dense(buffers);
    if (m) CHECK_CUDA(cudaFree(m));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a run cut short by `timeout` still shows its lines
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const bool bench = argc > 1 && std::strcmp(argv[1], "--bench") == 0;
  const DType F = DType::kFloat32, H = DType::kFloat16, BF = DType::kBFloat16;
  const MaskKind N = MaskKind::kNone, MB = MaskKind::kBool, MA = MaskKind::kAdditive;
  const Case cases[] = {
      {"f16 plain 97x97 d64", H, 2, 3, 3, 97, 97, 64, 64, 0, 0.f, N, 0, 0},
      {"bf16 causal1 130x130 d128", BF, 1, 2, 2, 130, 130, 128, 128, 1, 0.f, N, 0, 0},
      {"f16 causal2 33x100 d40/80", H, 2, 4, 2, 33, 100, 40, 80, 2, 0.f, N, 0, 0},
      {"bf16 boolmask+kl32 d96", BF, 3, 2, 1, 65, 77, 96, 96, 0, 0.f, MB, 4, 32},
      {"f16 addmask+softcap d256", H, 1, 2, 2, 70, 90, 256, 256, 0, 30.f, MA, 2, 0},
      {"bf16 decode gqa4 kl64 split", BF, 2, 8, 2, 1, 1500, 128, 128, 2, 0.f, N, 0, 64},
      {"f16 decode mha split", H, 2, 4, 4, 1, 2000, 64, 64, 0, 0.f, N, 0, 0},
      {"f32 plain d64", F, 2, 2, 2, 70, 129, 64, 64, 0, 0.f, N, 0, 0},
      {"f32 causal1 gqa d80/40", F, 1, 4, 2, 50, 50, 80, 40, 1, 0.f, MB, 2, 32},
      {"f32 addmask softcap d256", F, 1, 2, 1, 20, 40, 256, 200, 2, 20.f, MA, 4, 0},
      {"f32 decode split d128", F, 2, 8, 8, 1, 3000, 128, 128, 0, 0.f, N, 0, 0},
      // Padding masks at the element type's lowest value (pad_length(): batch 1's rows have no
      // visible key -- a uniform softmax, bf16's and float32's lowest are below -FLT_MAX / log2(e))
      // through the float32, the mma.sync (D=40) and the decode kernels.
      {"f32 floorpad d64 97", F, 6, 2, 2, 97, 300, 64, 64, 0, 0.f, MA, 5, 0},
      {"bf16 floorpad d40 causal2", BF, 6, 2, 1, 70, 200, 40, 40, 2, 0.f, MA, 5, 0},
      {"bf16 floorpad decode gqa4 d128", BF, 6, 8, 2, 1, 1025, 128, 128, 0, 0.f, MA, 5, 0},
      {"f32 floorpad decode d64", F, 6, 4, 4, 1, 777, 64, 64, 0, 0.f, MA, 5, 0},
      {"bf16 prefill split 8x4096", BF, 1, 1, 1, 8, 4096, 128, 128, 0, 0.f, N, 0, 0},
      // Q/K/V biases read as biased copies (bias_fold.h): mma.sync prefill, float32, split decode.
      {"f16 bias causal2 gqa2 d80", H, 2, 4, 2, 97, 150, 80, 80, 2, 0.f, MA, 2, 0, 0, 0, 0, 0, 1},
      {"f32 bias kl32 d64", F, 3, 2, 1, 70, 129, 64, 64, 0, 0.f, N, 0, 32, 0, 0, 0, 0, 1},
      {"bf16 bias decode split gqa4 d128", BF, 2, 8, 2, 1, 1500, 128, 128, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 1},
  };
  // Cases for the Hopper kernel (float16 / bfloat16; D and Dv <= 128 up to the D = 256 block at the
  // end; D = 40 / Dv = 80 and D = 96
  // through the zero-filled bucket columns): odd sizes (not multiples of
  // the 128x128 tiles), causal 1 and 2, masks (bool with fully masked rows, additive), softcap,
  // key_lengths (incl. 0: every row of batch 0 fully masked, and > Sk: clamped), GQA group 4.
  const Case hopper_cases[] = {
      {"hop bf16 d128 1000x1537", BF, 1, 2, 2, 1000, 1537, 128, 128, 0, 0.f, N, 0, 0},
      {"hop f16 d64 causal1 gqa4", H, 2, 8, 2, 300, 300, 64, 64, 1, 0.f, N, 0, 0},
      {"hop bf16 d128 causal2 kl32", BF, 3, 2, 1, 200, 777, 128, 128, 2, 0.f, N, 0, 32},
      {"hop f16 d128 boolmask softcap", H, 2, 4, 2, 257, 520, 128, 128, 0, 30.f, MB, 4, 0},
      {"hop bf16 d64 addmask gqa4", BF, 1, 4, 1, 130, 129, 64, 64, 0, 0.f, MA, 2, 0},
      {"hop f16 d64 causal1 kl64", H, 3, 2, 2, 513, 513, 64, 64, 1, 0.f, MB, 2, 64},
      {"hop bf16 d128 causal1 1000x1000", BF, 1, 2, 2, 1000, 1000, 128, 128, 1, 0.f, N, 0, 0},
      {"hop f16 d40/80 causal2 gqa2", H, 2, 4, 2, 150, 333, 40, 80, 2, 0.f, N, 0, 0},
      {"hop bf16 d96 addmask softcap", BF, 1, 3, 1, 260, 200, 96, 96, 1, 20.f, MA, 4, 0},
      // Masks read as column pairs (even Sk, no softcap): (B,1,S,S) additive as HF exports BERT's,
      // (B,1,1,Sk) bool padding masks (one row read for both rows of a thread) with odd key
      // lengths (a pair's second key past the limit: one element read), (Sq,Sk) additive causal 2.
      {"hop f16 d128 addmask B1SS", H, 2, 3, 3, 200, 300, 128, 128, 0, 0.f, MA, 4, 0},
      {"hop bf16 d64 boolpad causal1 kl32", BF, 3, 2, 2, 260, 260, 64, 64, 1, 0.f, MB, 1, 32},
      {"hop f16 d64 addmask causal2 gqa2", H, 1, 4, 2, 100, 258, 64, 64, 2, 0.f, MA, 2, 0},
      {"hop bf16 d128 boolmask B1SS kl64", BF, 2, 2, 1, 130, 390, 128, 128, 0, 0.f, MB, 4, 64},
      // Persistent grids: more row tiles (144, 150, 140, 144) than an H100/H200 has
      // multiprocessors (132), the blocks loop over several tiles each; as choose_plan decides
      // (non-causal with a pair mask and GQA 3: the static snake; causal with 4 row tiles per head
      // and a bool padding mask: the snake, which balances it), the dynamic order (causal 2 with
      // Sq > Sk: tiles without any key, i.e. zero K/V tiles, and key_lengths 0 for batch 0; causal 1
      // with 5 row tiles per head), and those two in the static snake (forced).
      {"hop f16 d64 persistent addmask gqa3", H, 2, 9, 3, 1000, 300, 64, 64, 0, 0.f, MA, 2, 0},
      {"hop bf16 d128 persistent causal2 kl32", BF, 3, 10, 5, 600, 400, 128, 128, 2, 0.f, N, 0, 32, 1},
      {"hop f16 d128 persistent causal1 gqa2", H, 2, 14, 7, 520, 520, 128, 128, 1, 0.f, N, 0, 0, 1},
      {"hop bf16 d64 persistent causal1 Sq512", BF, 2, 18, 6, 512, 512, 64, 64, 1, 0.f, MB, 1, 0},
      {"hop bf16 d128 snake causal2 kl32", BF, 3, 10, 5, 600, 400, 128, 128, 2, 0.f, N, 0, 32, 2},
      {"hop f16 d128 snake causal1 gqa2", H, 2, 14, 7, 520, 520, 128, 128, 1, 0.f, N, 0, 0, 2},
      // The dynamic order (choose_plan's, no switch): causal 1 with 14 row tiles per head (168
      // items) in sections of 5 (batch, head) pairs (the last one of 2), GQA 2, a padding mask;
      // key_lengths with GQA 2 (160 items, batch 0's length 0: items without key tiles).
      {"hop f16 d64 dynamic causal1 sections5", H, 3, 4, 2, 1700, 1700, 64, 64, 1, 0.f, MB, 3, 0, 7},
      {"hop bf16 d128 dynamic kl64 gqa2", BF, 4, 8, 4, 600, 700, 128, 128, 0, 0.f, N, 0, 64},
      // Key splits merged in a thread-block cluster (opt-in, OPSFUSE_CUDA_HOPPER_SPLITS): 2 splits
      // of a B=1 H=12 S=2048-like grid (192 row tiles), 4 splits of 8 key tiles with a padding mask,
      // 3 splits (uneven), a split left without keys by causal 1 / key_lengths (partials of max
      // -inf merged: zeros, never NaN), softcap with a bool mask, Dv != D.
      {"hop f16 d64 split addmask gqa3", H, 1, 12, 4, 2000, 2000, 64, 64, 0, 0.f, MA, 2, 0, 0, 2},
      {"hop bf16 d128 split4 boolpad", BF, 2, 6, 6, 1000, 1000, 128, 128, 0, 0.f, MB, 1, 0, 0, 4},
      {"hop f16 d128 split3 causal1 kl64", H, 2, 4, 2, 300, 600, 128, 128, 1, 0.f, N, 0, 64, 0, 3},
      {"hop bf16 d64 split4 boolmask softcap", BF, 1, 3, 1, 200, 700, 64, 64, 0, 25.f, MB, 4, 32, 0, 4},
      {"hop f16 d40/80 split2 causal2", H, 2, 4, 2, 130, 520, 40, 80, 2, 0.f, MA, 2, 0, 0, 2},
      // Padding masks (B,1,1,Sk) (mask_rank 3, pad_length(): per batch all visible, all masked,
      // a prefix ending inside / at the edge of a key tile, one key, random): the kernel classifies
      // each key tile once and scores uniform tiles without the mask (kScoreFast / kScoreNone),
      // prefix and random ones through the pair loads; each batch's first tile is of a different
      // class, through the key loop's first step (session 15). Sk not a multiple of 128,
      // GQA, causal 1 / 2 and key_lengths on top (the classes count keys below the key length
      // only), bool and additive (+0 / -0 / -inf) in both dtypes, a persistent grid (classes per
      // item) and key splits (classes per split).
      {"hop f16 d64 boolpad classes 300", H, 6, 4, 4, 200, 300, 64, 64, 0, 0.f, MB, 3, 0},
      {"hop bf16 d128 addpad gqa2 520", BF, 6, 2, 1, 130, 520, 128, 128, 0, 0.f, MA, 3, 0},
      {"hop f16 d64 boolpad causal1 gqa3 kl32", H, 6, 3, 1, 140, 300, 64, 64, 1, 0.f, MB, 3, 32},
      {"hop bf16 d64 addpad causal2 kl64", BF, 6, 2, 2, 150, 520, 64, 64, 2, 0.f, MA, 3, 64},
      {"hop f16 d128 addpad causal1 kl32", H, 6, 2, 2, 300, 300, 128, 128, 1, 0.f, MA, 3, 32},
      {"hop bf16 d128 boolpad causal2 520", BF, 7, 2, 2, 200, 520, 128, 128, 2, 0.f, MB, 3, 0},
      {"hop f16 d128 boolpad persistent", H, 6, 6, 6, 520, 384, 128, 128, 0, 0.f, MB, 3, 0, 1},
      {"hop bf16 d64 addpad split3 1000", BF, 6, 2, 2, 130, 1000, 64, 64, 0, 0.f, MA, 3, 0, 0, 3},
      // The same with the masked tail at the lowest finite value (mask_rank 5, transformers'
      // padding masks: such tiles are mixed for the classes, scored through the pair loads; a row
      // without a visible key is a softmax over its scores): a persistent grid of BERT's shape (512
      // keys, 4 key tiles), causal 1 with key_lengths, GQA, and an odd Sk (the general scoring).
      {"hop f16 d64 floorpad persistent 512", H, 6, 12, 12, 512, 512, 64, 64, 0, 0.f, MA, 5, 0, 1},
      {"hop bf16 d128 floorpad causal1 kl32 gqa2", BF, 6, 4, 2, 260, 390, 128, 128, 1, 0.f, MA, 5, 32},
      {"hop f16 d64 floorpad causal2 300", H, 6, 2, 2, 150, 300, 64, 64, 2, 0.f, MA, 5, 0},
      {"hop bf16 d64 floorpad odd Sk 301", BF, 6, 2, 1, 200, 301, 64, 64, 0, 0.f, MA, 5, 0},
      // The general kernel's tile classes (D = 256 with any mask, softcap with a mask at D <= 128):
      // padding masks of every class above scored through score_general (any layout, each tile
      // voted on per warp), bool, additive -inf and lowest-value tails, causal and key_lengths.
      {"hop bf16 d256 boolpad classes 300", BF, 6, 2, 1, 130, 300, 256, 256, 0, 0.f, MB, 3, 0},
      {"hop f16 d256 addpad causal1 kl32", H, 6, 2, 2, 200, 330, 256, 256, 1, 0.f, MA, 3, 32},
      {"hop bf16 d256 floorpad 260", BF, 6, 2, 2, 100, 260, 256, 256, 0, 0.f, MA, 5, 0},
      {"hop f16 d128 boolpad softcap gqa2 520", H, 6, 4, 2, 130, 520, 128, 128, 0, 30.f, MB, 3, 0},
      {"hop bf16 d64 addpad softcap causal2 300", BF, 6, 2, 2, 150, 300, 64, 64, 2, 20.f, MA, 3, 0},
      // Tail split (OPSFUSE_CUDA_HOPPER_TAIL_SPLIT=1): a persistent grid of clusters of 2 whose
      // last, partial round's items are split by key tiles and merged in distributed shared memory.
      // Row-tile counts for 132 SMs (H100 / H200; G = 132): the seed B=1 H=12 S=2048 (192, tail
      // 60); 195 with a tail of 63 (odd: the last cluster of the round has an item, the next none),
      // MQA, causal 2 with Sq - Sk = 200 (row tile 0 has no key tile: both halves empty; the others
      // one: rank 0 empty), key_lengths (batch 3 random, 4 clamped, in the tail); D=128
      // with a (B,1,1,Sk) bool padding mask (192), GQA 2, Sk = 900 (not a multiple of 128); Sk =
      // 100 (one key tile: rank 0, which stores, gets none, rank 1 all) with an additive mask;
      // causal 1 (forced: 144 row tiles, items of 1..12 key tiles, the lightest split 0 / 1);
      // a small one for --quick (140 items of 2 key tiles, Sk = 130).
      {"hop f16 d64 tail seed 12x2048", H, 1, 12, 12, 2048, 2048, 64, 64, 0, 0.f, N, 0, 0, 0, 0, 1},
      {"hop bf16 d128 tail odd causal2 mqa kl32", BF, 5, 13, 1, 300, 100, 128, 128, 2, 0.f, N, 0, 32, 1, 0, 1},
      {"hop f16 d128 tail boolpad gqa2 900", H, 6, 4, 2, 900, 900, 128, 128, 0, 0.f, MB, 3, 0, 0, 0, 1},
      {"hop bf16 d64 tail Sk100 addmask gqa3", BF, 2, 9, 3, 1200, 100, 64, 64, 0, 0.f, MA, 2, 0, 0, 0, 1},
      {"hop f16 d64 tail causal1 gqa3", H, 1, 12, 4, 1500, 1500, 64, 64, 1, 0.f, N, 0, 0, 1, 0, 1},
      {"hop f16 d64 tail quick 140x64", H, 2, 70, 14, 64, 130, 64, 64, 0, 0.f, N, 0, 0, 0, 0, 1},
      // Stream-K (OPSFUSE_CUDA_HOPPER_STREAM_K=1; 132 SMs): persistent grids whose blocks share the
      // (row tile, key tile) units, items cut between two blocks merged through the workspace by
      // whichever part finishes second. 144 items of 8 key tiles (Sk = 1000: the last tile partial),
      // GQA 4, Sq = 1025 (a one-row tile); 135 items of 3 key tiles (8 or 9 units per block
      // against 3: nearly every item cut); D = 80 / Dv = 96 with MQA-like GQA 11, 165 items of 16
      // key tiles; 288 items of 7 (one round of whole items, then 156 shared); a small one for
      // --quick (140 items of 3 key tiles). (Below 2 x 132 items all are shared.)
      {"hop bf16 d128 streamk gqa4 1025x1000", BF, 2, 8, 2, 1025, 1000, 128, 128, 0, 0.f, N, 0, 0, 0, 0, 0, 1},
      {"hop f16 d64 streamk after a round 288", H, 4, 8, 8, 1100, 777, 64, 64, 0, 0.f, N, 0, 0, 0, 0, 0, 1},
      {"hop f16 d64 streamk short items", H, 3, 5, 5, 1100, 300, 64, 64, 0, 0.f, N, 0, 0, 0, 0, 0, 1},
      {"hop bf16 d80/96 streamk gqa11", BF, 1, 33, 3, 520, 2000, 80, 96, 0, 0.f, N, 0, 0, 0, 0, 0, 1},
      {"hop f16 d64 streamk quick 140x64", H, 2, 70, 14, 64, 300, 64, 64, 0, 0.f, N, 0, 0, 0, 0, 0, 1},
      // Warpgroup key split (choose_plan's hopper_wg_split(): one round of 64-row items, each
      // warpgroup on every other key tile, merged in shared memory): the seed's S=512; 3 key tiles
      // (warpgroup 1 one turn short) with GQA 3 and Sq = 97; Sk = 129 (the second tile one key) with
      // D = 40 / Dv = 80; Sq = 3 with 16 key tiles, MQA (fewer rows per KV head would be a decode
      // shape); D = 96 with 5 tiles; forced (OPSFUSE_CUDA_HOPPER_WG_SPLIT=1) beyond one round: 528
      // items of 7 key tiles, GQA 6.
      {"hop f16 d64 wgsplit seed 12x512", H, 1, 12, 12, 512, 512, 64, 64, 0, 0.f, N, 0, 0},
      {"hop bf16 d128 wgsplit 3 tiles gqa3", BF, 2, 6, 2, 97, 300, 128, 128, 0, 0.f, N, 0, 0},
      {"hop f16 d40/80 wgsplit Sk129", H, 3, 4, 4, 130, 129, 40, 80, 0, 0.f, N, 0, 0},
      {"hop bf16 d64 wgsplit Sq3 mqa", BF, 2, 8, 1, 3, 2000, 64, 64, 0, 0.f, N, 0, 0},
      {"hop f16 d96 wgsplit 5 tiles", H, 1, 5, 5, 200, 600, 96, 96, 0, 0.f, N, 0, 0},
      {"hop bf16 d64 wgsplit forced 528", BF, 2, 66, 11, 200, 800, 64, 64, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 1},
      // Item chaining (kPlainChain: persistent plain launches at D = 128 with >= 2048 keys, causal
      // >= 1024, without key_lengths or biases, non-causal ones with a partial last key tile (whole
      // tiles go to kPlainFast); the last field asks that it ran): 216 items of 17 key tiles, the
      // last partial (Sk = 2100), Sq = 1025 (a one-row tile), GQA 3; 288 items of 100 rows, MQA;
      // causal 1 in the dynamic order (17 row tiles per head: items of 1 to 17 key tiles); causal 2
      // with Sk > Sq (the snake, 6 row tiles per head), D = 80 / Dv = 96; causal 1 over 1024 keys
      // (items of 1 to 8 tiles) and over 1100 (1 to 9, the last partial), GQA 3; small ones for
      // --quick (270 items of 64 rows: blocks of three items, Q slots reused; 136 causal items of 1
      // to 8 tiles).
      {"hop bf16 d128 chain gqa3 1025x2100", BF, 2, 12, 4, 1025, 2100, 128, 128, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop f16 d128 chain Sq100 mqa", H, 3, 96, 1, 100, 2100, 128, 128, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop bf16 d128 chain dynamic causal1", BF, 1, 10, 5, 2100, 2100, 128, 128, 1, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop f16 d80/96 chain causal2 gqa2", H, 2, 12, 6, 700, 2100, 80, 96, 2, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop f16 d128 chain quick 270x2100", H, 2, 135, 15, 64, 2100, 128, 128, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop bf16 d128 chain causal1 1024", BF, 2, 16, 16, 1024, 1024, 128, 128, 1, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop f16 d128 chain causal1 gqa3 1100", H, 2, 12, 4, 1100, 1100, 128, 128, 1, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop f16 d128 chain quick causal1 136x1024", H, 1, 17, 17, 1024, 1024, 128, 128, 1, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      // Short items in sequence (kPlainSeq: plain launches at D <= 64 over <= 8 key tiles; the last
      // field asks that it ran): the seed's S=128 (12 items of one tile); BERT's S=512 in a
      // persistent grid (768 items of 4 tiles); one key (Sk = 1) with D = 40, GQA 3 and Sq = 97;
      // causal 2 with key_lengths (items without a key tile) in the dynamic order; 2 key splits
      // in a cluster (tiles 0-1 and 2-3 of Sk = 500, merged); the seed's S=1024 (96 items of 8
      // tiles); causal 1 with GQA 2 over 5 key tiles, the last partial (Sk = 600).
      {"hop f16 d64 seq seed 12x128", H, 1, 12, 12, 128, 128, 64, 64, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop bf16 d64 seq persistent 8x12x512", BF, 8, 12, 12, 512, 512, 64, 64, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop f16 d40 seq Sk1 gqa3", H, 2, 6, 2, 97, 1, 40, 40, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop bf16 d64 seq dynamic causal2 kl32", BF, 3, 50, 10, 200, 450, 64, 64, 2, 0.f, N, 0, 32, 1, 0, 0, 0, 0, 0, 0, 1},
      {"hop f16 d64 seq split2 500", H, 1, 4, 4, 300, 500, 64, 64, 0, 0.f, N, 0, 0, 0, 2, 0, 0, 0, 0, 0, 1},
      {"hop f16 d64 seq seed 12x1024", H, 1, 12, 12, 1024, 1024, 64, 64, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop bf16 d64 seq causal1 gqa2 600", BF, 2, 8, 4, 600, 600, 64, 64, 1, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      // At D = 128 (<= 4 key tiles by default): a persistent grid of 160 items of 4 tiles; D = 96
      // with causal 1 and GQA 2 over 3 tiles, the last partial; key_lengths over Sk = 257 (the
      // third tile one key).
      {"hop bf16 d128 seq persistent 40x512", BF, 1, 40, 40, 512, 512, 128, 128, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop f16 d96 seq causal1 gqa2 300", H, 2, 8, 4, 300, 300, 96, 96, 1, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop f16 d128 seq kl32 257", H, 3, 4, 4, 130, 257, 128, 128, 0, 0.f, N, 0, 32, 0, 0, 0, 0, 0, 0, 0, 1},
      // In sequence on 256-key tiles (kPlainSeqWide, OPSFUSE_CUDA_HOPPER_SEQ_WIDE=N as the last field;
      // it must run where its rule allows): the seed's S=1024 (96 items of 4 tiles); BERT's S=512 in
      // a persistent grid; the seed's S=2048 (the tail split: clusters of 2 merge over the 256-key
      // ring); 2 key splits in a cluster with GQA 2 (tiles 0 and 1-2 of Sk = 768); D = 40 with
      // GQA 3 and Sq = 97; bf16 with Q and V biases; and where it must not run: Sk = 1000 (a key
      // limit inside the last tile), causal, beyond the limit (Sk = 1280 over 4), one tile (256).
      {"hop f16 d64 wide seed 12x1024", H, 1, 12, 12, 1024, 1024, 64, 64, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4},
      {"hop bf16 d64 wide persistent 8x12x512", BF, 8, 12, 12, 512, 512, 64, 64, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4},
      {"hop f16 d64 wide tail seed 12x2048", H, 1, 12, 12, 2048, 2048, 64, 64, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8},
      {"hop f16 d64 wide split2 gqa2 768", H, 2, 8, 4, 300, 768, 64, 64, 0, 0.f, N, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 4},
      {"hop bf16 d40 wide Sq97 gqa3 512", BF, 8, 24, 8, 97, 512, 40, 40, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4},
      {"hop bf16 d64 wide bias 4x8x512", BF, 4, 8, 8, 700, 512, 64, 64, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 4},
      {"hop f16 d64 wide not 1000", H, 1, 12, 12, 1000, 1000, 64, 64, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4},
      {"hop f16 d64 wide not causal1 512", H, 2, 8, 8, 512, 512, 64, 64, 1, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4},
      {"hop f16 d64 wide not beyond 1280", H, 1, 12, 12, 1280, 1280, 64, 64, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4},
      {"hop f16 d64 wide not one tile 256", H, 8, 12, 12, 256, 256, 64, 64, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4},
      // Whole, visible key tiles (kPlainFast: plain launches at D = 128 whose keys fill whole 128-key
      // tiles, no causal, no key_lengths, unsplit; the last field asks that it ran exactly where its
      // rule allows): 216 items of 8 tiles with a partial last row tile (Sq = 1100) and GQA 3; one
      // round of 96 items at D = 96 with Sq = 97; Q and V biases over 6 tiles; 280 items of 5 tiles
      // for --quick; 16 tiles in a persistent grid (which chaining leaves to it); and where it must
      // not run: Sk = 1000 (a key limit inside the last tile), causal, key_lengths, the
      // OPSFUSE_CUDA_HOPPER_STREAM_K=1 schedule.
      {"hop bf16 d128 fast gqa3 1100x1024", BF, 2, 12, 4, 1100, 1024, 128, 128, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop f16 d96 fast one round 97x640", H, 6, 16, 16, 97, 640, 96, 96, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop bf16 d128 fast bias 2x16x768", BF, 2, 16, 16, 1024, 768, 128, 128, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1},
      {"hop f16 d128 fast quick 280x640", H, 2, 140, 140, 64, 640, 128, 128, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop bf16 d128 fast not 1000", BF, 2, 16, 16, 1024, 1000, 128, 128, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop f16 d128 fast not causal1 1024", H, 2, 16, 16, 1024, 1024, 128, 128, 1, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop bf16 d128 fast not kl32 1024", BF, 2, 16, 16, 1024, 1024, 128, 128, 0, 0.f, N, 0, 32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop f16 d128 fast 16 tiles 2048", H, 2, 16, 8, 1024, 2048, 128, 128, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop bf16 d128 fast not streamk 1024", BF, 2, 16, 16, 1024, 1024, 128, 128, 0, 0.f, N, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1},
      // Three consumer warpgroups (kPlainSeq3; the last field asks that it ran exactly where its rule
      // allows): the seed's S=1024 (96 items of 8 tiles, 2 in the third
      // warpgroup's tail); GQA 3 with a partial last row tile over 6 tiles; D = 40 over 3 tiles (a tail
      // of 1); 5 tiles (each with more 64-row items than SMs: fewer take the warpgroup split); and where it must not run: Sk = 1000 (a key limit inside the
      // last tile), 2 tiles, 9 tiles, more items than SMs (768), causal, Q and V biases.
      {"hop f16 d64 seq3 seed 12x1024", H, 1, 12, 12, 1024, 1024, 64, 64, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop bf16 d64 seq3 gqa3 Sq600 768", BF, 2, 12, 4, 600, 768, 64, 64, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop f16 d40 seq3 quick 30x300x384", H, 1, 30, 30, 300, 384, 40, 40, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop bf16 d64 seq3 5 tiles 16x1000x640", BF, 1, 16, 16, 1000, 640, 64, 64, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop f16 d64 seq3 not 1000", H, 1, 12, 12, 1000, 1000, 64, 64, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop f16 d64 seq3 not 2 tiles", H, 1, 12, 12, 256, 256, 64, 64, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop bf16 d64 seq3 not 9 tiles", BF, 1, 12, 12, 1024, 1152, 64, 64, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop f16 d64 seq3 not 768 items", H, 8, 12, 12, 1024, 1024, 64, 64, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop f16 d64 seq3 not causal1", H, 1, 12, 12, 1024, 1024, 64, 64, 1, 0.f, N, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
      {"hop bf16 d64 seq3 not bias", BF, 1, 12, 12, 1024, 1024, 64, 64, 0, 0.f, N, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1},
      // Small grids whose portable plan splits the keys (<= 66 blocks, >= 8 key tiles of 64): the
      // Hopper kernel must take them where their rows fill its items for a third of the SMs
      // (hopper_eligible): 128 items of 64 rows (the warpgroup split) at D = 128, 64 at D = 64, 64
      // causal 128-row items.
      {"hop bf16 d128 smallgrid 1x16x512", BF, 1, 16, 16, 512, 512, 128, 128, 0, 0.f, N, 0, 0},
      {"hop f16 d64 smallgrid 1x4x1024", H, 1, 4, 4, 1024, 1024, 64, 64, 0, 0.f, N, 0, 0},
      {"hop f16 d128 smallgrid causal1 1x16x512", H, 1, 16, 16, 512, 512, 128, 128, 1, 0.f, N, 0, 0},
      // D = 256 (64-key tiles; masks and softcap through the general scoring; never split, so the
      // requested key splits and tail split are ignored): odd Sk, GQA, both causal alignments,
      // key_lengths (a V tile's tail zeroed), Dv != D both ways, bool / additive / padding masks,
      // softcap, a persistent grid (3 x 9 x 5 = 135 row tiles on 132 SMs; 2 x 8 x 5 causal, forced;
      // batch 0's key length is 0, as in every key_lengths case: batch 1 carries the values).
      {"hop f16 d256 plain 200x300", H, 2, 4, 4, 200, 300, 256, 256, 0, 0.f, N, 0, 0},
      {"hop bf16 d256 causal1 gqa2 boolmask kl32", BF, 2, 4, 2, 130, 260, 256, 256, 1, 0.f, MB, 4, 32},
      {"hop f16 d256/200 causal2 addmask softcap", H, 1, 3, 3, 97, 300, 256, 200, 2, 30.f, MA, 2, 0},
      {"hop bf16 d200/256 persistent addpad gqa3", BF, 3, 9, 3, 520, 400, 200, 256, 0, 0.f, MA, 3, 0},
      {"hop f16 d256 persistent causal1 kl64", H, 2, 8, 4, 600, 600, 256, 256, 1, 0.f, N, 0, 64, 1},
      {"hop bf16 d256 split2 tail ignored", BF, 1, 12, 12, 300, 700, 256, 256, 0, 0.f, N, 0, 0, 0, 2, 1},
      // One Q buffer with the next item known a round ahead (session 44): small persistent grids
      // (140 one-tile items, forced) for racecheck, in the static order and (key_lengths) the
      // dynamic one, the latter with the (192, 128) kernel.
      {"hop f16 d256 persistent quick 140x64", H, 2, 70, 14, 64, 130, 256, 256, 0, 0.f, N, 0, 0, 1},
      {"hop bf16 d192/128 latent persistent quick 140x64 kl32", BF, 2, 70, 14, 64, 130, 192, 128, 0, 0.f, N, 0, 32, 1},
      // Latent attention, 128 < D <= 256 with Dv <= 128 (V, O and P V at 128 columns): D <= 192 in the
      // (192, 128) instantiation on 128-key tiles -- DeepSeek-V3's 192 / 128 causal on a persistent
      // grid with GQA, the general kernel's mask + softcap + key_lengths, key_lengths alone (a V tile's
      // tail zeroed), D and Dv off the buckets with a bool mask (odd Sk: general scoring), the pair
      // masks (a padding mask's tile classes; an additive (Sq, Sk) one, causal, key_lengths) -- and
      // D > 192 in the (256, 128) one (a padding mask, Dv off the bucket). The Q bias cases below
      // take (192, 128) too (its walk of Q's rows: 120 threads over 24 chunks a row).
      {"hop bf16 d192/128 latent persistent causal1 gqa2", BF, 2, 8, 4, 600, 600, 192, 128, 1, 0.f, N, 0, 0, 1},
      {"hop f16 d192/128 latent addmask softcap kl32", H, 2, 4, 4, 130, 300, 192, 128, 2, 30.f, MA, 2, 32},
      {"hop bf16 d256/64 latent boolpad gqa2", BF, 3, 4, 2, 97, 260, 256, 64, 0, 0.f, MB, 3, 0},
      {"hop f16 d200/72 latent causal2 kl64", H, 2, 4, 2, 130, 389, 200, 72, 2, 0.f, N, 0, 64},
      {"hop f16 d192/128 latent kl64 gqa4", H, 3, 8, 2, 300, 700, 192, 128, 0, 0.f, N, 0, 64},
      {"hop bf16 d176/96 latent boolmask causal1", BF, 2, 4, 4, 200, 333, 176, 96, 1, 0.f, MB, 4, 0},
      {"hop bf16 d192/128 latent boolpad classes gqa2", BF, 3, 4, 2, 130, 300, 192, 128, 0, 0.f, MB, 3, 0},
      {"hop f16 d192/128 latent addmask causal1 kl32", H, 2, 4, 4, 200, 260, 192, 128, 1, 0.f, MA, 2, 32},
      // Q/K/V biases, added by the kernel (Q's into its tile, V's in the epilogue of every schedule,
      // K's left out) -- except softcap with K's bias, which reads biased copies (bias_fold.h):
      // BERT's padded shape, a persistent causal grid with key_lengths, key splits, the tail split,
      // stream-K, D = 256 with Dv != D.
      {"hop f16 d64 bias addpad 512", H, 6, 12, 12, 512, 512, 64, 64, 0, 0.f, MA, 3, 0, 0, 0, 0, 0, 1},
      {"hop bf16 d128 bias persistent causal1 kl32", BF, 3, 10, 5, 600, 400, 128, 128, 1, 0.f, N, 0, 32, 1, 0, 0, 0, 1},
      {"hop f16 d64 bias softcap boolmask", H, 2, 4, 2, 257, 520, 64, 64, 0, 30.f, MB, 4, 0, 0, 0, 0, 0, 1},
      {"hop f16 d40/80 bias split2 causal2", H, 2, 4, 2, 130, 520, 40, 80, 2, 0.f, MA, 2, 0, 0, 2, 0, 0, 1},
      {"hop f16 d64 bias tail 140x64", H, 2, 70, 14, 64, 130, 64, 64, 0, 0.f, N, 0, 0, 0, 0, 1, 0, 1},
      {"hop f16 d64 bias streamk short items", H, 3, 5, 5, 1100, 300, 64, 64, 0, 0.f, N, 0, 0, 0, 0, 0, 1, 1},
      {"hop bf16 d256/200 bias causal2 gqa2", BF, 2, 4, 2, 130, 260, 256, 200, 2, 0.f, MB, 4, 32, 0, 0, 0, 0, 1},
      {"hop f16 d192/128 latent bias causal1", H, 2, 4, 2, 130, 260, 192, 128, 1, 0.f, N, 0, 0, 0, 0, 0, 0, 1},
      {"hop bf16 d176/128 latent bias boolpad persistent 140x64", BF, 2, 70, 14, 64, 130, 176, 128, 0, 0.f, MB, 3, 0, 1,
       0, 0, 0, 1},
  };
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  if (bench) {
    const int r = run_bench(stream);
    CHECK_CUDA(cudaStreamDestroy(stream));
    return r;
  }
  std::mt19937 rng(1234);
  int failed = 0, n = 0;
  std::string failed_names;  // " [name]" per failed case
  // --stress NAME N: the Hopper pass of one case N times on the same data (races that show rarely).
  const bool stress = argc > 3 && std::strcmp(argv[1], "--stress") == 0;
  const char* only = argc > 2 && std::strcmp(argv[1], "--only") == 0 ? argv[2] : nullptr;
  for (const Case& c : cases) {
    if (stress || only != nullptr) break;
    if (quick && n >= 6 && !c.bias) continue;  // --quick: the first six and the bias cases
    ++n;
    if (!run_case(c, rng, stream)) ++failed, failed_names += std::string(" [") + c.name + "]";
  }
  // The Hopper kernel must be taken on a compute capability 9.0 device when it was built in.
  int dev = 0, major = 0, minor = 0;
  CHECK_CUDA(cudaGetDevice(&dev));
  CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
#ifdef OPSFUSE_CUDA_HOPPER
  const bool hopper_expected = major == 9 && minor == 0;
#else
  const bool hopper_expected = false;
#endif
  // --quick (what compute-sanitizer runs): the first two Hopper cases, a pair-loaded mask, two
  // key-split cases, two padding masks (classified; floor-valued), the small tail-split, stream-K,
  // warpgroup-split and two chaining cases, one kPlainFast case, three bias cases (key splits, the
  // tail split, softcap's biased copies), the seed's S=128 and D = 96 causal in sequence (kPlainSeq),
  // latent attention's (192, 128) kernel (a mask, softcap, a V tile's tail zeroed; its two pair-mask
  // kernels; a Q bias), D = 256 (one Q buffer) and small persistent grids of both (the next item a
  // round ahead); the other persistent-grid cases are too large for racecheck's pace.
  const char* quick_hopper[] = {"hop bf16 d128 1000x1537", "hop f16 d64 causal1 gqa4", "hop f16 d64 addmask causal2 gqa2",
                                "hop bf16 d64 split4 boolmask softcap", "hop f16 d128 split3 causal1 kl64",
                                "hop f16 d64 boolpad causal1 gqa3 kl32", "hop f16 d64 floorpad causal2 300",
                                "hop f16 d64 tail quick 140x64", "hop f16 d64 streamk quick 140x64",
                                "hop f16 d40/80 bias split2 causal2", "hop f16 d64 bias tail 140x64",
                                "hop f16 d64 bias softcap boolmask", "hop bf16 d128 wgsplit 3 tiles gqa3",
                                "hop f16 d128 chain quick 270x2100", "hop f16 d128 chain quick causal1 136x1024",
                                "hop f16 d128 fast quick 280x640", "hop f16 d40 seq3 quick 30x300x384",
                                "hop f16 d64 seq seed 12x128",
                                "hop f16 d96 seq causal1 gqa2 300", "hop f16 d64 wide split2 gqa2 768",
                                "hop bf16 d40 wide Sq97 gqa3 512", "hop f16 d192/128 latent addmask softcap kl32",
                                "hop bf16 d192/128 latent boolpad classes gqa2",
                                "hop f16 d192/128 latent addmask causal1 kl32", "hop f16 d192/128 latent bias causal1",
                                "hop f16 d256 plain 200x300", "hop f16 d256 persistent quick 140x64",
                                "hop bf16 d192/128 latent persistent quick 140x64 kl32",
                                "hop bf16 d176/128 latent bias boolpad persistent 140x64"};
  uint32_t hseed = 777u;
  for (const Case& c : hopper_cases) {
    ++hseed;
    if (stress && std::strcmp(c.name, argv[2]) != 0) continue;
    if (only != nullptr && std::strstr(c.name, only) == nullptr) continue;
    if (quick && std::none_of(std::begin(quick_hopper), std::end(quick_hopper),
                              [&](const char* q) { return std::strcmp(q, c.name) == 0; }))
      continue;
    if (stress) {
      const int runs = std::atoi(argv[3]);
      setenv("OPSFUSE_CUDA_FORCE_HOPPER", "1", 1);
      set_schedule_switches(c);
      // Runs that fail print their own line; the count of them comes from those lines.
      std::mt19937 srng(hseed);
      const int bad = run_case(c, srng, stream, runs) ? 0 : 1;
      std::printf("stress %s: %d runs, %s\n", c.name, runs, bad ? "FAILED (see the FAIL lines)" : "all ok");
      failed += bad, n += runs;
      continue;
    }
    ++n;
    if (!run_hopper_pair(c, hseed, stream, hopper_expected)) ++failed, failed_names += std::string(" [") + c.name + "]";
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  // The names again on the last line, which is what a caller that keeps only the tail sees.
  std::printf("%d of %d cases failed%s\n", failed, n, failed_names.c_str());
  return failed ? 1 : 0;
}
