// The CUDA FusedAttention launcher (attention_cuda.h): validates the params, turns them into
// KernelArgs, chooses the kernel and the KV split with choose_plan() (the one heuristic), launches
// on the caller's stream and, for split-KV, the combine pass. Never synchronizes, never allocates.
//
// Hopper: when the library was built with CMAKE_CUDA_ARCHITECTURES including 90 (OPSFUSE_CUDA_HOPPER)
// and the device is compute capability 9.0, choose_plan() takes the sm_90a kernel (hopper/: wgmma,
// TMA, warp specialization) for the float16/bfloat16 prefill cases it covers (hopper_eligible()).
// Environment, read at every launcher call in one pass (read_switches(): a benchmark or test can
// compare both kernels in one process):
//   OPSFUSE_CUDA_DISABLE_HOPPER=1  the portable kernels only.
//   OPSFUSE_CUDA_FORCE_HOPPER=1    (tests) the Hopper kernel also where the portable plan would split
//                                  the keys (small grids, long Sk), which it otherwise keeps.
//   OPSFUSE_CUDA_HOPPER_PERSISTENT=0 / 1  no persistent Hopper grid / one wherever there are more
//                                  row tiles than SMs (hopper_persistence()).
//   OPSFUSE_CUDA_HOPPER_DYNAMIC=0 / 1  (A/B, tests) no dynamically scheduled persistent grid (causal
//                                  and key_lengths launches one block per tile, or in the static
//                                  order with PERSISTENT=1) / every persistent grid dynamically
//                                  scheduled (hopper_persistence()).
//   OPSFUSE_CUDA_HOPPER_SCHED_HEADS=N  (tests, sweeps) the dynamic order's sections of N (batch,
//                                  query head) pairs instead of hopper_sched_heads()'s L2 budget.
//   OPSFUSE_CUDA_HOPPER_MASK_PAIRS=0  (A/B) masks through the Hopper kernel's general scoring.
//   OPSFUSE_CUDA_HOPPER_TMA_STORE=0  (A/B, tests) the Hopper kernel stores Y from registers instead
//                                  of through shared memory and TMA.
//   OPSFUSE_CUDA_DECODE_NO_CLUSTER=1  (tests) split decode through the workspace + combine kernel
//                                  also where the sm_90 cluster merge would run (choose_plan).
//   OPSFUSE_CUDA_DECODE_SPLITS=N   (benchmark sweeps) decode with N key splits.
//   OPSFUSE_CUDA_HOPPER_SPLITS=N   (tests, sweeps) the Hopper kernel with N key splits per row tile.
//   OPSFUSE_CUDA_HOPPER_TAIL_SPLIT=0 / 1  (A/B, tests) no tail split of a persistent Hopper grid /
//                                  one wherever the persistent grid is taken and its last round
//                                  fits in one split round (hopper_tail_split()).
//   OPSFUSE_CUDA_HOPPER_STREAM_K=0 / 1  (A/B, tests) no stream-K schedule / one wherever the
//                                  kernel takes it (hopper_stream_k()).
//   OPSFUSE_CUDA_HOPPER_WG_SPLIT=0 / 1  (A/B, tests) no warpgroup key split / one wherever the
//                                  plain kernel takes it (hopper_wg_split()), also beyond one
//                                  round of 64-row items.
//   OPSFUSE_CUDA_HOPPER_CHAIN=0    (A/B, tests) no item chaining: persistent plain launches take
//                                  the kernel that runs each item's key loop on its own; =N >= 2
//                                  (A/B, traces) chaining from N key tiles instead of 16 (8 causal).
//   OPSFUSE_CUDA_HOPPER_PDL=1      the Hopper prefill kernel as a programmatic dependent launch: its
//                                  blocks start while the previous kernel in the stream ends (and
//                                  wait for it before any global access). Off by default: on the
//                                  H200 it saves ~0.6 us per call after a call of its own, but costs
//                                  0.1-0.3 us after a GEMM or an elementwise kernel, as inside a
//                                  model (docs/notes/cuda_kernel.md, session 25).
//   OPSFUSE_CUDA_HOPPER_SEQ=N      (A/B, tests) plain launches at D <= 64 over <= N key tiles run
//                                  them in sequence (kPlainSeq, launch_hopper; default 8); 0 never.
//   OPSFUSE_CUDA_HOPPER_SEQ_D128=N (A/B, tests) the same at D = 128 (default 4); 0 never.
//   OPSFUSE_CUDA_HOPPER_SEQ_WIDE=N (A/B, tests) plain launches at D <= 64 over 2 to N whole 256-key
//                                  tiles run in sequence on 256-key tiles (kPlainSeqWide,
//                                  launch_hopper; default 32); 0 never.
//   OPSFUSE_CUDA_HOPPER_DV_BUCKET=0 (A/B, tests) latent attention (128 < D <= 256, Dv <= 128) in the
//                                  D = 256 kernel with V padded to 256 columns, instead of the
//                                  (192, 128) or (256, 128) instantiation (Plan::bucket_v).
//   OPSFUSE_CUDA_HOPPER_D192=0     (A/B, tests) latent attention with D <= 192 in the (256, 128)
//                                  instantiation instead of the (192, 128) one (Plan::bucket).
//   OPSFUSE_CUDA_HOPPER_FAST=0     (A/B, tests) plain D = 128 launches whose key tiles are all whole
//                                  and visible in kPlain (or the chain) instead of kPlainFast
//                                  (launch_hopper).
//   OPSFUSE_CUDA_HOPPER_SEQ3=0     (A/B, tests) one-round plain launches at D <= 64 over 3 to 8 whole,
//                                  visible 128-key tiles in the two-consumer in-sequence kernels
//                                  instead of the three-consumer one (kPlainSeq3,
//                                  hopper/hopper_seq3.cuh; hopper_three_consumers()).
//   OPSFUSE_CUDA_HOPPER_DECODE=0   (tests, A/B) decode shapes through the portable decode kernel
//                                  instead of the sm_90 TMA one (hopper/hopper_decode.cuh).
// workspace_size() answers for the larger of the portable plan and the Hopper one, so no variable
// can make a launch short of workspace (nor the portable fallback when the driver refuses a TMA map).
#include "attention_cuda.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include <cuda_runtime.h>
#include <unistd.h>  // environ

#include "bias_fold.h"
#include "common/message.h"
#include "kernel_common.cuh"

namespace opsfuse::cuda {
namespace {

using detail::KernelArgs;
using detail::KernelKind;
using detail::Plan;
using detail::Switch;
using detail::Switches;

thread_local std::string g_last_error;
thread_local int g_last_kind = -1;  // KernelKind of this thread's last kernel launch (test hook)
thread_local int g_last_hopper_mode = -1;  // hopper::Mode of its last Hopper prefill launch (test hook)

Status fail(Status s, const std::string& msg) {
  g_last_error = msg;
  return s;
}

Status cuda_fail(cudaError_t err, const char* what) {
  Message os;
  os << what << " failed: " << cudaGetErrorName(err) << ": " << cudaGetErrorString(err);
  return fail(Status::kDeviceError, os.str());
}

// What the heuristic needs to know of the current device, read once per device (attribute
// queries: no synchronization).
struct DeviceInfo {
  int sms = 0;
  int smem_per_sm = 0;  // bytes of shared memory per multiprocessor
  int cc = 0;           // compute capability, major * 10 + minor
};

cudaError_t device_info(DeviceInfo* out) {
  static int cache_sms[64] = {};
  static int cache_smem[64] = {};
  static int cache_cc[64] = {};
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev < 64 && __atomic_load_n(&cache_sms[dev], __ATOMIC_ACQUIRE) > 0) {
    out->smem_per_sm = __atomic_load_n(&cache_smem[dev], __ATOMIC_ACQUIRE);
    out->cc = __atomic_load_n(&cache_cc[dev], __ATOMIC_ACQUIRE);
    out->sms = __atomic_load_n(&cache_sms[dev], __ATOMIC_ACQUIRE);
    return cudaSuccess;
  }
  int cc_major = 0, cc_minor = 0;
  err = cudaDeviceGetAttribute(&out->sms, cudaDevAttrMultiProcessorCount, dev);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&out->smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (err != cudaSuccess) return err;
  out->cc = cc_major * 10 + cc_minor;
  if (dev < 64) {
    __atomic_store_n(&cache_smem[dev], out->smem_per_sm, __ATOMIC_RELEASE);
    __atomic_store_n(&cache_cc[dev], out->cc, __ATOMIC_RELEASE);
    __atomic_store_n(&cache_sms[dev], out->sms, __ATOMIC_RELEASE);
  }
  return cudaSuccess;
}

// During stream capture (CUDA graphs: ORT's enable_cuda_graph, torch.cuda.graph) the stream may not
// be queried for its device (cudaErrorStreamCaptureUnsupported, which also invalidates the capture):
// then the caller's current device is kept, as it is when the stream is a default stream.
cudaError_t select_stream_device(cudaStream_t stream) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return cudaSuccess;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaError_t err = cudaStreamIsCapturing(stream, &capture);
  if (err != cudaSuccess) return err;
  if (capture != cudaStreamCaptureStatusNone) return cudaSuccess;
  int want = 0, have = 0;
  err = cudaStreamGetDevice(stream, &want);
  if (err != cudaSuccess) return err;
  err = cudaGetDevice(&have);
  if (err != cudaSuccess) return err;
  return want == have ? cudaSuccess : cudaSetDevice(want);
}

int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// The switches (kernel_args.h), one pass over the environment: only entries that start with the
// common prefix are compared with the names.
Switches read_switches() {
  static constexpr const char* kNames[] = {
      "DISABLE_HOPPER",    "FORCE_HOPPER",       "HOPPER_DECODE",   "HOPPER_PERSISTENT",   "HOPPER_SPLITS",
      "HOPPER_TAIL_SPLIT", "HOPPER_MASK_PAIRS",  "HOPPER_PINGPONG", "HOPPER_MASK_CLASSES", "HOPPER_TMA_STORE",
      "HOPPER_DYNAMIC",    "HOPPER_SCHED_HEADS", "HOPPER_STREAM_K", "HOPPER_WG_SPLIT",     "HOPPER_CHAIN",
      "HOPPER_PDL",        "HOPPER_SEQ",        "HOPPER_SEQ_D128", "HOPPER_SEQ_WIDE",     "HOPPER_DV_BUCKET",
      "HOPPER_D192",       "HOPPER_FAST",        "HOPPER_SEQ3",
      "DECODE_SPLITS",     "DECODE_NO_CLUSTER",
      "DECODE_L2_PROMOTION", "DECODE_EVICT_FIRST"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == static_cast<size_t>(Switch::kCount),
                "one name per Switch, in its order");
  static constexpr char kPrefix[] = "OPSFUSE_CUDA_";
  constexpr size_t kPrefixLen = sizeof(kPrefix) - 1;
  Switches sw;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* entry = *e;
    if (std::strncmp(entry, kPrefix, kPrefixLen) != 0) continue;
    const char* name = entry + kPrefixLen;
    const char* eq = std::strchr(name, '=');
    if (eq == nullptr) continue;
    for (int i = 0; i < static_cast<int>(Switch::kCount); ++i) {
      const size_t n = std::strlen(kNames[i]);
      if (static_cast<size_t>(eq - name) == n && std::strncmp(name, kNames[i], n) == 0) sw.value[i] = eq + 1;
    }
  }
  return sw;
}

// The layout TMA can address (hopper/hopper_host.cu encodes it): a 16-byte aligned base, and
// every stride that is stepped over (extent > 1) positive, a multiple of 16 bytes, below 2^40.
[[maybe_unused]] bool tma_layout_ok(const void* ptr, const int64_t stride[3], int64_t batch, int64_t heads, int64_t rows) {
  if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) return false;
  const int64_t extent[3] = {batch, heads, rows};
  for (int i = 0; i < 3; ++i) {
    if (extent[i] <= 1) continue;
    const int64_t bytes = stride[i] * 2;
    if (stride[i] <= 0 || bytes % 16 != 0 || bytes >= (int64_t{1} << 40)) return false;
  }
  return true;
}

bool hopper_wg_split(const AttentionParams& p, const DeviceInfo& dev, const Plan& plan, const Switches& sw);

// Whether the Hopper kernel (hopper/hopper_fwd.cuh) covers a launch whose portable plan is `plan`:
// compiled in, a compute capability 9.0 device, not disabled, float16/bfloat16, any bucket (64, 128
// or 256; TMA zero-fills the columns beyond D / Dv, so e.g. D = 40 or Dv != D run too), a prefill
// plan, TMA-addressable Q/K/V. Where the portable plan splits the keys (a grid of <= half the SMs
// in blocks, >= 8 key tiles), the Hopper kernel takes the launch unsplit only if its query rows
// fill items (64 rows where the warpgroup split takes them, else 128) for a third of the SMs: its
// per-SM rate is >= 3x the portable kernel's (the benchmark's sm80 rows: 0.26-0.31x cuDNN against
// 0.95-1.1x), and on the H200 (session 27) 64-128 such items ran 1.7-3x faster than the portable
// split (B=1 H=16 S=512 D=128 12.2 against 36.5 µs, cuDNN 13.2). Fewer items (short query blocks
// over long keys) keep the portable split, which spreads the keys over every SM. (At D = 256 the
// portable blocks hold 64 rows, so it splits only grids of <= 33 Hopper items: never taken there.)
bool hopper_eligible(const AttentionParams& p, const DeviceInfo& dev, const Plan& plan, const Switches& sw) {
#ifndef OPSFUSE_CUDA_HOPPER
  (void)p, (void)dev, (void)plan, (void)sw;
  return false;
#else
  if (dev.cc != 90 || plan.kind != KernelKind::kTensorCore) return false;
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) return false;
  if (p.seq_k < 1 || p.seq_q < 1) return false;
  if (ceil_div(p.seq_q, 128) * p.batch * p.heads_q >= INT_MAX) return false;
  if (!tma_layout_ok(p.q, p.q_stride, p.batch, p.heads_q, p.seq_q) ||
      !tma_layout_ok(p.k, p.k_stride, p.batch, p.heads_kv, p.seq_k) ||
      !tma_layout_ok(p.v, p.v_stride, p.batch, p.heads_kv, p.seq_k))
    return false;
  if (sw.is(Switch::kDisableHopper, '1')) return false;
  if (plan.num_splits == 1 || sw.is(Switch::kForceHopper, '1')) return true;
  // Items counted by the query rows they hold: a head of 32 rows fills a quarter of a 128-row item
  // but takes as long as a full one (GQA groups are not packed into the Hopper kernel's items).
  const int rows_per_item = hopper_wg_split(p, dev, plan, sw) ? 64 : 128;
  const int64_t rows = static_cast<int64_t>(p.seq_q) * p.batch * p.heads_q;
  return 3 * rows >= static_cast<int64_t>(dev.sms) * rows_per_item;
#endif
}

// Whether the sm_90 decode kernel (hopper/hopper_decode.cuh: TMA loads of K and V) takes a launch
// whose portable plan is the decode kernel `plan`: compiled in, a compute capability 9.0 device,
// TMA-addressable K and V (Q is loaded by the threads), not switched off.
bool hopper_decode_eligible(const AttentionParams& p, const DeviceInfo& dev, const Plan& plan, const Switches& sw) {
#ifndef OPSFUSE_CUDA_HOPPER
  (void)p, (void)dev, (void)plan, (void)sw;
  return false;
#else
  if (dev.cc != 90 || plan.kind != KernelKind::kTensorCoreDecode || plan.bucket > 128) return false;
  if (p.seq_k < 1 || !tma_layout_ok(p.k, p.k_stride, p.batch, p.heads_kv, p.seq_k) ||
      !tma_layout_ok(p.v, p.v_stride, p.batch, p.heads_kv, p.seq_k))
    return false;
  return !sw.is(Switch::kDisableHopper, '1') && !sw.is(Switch::kHopperDecode, '0');
#endif
}

// Hopper persistent grid (one block per multiprocessor, each looping over row tiles; the producer
// loads the next tile's Q and K/V while the consumers finish the current one, which hides a tile's
// prologue and epilogue) when there are more row tiles than multiprocessors. How the blocks share
// the tiles (hopper_fwd.cuh):
//  - static snake order (sched_heads 0) where it balances: tiles of equal cost (non-causal, no
//    key_lengths), and causal grids where the snake pairs each block's heavy and light row tiles
//    exactly, i.e. 2 * #SMs is a multiple of the row tiles per head (264 and 8 at S=1024 on 132 SMs:
//    every block's two consecutive items sum to 9 key tiles);
//  - dynamic order (sched_heads > 0, hopper_sched_heads()) for the other causal grids and for
//    key_lengths (costs that differ by tile, or depend on data): each block's producer draws its
//    next tile from a ticket counter, heaviest first within L2-sized sections of heads. Before it,
//    those launches ran one block per tile, dynamically balanced by the hardware's block scheduler
//    but paying every tile's prologue and epilogue (a block of 225 KB of shared memory has its SM
//    to itself: nothing overlaps them).
// OPSFUSE_CUDA_HOPPER_PERSISTENT=0: never persistent; =1: persistent wherever there are more tiles
// than SMs, in the snake order unless the dynamic one is taken. OPSFUSE_CUDA_HOPPER_DYNAMIC=0: no
// dynamic order (those launches one block per tile again, as before it, or the snake with
// PERSISTENT=1, the tests' way to run it on any shape); =1: every persistent grid dynamic.
struct Persistence {
  bool persistent = false;
  bool dynamic = false;
};
[[maybe_unused]] Persistence hopper_persistence(const AttentionParams& p, const DeviceInfo& dev, const Plan& plan,
                                                const Switches& sw) {
  Persistence r;
  if (sw.is(Switch::kHopperPersistent, '0')) return r;
  const int64_t tiles = static_cast<int64_t>(plan.row_tiles) * p.batch * p.heads_q;
  if (tiles <= dev.sms) return r;
  const bool snake_balances =
      p.key_lengths == nullptr && (p.is_causal == 0 || (2 * dev.sms) % std::max(1, plan.row_tiles) == 0);
  const bool dynamic_off = sw.is(Switch::kHopperDynamic, '0');
  r.persistent = snake_balances || !dynamic_off || sw.is(Switch::kHopperPersistent, '1');
  r.dynamic = r.persistent && (sw.is(Switch::kHopperDynamic, '1') || (!snake_balances && !dynamic_off));
  return r;
}

// The dynamic order's section: how many (batch, query head) pairs' row tiles are handed out before
// the next pairs' (heaviest row tiles first within a section), so that the K/V the blocks read at
// once stay in L2. 32 MB of the H200's 50 MB L2 (the rest for Q, Y and the blocks' other traffic);
// the query heads of one GQA group share their K/V. A model of the schedule (row-tile costs of
// causal B=8 H=16 S=4096, B=2 H=16 S=16384, B=1 H=16 S=8192, B=4 H=32 S=2048, 132 blocks, a fixed
// cost per tile) puts it within 1-2 % of a perfect balance, against 3-6 % for the snake
// (docs/notes/cuda_kernel.md, session 8).
[[maybe_unused]] int hopper_sched_heads(const AttentionParams& p, const Switches& sw) {
  if (const char* e = sw.get(Switch::kHopperSchedHeads); e != nullptr && std::atoi(e) > 0)
    return static_cast<int>(std::min<int64_t>(std::atoi(e), p.batch * p.heads_q));
  constexpr int64_t kL2Budget = int64_t{32} << 20;
  const int64_t group = std::max<int64_t>(1, p.heads_q / std::max<int64_t>(1, p.heads_kv));
  const int64_t kv_bytes = std::max<int64_t>(1, p.seq_k * (p.head_dim + p.head_dim_v) * 2 / group);
  return static_cast<int>(std::clamp<int64_t>(kL2Budget / kv_bytes, 1, p.batch * p.heads_q));
}

// Hopper key splits (hopper_fwd.cuh: each row tile's keys split s ways in a thread-block cluster,
// merged in distributed shared memory). Opt-in only, OPSFUSE_CUDA_HOPPER_SPLITS=N (1..8, at most one
// per key tile; tests, sweeps): written for grids with a partial last wave (seed B=1 H=12 S=2048,
// 192 row tiles on 132 SMs), but measured on the H200 (2026-11-29, runs 2 and 3) no faster than
// the unsplit launch: S=2048 2 splits 50.1 us against 46.8-48.5 persistent, S=512 10.2 against
// 9.9-10.2 (docs/notes/cuda_kernel.md, session 3). Each split block repeats the Q load, the pipeline
// fill and the epilogue, which the model "key tiles / s" left out.
[[maybe_unused]] int hopper_key_splits(const AttentionParams& p, const Switches& sw) {
  const char* e = sw.get(Switch::kHopperSplits);
  if (e == nullptr || std::atoi(e) <= 1) return 1;
  return std::max(1, std::min({std::atoi(e), 8, ceil_div(p.seq_k, 128)}));
}

// Hopper tail split (hopper_fwd.cuh, tail_round): a persistent grid whose last round is partial
// leaves SMs idle for a whole item time (seed B=1 H=12 S=2048 D=64: 192 row tiles on 132 SMs, the
// second round busies 60 of 132; 46.8-48.2 us against cuDNN's 41.6). Launched as clusters of 2
// (grid G = #SMs rounded down to even), the full rounds run unsplit as before and the last round's
// items are split 2 ways by key tiles within a cluster, merged in distributed shared memory: that
// round takes ~half an item time plus the merge instead of a whole one (seed: 1 + ~0.5 rounds
// instead of 2). Only where the kernel's one split round holds the tail (0 < items mod G <= G / 2).
// Chosen for non-causal launches without key_lengths with G < items <= 1.5 G (one full round; the
// tail's share of the time is largest), the conditions of a non-causal persistent grid. Splitting
// every item instead measured slower (hopper_key_splits()): each split repeats the Q load, the
// pipeline fill and the epilogue, which the tail split pays only in its last round.
// OPSFUSE_CUDA_HOPPER_TAIL_SPLIT=0: never; =1: wherever the persistent grid is taken and the tail
// fits (causal, key_lengths, several full rounds).
[[maybe_unused]] bool hopper_tail_split(const AttentionParams& p, const Plan& plan, const Switches& sw) {
  if (sw.is(Switch::kHopperTailSplit, '0')) return false;
  const int64_t items = static_cast<int64_t>(plan.row_tiles) * p.batch * p.heads_q;
  const int64_t g = std::min<int64_t>(items, plan.persistent) & ~int64_t{1};
  if (g < 2 || items % g == 0 || 2 * (items % g) > g) return false;
  if (sw.is(Switch::kHopperTailSplit, '1')) return true;
  return items / g == 1 && p.is_causal == 0 && p.key_lengths == nullptr;
}

// Hopper stream-K (hopper_fwd.cuh, KernelArgs::sk_count): a persistent grid of G blocks over n
// items of T key tiles each takes ceil(n / G) item times, the last round partly idle (prefill B=8
// H=16 D=128: S=1024 is 1024 items of 8 key tiles on 132 SMs, 7.76 rounds; S=4096 and 16384 are
// 4096 items, 31.03 rounds: ~3 % of the SMs' time idle at each). With stream-K the last n_sk items
// (G <= n_sk < 2 G, after floor(n / G) - 1 rounds of whole items) are shared as n_sk T (item, key
// tile) units in contiguous ranges of ~n_sk T / G, so every block finishes at about the same time;
// an item cut between two blocks costs one float32 partial (O, max, sum) written and read back
// through L2 (~70 KB at D = 128) and one arrival count, and the counts a memset: ~10 us of fixed
// cost in all. Measured on the H200 (2026-12-02, B=8 H=16 D=128 bf16, against the static order;
// docs/notes/cuda_kernel.md, session 11): S=1024 (T = 8, items of ~15 us) 7 % slower; S=4096
// (T = 32) 1.3 % faster in an interleaved A/B, 0.6 % slower in two benchmark runs each; S=16384
// (T = 128) 0.6 % and 1.5 % faster -- not the 3 % of idle SM time the round count suggests.
// Taken for items of >= 128 key tiles (16384 keys at D <= 128, where it measured faster) when the
// static grid loses >= 2 % to the partial round: uniform items (non-causal, no key_lengths), no
// mask or softcap (the plain kernel), D <= 128, items >= G, and not where the tail split is taken
// (G < n <= 1.5 G). OPSFUSE_CUDA_HOPPER_STREAM_K=0: never; =1: wherever those conditions hold but
// the 2 %, the 128 key tiles (>= 2 suffice) and the tail split's.
[[maybe_unused]] bool hopper_stream_k(const AttentionParams& p, const Plan& plan, const Switches& sw) {
  if (sw.is(Switch::kHopperStreamK, '0')) return false;
  if (plan.persistent <= 0 || plan.sched_heads != 0 || plan.cluster != 1 || plan.bucket > 128) return false;
  if (p.is_causal != 0 || p.key_lengths != nullptr || p.mask_kind != MaskKind::kNone || p.softcap > 0.0f)
    return false;
  const int64_t items = static_cast<int64_t>(plan.row_tiles) * p.batch * p.heads_q;
  const int64_t tiles = ceil_div(p.seq_k, plan.block_n);
  const int64_t g = plan.persistent;
  if (items < g || tiles < 2 || items * tiles >= INT_MAX) return false;
  if (sw.is(Switch::kHopperStreamK, '1')) return true;
  const int64_t rounds = (items + g - 1) / g;
  return tiles >= 128 && static_cast<double>(rounds * g) >= 1.02 * static_cast<double>(items);
}

// Hopper three-consumer kernel (hopper_seq3.cuh, kPlainSeq3): a third consumer warpgroup takes the
// last key tiles of both 64-row strips of a 128-row item, so that the item's chain of key-tile steps,
// the block's whole time in a launch of one round, is shorter (6 steps of 128 keys instead of 4 of
// 256, about 7.7, at 8 tiles). Taken for one-round launches (row tiles <= SMs, unsplit, not the
// warpgroup split, which takes one-round launches of 64-row items) of plain attention at D <= 64 --
// no mask, softcap, causal or key_lengths, a positive scale -- over 3 to 8 whole 128-key tiles
// (launch_hopper also needs no Q / V bias in the kernel and Y through TMA stores). The H100's
// same-process A/B (docs/notes/cuda_kernel.md, session 51; fp16 unless noted): the seed's S=1024
// 14.4 -> 13.6 µs (bf16 14.3 -> 13.5), 16 heads of 1024 keys -6 %, 16 of 768 -9 %, 24 of 512 -10 %,
// 40 of 384 -13 %. OPSFUSE_CUDA_HOPPER_SEQ3=0: never.
[[maybe_unused]] bool hopper_three_consumers(const AttentionParams& p, const DeviceInfo& dev, const Plan& plan,
                                             const Switches& sw) {
  if (sw.is(Switch::kHopperSeq3, '0') || plan.bucket != 64 || plan.persistent != 0 || plan.cluster != 1 ||
      plan.wg_split)
    return false;
  if (p.is_causal != 0 || p.key_lengths != nullptr || p.mask_kind != MaskKind::kNone || p.softcap > 0.0f ||
      !(p.scale > 0.0f) || p.seq_k % 128 != 0 || p.seq_k < 3 * 128 || p.seq_k > 8 * 128)
    return false;
  return static_cast<int64_t>(plan.row_tiles) * p.batch * p.heads_q <= dev.sms;
}

// Hopper warpgroup key split (hopper_fwd.cuh, kPlainSplit): items of 64 query rows, one block each,
// whose key tiles the block's two consumer warpgroups take in turn (even / odd), merged in shared
// memory at the end. For launches of one round, whose time is one block's item: a 128-row item runs
// its key tiles one after another at ~2,900 SM clocks each (the two warpgroups' softmax paces the
// D = 64 loop), the split half as many per block on up to twice the blocks (seed B=1 H=12 S=512
// D=64: 96 blocks of 2 + 2 tiles instead of 48 of 4; with Sq <= 64 as many blocks, where the
// 128-row launch's second warpgroup has no rows). Kernel traces and the A/B:
// docs/notes/cuda_kernel.md, session 19. Taken where the 64-row items fit in one round (<= #SMs),
// for the plain kernel (no mask, no softcap) without causal, key_lengths or Q's bias (every item
// then has the same >= 2 key tiles, which the warpgroups' turns rely on), D <= 128.
// OPSFUSE_CUDA_HOPPER_WG_SPLIT=0: never; =1: also beyond one round (several waves of blocks).
[[maybe_unused]] bool hopper_wg_split(const AttentionParams& p, const DeviceInfo& dev, const Plan& plan,
                                      const Switches& sw) {
  if (sw.is(Switch::kHopperWgSplit, '0') || plan.bucket > 128) return false;
  if (p.is_causal != 0 || p.key_lengths != nullptr || p.mask_kind != MaskKind::kNone || p.softcap > 0.0f ||
      p.q_bias != nullptr || ceil_div(p.seq_k, 128) < 2)
    return false;
  const int64_t items = static_cast<int64_t>(ceil_div(p.seq_q, 64)) * p.batch * p.heads_q;
  return items <= dev.sms || (sw.is(Switch::kHopperWgSplit, '1') && items < INT_MAX);  // n_work is an int
}

// Decode cluster merge: how many clusters of `cluster` blocks of the plan's decode kernel
// (flash_decode.cuh for this ring depth, or hopper/hopper_decode.cuh) for this dtype / bucket fit on
// the device at once (0: not compiled for sm_90).
int decode_clusters(const AttentionParams& p, const Plan& plan, int cluster) {
  using namespace detail;
  const bool h = p.dtype == DType::kFloat16;
  if (plan.kind == KernelKind::kHopperDecode) {
#ifdef OPSFUSE_CUDA_HOPPER
    if (plan.bucket == 64) return h ? clusters_hopper_dec_f16_d64(cluster) : clusters_hopper_dec_bf16_d64(cluster);
    if (plan.bucket == 128) return h ? clusters_hopper_dec_f16_d128(cluster) : clusters_hopper_dec_bf16_d128(cluster);
#endif
    return 0;
  }
  if (plan.bucket == 64) return h ? clusters_tcdec_f16_d64(plan.stages, cluster) : clusters_tcdec_bf16_d64(plan.stages, cluster);
  if (plan.bucket == 128)
    return h ? clusters_tcdec_f16_d128(plan.stages, cluster) : clusters_tcdec_bf16_d128(plan.stages, cluster);
  return 0;
}

// THE heuristic: which kernel, which tiles, how many KV splits. Depends on shapes, dtype and the
// device's multiprocessor count only (never on data), so workspace_size() and launch() agree.
//  - float32 -> the SIMT kernel (true float32).
//  - float16 / bfloat16 with at most 16 rows per (batch, kv head) -- decoding, where the GQA
//    packing puts the group's query heads into one tile -- and D, Dv <= 128 -> the decode kernel
//    (flash_decode.cuh: 16 rows, 4 warps sharing each 64-key tile, a 2..4-deep K/V ring).
//  - otherwise the prefill tiles of the head-size bucket.
//  Split-KV: decode tiles split the keys so that the grid fills every resident block slot once
//  (memory bound: bytes in flight matter, and a second partial wave would idle most of the chip);
//  prefill tiles split only when the grid leaves at least half of the multiprocessors idle and
//  each split keeps >= 4 key tiles (the combine pass is not free).
//  Decode split on compute capability >= 9.0 with <= 8 splits: the splits of one (batch, kv head)
//  are one thread-block cluster that merges in distributed shared memory and writes Y (plan.cluster,
//  no combine launch: ~3-5 us less), when the device holds all the clusters at once (one wave,
//  cudaOccupancyMaxActiveClusters) and OPSFUSE_CUDA_DECODE_NO_CLUSTER is not 1 (tests: the
//  workspace + combine path). workspace_size() still counts the split workspace (a superset).
//  Hopper decode (allow_hopper, hopper_decode_eligible()): a decode plan becomes
//  KernelKind::kHopperDecode with the same splits (its blocks are as resident: two per SM), under
//  the same cluster rule (its own occupancy); short key sequences may take fewer splits whose
//  clusters fit (measured below).
//  Hopper (allow_hopper, hopper_eligible()): a float16/bfloat16 prefill plan that the sm_90a kernel
//  covers becomes KernelKind::kHopper (128x128 tiles, 128x64 at D = 256; a persistent grid,
//  hopper_persistence(), statically or dynamically scheduled (plan.sched_heads), whose partial
//  last round may be split by keys in clusters of 2 when static,
//  hopper_tail_split() (plan.cluster = 2 with plan.persistent > 0), or, opt-in, key splits merged
//  in a cluster, hopper_key_splits(); neither split at D = 256).
Plan choose_plan(const AttentionParams& p, const DeviceInfo& dev, const Switches& sw, bool allow_hopper = true) {
  Plan plan;
  const int64_t dmax = std::max(p.head_dim, p.head_dim_v);
  plan.bucket = dmax <= 64 ? 64 : (dmax <= 128 ? 128 : 256);
  plan.bucket_v = plan.bucket;  // the Hopper kernel's latent-attention instantiation may take less (below)
  const int64_t rows = (p.heads_q / p.heads_kv) * p.seq_q;
  detail::TileShape tile;
  int smem_block = 0;
  if (p.dtype == DType::kFloat32) {
    plan.kind = KernelKind::kFloat32;
    // Every warp of either tile does the same steps per row it owns (4 rows per row group), so the
    // time is ~ (warps on the busiest SM sub-partition) x (rows per warp). The 1-warp small tile
    // (half the rows per warp, 1.25x for its lower FFMA share and its own K/V reads) is taken when
    // that is clearly shorter: small grids, where the prefill tile leaves most SMs idle.
    const detail::TileShape big = plan.bucket == 64 ? detail::kF32Tile64
                                  : (plan.bucket == 128 ? detail::kF32Tile128 : detail::kF32Tile256);
    const detail::TileShape small = plan.bucket == 64 ? detail::kF32Small64
                                    : (plan.bucket == 128 ? detail::kF32Small128 : detail::kF32Small256);
    auto cost = [&](const detail::TileShape& t) {
      const int64_t warps = p.batch * p.heads_kv * ceil_div(rows, t.block_m) * t.warps;
      const int64_t per_subpartition = (warps + 4 * dev.sms - 1) / (4 * static_cast<int64_t>(dev.sms));
      return static_cast<double>(per_subpartition) * t.block_m / t.warps * (t.warps == 1 ? 1.25 : 1.0);
    };
    tile = cost(small) <= 0.75 * cost(big) ? small : big;
    smem_block = detail::f32_smem_bytes(plan.bucket, tile.block_m, tile.block_n);
  } else {
    const bool decode = rows <= 16 && plan.bucket <= 128;
    plan.kind = decode ? KernelKind::kTensorCoreDecode : KernelKind::kTensorCore;
    tile = decode ? detail::kTcDecodeTile
                  : (plan.bucket == 64 ? detail::kTcTile64 : (plan.bucket == 128 ? detail::kTcTile128 : detail::kTcTile256));
    // Prefill: a 2-stage K/V ring where a block fits (the per-block opt-in limit is the SM's less
    // 1 KB) and as many blocks stay resident as with 1 stage; else 1 stage (sm_86/89 at D >= 128,
    // sm_80 at D = 128, where 1 stage keeps 2 blocks per SM and the blocks overlap each other).
    const int two = detail::tc_smem_bytes(plan.bucket, tile.block_m, tile.block_n, 2);
    const int one = detail::tc_smem_bytes(plan.bucket, tile.block_m, tile.block_n, 1);
    const bool two_fit = two + 1024 <= dev.smem_per_sm &&
                         std::min(tile.per_sm_regs, dev.smem_per_sm / (two + 1024)) >=
                             std::min(tile.per_sm_regs, dev.smem_per_sm / (one + 1024));
    plan.stages = two_fit ? 2 : 1;
    smem_block = plan.stages == 2 ? two : one;
  }
  if (plan.kind == KernelKind::kTensorCoreDecode) {  // flash_decode.cuh: a ring of K/V stages
    plan.stages = detail::decode_stages(plan.bucket, dev.smem_per_sm);
    smem_block = detail::decode_smem_bytes(plan.bucket, plan.stages);
  }
  plan.block_m = tile.block_m;
  plan.block_n = tile.block_n;
  plan.row_tiles = ceil_div(rows, tile.block_m);
  // Resident blocks per multiprocessor: shared memory, or registers (tile.per_sm_regs).
  const int per_sm = std::max(1, std::min(tile.per_sm_regs, dev.smem_per_sm / (smem_block + 1024)));
  const int64_t blocks = p.batch * p.heads_kv * plan.row_tiles;
  const int n_tiles = ceil_div(p.seq_k, tile.block_n);
  const int64_t slots = static_cast<int64_t>(dev.sms) * per_sm;
  int splits = 1;
  if (blocks > 0 && n_tiles > 1) {
    if (plan.kind == KernelKind::kTensorCoreDecode) {
      // Memory bound: fill every resident slot once (one wave), each split >= 2 key tiles.
      if (blocks < slots) splits = std::min<int64_t>(slots / blocks, std::max(1, n_tiles / 2));
      // OPSFUSE_CUDA_DECODE_SPLITS=N (benchmark sweeps): N splits, at most one per key tile. Read by
      // workspace_size() and launch() alike, so both see the same plan.
      const char* forced = sw.get(Switch::kDecodeSplits);
      if (forced != nullptr && std::atoi(forced) > 0) splits = std::min(std::atoi(forced), n_tiles);
    } else if (plan.kind == KernelKind::kFloat32) {
      // Compute bound on the CUDA cores: the busiest SM sub-partition runs ceil(warps * s / (4 SMs))
      // warps of 1/s of the keys each. Split when that is >= 20% less than unsplit (the combine
      // pass costs a launch and a pass over the partials), each split >= 4 key tiles. E.g. 192
      // 4-warp blocks on 132 SMs (seed S=1024): 2 blocks on the busiest SM, 3 of half the keys.
      const int64_t sub = 4 * static_cast<int64_t>(dev.sms);
      auto load = [&](int s) { return static_cast<double>((blocks * tile.warps * s + sub - 1) / sub) / s; };
      int best = 1;
      for (int s = 2; s <= std::min(8, n_tiles / 4); ++s)
        if (load(s) < load(best)) best = s;
      if (load(best) <= 0.8 * load(1)) splits = best;
    } else if (2 * blocks <= dev.sms && n_tiles >= 8) {
      splits = std::min<int64_t>(slots / blocks, n_tiles / 4);
    }
  }
  plan.num_splits = std::max(1, std::min(splits, 128));
  if (allow_hopper && hopper_decode_eligible(p, dev, plan, sw)) plan.kind = KernelKind::kHopperDecode;
  const bool decode = plan.kind == KernelKind::kTensorCoreDecode || plan.kind == KernelKind::kHopperDecode;
  if (decode && dev.cc >= 90 && !sw.is(Switch::kDecodeNoCluster, '1')) {
    auto fits = [&](int s) { return s > 1 && s <= 8 && decode_clusters(p, plan, s) >= blocks; };
    if (fits(plan.num_splits)) {
      plan.cluster = plan.num_splits;
    } else if (plan.kind == KernelKind::kHopperDecode && plan.num_splits > 2 && n_tiles <= 32 &&
               sw.get(Switch::kDecodeSplits) == nullptr) {
      // Short key sequences (<= 32 key tiles per (batch, kv head)) on the TMA decode kernel, whose
      // time is mostly the fixed launch-to-result part: fewer splits whose clusters fit (no
      // combine launch) beat the fill-every-slot count. Measured on the H200 (2026-11-29, B=8
      // Hq=32 Hkv=8, 64 (batch, kv head) pairs): Sk=1024 4 splits + combine 18.3 us, 3 splits in
      // clusters 15.8 (cuDNN 15.1); at Sk=8192 the same change costs (70.6 -> 72.8 us), so long
      // sequences keep the slot-filling count.
      for (int s = plan.num_splits - 1; s >= 2; --s)
        if (fits(s)) {
          plan.num_splits = plan.cluster = s;
          break;
        }
    }
  }
  if (allow_hopper && hopper_eligible(p, dev, plan, sw)) {
    // hopper/hopper_fwd.cuh: 128 query rows of one (batch, query head) per block, 128-key tiles
    // (64 at D = 256, whose split merge would not fit its shared memory: never split there).
    plan.kind = KernelKind::kHopper;
    // Latent attention (DeepSeek-V3: D = 192, Dv = 128): V, O and the P V product at 128 columns
    // rather than padded to 256 (hopper_{f16,bf16}_d256v128.cu: a quarter less tensor work per tile,
    // 64 accumulators per thread instead of 128), and with D <= 192 Q / K over 192 columns on 128-key
    // tiles (d192v128.cu). docs/notes/cuda_kernel.md, session 43.
    if (plan.bucket == 256 && p.head_dim_v <= 128 && !sw.is(Switch::kHopperDvBucket, '0')) {
      plan.bucket_v = 128;
      if (p.head_dim <= 192 && !sw.is(Switch::kHopperD192, '0')) plan.bucket = 192;
    }
    plan.block_m = 128;
    plan.block_n = plan.bucket == 256 ? 64 : 128;
    plan.row_tiles = ceil_div(p.seq_q, 128);
    plan.num_splits = 1;
    plan.cluster = plan.bucket > 128 ? 1 : hopper_key_splits(p, sw);
    if (plan.cluster == 1 && hopper_wg_split(p, dev, plan, sw)) {
      // One block per 64-row item (no persistent grid: one round, or several waves when forced).
      plan.wg_split = true;
      plan.block_m = 64;
      plan.row_tiles = ceil_div(p.seq_q, 64);
    } else {
      const Persistence pers = plan.cluster == 1 ? hopper_persistence(p, dev, plan, sw) : Persistence{};
      plan.persistent = pers.persistent ? dev.sms : 0;
      plan.sched_heads = pers.dynamic ? hopper_sched_heads(p, sw) : 0;  // dynamic implies persistent
      if (plan.persistent > 0 && plan.sched_heads == 0 && plan.bucket <= 128 && hopper_tail_split(p, plan, sw) &&
          !sw.is(Switch::kHopperStreamK, '1'))
        plan.cluster = 2;  // the last round split
      plan.stream_k = hopper_stream_k(p, plan, sw);
    }
  }
  // A/B switches the launch functions apply (see where each is used).
  plan.pingpong = !sw.is(Switch::kHopperPingpong, '0');
  plan.mask_classes = !sw.is(Switch::kHopperMaskClasses, '0');
  plan.mask_pairs = !sw.is(Switch::kHopperMaskPairs, '0');
  plan.tma_store = !sw.is(Switch::kHopperTmaStore, '0');
  plan.fast_plain = !sw.is(Switch::kHopperFast, '0');
  plan.three_consumers = plan.kind == KernelKind::kHopper && hopper_three_consumers(p, dev, plan, sw);
  if (const char* chain = sw.get(Switch::kHopperChain)) {
    const int n = std::max(0, std::atoi(chain));
    if (n != 1) plan.chain_tiles = plan.chain_tiles_causal = n;  // 1: on, as by default
  }
  plan.pdl = sw.is(Switch::kHopperPdl, '1');
  if (const char* seq = sw.get(Switch::kHopperSeq)) plan.seq_tiles = std::max(0, std::atoi(seq));
  if (const char* seq = sw.get(Switch::kHopperSeqD128)) plan.seq_tiles_d128 = std::max(0, std::atoi(seq));
  if (const char* seq = sw.get(Switch::kHopperSeqWide)) plan.seq_wide_tiles = std::max(0, std::atoi(seq));
  if (const char* promo = sw.get(Switch::kDecodeL2Promotion)) plan.l2_promotion = std::atoi(promo);
  plan.evict_first = !sw.is(Switch::kDecodeEvictFirst, '0');
  return plan;
}

// The dynamic schedule's ticket counter (Plan::sched_heads), at the workspace's start.
constexpr size_t kTicketBytes = 256;

// Stream-K (Plan::stream_k): one arrival count per shared item, then two partial slots per block,
// each (bucket / 8 + 1) x 256 float4 (hopper_fwd.cuh); both 256-byte aligned from a 256-byte
// aligned start.
struct StreamKLayout {
  size_t count_bytes, slot_bytes, bytes;
};
// Whole-item rounds before the shared items, and the shared items (Plan::stream_k).
struct StreamKSplit {
  int64_t rounds, items;
};
StreamKSplit stream_k_split(const AttentionParams& p, const Plan& plan) {
  const int64_t items = static_cast<int64_t>(plan.row_tiles) * p.batch * p.heads_q;
  const int64_t rounds = std::max<int64_t>(0, items / plan.persistent - 1);
  return {rounds, items - rounds * plan.persistent};
}
StreamKLayout stream_k_layout(const AttentionParams& p, const Plan& plan) {
  StreamKLayout l;
  const size_t items = static_cast<size_t>(stream_k_split(p, plan).items);
  l.count_bytes = (items * sizeof(int) + 255) & ~size_t{255};
  l.slot_bytes = static_cast<size_t>(plan.bucket / 8 + 1) * 256 * 16;
  l.bytes = 256 + l.count_bytes + 2 * static_cast<size_t>(plan.persistent) * l.slot_bytes;
  return l;
}

size_t workspace_for(const AttentionParams& p, const Plan& plan) {
  if (plan.sched_heads > 0) return kTicketBytes;
  if (plan.stream_k) return stream_k_layout(p, plan).bytes;
  if (plan.num_splits <= 1) return 0;
  const size_t rows = static_cast<size_t>(p.batch) * p.heads_q * p.seq_q;
  return static_cast<size_t>(plan.num_splits) * rows * (static_cast<size_t>(p.head_dim_v) + 2) * sizeof(float) + 256;
}

std::string check_params(const AttentionParams& p) {
  Message os;
  if (p.batch < 0 || p.heads_q < 0 || p.heads_kv < 0 || p.seq_q < 0 || p.seq_k < 0) {
    os << "negative size in params";
  } else if (p.heads_kv == 0 && p.heads_q != 0) {
    os << "heads_kv is 0";
  } else if (p.heads_kv > 0 && p.heads_q % p.heads_kv != 0) {
    os << "the number of query heads (" << p.heads_q << ") must be a multiple of the number of key/value heads ("
       << p.heads_kv << ")";
  } else if (p.head_dim < 1 || p.head_dim > 256 || p.head_dim_v < 1 || p.head_dim_v > 256) {
    os << "unsupported head size: D = " << p.head_dim << ", Dv = " << p.head_dim_v << "; both must be in 1..256";
  } else if (p.is_causal < 0 || p.is_causal > 2) {
    os << "is_causal must be 0, 1 or 2, got " << p.is_causal;
  } else if (!(std::isfinite(p.softcap) && p.softcap >= 0.0f)) {
    os << "softcap must be a finite float >= 0, got " << p.softcap;
  } else if (!std::isfinite(p.scale)) {
    os << "scale must be finite, got " << p.scale;
  } else if (p.mask_kind != MaskKind::kNone && p.mask == nullptr) {
    os << "attn_mask kind is set but the mask pointer is null";
  } else if (p.heads_kv > 0 && (p.heads_q / p.heads_kv) * p.seq_q > INT_MAX / 2) {
    os << "too many query rows per key/value head: " << (p.heads_q / p.heads_kv) * p.seq_q;
  } else if (p.seq_k > INT_MAX / 2) {
    os << "key sequence too long: " << p.seq_k;
  } else if (p.batch * p.heads_kv > INT_MAX / 2) {
    os << "batch * key/value heads too large: " << p.batch * p.heads_kv;
  }
  return os.str();
}

bool aligned(const void* ptr, size_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

// Biases (AttentionParams::q_bias ...; bias_fold.h): the Hopper prefill kernel adds them itself,
// except K's under softcap (tanh does not pass a per-row constant through, so it cannot be left out).
bool fuses_biases(const AttentionParams& p, const Plan& plan) {
  return plan.kind == KernelKind::kHopper && !(p.softcap > 0.0f && p.k_bias != nullptr);
}
// Kernels that add V's bias in their epilogue (O + l b before the division by l, which also holds
// for split partials: the combine's weights are linear in l). The others read a copy: the decode
// kernels, and the mma.sync kernel, which sits at 255 registers at D = 128 and spilled with it
// (24-128 bytes on sm_80-90; session 17).
bool adds_v_bias(const Plan& plan) {
  return plan.kind == KernelKind::kHopper || plan.kind == KernelKind::kFloat32;
}
// Where planning places the biased copies before the workspace exists (choose_plan() reads pointer
// alignment only; the real copies start 256-byte aligned too).
void* const kPlanningBase = reinterpret_cast<void*>(uintptr_t{1} << 12);

// What a launch of `p` runs: its plan, the params its kernel reads (the biased copies placed at
// kPlanningBase), and the copies' workspace (room to align their start included; the kernel's own
// workspace follows them). One function for workspace_size() and the launch, so that both agree.
struct LaunchPlan {
  Plan plan;
  AttentionParams reads;
  bool copy_v = false;
  size_t copy_bytes = 0;
};
LaunchPlan plan_launch(const AttentionParams& p, const DeviceInfo& dev, const Switches& sw, bool allow_hopper) {
  LaunchPlan lp;
  lp.reads = p;
  lp.plan = choose_plan(p, dev, sw, allow_hopper);
  if (!has_bias(p) || fuses_biases(p, lp.plan)) return lp;
  // Copies of Q and K; V's too when the kernel chosen for the copies does not add V's bias.
  for (const bool copy_v : {false, true}) {
    const BiasedCopies copies = plan_biased_copies(p, kPlanningBase, detail::kBiasedCopyAlign, copy_v);
    lp.copy_v = copy_v;
    lp.reads = copies.reading;
    lp.copy_bytes = copies.count > 0 ? copies.bytes + detail::kBiasedCopyAlign : 0;
    lp.plan = choose_plan(lp.reads, dev, sw, allow_hopper);
    if (lp.reads.v_bias == nullptr || adds_v_bias(lp.plan)) break;
  }
  return lp;
}
size_t workspace_need(const LaunchPlan& lp) { return lp.copy_bytes + workspace_for(lp.reads, lp.plan); }

template <typename T>
__global__ void combine_splits_kernel(const KernelArgs a) {
  // One warp per output row: merges the splits' (max, sum, unnormalized output).
  const int64_t total = static_cast<int64_t>(a.batch) * a.heads_q * a.seq_q;
  const int64_t grow = static_cast<int64_t>(blockIdx.x) * 4 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (grow >= total) return;
  float m_max = -INFINITY;
  for (int s = 0; s < a.num_splits; ++s) m_max = fmaxf(m_max, a.part_ml[(s * total + grow) * 2]);
  const float base = m_max == -INFINITY ? 0.0f : m_max;
  float l_sum = 0.0f;
  for (int s = 0; s < a.num_splits; ++s) {
    const float* ml = a.part_ml + (s * total + grow) * 2;
    l_sum += exp2f(ml[0] - base) * ml[1];
  }
  const float inv = l_sum > 0.0f ? 1.0f / l_sum : 0.0f;  // fully masked row -> 0
  const int64_t i = grow % a.seq_q, h = (grow / a.seq_q) % a.heads_q, b = grow / (static_cast<int64_t>(a.seq_q) * a.heads_q);
  T* yrow = static_cast<T*>(a.y) + b * a.y_stride[0] + h * a.y_stride[1] + i * a.y_stride[2];
  for (int c = lane; c < a.head_dim_v; c += 32) {
    float acc = 0.0f;
    for (int s = 0; s < a.num_splits; ++s) {
      const float w = exp2f(a.part_ml[(s * total + grow) * 2] - base);
      acc += w * a.part_o[(s * total + grow) * a.head_dim_v + c];
    }
    yrow[c] = detail::from_float<T>(acc * inv);
  }
}

template <typename T>
cudaError_t launch_combine(const KernelArgs& a, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(a.batch) * a.heads_q * a.seq_q;
  combine_splits_kernel<T><<<static_cast<unsigned>((total + 3) / 4), 128, 0, stream>>>(a);
  return cudaGetLastError();
}

using RunFn = cudaError_t (*)(const KernelArgs&, const Plan&, cudaStream_t);

RunFn pick_kernel(const AttentionParams& p, const Plan& plan) {
  using namespace detail;
  const int bi = plan.bucket == 64 ? 0 : (plan.bucket == 128 ? 1 : 2);
  switch (plan.kind) {
    case KernelKind::kFloat32: {
      static const RunFn f[3] = {run_f32_d64, run_f32_d128, run_f32_d256};
      return f[bi];
    }
    case KernelKind::kTensorCoreDecode: {
      static const RunFn h[2] = {run_tcdec_f16_d64, run_tcdec_f16_d128};
      static const RunFn bf[2] = {run_tcdec_bf16_d64, run_tcdec_bf16_d128};
      if (bi > 1) return nullptr;
      return p.dtype == DType::kFloat16 ? h[bi] : bf[bi];
    }
    case KernelKind::kTensorCore: {
      static const RunFn h[3] = {run_tc_f16_d64, run_tc_f16_d128, run_tc_f16_d256};
      static const RunFn bf[3] = {run_tc_bf16_d64, run_tc_bf16_d128, run_tc_bf16_d256};
      return p.dtype == DType::kFloat16 ? h[bi] : bf[bi];
    }
    case KernelKind::kHopperDecode: {
#ifdef OPSFUSE_CUDA_HOPPER
      static const RunFn h[2] = {run_hopper_dec_f16_d64, run_hopper_dec_f16_d128};
      static const RunFn bf[2] = {run_hopper_dec_bf16_d64, run_hopper_dec_bf16_d128};
      if (bi > 1) return nullptr;
      return p.dtype == DType::kFloat16 ? h[bi] : bf[bi];
#else
      return nullptr;
#endif
    }
    case KernelKind::kHopper: {
#ifdef OPSFUSE_CUDA_HOPPER
      static const RunFn h[3] = {run_hopper_f16_d64, run_hopper_f16_d128, run_hopper_f16_d256};
      static const RunFn bf[3] = {run_hopper_bf16_d64, run_hopper_bf16_d128, run_hopper_bf16_d256};
      if (plan.bucket == 192)  // latent attention: Q / K over 192 columns, V's own bucket
        return p.dtype == DType::kFloat16 ? run_hopper_f16_d192_v128 : run_hopper_bf16_d192_v128;
      if (plan.bucket == 256 && plan.bucket_v == 128)  // latent attention: V's own bucket
        return p.dtype == DType::kFloat16 ? run_hopper_f16_d256_v128 : run_hopper_bf16_d256_v128;
      return p.dtype == DType::kFloat16 ? h[bi] : bf[bi];
#else
      return nullptr;
#endif
    }
  }
  return nullptr;
}

}  // namespace

size_t workspace_size(const AttentionParams& p) {
  if (!check_params(p).empty()) return 0;
  if (p.batch == 0 || p.heads_q == 0 || p.seq_q == 0) return 0;
  DeviceInfo dev;
  if (device_info(&dev) != cudaSuccess) return 0;
  const Switches sw = read_switches();
  // The chosen plan and the portable one that a TMA refusal falls back to (see the top).
  return std::max(workspace_need(plan_launch(p, dev, sw, /*allow_hopper=*/true)),
                  workspace_need(plan_launch(p, dev, sw, /*allow_hopper=*/false)));
}

bool describe_plan(const AttentionParams& p, int sms, int smem_per_sm, int cc, PlanSummary* out) {
  g_last_error = check_params(p);
  if (!g_last_error.empty()) return false;
  DeviceInfo dev;
  dev.sms = sms;
  dev.smem_per_sm = smem_per_sm;
  dev.cc = cc;
  const Plan plan = plan_launch(p, dev, read_switches(), /*allow_hopper=*/true).plan;
  static constexpr const char* kKinds[] = {"tensor_core", "tensor_core_decode", "float32", "hopper", "hopper_decode"};
  static_assert(sizeof(kKinds) / sizeof(kKinds[0]) == static_cast<size_t>(KernelKind::kHopperDecode) + 1,
                "one name per KernelKind, in its order");
  PlanSummary r;
  r.kernel = kKinds[static_cast<int>(plan.kind)];
  r.bucket = plan.bucket;
  r.bucket_v = plan.bucket_v;
  r.block_m = plan.block_m;
  r.num_splits = plan.num_splits;
  r.cluster = plan.cluster;
  r.persistent = plan.persistent;
  r.sched_heads = plan.sched_heads;
  r.wg_split = plan.wg_split;
  r.stream_k = plan.stream_k;
  r.chain_tiles = plan.chain_tiles;
  r.chain_tiles_causal = plan.chain_tiles_causal;
  r.fast_plain = plan.fast_plain;
  r.three_consumers = plan.three_consumers;
#ifdef OPSFUSE_CUDA_HOPPER
  r.hopper_compiled = true;
#endif
  *out = r;
  return true;
}

namespace {

// Where a launch's scratch space comes from: a caller's buffer of fixed size (launch() with a
// workspace), or an allocator asked for what the chosen plan needs (launch() with a ScratchAlloc:
// the plan is made once per call).
struct Scratch {
  void* ptr = nullptr;
  size_t bytes = 0;
  ScratchAlloc alloc = nullptr;
  void* ctx = nullptr;
  // True when at least `need` bytes are at ptr (asking the allocator when there is one).
  bool ensure(size_t need) {
    if (need == 0 || (ptr != nullptr && bytes >= need)) return true;
    if (alloc == nullptr) return false;
    ptr = alloc(ctx, need);
    bytes = ptr != nullptr ? need : 0;
    return ptr != nullptr;
  }
};

Status launch_with(const AttentionParams& p, Scratch& scratch, void* stream_ptr) {
  g_last_error.clear();
  const std::string bad = check_params(p);
  if (!bad.empty()) return fail(Status::kInvalidArgument, bad);
  if (p.batch == 0 || p.heads_q == 0 || p.seq_q == 0) return Status::kOk;  // empty output
  if (p.q == nullptr || p.y == nullptr || (p.seq_k > 0 && (p.k == nullptr || p.v == nullptr)))
    return fail(Status::kInvalidArgument, "a Q, K, V or Y data pointer is null");
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);

  // This library links its own (static) CUDA runtime, whose current device is not the caller's:
  // make it the stream's device (host-side query, no synchronization).
  cudaError_t err = select_stream_device(stream);
  if (err != cudaSuccess) return cuda_fail(err, "selecting the stream's device");
  DeviceInfo dev;
  err = device_info(&dev);
  if (err != cudaSuccess) return cuda_fail(err, "reading the device's attributes");
  const Switches sw = read_switches();
  // Biases that the chosen kernel does not add: the kernels read biased copies at the workspace's
  // start (bias_fold.h), planned for as what they are (dense tensors), the kernel's own workspace
  // after them.
  const LaunchPlan chosen = plan_launch(p, dev, sw, /*allow_hopper=*/true);
  Plan plan = chosen.plan;
  // A workspace sized for another shape (TensorRT samples its profile's range) may lack stream-K's
  // partial slots: the static order then, which needs none.
  if (plan.stream_k && !scratch.ensure(workspace_need(chosen))) plan.stream_k = false;
  auto short_of = [&](size_t bytes) {
    if (scratch.alloc != nullptr) return fail(Status::kDeviceError, "could not allocate the launch's scratch space");
    Message os;
    os << "the launch needs " << bytes << " bytes of workspace (workspace_size), got " << scratch.bytes;
    return fail(Status::kInvalidArgument, os.str());
  };
  const size_t need = chosen.copy_bytes + workspace_for(chosen.reads, plan);
  if (!scratch.ensure(need)) return short_of(need);
  // Writes the biased copies that `lp` reads at the (256-byte aligned) start of the scratch space
  // and moves `workspace` past them; returns the params reading them.
  void* workspace = scratch.ptr;
  auto place_copies = [&](const LaunchPlan& lp) {
    workspace = scratch.ptr;
    err = cudaSuccess;
    if (lp.copy_bytes == 0) return lp.reads;
    constexpr uintptr_t kAlign = detail::kBiasedCopyAlign;
    void* base = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(scratch.ptr) + kAlign - 1) & ~(kAlign - 1));
    const BiasedCopies copies = plan_biased_copies(p, base, kAlign, lp.copy_v);
    workspace = static_cast<char*>(base) + copies.bytes;
    err = detail::launch_fold_biases(p, copies, stream);
    return copies.reading;
  };
  const AttentionParams qkv = place_copies(chosen);
  if (err != cudaSuccess) return cuda_fail(err, "launching the bias copies' kernel");

  KernelArgs a{};
#ifdef OPSFUSE_HOPPER_TRACE
  if (const char* e = std::getenv("OPSFUSE_HOPPER_TRACE_PTR"); e != nullptr)
    a.trace = reinterpret_cast<unsigned long long*>(std::strtoull(e, nullptr, 0));
#endif
  a.y = p.y;
  a.mask = p.mask_kind == MaskKind::kNone ? nullptr : p.mask;
  a.mask_kind = static_cast<int>(p.mask_kind);
  a.key_lengths = p.key_lengths;
  a.key_lengths_int64 = p.key_lengths_int64 ? 1 : 0;
  a.batch = static_cast<int>(p.batch);
  a.heads_q = static_cast<int>(p.heads_q);
  a.heads_kv = static_cast<int>(p.heads_kv);
  a.group = static_cast<int>(p.heads_q / p.heads_kv);
  a.seq_q = static_cast<int>(p.seq_q);
  a.seq_k = static_cast<int>(p.seq_k);
  a.head_dim = static_cast<int>(p.head_dim);
  a.head_dim_v = static_cast<int>(p.head_dim_v);
  a.rows = a.group * a.seq_q;
  a.causal = p.is_causal;
  a.causal_offset = p.is_causal == 2 ? a.seq_k - a.seq_q : 0;
  for (int i = 0; i < 3; ++i) a.y_stride[i] = p.y_stride[i];
  for (int i = 0; i < 4; ++i) a.mask_stride[i] = p.mask_stride[i];
  a.scale = p.scale;
  a.scale_log2 = p.scale * detail::kLog2e;
  a.softcap = p.softcap;
  const size_t esize = p.dtype == DType::kFloat32 ? 4 : 2;
  // Q, K, V (and the biases the kernel adds itself) as the kernel reads them.
  auto bind_inputs = [&](const AttentionParams& r) {
    a.q = r.q;
    a.k = r.k;
    a.v = r.v;
    for (int i = 0; i < 3; ++i) {
      a.q_stride[i] = r.q_stride[i];
      a.k_stride[i] = r.k_stride[i];
      a.v_stride[i] = r.v_stride[i];
    }
    a.q_bias = r.q_bias;
    a.v_bias = r.v_bias;
    bool vec = aligned(r.q, 16) && aligned(r.k, 16) && aligned(r.v, 16);
    for (int i = 0; i < 3; ++i)
      vec = vec && (r.q_stride[i] * esize) % 16 == 0 && (r.k_stride[i] * esize) % 16 == 0 &&
            (r.v_stride[i] * esize) % 16 == 0;
    a.vec_loads = vec ? 1 : 0;
  };
  bind_inputs(qkv);
  bool vs = aligned(p.y, 2 * esize);
  for (int i = 0; i < 3; ++i) vs = vs && p.y_stride[i] % 2 == 0;
  a.vec_store = vs ? 1 : 0;
  // The split-KV workspace layout of a plan: partial outputs, then (max, sum) per split and row.
  auto bind_splits = [&](const Plan& pl) {
    a.num_splits = pl.num_splits;
    if (pl.num_splits > 1) {
      const size_t rows = static_cast<size_t>(p.batch) * p.heads_q * p.seq_q;
      uintptr_t base = (reinterpret_cast<uintptr_t>(workspace) + 255) & ~uintptr_t(255);
      a.part_o = reinterpret_cast<float*>(base);
      a.part_ml = a.part_o + static_cast<size_t>(pl.num_splits) * rows * p.head_dim_v;
    }
  };
  bind_splits(plan);
  a.sched_heads = plan.sched_heads;
  // The ticket counter, 4-byte aligned at the workspace's first kTicketBytes (zeroed by launch_hopper).
  a.tile_counter = plan.sched_heads > 0
                       ? reinterpret_cast<int*>((reinterpret_cast<uintptr_t>(workspace) + 3) & ~uintptr_t(3))
                       : nullptr;
  if (plan.stream_k) {
    const StreamKLayout l = stream_k_layout(p, plan);
    const uintptr_t base = (reinterpret_cast<uintptr_t>(workspace) + 255) & ~uintptr_t(255);
    const StreamKSplit split = stream_k_split(p, plan);
    const int64_t units = split.items * ceil_div(p.seq_k, plan.block_n);
    a.sk_count = reinterpret_cast<int*>(base);
    a.sk_part = reinterpret_cast<float*>(base + l.count_bytes);
    a.sk_rounds = static_cast<int>(split.rounds);
    a.sk_q = static_cast<int>(units / plan.persistent);
    a.sk_r = static_cast<int>(units % plan.persistent);
  }
  const RunFn run = pick_kernel(p, plan);
  if (run == nullptr) return fail(Status::kUnsupported, "no compiled kernel for this configuration");
  g_last_kind = static_cast<int>(plan.kind);
  Plan ran = plan;
  err = run(a, plan, stream);
  if (err == cudaErrorNotSupported && (plan.kind == KernelKind::kHopper || plan.kind == KernelKind::kHopperDecode)) {
    // The driver refused a TMA layout that the eligibility checks let through (nothing was
    // launched): the portable plan instead, when the workspace covers it (workspace_size() counts
    // it; a caller that sized the workspace for the Hopper plan alone may fall short) or the
    // scratch allocator hands out what it needs.
    // Planned from `p` again, biases included (the copies are rewritten in stream order; nothing
    // has read them yet).
    const LaunchPlan portable = plan_launch(p, dev, sw, /*allow_hopper=*/false);
    const bool room = scratch.ensure(workspace_need(portable));
    if (!room && has_bias(p)) return short_of(workspace_need(portable));  // never run without the biases
    const RunFn fallback_run = room ? pick_kernel(p, portable.plan) : nullptr;
    if (fallback_run != nullptr) {
      bind_inputs(place_copies(portable));
      if (err != cudaSuccess) return cuda_fail(err, "launching the bias copies' kernel");
      bind_splits(portable.plan);
      g_last_kind = static_cast<int>(portable.plan.kind);
      ran = portable.plan;
      err = fallback_run(a, portable.plan, stream);
    }
  }
  if (err != cudaSuccess) return cuda_fail(err, "launching the FusedAttention kernel");
  if (ran.num_splits > 1 && ran.cluster <= 1) {  // a cluster merge (decode) already wrote Y
    switch (p.dtype) {
      case DType::kFloat32: err = launch_combine<float>(a, stream); break;
      case DType::kFloat16: err = launch_combine<__half>(a, stream); break;
      case DType::kBFloat16: err = launch_combine<__nv_bfloat16>(a, stream); break;
    }
    if (err != cudaSuccess) return cuda_fail(err, "launching the split-KV combine kernel");
  }
  return Status::kOk;
}

}  // namespace

Status launch(const AttentionParams& p, void* workspace, size_t workspace_bytes, void* stream) {
  Scratch scratch;
  scratch.ptr = workspace;
  scratch.bytes = workspace == nullptr ? 0 : workspace_bytes;
  return launch_with(p, scratch, stream);
}

Status launch(const AttentionParams& p, ScratchAlloc alloc, void* alloc_ctx, void* stream) {
  Scratch scratch;
  scratch.alloc = alloc;
  scratch.ctx = alloc_ctx;
  return launch_with(p, scratch, stream);
}

const char* last_error_message() { return g_last_error.c_str(); }

namespace detail {
int last_launch_kind() { return g_last_kind; }
int last_hopper_mode() { return g_last_hopper_mode; }
void record_hopper_mode(int mode) { g_last_hopper_mode = mode; }
}  // namespace detail

}  // namespace opsfuse::cuda
