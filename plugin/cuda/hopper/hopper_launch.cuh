// Internal to plugin/cuda: the Hopper prefill kernel's launcher -- which instantiation (mode) a
// launch takes, its tensor maps, shared memory, grid and cluster shape -- with the measurements
// behind each rule. The instantiation files (hopper_{f16,bf16}_d{64,128,256}.cu) include it.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "hopper_fwd.cuh"
#include "hopper_seq3.cuh"

namespace opsfuse::cuda::detail {

// Which instantiation (hopper::Mode) a launch takes. Pair masks need mask_stride[3] == 1, every
// element offset of a pair even (each stride even, the base aligned to a pair) and rows of even
// length (Sk even: a pair that starts below Sk ends below it, see mask_pair_load); anything else
// with a mask, and softcap, take kGeneral. plan.mask_pairs false (OPSFUSE_CUDA_HOPPER_MASK_PAIRS=0)
// sends masks to kGeneral too.
inline int hopper_mode(const KernelArgs& a, const Plan& plan) {
  if (a.mask_kind == 0 && !(a.softcap > 0.0f)) return hopper::kPlain;
  if (a.mask_kind == 0 || a.softcap > 0.0f || !plan.mask_pairs) return hopper::kGeneral;
  const int64_t pair_bytes = a.mask_kind == 1 ? 2 : 4;
  bool ok = a.mask_stride[3] == 1 && a.seq_k % 2 == 0 && reinterpret_cast<uintptr_t>(a.mask) % pair_bytes == 0;
  for (int i = 0; i < 3; ++i) ok = ok && a.mask_stride[i] % 2 == 0;
  if (!ok) return hopper::kGeneral;
  return a.mask_kind == 1 ? hopper::kMaskBool : hopper::kMaskAdd;
}

// kDv: V's column bucket (hopper::Config), kD but for latent attention's (192, 128) and (256, 128)
// instantiations, which choose_plan takes through Plan::bucket and Plan::bucket_v.
template <typename T, int kD, int kDv = kD>
cudaError_t launch_hopper(const KernelArgs& a, const Plan& plan, cudaStream_t stream) {
  static_assert(kDv == kD || kD > 128, "a V bucket of its own: latent attention's kernels only (D > 128)");
  using Cfg = hopper::ModeConfig<kD, hopper::kPlain, kDv>;  // every mode's but kPlainSeqWide's (WideCfg)
  using WideCfg = hopper::ModeConfig<kD, hopper::kPlainSeqWide>;
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  if (a.head_dim > kD || a.head_dim_v > kDv) return cudaErrorInvalidValue;  // a plan for another bucket
  CUtensorMap tq, tk, tv, ty;  // K and V's once the mode (their tiles' keys) is known
  if (!hopper_encode_map(&tq, a.q, kBf16, a.head_dim, a.seq_q, a.heads_q, a.batch, a.q_stride, hopper::kBM))
    return cudaErrorNotSupported;  // nothing launched: the launcher falls back to the portable kernel
  // Y through TMA stores (64-row boxes, one per consumer warpgroup) where the driver takes its layout
  // (16-byte aligned base and strides) and plan.tma_store (OPSFUSE_CUDA_HOPPER_TMA_STORE=0: stores
  // from registers, to measure); otherwise the kernel stores from registers.
  const int tma_store = Cfg::kOStage && plan.tma_store &&
                                hopper_encode_map(&ty, a.y, kBf16, a.head_dim_v, a.seq_q, a.heads_q, a.batch,
                                                  a.y_stride, 64, /*l2_promotion=*/0)
                            ? 1
                            : 0;
  if (!tma_store) ty = tq;  // a valid map in the unused parameter
  static int smem_done[hopper::kModes][64] = {};
  // D = 256 reads masks through the general scoring: the pair loads' 16 registers do not fit
  // beside its 128-register O (ptxas spilled them), and that leaves two instantiations to compile.
  // Latent attention's D = 192 kernel, whose O has D = 128's 64 registers, takes the pair masks.
  int mode = hopper_mode(a, plan);
  if (kD == 256 && mode != hopper::kPlain) mode = hopper::kGeneral;
  // The warpgroup key split (choose_plan's hopper_wg_split()): the plain kernel's launches only, one
  // block per 64-row item, every item with the same >= 2 key tiles (no causal, no key_lengths) and
  // no Q bias (each warpgroup would add it to the rows they share).
  if (plan.wg_split) {
    if (kD > 128 || mode != hopper::kPlain || plan.persistent > 0 || plan.cluster != 1 || a.sk_count != nullptr ||
        a.tile_counter != nullptr || a.causal != 0 || a.key_lengths != nullptr || a.q_bias != nullptr ||
        a.seq_k <= hopper::kBN)
      return cudaErrorInvalidValue;
    mode = hopper::kPlainSplit;
  }
  // Whether every key tile of `keys` keys is whole and visible to every row -- no causal, no
  // key_lengths, Sk a multiple of `keys`, a positive scale: what the kernels that score every tile
  // with the fast variant alone (kPlainSeqWide, kPlainFast; their with_scoring) require.
  auto whole_visible_tiles = [&](int keys) {
    return a.causal == 0 && a.key_lengths == nullptr && a.scale_log2 > 0.0f && a.seq_k % keys == 0;
  };
  // kPlainFast's launches (below): plain, whole visible 128-key tiles, unsplit, no stream-K.
  const bool fast_plain = kD == 128 && plan.fast_plain && mode == hopper::kPlain && whole_visible_tiles(Cfg::kBN) &&
                          a.sk_count == nullptr && plan.cluster == 1;
  const int item_rows = plan.wg_split ? 64 : hopper::kBM;
  const int64_t blocks = static_cast<int64_t>((a.seq_q + item_rows - 1) / item_rows) * a.batch * a.heads_q;
  // Item chaining (kPlainChain): a persistent plain launch whose blocks take several items each,
  // in either order, unsplit, without stream-K. Every item must have a key tile (the chain's step
  // takes each item's first: no key_lengths, causal rows that see key 0), no Q or V bias (added
  // at an item's start and end outside the chained steps) and its output through TMA stores.
  // Taken where the keys span >= Plan::chain_tiles key tiles (16), causal >= chain_tiles_causal
  // (8; OPSFUSE_CUDA_HOPPER_CHAIN=N moves both): the H200's same-process A/B (session 22, B=8
  // H=16 D=128 bf16) measured S=4096 -0.7 to -1.1 %, causal -1.2 to -1.9 %, causal S=16384
  // -1.7 %, but S=1024 (8-tile items) +0.6 to +1.0 % and causal S=1024 +1 %. Since early Q
  // (session 33) the H100 measured causal launches over 8-15 key tiles -2 to -4 % in all 30
  // pairs of session 36 (five shapes, bf16 / fp16), non-causal S=1024 still +0.6 %. Launches that
  // kPlainFast takes stay unchained: the H100 measured it against the chain at S=2048 -0.8 to
  // -1 % in 6 rounds of 8, level in 2, and at S=4096 -1.1 to -1.6 % or level (sessions 45, 46).
  const int chain_tiles = a.causal != 0 ? plan.chain_tiles_causal : plan.chain_tiles;
  if (kD == 128 && mode == hopper::kPlain && !fast_plain && chain_tiles > 0 && plan.persistent > 0 &&
      blocks > plan.persistent && a.seq_k >= static_cast<int64_t>(chain_tiles) * Cfg::kBN &&
      plan.cluster == 1 && a.sk_count == nullptr && a.key_lengths == nullptr && a.q_bias == nullptr &&
      a.v_bias == nullptr && tma_store && (a.causal == 0 || a.causal_offset >= 0))
    mode = hopper::kPlainChain;
  // Short items in sequence (kPlainSeq, D <= 128): where every item has at most plan.seq_tiles key
  // tiles, each tile's S, softmax and P V run one after the other (no first tile of its own, no
  // trailing P V). The H200's same-process A/B (session 26, fp16; docs/notes/cuda_kernel.md):
  // one-tile items (S=128) -7 to -8 %, 3-4 tiles (B=8 H=12 S=384 / 512, causal B=4 H=16 S=512)
  // -7 %, 8 tiles (Sk = 1024, one round or several, causal or not) -2 to -4 %; 16 tiles level to
  // +1.5 %, 32 tiles +3.5 %: hence 8 (Plan::seq_tiles, OPSFUSE_CUDA_HOPPER_SEQ=N). At D = 128, whose
  // tile is tensor-bound and keeps its own S / P V overlap in kPlain (session 27, bf16 / fp16):
  // 2-tile items -6.5 %, 4 tiles -3 %, causal over 1-4 tiles -3 %, but causal over 1-8 level and
  // 8 tiles +3 to +7 %: hence 4 (Plan::seq_tiles_d128, OPSFUSE_CUDA_HOPPER_SEQ_D128=N).
  const int seq_tiles = kD == 64 ? plan.seq_tiles : kD == 128 ? plan.seq_tiles_d128 : 0;
  if (seq_tiles > 0 && mode == hopper::kPlain && a.sk_count == nullptr &&
      a.seq_k <= static_cast<int64_t>(seq_tiles) * Cfg::kBN)
    mode = hopper::kPlainSeq;
  // The same on 256-key tiles (kPlainSeqWide, D = 64): plain launches over 2 to Plan::seq_wide_tiles
  // whole, visible 256-key tiles (OPSFUSE_CUDA_HOPPER_SEQ_WIDE=N). The H200's same-process A/B
  // (session 28, fp16, against the default then): the seed's S=1024 -3 %, B=2 H=16 S=1024 -6.5 %,
  // B=8 H=12 S=1024 -8 %, the seed's S=2048 -9 %, B=4 H=16 S=4096 -9 %, B=2 H=16 S=8192 -9 %,
  // BERT's S=512 -4 %; one tile (B=8 H=12 S=256) +10 %, 64 tiles (B=1 H=16 S=16384) level: hence 2
  // to 32 (Plan::seq_wide_tiles).
  if (kD == 64 && plan.seq_wide_tiles > 0 && (mode == hopper::kPlain || mode == hopper::kPlainSeq) &&
      a.sk_count == nullptr && whole_visible_tiles(WideCfg::kBN) && a.seq_k >= 2 * WideCfg::kBN &&
      a.seq_k <= static_cast<int64_t>(plan.seq_wide_tiles) * WideCfg::kBN)
    mode = hopper::kPlainSeqWide;
  // Whole, visible key tiles (kPlainFast, D = 128): a plain launch that the in-sequence kernel did
  // not take over, with whole, visible 128-key tiles, unsplit (plan.cluster: no key or tail split)
  // and without stream-K, runs kPlain without the code it would never run (hopper_modes.h;
  // plan.fast_plain, OPSFUSE_CUDA_HOPPER_FAST=0: never). The H100's same-process A/B (session 45,
  // B=8 H=16 bf16 / fp16): S=1024 -3 to -5 %; S=2048 and 4096 -3 to -4 % against kPlain.
  if (fast_plain && mode == hopper::kPlain) mode = hopper::kPlainFast;
  // Three consumer warpgroups (kPlainSeq3, hopper_seq3.cuh): a launch that choose_plan marked for it
  // (plan.three_consumers: one round, unsplit, 3 to 8 whole, visible 128-key tiles at D <= 64) and
  // that the in-sequence kernels took (plain attention), without Q / V biases (the kernel adds none)
  // and with Y through TMA stores (its only store path).
  if (kD == 64 && plan.three_consumers && (mode == hopper::kPlainSeq || mode == hopper::kPlainSeqWide) &&
      tma_store && a.q_bias == nullptr && a.v_bias == nullptr)
    mode = hopper::kPlainSeq3;
  const bool wide = mode == hopper::kPlainSeqWide;
  const int keys_per_tile = wide ? WideCfg::kBN : Cfg::kBN;
  const int smem_bytes = wide ? WideCfg::kSmem : Cfg::kSmem;
  const int ring_bytes = wide ? 2 * WideCfg::kStages * WideCfg::kKVBytes : Cfg::kStages * (Cfg::kKVBytes + Cfg::kVBytes);
  if (!hopper_encode_map(&tk, a.k, kBf16, a.head_dim, a.seq_k, a.heads_kv, a.batch, a.k_stride, keys_per_tile) ||
      !hopper_encode_map(&tv, a.v, kBf16, a.head_dim_v, a.seq_k, a.heads_kv, a.batch, a.v_stride, keys_per_tile))
    return cudaErrorNotSupported;  // nothing launched: the launcher falls back to the portable kernel
  if (mode == hopper::kPlainSeq3) {
    if constexpr (kD == 64) {
      // Its own kernel: one block of 512 threads per item, no clusters, no persistent rounds.
      record_hopper_mode(mode);
      const auto seq3 = hopper::hopper_seq3_kernel<T>;
      cudaError_t err = ensure_smem(seq3, hopper::Seq3::kSmem, smem_done[mode]);
      if (err != cudaSuccess) return err;
      cudaLaunchAttribute pdl;
      pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      pdl.val.programmaticStreamSerializationAllowed = plan.pdl ? 1 : 0;
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(static_cast<unsigned>(blocks), 1, 1);
      cfg.blockDim = dim3(hopper::Seq3::kThreads, 1, 1);
      cfg.dynamicSmemBytes = hopper::Seq3::kSmem;
      cfg.stream = stream;
      cfg.attrs = &pdl;
      cfg.numAttrs = 1;
      const int n_tail = hopper::Seq3::tail_tiles(static_cast<int>(a.seq_k / Cfg::kBN));
      err = cudaLaunchKernelEx(&cfg, seq3, a, tq, tk, tv, ty, n_tail, plan.pingpong ? 1 : 0);
      return err != cudaSuccess ? err : cudaGetLastError();
    }
  }
  auto kernel = [&] {
    if constexpr (kD == 256) {
      return mode == hopper::kPlain ? hopper::hopper_fwd_kernel<T, kD, hopper::kPlain, kDv>
                                    : hopper::hopper_fwd_kernel<T, kD, hopper::kGeneral, kDv>;
    } else if constexpr (kD == 192) {
      return mode == hopper::kPlain     ? hopper::hopper_fwd_kernel<T, kD, hopper::kPlain, kDv>
             : mode == hopper::kMaskAdd  ? hopper::hopper_fwd_kernel<T, kD, hopper::kMaskAdd, kDv>
             : mode == hopper::kMaskBool ? hopper::hopper_fwd_kernel<T, kD, hopper::kMaskBool, kDv>
                                         : hopper::hopper_fwd_kernel<T, kD, hopper::kGeneral, kDv>;
    } else {
      // kPlainChain at D = 128 only: compiled where it is taken.
      auto chain = [] {
        if constexpr (kD == 128) return hopper::hopper_fwd_kernel<T, kD, hopper::kPlainChain>;
        else return hopper::hopper_fwd_kernel<T, kD, hopper::kPlain>;
      };
      // kPlainSeqWide at D = 64 only.
      auto seq_wide = [] {
        if constexpr (kD == 64) return hopper::hopper_fwd_kernel<T, kD, hopper::kPlainSeqWide>;
        else return hopper::hopper_fwd_kernel<T, kD, hopper::kPlain>;
      };
      // kPlainFast at D = 128 only.
      auto fast = [] {
        if constexpr (kD == 128) return hopper::hopper_fwd_kernel<T, kD, hopper::kPlainFast>;
        else return hopper::hopper_fwd_kernel<T, kD, hopper::kPlain>;
      };
      return mode == hopper::kPlain          ? hopper::hopper_fwd_kernel<T, kD, hopper::kPlain>
             : mode == hopper::kPlainChain   ? chain()
             : mode == hopper::kPlainSeq     ? hopper::hopper_fwd_kernel<T, kD, hopper::kPlainSeq>
             : mode == hopper::kPlainSeqWide ? seq_wide()
             : mode == hopper::kPlainFast    ? fast()
             : mode == hopper::kPlainSplit ? hopper::hopper_fwd_kernel<T, kD, hopper::kPlainSplit>
             : mode == hopper::kMaskAdd  ? hopper::hopper_fwd_kernel<T, kD, hopper::kMaskAdd>
             : mode == hopper::kMaskBool ? hopper::hopper_fwd_kernel<T, kD, hopper::kMaskBool>
                                         : hopper::hopper_fwd_kernel<T, kD, hopper::kGeneral>;
    }
  }();
  record_hopper_mode(mode);
  cudaError_t err = ensure_smem(kernel, smem_bytes, smem_done[mode]);
  if (err != cudaSuccess) return err;
  if (a.tile_counter != nullptr) {
    // The dynamic order's ticket counter starts at 0 (a persistent grid, never split).
    if (plan.persistent <= 0 || plan.cluster != 1) return cudaErrorInvalidValue;
    err = cudaMemsetAsync(a.tile_counter, 0, sizeof(int), stream);
    if (err != cudaSuccess) return err;
  }
  // Persistent (plan.persistent > 0, choose_plan): that many blocks loop over the row tiles.
#ifdef OPSFUSE_HOPPER_TRACE
  // Diagnostic builds only: a persistent grid of fewer blocks (OPSFUSE_HOPPER_TRACE_GRID), to see
  // how the blocks' pace depends on how many share the L2.
  const char* cap = std::getenv("OPSFUSE_HOPPER_TRACE_GRID");
  const int64_t grid = std::min<int64_t>(plan.persistent > 0 ? std::min<int64_t>(blocks, plan.persistent) : blocks,
                                         cap != nullptr && plan.persistent > 0 ? std::atoll(cap) : blocks);
#else
  const int64_t grid = plan.persistent > 0 ? std::min<int64_t>(blocks, plan.persistent) : blocks;
#endif
  if (a.sk_count != nullptr) {
    // Stream-K (choose_plan, hopper_stream_k()): the plain kernel on a persistent grid of
    // plan.persistent blocks (the units were divided among that many), unsplit; the arrival counts
    // of its shared items start at 0.
    const int64_t shared = blocks - static_cast<int64_t>(a.sk_rounds) * grid;
    if (kD > 128 || mode != hopper::kPlain || plan.persistent <= 0 || grid != plan.persistent || plan.cluster != 1 ||
        shared < grid || shared >= 2 * grid)
      return cudaErrorInvalidValue;
    err = cudaMemsetAsync(a.sk_count, 0, static_cast<size_t>(shared) * sizeof(int), stream);
    if (err != cudaSuccess) return err;
  }
  // OPSFUSE_CUDA_HOPPER_PINGPONG=0 turns the inter-warpgroup schedule off (to measure it);
  // OPSFUSE_CUDA_HOPPER_MASK_CLASSES=0 the padding-mask tile classes (every tile of a pair mask
  // through the pair loads, as before them: to measure them). Both arrive in the plan.
  const int pingpong = plan.pingpong ? 1 : 0;
  const int mask_classes = plan.mask_classes ? 1 : 0;
  // plan.cluster (choose_plan): without a persistent grid, key splits per row tile; with one, 2 =
  // the tail split (its last, partial round's items split 2 ways by keys, see the kernel).
  const int splits = plan.cluster;
  // A split merge stages (O, max, sum) of 256 threads over the K/V ring: kD / 8 + 1 float4 chunks
  // each, 132 KB at D = 256, more than its 128 KB ring (choose_plan never splits there).
  if (splits > 1 && (kD / 8 + 1) * 256 * 16 > ring_bytes) return cudaErrorInvalidValue;
  const bool tail = plan.persistent > 0 && splits == 2;
  int64_t tail_grid = grid & ~int64_t{1};  // blocks of a tail-split launch: whole clusters
  if (tail) {
    // choose_plan took the tail split only where the last round's items fit in one split round.
    const int64_t rem = tail_grid >= 2 ? blocks % tail_grid : 0;
    if (rem == 0 || 2 * rem > tail_grid) return cudaErrorInvalidValue;
  }
  // Programmatic dependent launch (plan.pdl): the blocks may start, set up their barriers and
  // prefetch the tensor maps while the previous kernel in the stream finishes; the kernel waits
  // for that kernel's completion before any global access (grid_dependency_wait()).
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = plan.pdl ? 1 : 0;
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = static_cast<unsigned>(splits);
  attr[1].val.clusterDim.y = 1;
  attr[1].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.blockDim = dim3(hopper::kThreads, 1, 1);
  cfg.dynamicSmemBytes = smem_bytes;
  cfg.stream = stream;
  cfg.attrs = attr;
  // The kernel on `grid` blocks without clusters (every round unsplit), or as clusters of `splits`
  // blocks with `key_splits` per item and split rounds from `tail_round` on.
  auto launch = [&](int64_t blocks_launched, bool clusters, int key_splits, int tail_round) {
    cfg.gridDim = dim3(static_cast<unsigned>(blocks_launched), 1, 1);
    cfg.numAttrs = clusters ? 2 : 1;
    const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, a, tq, tk, tv, ty, pingpong, static_cast<int>(blocks),
                                             key_splits, mask_classes, tail_round, tma_store);
    return e != cudaSuccess ? e : cudaGetLastError();
  };
  auto launch_plain = [&] { return launch(grid, false, 1, INT_MAX); };
  auto launch_clusters = [&](int key_splits, int tail_round) {
    return launch(tail ? tail_grid : blocks * splits, true, key_splits, tail_round);
  };
  if (tail) {
    // A persistent grid must be resident at once (one wave): with clusters of 2 that needs
    // tail_grid / 2 co-resident clusters (cudaOccupancyMaxActiveClusters, asked once per device
    // and instantiation); where the device holds fewer (an SM whose GPC partner is unavailable),
    // the plain persistent grid runs instead.
    static int clusters_cache[hopper::kModes][64] = {};
    const int fit = max_active_clusters_cached(clusters_cache[mode], kernel, hopper::kThreads, smem_bytes, 2);
    if (2 * static_cast<int64_t>(fit) < tail_grid) return launch_plain();
    return launch_clusters(1, static_cast<int>(blocks / tail_grid));
  }
  if (splits <= 1) return launch_plain();
  if (plan.persistent > 0 || splits > 8) return cudaErrorInvalidValue;
  return launch_clusters(splits, INT_MAX);
}

}  // namespace opsfuse::cuda::detail
