// Internal to plugin/cuda: the Hopper (sm_90a) FusedAttention forward kernel for float16 /
// bfloat16, head-size buckets 64, 128 and 256 (D, Dv <= bucket: TMA zero-fills the columns beyond D / Dv,
// the epilogue stores Dv columns), and for latent attention (Dv <= 128 < D) the (D, Dv) buckets
// (192, 128) and (256, 128) (kDv). Compiled only for sm_90a (hopper/*.cu); the launcher
// (attention_cuda.cu, choose_plan) takes it on compute capability 9.0 devices for the cases it
// covers and keeps the portable mma.sync kernel (flash_tc.cuh) for everything else.
// Beside it, one job each: hopper_config.h (tile traits, shared-memory budget, compile-time A/B
// switches), ptx_ops.cuh (wgmma wrappers and descriptors), mask_tiles.cuh (mask pair loads, tile
// classes), tma_ops.cuh (TMA / mbarrier), hopper_launch.cuh (mode, tensor maps, grid: launch_hopper).
//
// Design (one work item = 128 query rows of one (batch, query head); one block per item, or a
// persistent grid of one block per SM looping over items, in a static snake or a dynamic order
// (choose_plan's plan.persistent, plan.sched_heads);
// 3 warpgroups, 384 threads):
//  - warpgroup 0, the producer: gives its registers away (setmaxnreg.dec 24: the 384 threads start
//    with 168 each, and the consumers' 240 come only from this release, 24 x 128 + 240 x 256 =
//    168 x 384; at 32 their setmaxnreg.inc waited forever). One thread (warp 1) decides each
//    round's item (the static snake, or a ticket of the dynamic order), one (warp 2) publishes
//    its Work for the consumers from round 1 on (publish_work), another one (warp 0) issues
//    the TMA loads (cp.async.bulk.tensor, 128-byte swizzle) of each item's Q tile (into one of
//    Config::kQBuffers buffers, so that a persistent block's next Q is in flight during the current
//    item) and of the K and V tiles into a kStages-deep shared-memory ring, each with a "full"
//    mbarrier (transaction bytes) and an "empty" mbarrier that the consumers release.
//  - warpgroups 1 and 2, the consumers (setmaxnreg.inc 240): 64 query rows each.
//      S = Q K^T   wgmma m64n128k16 (m64n64k16 at D = 256: 64-key tiles, see Config), A = Q and
//                  B = K from shared memory (both K-major),
//      score       scale, softcap, mask, causal, key_lengths on the S accumulators (kernel_common.cuh;
//                  aligned masks without softcap as column-pair loads issued ahead, see Mode)
//      softmax     online, in registers, log2 domain, ex2.approx
//      O += P V    wgmma m64nDk16, A = P from registers (re-packed S accumulators), B = V from
//                  shared memory, N(=Dv)-major (transpose flag).
//    Within a warpgroup, softmax(j) runs while the tensor cores do P(j-1) V(j-1): per iteration,
//    S(j) and P(j-1)V(j-1) are issued back to back, the warpgroup waits for S(j) only, does the
//    softmax, then waits for the P V product before re-packing P(j) (FlashAttention-3's
//    intra-warpgroup overlap); the two consumer warpgroups also overlap each other.
//  - Epilogue: O / l into the output tile in shared memory (Q's swizzled layout), then one TMA store
//    per 64-column region and warpgroup (Config::kOStage, D <= 128); D = 256 and layouts the driver
//    refuses as a tensor map store from registers.
//  - Causal: key tiles past the block's last visible key are never loaded; GQA: K/V of kv head
//    h / group (each query head its own blocks, K/V reuse through L2); keys >= Sk arrive as zeros
//    (TMA out-of-bounds fill) and are masked to -inf; query rows >= Sq are zero-filled by TMA and
//    never stored. Fully masked rows keep max -inf, their exponent base is 0 so P = 0, l = 0 and
//    the epilogue writes 0 (never NaN), as in flash_tc.cuh.
//  - Padding masks (a bool / additive mask the same for every query row, mask_stride[2] == 0, as
//    the BERT rewrite feeds (B,1,1,S)): reading the mask per score cost ~27% over no mask at
//    B=8 H=12 S=512 D=64 even when it was all True, yet nearly every key tile of such a mask is
//    all visible, all masked, or visible up to the sequence's end. So each key tile is classified
//    once per item (tile_class_vote: every consumer warp reads the tile's mask bytes, 2 loads per
//    lane, one tile ahead, and votes): an all-visible tile is scored as the unmasked kernel would
//    (kScoreFast), an all-masked one not at all (kScoreNone: P = 0, no S product); only the others
//    (a visible prefix, a key limit inside, mixed) take the per-score mask path. The producer
//    still loads every tile (skipping all-masked tiles would need it to agree on the tile list:
//    not done).
//  - Tail split (choose_plan's hopper_tail_split(): plan.persistent > 0 with plan.cluster == 2): a
//    persistent grid whose last round is partial (seed B=1 H=12 S=2048: 192 row tiles on 132 SMs,
//    the second round keeps 60 busy) launches as clusters of 2; the full rounds run unsplit, the
//    last round's items go one per cluster, split by key tiles between its 2 blocks and merged
//    through distributed shared memory as a key-split launch does (see item_of and the epilogue),
//    so that round takes about half an item's time plus the merge instead of a whole one.
//  - Warpgroup key split (kPlainSplit, choose_plan's hopper_wg_split()): a launch of one round
//    whose blocks would each run a long key loop (seed B=1 H=12 S=512: 48 items on 132 SMs) takes
//    items of 64 rows instead, both consumer warpgroups on the same rows and alternate key tiles,
//    merged in shared memory: twice the blocks, half the tiles each.
//  - Stream-K (choose_plan's plan.stream_k: long non-causal items, a.sk_count != null): after the
//    static order's whole-item rounds but one, the last items' (item, key tile) units are shared
//    in equal contiguous ranges, so that no block idles through a partial last round; an item cut
//    between two blocks is merged by whichever part finishes second, through the workspace (see
//    item_of and the stream-K exchange after the key loop).
//  - Item chaining (kPlainChain, launch_hopper: persistent plain launches at D = 128 over >= 16 key
//    tiles): a block's items are one loop of key-tile steps; an item's first step issues its S
//    product beside the previous item's last P V and stores that item after the P V wait (its own
//    compile-time copy of the step, so that the steady step carries none of it).
//  - Short items in sequence (kPlainSeq, launch_hopper: plain launches over <= 8 key tiles at
//    D = 64, <= 4 at D = 128, by default): each key tile's S, softmax (under the turn) and P V one
//    after the other, no first tile of its own and no trailing P V -- a kernel a quarter smaller,
//    faster on short items; on long key loops kPlain's overlap of the softmax with P V pays more.
//    In kPlainSeqWide the row sums come out of the P V product (kSumOnTensor).
//
// Why raw PTX (inline asm) and not CUTLASS/CuTe: the kernel needs ~10 instructions (wgmma
// fence/commit/wait/mma_async, cp.async.bulk.tensor, mbarrier init/arrive/expect_tx/try_wait,
// setmaxnreg); inline PTX keeps the build free of a ~100 MB header dependency that CI would have
// to fetch, and each translation unit compiles in seconds instead of minutes. The price is that
// the shared-memory layouts and wgmma descriptors are spelled out here by hand (see smem_desc()).
//
// Shared-memory layouts (PTX ISA, "canonical layouts" of wgmma; byte addresses, the hardware
// applies the 128-byte swizzle: bits [4,7) ^= bits [7,10), so every region is 1024-byte aligned):
//  - Q, K (K-major): a tile of R rows x 64 columns (128 bytes per row) is one region of R * 128
//    bytes, row r at r * 128, exactly what TMA writes for a (64, R) box with SWIZZLE_128B. D = 128
//    is two such regions (columns 0-63, 64-127). Descriptor: SBO = 1024 (8-row groups), LBO unused
//    (encoded 1); k-step kk (16 columns = 32 bytes) starts at region kk / 4, byte (kk % 4) * 32.
//  - V (MN-major for O += P V: B[k = key][n = column]): same regions (rows = keys). Descriptor with
//    the transpose flag: LBO = bytes between 64-column regions (kBN * 128), SBO = 1024 (8 keys);
//    k-step kk (16 keys) starts at kk * 16 * 128 bytes.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <type_traits>
#include <utility>

#include <cuda.h>  // CUtensorMap (types only: nothing links libcuda)

#include "../kernel_common.cuh"
#include "hopper_config.h"
#include "hopper_modes.h"
#include "mask_tiles.cuh"
#include "pingpong_turns.cuh"
#include "ptx_ops.cuh"
#include "tma_ops.cuh"

namespace opsfuse::cuda::detail::hopper {

// --- the kernel -----------------------------------------------------------------------------------
// Accumulator layout of wgmma m64nN (per warpgroup thread t, warp w = t / 32, lane l): register
// d[i * 4 + h * 2 + e] holds row 16 w + l / 4 + 8 h, column 8 i + 2 (l % 4) + e. The A-from-registers
// fragment of m64n*k16 for k-step kk: a[0] = (row l/4, keys 16kk + 2(l%4) + {0,1}), a[1] = row + 8,
// a[2] / a[3] = the same with keys + 8 -- i.e. S columns 16 kk .. 16 kk + 15 re-packed in place.
// kMode: hopper_modes.h.
// How one key tile is scored (a compile-time variant of the loop body, so that each is one basic
// block): kScoreFast no per-score work (raw q.k, the scale folded into the exponent; positive
// scale, no key limit inside the tile, every key visible); kScoreLimits scale and per-key limits
// (causal, key_lengths, Sk; the plain kernel's, the others take kScoreMask); kScoreMask the mode's mask /
// softcap work (pair path or full_score()); kScoreNone every key masked: P = 0, the running
// max / sum unchanged (what -inf scores would give, without computing them).
enum Scoring : int { kScoreFast = 0, kScoreLimits = 1, kScoreMask = 2, kScoreNone = 3 };
template <int V>
using ScoringV = std::integral_constant<int, V>;

// kDv: V's and the output's column bucket (Config): kD but in latent attention's (192, 128) and
// (256, 128).
template <typename T, int kD, int kMode, int kDv = kD>
__global__ void __launch_bounds__(kThreads, 1)
    hopper_fwd_kernel(const __grid_constant__ KernelArgs a, const __grid_constant__ CUtensorMap tm_q,
                      const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v,
                      const __grid_constant__ CUtensorMap tm_y, const int pingpong, const int n_work,
                      const int splits, const int mask_classes, const int tail_round, const int tma_store) {
  using Cfg = ModeConfig<kD, kMode, kDv>;
  static_assert(kDv == kD || kD > 128, "a V bucket of its own: latent attention's kernels only (D > 128)");
  static_assert(kD % 64 == 0 && kD <= 256, "Q / K: whole 64-column regions");
  // Wide heads (D > 128: 192 and 256) are never split by keys, tail or stream-K (choose_plan): those
  // paths are compiled out of their kernels.
  constexpr bool kWideHead = kD > 128;
  // kPlainFast: kPlain for launches whose key tiles are all whole and visible -- the fast scoring
  // only, and none of the key split, tail split or stream-K code, which launch_hopper never pairs
  // with it (a third of kPlain's SASS; why that matters: hopper_modes.h).
  constexpr bool kFastOnly = kMode == kPlainFast;
  constexpr bool kNoSplit = kWideHead || kFastOnly;  // no key / tail split, no stream-K compiled in
  static_assert(kMode != kPlainSplit || kD <= 128, "the split merge stages O over the K ring: D <= 128");
  // kPlainSplit: both consumer warpgroups work on one item's 64 rows (the first 64 of the Q
  // buffer, whose 128-row TMA box also brings the next 64, unused), each on every other key tile.
  constexpr bool kSplitWG = kMode == kPlainSplit;
  constexpr bool kChain = kMode == kPlainChain;
  constexpr bool kSeqWide = kMode == kPlainSeqWide;
  constexpr bool kSeq = kMode == kPlainSeq || kSeqWide;
  static_assert(!kSeq || kD <= 128, "kPlainSeq: compiled at D = 64 and 128 only");
  static_assert(!kSeqWide || kD == 64, "kPlainSeqWide: compiled at D = 64 only");
  constexpr bool kPlainScores = kMode == kPlain || kFastOnly || kChain || kSeq;  // no mask, no softcap, 128-row items
  constexpr bool kEarlyQHere = kEarlyQ && kD == 128;  // hopper_config.h: measured at D = 128
  // Row sums on the tensor cores (kSumOnTensor): O's accumulators grow by one 8-column group.
  constexpr bool kSumTensor = Cfg::kOnesBytes > 0;  // kPlainSeqWide, unless OPSFUSE_HOPPER_SUM_ON_TENSOR=0
  constexpr int kOCols = kDv + (kSumTensor ? 8 : 0);
  constexpr int kItemRows = kSplitWG ? 64 : kBM;
  constexpr int kStages = Cfg::kStages;
  constexpr int kRegions = kD / 64;  // 128-byte column regions of a Q or K tile
  constexpr int kVRegions = kDv / 64;  // ... of a V tile and of the output
  constexpr int kBN = Cfg::kBN;      // keys per tile (shadows the namespace's D <= 128 value)

  extern __shared__ uint8_t smem_raw[];
  constexpr int kQBuffers = Cfg::kQBuffers;
  // The scheduler's item slots: two, also with one Q buffer at D = 192 (latent attention), so that the
  // next item is decided a round ahead and its first K / V tile loads before this item releases Q
  // (H100, session 44: causal B=1 H=128 S=2048 -6 %, at +3 % for causal B=4 H=16 S=4096, whose
  // items are twice as long; every latent shape measured is then ahead of cuDNN, S=2048 was not
  // before). D = 256's kernels keep one slot: the same change measured causal B=2 H=16 S=4096 +5 %
  // there (not analysed; likely the dynamic order's tickets, drawn an item earlier, unbalancing the
  // last rounds of its long items). A slot is free again once its round has released Q
  // (bar_qempty) -- with one Q buffer through a barrier of its own per slot (bar_slot_free), which
  // the work thread arrives on after that release: the scheduler waits two rounds back there, which
  // one Q-release barrier's parity cannot tell apart from the round after it. The consumers' slots
  // (the Work, and with one Q buffer the item, in item_slot[kSlots]) stay one per Q buffer: the work
  // thread fills them once the buffer is free.
  constexpr int kSlots = OPSFUSE_HOPPER_SLOT_AHEAD != 0 && kD == 192 ? 2 : kQBuffers;
  constexpr bool kSlotBars = kQBuffers < kSlots;
  __shared__ __align__(8) uint64_t bars[2 * kQBuffers + (kSlotBars ? 2 : 1) * kSlots + 4 * kStages];
  // Round r's item (slot r % kSlots), from the scheduler thread; with kSlotBars the consumers' copy last.
  __shared__ int item_slot[kSlots + (kSlotBars ? 1 : 0)];
  __shared__ int sk_flag;            // stream-K: what consumer thread 0 read of an item's arrival count
  __shared__ int2 sk_slot[kSlots];   // stream-K: round r's key tiles (sk_range), beside item_slot
  __shared__ int4 work_slot[kQBuffers][2];  // round r's Work for the consumers (publish_work)
  // The wide heads' (D = 192, 256) general kernels: the base through a shuffle, which ptxas takes as
  // warp-uniform and cannot recompute. Without it, ptxas rebuilt the base in vector registers inside
  // the key loop and moved every wgmma descriptor into uniform registers with R2UR just before its
  // HGMMA (35 of 41 at D = 256, 30 of 41 at 192; scripts/check_sass.py flags it). The other kernels
  // keep their code (with the shuffle D = 256's plain kernel spilled).
  const uint32_t base = uniform_if<OPSFUSE_HOPPER_UNIFORM_BASE != 0 && kMode == kGeneral && kWideHead>((smem_u32(smem_raw) + 1023u) & ~1023u);
  const uint32_t sQ = base;                              // Q buffer b at sQ + b * kQBytes
  const uint32_t sK = sQ + kQBuffers * Cfg::kQBytes;     // stage s at sK + s * kKVBytes
  const uint32_t sV = sK + kStages * Cfg::kKVBytes;      // stage s at sV + s * kVBytes
  const uint32_t sO = sV + kStages * Cfg::kVBytes;       // the output tile (Config::kOStage)
  const uint32_t sOnes = sO + (Cfg::kOStage ? Cfg::kQBytes : 0);  // kSumTensor: 2 KB per consumer warpgroup
  auto bar_kfull = [&](int s) { return smem_u32(&bars[s]); };
  auto bar_vfull = [&](int s) { return smem_u32(&bars[kStages + s]); };
  auto bar_kempty = [&](int s) { return smem_u32(&bars[2 * kStages + s]); };
  auto bar_vempty = [&](int s) { return smem_u32(&bars[3 * kStages + s]); };
  // Round r of a block uses Q buffer r % kQBuffers for the (r / kQBuffers)-th time: its "full"
  // barrier's phase parity, and that of the release the producer waits for before reusing it.
  auto bar_q = [&](int r) { return smem_u32(&bars[4 * kStages + r % kQBuffers]); };
  auto bar_qempty = [&](int r) { return smem_u32(&bars[4 * kStages + kQBuffers + r % kQBuffers]); };
  // Round r's item is in item_slot[r % kSlots] once this barrier's phase of that round completes
  // (the scheduler thread's arrive, see the producer).
  auto bar_sched = [&](int r) { return smem_u32(&bars[4 * kStages + 2 * kQBuffers + r % kSlots]); };
  auto q_parity = [&](int r) { return static_cast<uint32_t>((r / kQBuffers) & 1); };
  auto slot_parity = [&](int r) { return static_cast<uint32_t>((r / kSlots) & 1); };
  // The release of round r's slot: its Q buffer's (two buffers), or its own barrier (kSlotBars).
  auto bar_slot_free = [&](int r) {
    return kSlotBars ? smem_u32(&bars[4 * kStages + 2 * kQBuffers + kSlots + r % kSlots]) : bar_qempty(r);
  };

  // Work item w (a row tile) -> (batch, query head, row tile); row tiles of one head are adjacent
  // (K/V reuse in L2), heaviest (causal) first. n_work items in all: one per block unless the
  // launch is persistent (gridDim.x < n_work), where the producer loads the next item's Q and K/V
  // while the consumers finish the current one. The K/V ring's stage / phase and Q's phase
  // continue across a block's items (kv_base, round). Round r of block x is item r * G + x, or
  // r * G + G - 1 - x for odd r (G = gridDim.x; a snake, so that with causal row tiles, heaviest
  // first within a head, a block's light and heavy items pair up); the items of one round are
  // the same set as with one block per item in a wave (L2 reuse unchanged). Past n_work: done.
  // Row tiles per (batch, query head), computed where used (each role, after setmaxnreg): one value
  // computed ahead of the role branch for both roles stayed live across setmaxnreg and spilled at
  // D = 256 once the producer's scheduler thread used it too.
  auto row_tiles = [&]() {
    int n;
    asm volatile("mov.b32 %0, %1;\n" : "=r"(n) : "r"((a.seq_q + kItemRows - 1) / kItemRows));
    return n;
  };
  // Key splits (splits > 1, never with a persistent grid): blocks blockIdx.x / splits * splits ..
  // + splits - 1 are one thread-block cluster on one item, block (cluster rank) r taking the key
  // tiles [r n / splits, (r + 1) n / splits) of its n; rank 0 merges the others' partial results
  // through distributed shared memory and stores the rows (see the epilogue).
  // Tail split (tail_round = r_tail = n_work / G, else INT_MAX: a persistent grid of G =
  // gridDim.x blocks, G even, launched as clusters of 2, splits == 1; launch_hopper made sure that
  // 0 < n_work - r_tail G <= G / 2): rounds r < r_tail are the persistent rounds above, unsplit,
  // without cluster barriers; round r_tail is the last: cluster c = blockIdx.x / 2 takes item
  // r_tail G + c, if any, split 2 ways by key tiles as in a key-split launch (rank = blockIdx.x % 2;
  // a rank may get no key tile), merged into rank 0. Both blocks of a cluster get the same item
  // (or none) in that round, so they make the same cluster_sync() calls; a cluster without a tail
  // item makes none. r_tail is a kernel parameter (computing it here, n_work / G, kept a register
  // live through the consumers' key loop and spilled); rounds past it land beyond n_work.
  // Wide heads (D = 192, 256) never split (launch_hopper): their round structure is fixed at compile
  // time.
  const int tail_from = kNoSplit ? INT_MAX : tail_round;
  auto splits_in = [&](int r) { return r >= tail_from ? 2 : (kNoSplit ? 1 : splits); };  // round r's item
  // Stream-K (a.sk_count != null; the plain kernel at D <= 128 only, so that the others carry none
  // of it; launch_hopper: a persistent grid, unsplit, static order): the first a.sk_rounds rounds
  // are the static order's, whole items; the n_sk = n_work - sk_rounds G items after them (G <=
  // n_sk < 2 G) are shared as n_sk x sk_tiles() (item, key tile) units (unit u: item sk_base() + u /
  // T, key tile u % T), block x taking units [sk_unit(x), sk_unit(x + 1)): its round sk_rounds + j
  // is the j-th item that range touches, with the key tiles of it that fall in the range (work_of).
  // (Units over all items instead gave each block a head of its own, whose K/V then came from DRAM
  // instead of L2: 25-30 % slower on the H200; in the last rounds adjacent blocks share heads, as
  // in the static order.) A range holds at least T units (n_sk >= G), so an item is cut at most
  // once: its first part (key tiles 0 .. j - 1) is the last round of one block, its second the
  // first stream-K round of the next. Both parts end in the consumers' stream-K exchange (after
  // the key loop), where the second to arrive merges them and stores.
  auto stream_k = [&]() { return kMode == kPlain && !kWideHead && a.sk_count != nullptr; };  // not kPlainSplit
  auto sk_tiles = [&]() { return (a.seq_k + kBN - 1) / kBN; };
  auto sk_base = [&]() { return a.sk_rounds * static_cast<int>(gridDim.x); };  // the first shared item
  // (32-bit arithmetic: choose_plan keeps the units below 2^31; 64-bit divisions spilled in the
  // producer's 24 registers.)
  auto sk_unit = [&](int x) { return x * a.sk_q + min(x, a.sk_r); };
  auto item_of = [&](int r) {
    if (stream_k() && r >= a.sk_rounds) {
      const int tiles = sk_tiles(), x = blockIdx.x;
      const int j = sk_unit(x) / tiles + r - a.sk_rounds;
      return j * tiles < sk_unit(x + 1) ? sk_base() + j : n_work;
    }
    if (r >= tail_from) {
      const int64_t w = static_cast<int64_t>(r) * gridDim.x + blockIdx.x / 2;
      return w < n_work ? static_cast<int>(w) : n_work;
    }
    const int x = static_cast<int>(blockIdx.x) / splits, G = static_cast<int>(gridDim.x) / splits;
    const int64_t w = static_cast<int64_t>(r) * G + ((r & 1) ? G - 1 - x : x);
    return w < n_work ? static_cast<int>(w) : n_work;
  };
  // Dynamic order (a.tile_counter != null: choose_plan's plan.sched_heads, a persistent grid, never
  // split): a block's first item is ticket blockIdx.x, each later one ticket gridDim.x + the
  // counter's old value (launch_hopper zeroed it), drawn ahead by the producer's scheduler thread.
  // In either order that thread publishes round r's item in item_slot[r % kSlots] and arrives on
  // bar_sched(r) (a release); the loading thread reads it after its wait there (an acquire). The
  // static order's consumers compute item_of() themselves; the dynamic order's read the slot after
  // their wait on round r's Q barrier, which the loading thread arrives on after its read (n_work:
  // no more items, a plain arrive). Tickets walk sections of a.sched_heads (batch, query head)
  // pairs (whose K/V fit in L2 together): within a section row-tile level by level, heaviest
  // first, the section's heads side by side -- so that the blocks that finish early take the
  // light tiles. (dynamic_order() reads the kernel parameter where needed: a flag computed here,
  // live across setmaxnreg, was spilled by ptxas in every instantiation.)
  auto dynamic_order = [&]() { return a.tile_counter != nullptr; };
  auto ticket_item = [&](int ticket) {
    if (ticket >= n_work) return n_work;
    const int heads_all = a.batch * a.heads_q;
    const int tiles = row_tiles();
    const int per_section = a.sched_heads * tiles;
    const int section = ticket / per_section;
    const int first = section * a.sched_heads;
    const int heads = min(a.sched_heads, heads_all - first);
    const int idx = ticket - section * per_section;
    return (first + idx % heads) * tiles + idx / heads;  // level idx / heads: work_of's w % row tiles
  };
  struct Work {
    int b, h, hk, row0, len;
    int t_begin, t_end;  // this block's key tiles of the item (all of them unless split)
    KeyRange kr;
  };
  auto work_of = [&](int w, int ns) {  // ns: the item's key splits (splits_in(round))
    Work wk;
    const int n_rt = row_tiles();
    const int bh = w / n_rt;
    const int rt = n_rt - 1 - w % n_rt;
    wk.b = bh / a.heads_q;
    wk.h = bh % a.heads_q;
    wk.hk = wk.h / a.group;
    wk.row0 = rt * kItemRows;
    wk.len = key_length_of(a, wk.b);
    // key_range() works on packed rows (head-in-group * Sq + position).
    const int g = wk.h - wk.hk * a.group;
    wk.kr = key_range(a, g * a.seq_q + wk.row0, g * a.seq_q + min(wk.row0 + kItemRows, a.seq_q) - 1, wk.len);
    const int n_tiles = (wk.kr.n_end + kBN - 1) / kBN;
    const int split = static_cast<int>(blockIdx.x) % ns;  // the cluster rank (0 unless split)
    wk.t_begin = split * n_tiles / ns;
    wk.t_end = (split + 1) * n_tiles / ns;
    return wk;
  };
  // Stream-K: the key tiles [t_begin, t_end) of item w (T = sk_tiles() of them) in this block's
  // range, as (t_begin, t_end); the whole item before the shared ones. The producer's scheduler
  // thread publishes it (sk_slot) for the loading thread, where this arithmetic spilled.
  auto sk_range = [&](int w) {
    const int tiles = sk_tiles();
    if (w < sk_base()) return make_int2(0, tiles);
    const int x = blockIdx.x, first = (w - sk_base()) * tiles;
    return make_int2(max(0, sk_unit(x) - first), min(tiles, sk_unit(x + 1) - first));
  };
  // Round r's item w as the producer threads see it, after the scheduler's bar_sched(r): with
  // stream-K, its key tiles are the ones the scheduler published (sk_slot).
  auto scheduled_work = [&](int r, int w) {
    Work wk = work_of(w, splits_in(r));
    if (stream_k()) {
      const volatile int2& tr = sk_slot[r % kSlots];
      wk.t_begin = tr.x;
      wk.t_end = tr.y;
    }
    return wk;
  };
  // Round r's Work through shared memory: the producer's work thread stores it before its arrive
  // on round r's Q barrier (a release); consumers read it after their wait there (an acquire).
  // From round 1 on the consumers take it from here instead of recomputing it: item_of's and
  // work_of's divisions by kernel parameters (~500 instructions of SASS, long dependent chains)
  // sat at every item boundary of both consumer warpgroups, with the tensor cores idle. Only the
  // consumers' part of it: they use neither hk nor kr.n_end.
  // Round r's Q tile (item wk) into its buffer, with its bytes announced on round r's Q barrier
  // (an arrive): by the loading thread, or with kEarlyQHere from round 1 by the work thread.
  auto load_q = [&](int r, const Work& wk) {
    const uint32_t sq = sQ + (r % kQBuffers) * Cfg::kQBytes;
    mbar_expect_tx(bar_q(r), Cfg::kQBytes);
#pragma unroll
    for (int c = 0; c < kRegions; ++c) tma_load_4d(sq + c * kBM * 128, &tm_q, bar_q(r), c * 64, wk.row0, wk.h, wk.b);
  };
  auto publish_work = [&](int r, int w) {
    const Work wk = scheduled_work(r, w);
    int4* const slot = work_slot[r % kQBuffers];
    slot[0] = make_int4(wk.b, wk.h, wk.row0, wk.len);
    slot[1] = make_int4(wk.t_begin, wk.t_end, wk.kr.all_visible, 0);
    return wk;
  };
  // (Plain loads: the wait before them is an asm with a memory clobber, which they cannot cross.)
  // Consumers read a round's slots (this Work, its item) in lane 0 of each warp and broadcast
  // them: a slot is rewritten for round r + kQBuffers once round r's Q is released, an arrive by
  // lane 0 of every consumer warp, after which lane 0's own read is ordered by program order. (Reads
  // by every lane were ordered before that arrive only through __syncwarp(): correct under the PTX
  // memory model, but compute-sanitizer's racecheck reported them as WAR hazards once a --quick
  // case reused a slot, session 22. The every-lane reads measured 1.2-1.5 % faster at 8-tile D = 128
  // items, through ptxas's schedule of the whole kernel; every consumer thread releasing Q after
  // its own read, which racecheck also accepts, was slower than this: session 23.)
  auto lane0_broadcast = [](int v) { return __shfl_sync(0xffffffffu, v, 0); };
  auto published_work = [&](int r) {
    const int4* const slot = work_slot[r % kQBuffers];
    int4 x = make_int4(0, 0, 0, 0), y = x;
    if ((threadIdx.x & 31u) == 0) x = slot[0], y = slot[1];
    x = make_int4(lane0_broadcast(x.x), lane0_broadcast(x.y), lane0_broadcast(x.z), lane0_broadcast(x.w));
    y = make_int4(lane0_broadcast(y.x), lane0_broadcast(y.y), lane0_broadcast(y.z), 0);
    Work wk;
    wk.b = x.x, wk.h = x.y, wk.row0 = x.z, wk.len = x.w;
    wk.t_begin = y.x, wk.t_end = y.y, wk.kr.all_visible = y.z;
    wk.hk = 0, wk.kr.n_end = 0;  // unused by the consumers
    return wk;
  };

  const int tid = threadIdx.x;
  if (tid == 0) {
    // The tensor maps (kernel parameters) into the TMA unit's descriptor cache before the first
    // load needs them.
    prefetch_tensormap(&tm_q);
    prefetch_tensormap(&tm_k);
    prefetch_tensormap(&tm_v);
    if (Cfg::kOStage && tma_store) prefetch_tensormap(&tm_y);
    for (int b = 0; b < kSlots; ++b) {  // kSlots >= kQBuffers
      if (b < kQBuffers) mbar_init(bar_q(b), 2);  // load_q()'s arrive (with Q's bytes) and the work thread's
      mbar_init(bar_sched(b), 1);
      if (b < kQBuffers) mbar_init(bar_qempty(b), kConsumerWarps);
      if (kSlotBars) mbar_init(bar_slot_free(b), 1);  // the work thread's
    }
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bar_kfull(s), 1);
      mbar_init(bar_vfull(s), 1);
      mbar_init(bar_kempty(s), kConsumerWarps);
      mbar_init(bar_vempty(s), kConsumerWarps);
    }
    fence_mbarrier_init();
  }
  __syncthreads();
  // Everything above touches only shared memory and the kernel parameters: with a programmatic
  // dependent launch (Plan::pdl) it overlaps the previous kernel's tail. Every thread waits here
  // for that kernel's results before its first global access (reads of Q/K/V, key_lengths, the
  // mask and the workspace; writes of Y, which that kernel may still be reading).
  grid_dependency_wait();
  launch_dependents();

  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
  if (wg == 0) {
    // ---- producer ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    // Two threads: a scheduler that decides each round's item and one that issues the loads. The
    // scheduler (warp 1) publishes round r's item, in the static order (item_of) or the dynamic
    // one (a ticket drawn from the counter), once round r - kSlots has released its slot (the
    // loading and work threads have read it by then): a round or more ahead of the loads, which
    // hides the atomic's latency. The item arithmetic has its own registers this way; in the loading
    // thread's 24 it spilled.
    if (tid == 32) {
      for (int round = 0;; ++round) {
        if (round >= kSlots) mbar_wait(bar_slot_free(round), slot_parity(round - kSlots));
        int w = item_of(round);
        if (dynamic_order())
          w = ticket_item(round == 0 ? static_cast<int>(blockIdx.x)
                                     : static_cast<int>(gridDim.x) + atomicAdd(a.tile_counter, 1));
        item_slot[round % kSlots] = w;
        if (stream_k() && w < n_work) sk_slot[round % kSlots] = sk_range(w);
        mbar_arrive(bar_sched(round));
        if (w >= n_work) break;
      }
    }
    // A third thread (warp 2) publishes each round's Work for the consumers (publish_work) and is
    // the second arrival on that round's Q barrier, so that the consumers' wait there covers its
    // stores. (In the scheduler thread's 24 registers, beside sk_range, this spilled.) Round 0's
    // consumers compute their Work beside Q's load; this thread still reads round 0's item and
    // arrives on its Q barrier like any other round's: the consumers then cannot release round 0,
    // nor the scheduler reuse its slot or move bar_sched on, before this thread has passed it (a
    // read without that arrive raced with the slot's reuse, and a wait one phase late would hang).
    // kEarlyQ: from round 1 on this thread also loads the round's Q (its arrive with Q's bytes
    // stands for the loading thread's), right after the Work is out: the scheduler published the
    // round only once the buffer's previous round released it. With one Q buffer (kSlotBars) the
    // scheduler is a round further ahead: this thread waits for the previous round's release of Q
    // (the consumers have read their slots, and that round's Q phase is complete) before it fills
    // the consumers' slots and arrives, then frees that round's scheduler slot.
    if (tid == 64) {
      for (int round = 0;; ++round) {
        mbar_wait(bar_sched(round), slot_parity(round));
        const int w = *reinterpret_cast<volatile int*>(&item_slot[round % kSlots]);
        if constexpr (kSlotBars) {
          if (round > 0) {
            mbar_wait(bar_qempty(round), q_parity(round - 1));
            mbar_arrive(bar_slot_free(round - 1));
          }
          item_slot[kSlots] = w;
        }
        if (round > 0 && w < n_work) {
          const Work wk = publish_work(round, w);
          if constexpr (kEarlyQHere) load_q(round, wk);
        }
        mbar_arrive(bar_q(round));
        if (kEarlyQHere && round > 0 && w >= n_work) mbar_arrive(bar_q(round));  // the loading thread's share
        if (w >= n_work) break;
      }
    }
    if (tid == 0) {
      int kv = 0;  // K/V tiles loaded by this block so far (ring position)
      for (int round = 0;; ++round) {
        // (The static order's first item without the wait: on a one-round grid, e.g. the seed
        // shapes, that wait was on the launch's critical path. Not with stream-K: its item
        // arithmetic here, beside the loads' registers, spilled. It needs two item slots: with one,
        // round 1's wait would be on the same barrier as round 0's, for its second phase, and a
        // parity wait for a phase whose predecessor has not completed passes at once -- this
        // thread, done with a short item's loads before the scheduler's first arrive, read round
        // 1's slot before it was written; racecheck found that with one slot, session 43. With two
        // round 1 waits on the other barrier's first phase, which the scheduler completes after
        // round 0's.)
        int w;
        if (round == 0 && kSlots > 1 && !dynamic_order() && !stream_k()) {
          w = item_of(0);
        } else {
          mbar_wait(bar_sched(round), slot_parity(round));
          w = *reinterpret_cast<volatile int*>(&item_slot[round % kSlots]);
        }
        const bool loads_q = !kEarlyQHere || round == 0;  // kEarlyQ: the work thread loads later rounds' Q
        // The Q buffer's previous item (round - kQBuffers) released it after its last S = Q K^T.
        auto wait_q_free = [&] {
          if (loads_q && round >= kQBuffers) mbar_wait(bar_qempty(round), q_parity(round - kQBuffers));
        };
        if (w >= n_work) {
          // No more items: the consumers read n_work after this round's Q barrier (round 0 of the
          // static order computes it, and nobody waits on that phase); with one Q buffer, once the
          // previous round's phase is complete.
          if (kSlotBars) wait_q_free();
          if (loads_q) mbar_arrive(bar_q(round));
          break;
        }
        if constexpr (!kSlotBars) wait_q_free();
        const Work wk = scheduled_work(round, w);
        auto load_kv = [&](int it) {
          const int s = kv % kStages;
          const uint32_t empty_parity = ((kv / kStages) & 1) ^ 1;  // first use of a stage passes at once
          mbar_wait(bar_kempty(s), empty_parity);
          mbar_expect_tx(bar_kfull(s), Cfg::kKVBytes);
#pragma unroll
          for (int c = 0; c < kRegions; ++c)
            tma_load_4d(sK + s * Cfg::kKVBytes + c * kBN * 128, &tm_k, bar_kfull(s), c * 64, it * kBN, wk.hk, wk.b);
          mbar_wait(bar_vempty(s), empty_parity);
          mbar_expect_tx(bar_vfull(s), Cfg::kVBytes);
#pragma unroll
          for (int c = 0; c < kVRegions; ++c)
            tma_load_4d(sV + s * Cfg::kVBytes + c * kBN * 128, &tm_v, bar_vfull(s), c * 64, it * kBN, wk.hk, wk.b);
        };
        int it = wk.t_begin;
        // With one Q buffer (kSlotBars), a later round's first K / V tile goes out before the wait
        // for Q's release: the item is known a round ahead, and only its Q waits for the previous
        // item's last S.
        if (kSlotBars && round > 0 && it < wk.t_end) load_kv(it++), ++kv;
        if constexpr (kSlotBars) wait_q_free();
        if (loads_q) load_q(round, wk);
        for (; it < wk.t_end; ++it, ++kv) load_kv(it);
      }
    }
    // The split merge's two cluster barriers count every thread of the cluster: a key-split
    // launch merges its one item, a tail-split one the item of its last round if its cluster has
    // one (the same answer in both blocks). Either is the block's last item, so tid 0 has issued
    // all its loads before it arrives.
    if (!kNoSplit && (splits > 1 || item_of(tail_from) < n_work)) {
      __syncwarp();
      cluster_sync();
      cluster_sync();
    }
    return;
  }

  // ---- consumers ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  const int cw = wg - 1;            // consumer warpgroup: rows 64 cw .. 64 cw + 63 of the tile
  const int t = tid % 128;
  const int warp = t / 32, lane = t % 32;
  int kv_base = 0;  // K/V tiles of this block's earlier items (ring position of the item's first tile)
  int round = 0;
  // This consumer warpgroup's 128 threads meet (named barrier 4 + cw). Immediates: a register
  // barrier id would make ptxas reserve all 16.
  auto wg_sync = [&]() {
    if (cw == 0) asm volatile("bar.sync 4, 128;\n" ::: "memory");
    else asm volatile("bar.sync 5, 128;\n" ::: "memory");
  };
  if constexpr (kSumTensor) {
    // This warpgroup's block of ones (T 1.0 = 0x3C00 / 0x3F80), 16 bytes per thread, made visible to
    // the async proxy that wgmma reads shared memory through.
    const uint32_t one2 = std::is_same_v<T, __half> ? 0x3C003C00u : 0x3F803F80u;
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(sOnes + cw * 2048 + t * 16), "r"(one2)
                 : "memory");
    fence_proxy_async_smem();
    wg_sync();
  }
#ifdef OPSFUSE_HOPPER_TRACE
  // Diagnostic builds only: event e of round r of this block's warpgroup cw, as globaltimer ns at
  // a.trace[((block * 2 + cw) * 64 + r) * 32 + e] and as the SM's clock at e + 8 of that row
  // (scripts/hopper_trace.py reads them); slots 16 + k: the clocks the item's key loop spent in
  // wait k, 0 K tile, 1 V tile, 2 the turn, 3 the S product, 4 the P V product (OPSFUSE_HOPPER_TIMED;
  // every tile's step, the first one's too where the loop takes it, kFirstInLoop).
  // kPlainChain: an item's events 0-4 after the block's first come from the boundary step that
  // starts it, its events 5 and 6 (its last P V done, its stores issued) from the next item's
  // boundary step (OPSFUSE_HOPPER_STAMP_AT, round r - 1), and event 7, where its last tile's
  // step has ended, carries its waits.
  unsigned int waited[5] = {0, 0, 0, 0, 0};
  auto trace = [&](int e, int r) {
    if (a.trace != nullptr && t == 0 && r < 64) {
      unsigned long long ns;
      asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(ns)::"memory");
      unsigned long long* row = a.trace + ((static_cast<int>(blockIdx.x) * 2 + cw) * 64 + r) * 32;
      row[e] = ns;
      row[e + 8] = clock64();
      if ((e == 5 && r == round) || e == 7)
        for (int k = 0; k < 5; ++k) row[16 + k] = waited[k];
    }
    if (e == 0)
      for (int k = 0; k < 5; ++k) waited[k] = 0;
  };
#define OPSFUSE_HOPPER_STAMP(e) trace(e, round)
#define OPSFUSE_HOPPER_STAMP_AT(r, e) trace(e, r)
#define OPSFUSE_HOPPER_TIMED(k, ...)                     \
  do {                                                   \
    const long long c0_ = clock64();                     \
    __VA_ARGS__;                                         \
    waited[k] += static_cast<unsigned>(clock64() - c0_); \
  } while (0)
#else
#define OPSFUSE_HOPPER_STAMP(e) ((void)0)  // nothing in a shipped build
#define OPSFUSE_HOPPER_STAMP_AT(r, e) ((void)0)
#define OPSFUSE_HOPPER_TIMED(k, ...) __VA_ARGS__
#endif
  // Round r's item: computed for the static order's round 0, else as the producer published it
  // (the wait on round r's Q barrier here is repeated below, where it returns at once).
  auto consumer_item = [&](int r) {
    if (r == 0 && !dynamic_order()) return item_of(0);
    mbar_wait(bar_q(r), q_parity(r));
    int w = 0;
    if ((threadIdx.x & 31u) == 0) w = *reinterpret_cast<volatile int*>(&item_slot[kSlotBars ? kSlots : r % kSlots]);
    return lane0_broadcast(w);  // see published_work
  };
  for (int w = consumer_item(0); w < n_work; w = consumer_item(++round)) {
    OPSFUSE_HOPPER_STAMP(0);  // the item's start
    // Round 0: computed here, while Q loads; later rounds: as the work thread published it.
    Work wk;
    if (round == 0) {
      wk = work_of(w, splits_in(0));
      if (stream_k()) {
        const int2 tr = sk_range(w);
        wk.t_begin = tr.x;
        wk.t_end = tr.y;
      }
    } else {
      wk = published_work(round);
    }
    // The item's coordinates and key tiles; kPlainChain moves them on to the block's next item
    // inside its key loop (below), the other modes keep them for the item.
    int b = wk.b, h = wk.h, row0 = wk.row0, len = wk.len;
    int t_begin = wk.t_begin, t_end = wk.t_end;
    const int n_tiles = t_end - t_begin;
    // This warpgroup's key tiles: all of the item's, or (kPlainSplit) every other one from
    // t_begin + cw, n_mine of them, the last my_last. A stage it consumes is released for both
    // warpgroups (the empty barriers count 8 consumer warps): release().
    constexpr int kStride = kSplitWG ? 2 : 1;
    int my_begin = kSplitWG ? t_begin + cw : t_begin;
    const int n_mine = kSplitWG ? max(0, (t_end - my_begin + 1) / 2) : n_tiles;
    int my_last = kSplitWG ? my_begin + 2 * (n_mine - 1) : t_end - 1;
    auto release = [](uint32_t bar) { mbar_arrive_n<kStride>(bar); };
    int ring0 = kv_base - t_begin;  // ring position of key tile `it` is ring0 + it
    KeyRange kr = wk.kr;
    // This thread's rows of the item at row0_: rbase (h = 0) and rbase + 8 (h = 1).
    auto rows_base = [&](int row0_) { return row0_ + (kSplitWG ? 0 : cw * 64) + warp * 16 + lane / 4; };
    int rbase = rows_base(row0);

    // Per-row contract data (two rows per thread, hh = 0 / 1). Only the key limits stay in registers
    // through the loop; the rest is recomputed where needed (registers are the limit here).
    auto row_info = [&](int hh) {
      RowInfo r;
      const int pos = rbase + hh * 8;
      r.valid = pos < a.seq_q;
      r.head = h;
      r.pos = r.valid ? pos : 0;
      int lim = len;
      if (a.causal) lim = min(lim, r.pos + a.causal_offset + 1);
      r.key_limit = r.valid ? max(lim, 0) : 0;
      r.mask_off = b * a.mask_stride[0] + h * a.mask_stride[1] + r.pos * a.mask_stride[2];
      return r;
    };
    int key_limit[2] = {row_info(0).key_limit, row_info(1).key_limit};
    constexpr bool kElementwise = kMode == kGeneral;  // scores through full_score()
    constexpr bool kPairMask = kMode == kMaskAdd || kMode == kMaskBool;
    constexpr bool elementwise = kElementwise;

    float o[kOCols / 2];  // kSumTensor: o[kDv / 2 + 2 hh] is row hh's sum, the same in the quad's lanes
#pragma unroll
    for (int i = 0; i < kOCols / 2; ++i) o[i] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    float alpha[2] = {1.0f, 1.0f};
    // kLazyRescale at D >= 128 in the plain kernels only: in the others (first tile inside the key
    // loop) the conditional rescale made ptxas serialize every wgmma (C7515).
    constexpr bool kLazy = kLazyRescale && kD >= 128 && (kPlainScores || kSplitWG);
    bool rescale_due = false;  // kLazy: this warp's alpha is not 1 (warp-uniform)
    float s[kBN / 2];
#pragma unroll
    for (int i = 0; i < kBN / 2; ++i) s[i] = 0.0f;
    using PFrag = uint32_t[kBN / 16][4];
    PFrag p;  // P as the A operand of O += P V

    // This warpgroup's 64 rows in each region of round r's Q buffer.
    auto q_tile_of = [&](int r) { return sQ + (r % kQBuffers) * Cfg::kQBytes + (kSplitWG ? 0 : cw * 64 * 128); };
    uint32_t q_off = q_tile_of(round);
    // Operand descriptors. D >= 128: one smem_desc() per item (Q) or tile (K, V), desc_plus() per
    // k-step (ptxas recomputed smem_desc()'s and / shift / or chain per k-step, between the turn
    // barrier and the HGMMAs; session 12's same-call A/B: prefill D = 128 S=1024 1.5 % and causal
    // 1 % faster, S=4096 level). D = 64 keeps smem_desc() per k-step (the A/B: level, the seed
    // shapes 0-3 % slower with desc_plus()); q_desc, k_desc and v_desc serve D >= 128 only (at
    // D = 64 they are unused and compiled away).
    uint64_t q_desc = smem_desc(q_off, 16, 1024);
    auto issue_qk = [&](int stage) {
      const uint32_t kb = sK + stage * Cfg::kKVBytes;
      const uint64_t k_desc = smem_desc(kb, 16, 1024);
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const uint32_t col = (kk % 4) * 32;
        if constexpr (kD >= 128) {
          mma_qk<T, kBN>(s, desc_plus(q_desc, (kk / 4) * (kBM * 128) + col),
                         desc_plus(k_desc, (kk / 4) * (kBN * 128) + col), kk == 0 ? 0u : 1u);
        } else {
          const uint64_t da = smem_desc(q_off + (kk / 4) * (kBM * 128) + col, 16, 1024);
          const uint64_t db = smem_desc(kb + (kk / 4) * (kBN * 128) + col, 16, 1024);
          mma_qk<T, kBN>(s, da, db, kk == 0 ? 0u : 1u);
        }
      }
    };
    // The k-steps [from, to) of O += P V (16 keys each; all of them by default).
    auto issue_pv = [&](int stage, const PFrag& pf, auto from, auto to) {
      const uint32_t vb = sV + stage * Cfg::kVBytes;
      const uint64_t v_desc = smem_desc(vb, kBN * 128, 1024);
#pragma unroll
      for (int kk = decltype(from)::value; kk < decltype(to)::value; ++kk) {
        if constexpr (kD >= 128) {
          mma_pv<T, kDv>(o, pf[kk], desc_plus(v_desc, kk * 16 * 128));
        } else {
          // kSumTensor: B's second 64-column region (LBO bytes on) is this warpgroup's block of ones.
          const uint32_t at = vb + kk * 16 * 128;
          const uint32_t lbo = kSumTensor ? sOnes + cw * 2048 - at : kBN * 128;
          mma_pv<T, kOCols>(o, pf[kk], smem_desc(at, lbo, 1024));
        }
      }
    };
    // Scores of tile `it` in the log2 domain, online softmax; s becomes exp2(s - max).
    // Tile `it` takes the limits path (per-key limits: causal, key_lengths, Sk) when it crosses the
    // block's all-visible bound; a non-positive scale takes it too (the fast path folds the scale
    // into the exponent, which needs it positive). The caller picks the variant at compile time
    // (`variant` is a ScoringV, see with_scoring) so that each variant of the loop body is one
    // basic block, in which ptxas can overlap the exponentials with the pending P V product.
    // Pair masks: this thread's two mask rows (byte pointers; rows out of range have key_limit 0
    // and are never read), and the raw pairs of one tile, element e of a pair in bits [16e, 16e+16)
    // (T) or [8e, 8e+8) (bool). A pair is read when its first element is below the row's key limit
    // (<= Sk; see mask_pair_load); a row shared by both rows (mask_stride[2] == 0, padding masks) is
    // read once.
    constexpr int kMaskBytes = kMode == kMaskBool ? 1 : 2;
    // Row 1 (rbase + 8) is at mrow0 + 8 rows whenever it is valid (then row 0 is too), so only
    // row 0's pointer stays in a register (the strides are kernel parameters).
    const char* mrow0 = nullptr;
    if constexpr (kPairMask) mrow0 = static_cast<const char*>(a.mask) + row_info(0).mask_off * kMaskBytes;
    const bool mask_rows_shared = a.mask_stride[2] == 0;
    uint32_t mraw[2][kBN / 8];
    auto load_mask = [&](int it) {
      if constexpr (kPairMask) {
        const int j0 = it * kBN + 2 * (lane % 4);
        auto load_row = [&](int hh, int lim) {
          const char* base = mrow0 + (hh * 8 * a.mask_stride[2] + j0) * kMaskBytes;
          const int rem = lim - j0;  // the pair at column j0 + i * 8 is read when i * 8 < rem
          mask_row_loads<kMaskBytes>(mraw[hh], base, rem, std::make_integer_sequence<int, kBN / 8>{});
        };
        if (mask_rows_shared) {
          load_row(0, max(key_limit[0], key_limit[1]));
#pragma unroll
          for (int i = 0; i < kBN / 8; ++i) mraw[1][i] = mraw[0][i];
        } else {
          load_row(0, key_limit[0]);
          load_row(1, key_limit[1]);
        }
      }
    };
    auto is_boundary = [&](int it) { return it * kBN + kBN > kr.all_visible || !(a.scale_log2 > 0.0f); };
    // l = l * alpha + this tile's row sum (even and odd columns summed apart, then added).
    auto row_sums = [&]() {
      if constexpr (kSumTensor) return;  // in O's last column group
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
        for (int i = 0; i < kBN / 8; ++i) {
          sum0 += s[i * 4 + 2 * hh];
          sum1 += s[i * 4 + 2 * hh + 1];
        }
        l_run[hh] = l_run[hh] * alpha[hh] + (sum0 + sum1);
      }
    };
    // The general kernel's scores: full_score()'s contract (kernel_common.cuh), computed per tile
    // rather than per element. full_score() branches on the mask's kind and uses each mask load at
    // once, and its softcap is tanhf and an IEEE division (a slow-path call per score): 7-9x the plain
    // kernel's time with softcap, 4x with a mask at D = 256 (session 40). Here the kind is read once
    // per tile (0 none, 1 bool, 2 additive), the mask elements of kMaskChunk column groups are loaded
    // before any of them is used, and softcap goes through MUFU:
    //   cap tanh(v / cap) = cap - 2 cap / (2^(v 2 log2(e) / cap) + 1),
    // kc = scale 2 log2(e) / cap taken once per tile. Emulated in float32 with the approximations'
    // errors, the score's absolute error is <= 2.7e-5 at cap 50 (tanhf: ~5e-6), against ~0.02 for a
    // float16 score's own rounding there; +-inf give +-cap, NaN stays NaN.
    const float cap = a.softcap;
    auto cap_exponent_scale = [&]() { return a.scale * (2.0f * kLog2e) * rcp_approx(cap); };
    // Unmasked (softcap alone, Gemma 2's case): the key limits and the cap, no loads, no branches on
    // the kind (through the masked loop below it took 1.7x as long, session 41); the result goes to
    // the log2 domain directly (cap log2(e) - 2 cap log2(e) r: finite, so to_log2_units' bf16
    // overflow case cannot arise).
    auto score_unmasked = [&](int n0, int c0) {
      if (cap > 0.0f) {
        const float kc = cap_exponent_scale(), cl = cap * kLog2e;
#pragma unroll
        for (int i = 0; i < kBN / 8; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int j = n0 + i * 8 + c0 + (e & 1);
            float& x = s[i * 4 + e];
            const float r = rcp_approx(ex2(x * kc) + 1.0f);
            x = j < key_limit[e >> 1] ? fmaf(-2.0f * cl, r, cl) : -INFINITY;
          }
      } else {
#pragma unroll
        for (int i = 0; i < kBN / 8; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int j = n0 + i * 8 + c0 + (e & 1);
            float& x = s[i * 4 + e];
            x = j < key_limit[e >> 1] ? to_log2_units<T>(x * a.scale) : -INFINITY;
          }
      }
    };
    // Masks the same for every query row (mask_stride[2] == 0: padding masks): each warp classes the
    // tile's keys below len as all visible (bool != 0, additive +-0: x + mask == x), all masked (bool
    // 0, additive -inf) or mixed, from kBN / 32 keys per lane; a uniform tile skips the per-score
    // loads (score_unmasked, or -inf). D = 256 loads them at the start of the step (in flight through
    // its waits); at D = 128 the 4 registers held there spilled, so the loads go out when the tile is
    // scored. (The pair-mask kernels' tile classes need pair-aligned rows; these take any layout.)
    constexpr int kClassKeys = kBN / 32;
    constexpr bool kClassEarly = kD == 256;
    const bool class_general = kElementwise && a.mask_kind != 0 && a.mask_stride[2] == 0;
    uint32_t graw[kClassKeys];
    auto general_class_load = [&](int it) {
      if (!class_general) return;
      const int64_t esize = a.mask_kind == 2 ? 2 : 1;
      const int64_t step = a.mask_stride[3] * esize;
      const int k0 = it * kBN + lane * kClassKeys;
      const uint8_t* p = static_cast<const uint8_t*>(a.mask) + (row_info(0).mask_off + static_cast<int64_t>(k0) * a.mask_stride[3]) * esize;
#pragma unroll
      for (int e = 0; e < kClassKeys; ++e) {
        graw[e] = 0;
        if (k0 + e < len)
          graw[e] = a.mask_kind == 1 ? __ldg(p + e * step) : __ldg(reinterpret_cast<const unsigned short*>(p + e * step));
      }
    };
    auto score_general = [&](int n0, int c0) {
      constexpr int kMaskChunk = kD == 128 || kD == 192 ? 1 : 2;  // column groups per batch: 2 / 4 loads in flight per row (more spilled at D = 128)
      const int kind = a.mask_kind;
      if (kind == 0) {
        score_unmasked(n0, c0);
        return;
      }
      if (class_general) {
        if constexpr (!kClassEarly) general_class_load(n0 / kBN);
        constexpr uint32_t kNegInf = std::is_same_v<T, __half> ? 0xfc00u : 0xff80u;
        bool visible = true, masked = true;
#pragma unroll
        for (int e = 0; e < kClassKeys; ++e) {
          if (n0 + lane * kClassKeys + e >= len) continue;
          visible = visible && (kind == 1 ? graw[e] != 0 : (graw[e] & 0x7fffu) == 0);
          masked = masked && (kind == 1 ? graw[e] == 0 : graw[e] == kNegInf);
        }
        if (__all_sync(0xffffffffu, visible)) {
          score_unmasked(n0, c0);
          return;
        }
        if (__all_sync(0xffffffffu, masked)) {
#pragma unroll
          for (int i = 0; i < kBN / 2; ++i) s[i] = -INFINITY;
          return;
        }
      }
      const float kc = cap > 0.0f ? cap_exponent_scale() : 0.0f;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const RowInfo ri = row_info(hh);
        const int64_t esize = kind == 2 ? 2 : 1;
        const int64_t mstep = a.mask_stride[3] * esize;  // bytes per key
        // Element (row, n0 + c0), then 8 keys on per column group: pointer steps, not a 64-bit
        // product per element.
        const uint8_t* mp = static_cast<const uint8_t*>(a.mask) + (ri.mask_off + static_cast<int64_t>(n0 + c0) * a.mask_stride[3]) * esize;
#pragma unroll
        for (int i0 = 0; i0 < kBN / 8; i0 += kMaskChunk) {
          uint32_t m[kMaskChunk][2];
#pragma unroll
          for (int i = 0; i < kMaskChunk; ++i) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int j = n0 + (i0 + i) * 8 + c0 + e;
              const uint8_t* p = e == 0 ? mp : mp + mstep;
              m[i][e] = 0;
              if (kind != 0 && j < ri.key_limit)
                m[i][e] = kind == 1 ? __ldg(p) : __ldg(reinterpret_cast<const unsigned short*>(p));
            }
            mp += 8 * mstep;
          }
#pragma unroll
          for (int i = 0; i < kMaskChunk; ++i)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int j = n0 + (i0 + i) * 8 + c0 + e;
              float& x = s[(i0 + i) * 4 + 2 * hh + e];
              float v = x * a.scale;
              if (cap > 0.0f) v = fmaf(-2.0f * cap, rcp_approx(ex2(x * kc) + 1.0f), cap);
              const unsigned short bits = static_cast<unsigned short>(m[i][e]);
              if constexpr (std::is_same_v<T, __half>) v += kind == 2 ? __half2float(__ushort_as_half(bits)) : 0.0f;
              else v += kind == 2 ? __bfloat162float(__ushort_as_bfloat16(bits)) : 0.0f;
              const bool vis = j < ri.key_limit && (kind != 1 || m[i][e] != 0);
              x = vis ? to_log2_units<T>(v) : -INFINITY;
            }
        }
      }
    };
    // `defer_sums` (std::true_type): the row sums are left to row_sums(), called after the P V wait.
    auto softmax = [&](int it, auto variant, auto defer_sums) {
      constexpr int kV = decltype(variant)::value;
      const int n0 = it * kBN;
      const int c0 = 2 * (lane % 4);
      if constexpr (kV == kScoreNone) {
        // Every key of the tile masked: exp2(-inf - max) = 0 and the running max / sum stay.
#pragma unroll
        for (int i = 0; i < kBN / 2; ++i) s[i] = 0.0f;
        alpha[0] = alpha[1] = 1.0f;
        rescale_due = false;
        return;
      }
      if constexpr (kV == kScoreMask && kPairMask) {
        // full_score()'s arithmetic: (qk * scale [+ mask]) * log2 e, or -inf.
#pragma unroll
        for (int i = 0; i < kBN / 8; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int j = n0 + i * 8 + c0 + (e & 1);
            const uint32_t raw = mraw[e >> 1][i];
            float x = s[i * 4 + e] * a.scale;
            bool vis = j < key_limit[e >> 1];
            if constexpr (kMode == kMaskBool) {
              vis = vis && ((raw >> (8 * (e & 1))) & 0xffu) != 0;
            } else {
              const unsigned short bits = static_cast<unsigned short>(raw >> (16 * (e & 1)));
              if constexpr (std::is_same_v<T, __half>) x += __half2float(__ushort_as_half(bits));
              else x += __bfloat162float(__ushort_as_bfloat16(bits));
            }
            s[i * 4 + e] = vis ? to_log2_units<T>(x) : -INFINITY;
          }
      } else if constexpr (kV == kScoreMask && elementwise) {
        score_general(n0, c0);
      } else if constexpr (kV == kScoreLimits) {
        const int lim[2] = {key_limit[0], key_limit[1]};
#pragma unroll
        for (int i = 0; i < kBN / 8; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int j = n0 + i * 8 + c0 + (e & 1);
            s[i * 4 + e] = j < lim[e >> 1] ? s[i * 4 + e] * a.scale_log2 : -INFINITY;
          }
      }
      // Fast tiles (positive scale) keep the raw q.k: the row max is taken on them (scaling is
      // monotone) and the scale is folded into the exponent's FFMA.
      const float c = kV == kScoreFast ? a.scale_log2 : 1.0f;
      [[maybe_unused]] float tile_max[2];  // kLazy: each row's max of its base and this tile's scores
      // Row hh's base moves to mx: alpha = 2^(old - new) rescales O and l (-inf: base 0).
      auto move_base = [&](int hh, float mx) {
        alpha[hh] = ex2(m_run[hh] - (mx == -INFINITY ? 0.0f : mx));
        m_run[hh] = mx;
      };
      // Row hh's exponentials against base mx (fully masked so far, -inf: base 0, exp2(-inf) = 0).
      auto exponentiate = [&](int hh, float mx) {
        const float mbase = mx == -INFINITY ? 0.0f : mx;
#pragma unroll
        for (int i = 0; i < kBN / 8; ++i) {
          s[i * 4 + 2 * hh] = ex2(fmaf(s[i * 4 + 2 * hh], c, -mbase));
          s[i * 4 + 2 * hh + 1] = ex2(fmaf(s[i * 4 + 2 * hh + 1], c, -mbase));
        }
      };
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        // The row max. D = 64 takes it through 4 independent chains (one 16-deep chain of
        // dependent max instructions is latency its exponentials wait for; D = 64's key loop is
        // latency-bound, D = 128's tensor-bound); D = 128 and 256 keep one chain, which measured
        // 1-2 % faster there (same-process A/B, docs/notes/cuda_kernel.md, session 7; 8 chains were
        // noise, 16 went to local memory, and 4 at D = 256 spilled).
        float tmax = -INFINITY;
        if constexpr (kD == 64) {
          float part[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) part[k] = fmaxf(s[k * 4 + 2 * hh], s[k * 4 + 2 * hh + 1]);
#pragma unroll
          for (int i = 4; i < kBN / 8; ++i)
            part[i % 4] = fmaxf(part[i % 4], fmaxf(s[i * 4 + 2 * hh], s[i * 4 + 2 * hh + 1]));
          tmax = fmaxf(fmaxf(part[0], part[2]), fmaxf(part[1], part[3]));
        } else {
#pragma unroll
          for (int i = 0; i < kBN / 8; ++i) tmax = fmaxf(tmax, fmaxf(s[i * 4 + 2 * hh], s[i * 4 + 2 * hh + 1]));
        }
        float mx = fmaxf(m_run[hh], tmax * c);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        if constexpr (kLazy) {
          tile_max[hh] = mx;
          continue;  // the exponentials below, once both rows' maxima are known
        }
        move_base(hh, mx);
        exponentiate(hh, mx);
      }
      if constexpr (kLazy) {
        // The warp moves its bases only if a row outgrew its own by more than the slack (a row
        // fully masked so far, -inf, moves at its first visible key); then each row takes its max.
        const bool grew = tile_max[0] > m_run[0] + kRescaleSlack || tile_max[1] > m_run[1] + kRescaleSlack;
        rescale_due = __any_sync(0xffffffffu, grew);
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          if (rescale_due) move_base(hh, tile_max[hh]);
          else alpha[hh] = 1.0f;
          exponentiate(hh, m_run[hh]);
        }
      }
      if constexpr (!decltype(defer_sums)::value) row_sums();
    };
    // P's k-steps [from, to) from s.
    auto pack_range = [&](PFrag& dst, auto from, auto to) {
#pragma unroll
      for (int kk = decltype(from)::value; kk < decltype(to)::value; ++kk) {
        dst[kk][0] = pack2<T>(s[(2 * kk) * 4 + 0], s[(2 * kk) * 4 + 1]);
        dst[kk][1] = pack2<T>(s[(2 * kk) * 4 + 2], s[(2 * kk) * 4 + 3]);
        dst[kk][2] = pack2<T>(s[(2 * kk + 1) * 4 + 0], s[(2 * kk + 1) * 4 + 1]);
        dst[kk][3] = pack2<T>(s[(2 * kk + 1) * 4 + 2], s[(2 * kk + 1) * 4 + 3]);
      }
    };
    using KFirst = std::integral_constant<int, 0>;
    using KHalf = std::integral_constant<int, kBN / 32>;
    using KAll = std::integral_constant<int, kBN / 16>;
    auto pack_into = [&](PFrag& dst) { pack_range(dst, KFirst{}, KAll{}); };
    auto issue_pv_all = [&](int stage, const PFrag& pf) { issue_pv(stage, pf, KFirst{}, KAll{}); };
    // Keys >= key_lengths[b] inside the tile that holds that bound are real memory (TMA only
    // zero-fills beyond Sk) and may hold anything, NaN included, in a padded cache: their P is 0, but
    // 0 * NaN is NaN, so the two consumer warpgroups zero those V rows before using the tile
    // (generic-proxy stores shared between them, a proxy fence for wgmma, a 256-thread barrier;
    // both reach it for the same tile, once per block at most).
    auto zero_v_tail = [&](int stage, int tile) {
      const int from = len - tile * kBN;
      if (a.key_lengths == nullptr || from <= 0 || from >= kBN) return;
      const uint32_t vb = sV + stage * Cfg::kVBytes;
      // Pair masks: t + 128 cw (= tid - 128) read again here (volatile: not hoisted) rather than
      // kept in registers through the key loop for this rare path (their D=128 variants spilled).
      int idx0 = t + 128 * cw;
      if constexpr (kPairMask) {
        uint32_t tx;
        asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tx));
        idx0 = static_cast<int>(tx) - 128;
      }
      for (int idx = idx0; idx < (kBN - from) * kVRegions * 8; idx += 256) {
        const int chunk = idx % 8, rr = from + (idx / 8) % (kBN - from), reg = idx / (8 * (kBN - from));
        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(vb + reg * kBN * 128 + rr * 128 + chunk * 16),
                     "r"(0u)
                     : "memory");
      }
      fence_proxy_async_smem();
      asm volatile("bar.sync 1, 256;\n" ::: "memory");
    };
    auto rescale_o_by = [&](const float (&f)[2]) {
#pragma unroll
      for (int i = 0; i < kOCols / 8; ++i) {
        o[i * 4 + 0] *= f[0];
        o[i * 4 + 1] *= f[0];
        o[i * 4 + 2] *= f[1];
        o[i * 4 + 3] *= f[1];
      }
    };
    auto rescale_o = [&]() { rescale_o_by(alpha); };
    // A row's sum over the quad's four lanes (every lane takes part), and its inverse.
    auto quad_sum = [](float l) {
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      return l;
    };
    auto inverse = [](float l) { return l > 0.0f ? rcp_approx(l) : 0.0f; };
    // The item at (row0_, h_, b_) through shared memory and TMA stores (Config::kOStage with
    // tma_store): O / l, l the quad's sum of the threads' row sums lp (l = 0, a fully masked row:
    // 0). Each warpgroup writes its 64 rows into the output tile in the TMA box layout (128-byte
    // rows, 16-byte chunk k of row r at chunk k ^ (r % 8): the swizzle, which also spreads a warp's
    // 8 rows over all 32 banks), then one thread stores each 64-column region with TMA (rows >= Sq
    // and columns >= Dv are clipped by the tensor map). Named barrier 4 + cw; the previous item's
    // stores must have read the buffer first.
    auto store_staged = [&](const float (&lp)[2], int row0_, int h_, int b_) {
      const uint32_t so = sO + cw * 64 * 128;
      if (t == 0) bulk_wait_read();
      wg_sync();
      // kPlainSeqWide: the thread's lane read again here (volatile: not hoisted), so that ptxas does
      // not compute the 16 store addresses ahead of the key loop and keep them there (with them the
      // wide step's wgmmas were serialized, C7512).
      int lane_ = lane, warp_ = warp;
      if constexpr (kSeqWide) {
        uint32_t tx;
        asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tx));
        lane_ = static_cast<int>(tx % 32), warp_ = static_cast<int>((tx % 128) / 32);
      }
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float inv = inverse(quad_sum(lp[hh]));
        const int r = warp_ * 16 + lane_ / 4 + hh * 8;
#pragma unroll
        for (int i = 0; i < kDv / 8; ++i) {
          const uint32_t addr = so + (i / 8) * (kBM * 128) + r * 128 + (((i % 8) ^ (r % 8)) << 4) + 4 * (lane_ % 4);
          asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr),
                       "r"(pack2<T>(o[i * 4 + 2 * hh] * inv, o[i * 4 + 2 * hh + 1] * inv))
                       : "memory");
        }
      }
      fence_proxy_async_smem();
      wg_sync();
      if (t == 0) {
#pragma unroll
        for (int c = 0; c < kVRegions; ++c) tma_store_4d(&tm_y, so + c * (kBM * 128), c * 64, row0_ + cw * 64, h_, b_);
        bulk_commit();
      }
    };

    // Pingpong (`pingpong` != 0, pingpong_turns.cuh): the two consumer warpgroups take turns
    // issuing their wgmma batches, each passing the turn right after it issued, so one's softmax
    // overlaps the other's products. Each warpgroup issues n_tiles + 1 batches (n_tiles: this
    // block's key tiles of the item). kPlainSplit with an odd number of tiles: warpgroup 1 has one
    // batch less, so it passes its last turn too and then waits out warpgroup 0's last (odd_turn).
    const bool odd_turn = kSplitWG && cw == 1 && n_mine < n_tiles - n_mine;
    const bool pp = pingpong != 0 && n_tiles > 0;
    auto turn_wait = [&]() { pingpong_wait(pp, cw); };
    auto turn_pass = [&](bool last) { pingpong_pass(pp, cw, last, odd_turn); };
    pingpong_open(pp, cw);

    // K/V tile `it` (t_begin <= it < t_end) of this item is ring tile ring0 + it: its stage and
    // phase parity.
    auto stage_of = [&](int it) { return (ring0 + it) % kStages; };
    auto parity_of = [&](int it) { return static_cast<uint32_t>(((ring0 + it) / kStages) & 1); };
    // Tile classes (padding-style masks, kPairMask with mask_stride[2] == 0; else kTileMixed): the
    // class of tile it + 1 is read while tile it is processed (loads at the start of step(it), the
    // vote once S(it) is waited for), so that step(it + 1) knows before it issues anything whether
    // it needs the pair loads or its S product at all; the first tile's class loads go out before
    // Q is waited for and are voted on after that wait.
    // (The vote reads 4 keys per lane: 128-key tiles only; D = 256's 64-key tiles score every tile
    // of a pair mask through the pair loads.)
    const bool classify = kPairMask && kBN == 128 && mask_rows_shared && mask_classes != 0;
    uint32_t craw[2];
    auto class_load = [&](int it) {
      if constexpr (kPairMask) {
        if (classify) tile_class_load<kMaskBytes>(craw, mrow0, it * kBN, len, lane);
      }
    };
    auto class_vote = [&](int it) {
      if constexpr (kPairMask) {
        if (classify) return tile_class_vote<T, kMaskBytes>(craw, it * kBN, len, lane);
      }
      return kTileMixed;
    };
    // Calls f(ScoringV<V>{}) with tile it's scoring variant (cls: its class).
    auto with_scoring = [&](int it, int cls, auto&& f) {
      if constexpr (kSeqWide || kFastOnly) {
        // launch_hopper takes kPlainSeqWide and kPlainFast only where every key tile is whole and
        // visible (its whole_visible_tiles). kPlainSeqWide: the limits variant's 128 per-key tests
        // left its wgmmas too few registers (ptxas serialized them, C7512).
        f(ScoringV<kScoreFast>{});
      } else if constexpr (kPlainScores || kSplitWG) {
        if (is_boundary(it)) f(ScoringV<kScoreLimits>{});
        else f(ScoringV<kScoreFast>{});
      } else if constexpr (kMode == kGeneral) {
        f(ScoringV<kScoreMask>{});
      } else {
        // A visible-prefix or boundary tile takes the mask variant too: its pair loads read the
        // prefix's end from the mask itself, and the loop body carries one variant less (~1,100
        // instructions; see kFirstInLoop below for why size matters; session 15's A/B: level alone,
        // 4-5 % faster between BERT's GEMMs than with the limits variant for them). One call site
        // per variant: each is inlined where it is called.
        if (cls == 0) f(ScoringV<kScoreNone>{});  // kTileMixed is negative: never 0 or kBN
        else if (cls == kBN && !is_boundary(it)) f(ScoringV<kScoreFast>{});
        else f(ScoringV<kScoreMask>{});
      }
    };
    // The first tile: through the key loop's body in the mask / softcap kernels, its own copy in
    // the plain one. Each copy of the scoring variants is ~1,000 instructions of SASS, and a
    // kernel's first item on an SM runs from cold instruction caches: between BERT's GEMMs the pair-
    // mask kernel's size, run or not, cost it ~25 % (session 14). Session 15's same-call A/B (fp16
    // D = 64, B=8 H=12 S=512, µs alone / between the GEMMs): additive zeros mask 25.3 / 33.8 ->
    // 24.1 / 30.0, padded 28.4 / 39.4 -> 27.4 / 32.0 (with the prefix tiles above); the plain kernel
    // in the loop: 21.7 / 26.7 -> 22.0 / 26.1 and the seed shapes 1-3 % slower, so it keeps its copy.
    constexpr bool kFirstInLoop = !kPlainScores && !kSplitWG;
    if (n_tiles > 0) class_load(t_begin);  // pair masks: voted on after the Q wait
    // Q's bias (a.q_bias, bias_fold.h): added to this warpgroup's 64 rows of the Q tile in place,
    // once per item, before any S product reads it (16-byte chunks: the swizzle moves chunks, so
    // chunk k of row r sits at k ^ (r % 8); generic-proxy stores, then a proxy fence for wgmma and
    // the warpgroup's barrier). Q then holds round_T(q + b), as the graph's Add computed it. Rows
    // past Sq (zero-filled) get the bias too and are never stored; columns past D get none.
    // A thread's chunks are t, t + 128, ...: all in one column group (128 is a multiple of the
    // kRegions * 8 chunks of a row), so its 8 bias values are loaded once, before the Q wait, whose
    // latency they share (loaded inside the rolled loop, session 16's first version, they were on the
    // critical path of every item, 4 x 8 loads in sequence).
    const bool add_q_bias = a.q_bias != nullptr && n_tiles > 0;
    // V's bias (a.v_bias): this thread's output columns' values as T pairs, loaded while the item's
    // last P V product runs (D = 64) or in the epilogue, and added there.
    uint32_t vb_pair[kDv / 8];
    bool vb_loaded = false;
    auto load_v_bias = [&]() {
      const unsigned short* vb = static_cast<const unsigned short*>(a.v_bias) + (h / a.group) * a.head_dim_v;
#pragma unroll
      for (int i = 0; i < kDv / 8; ++i) {
        const int c = i * 8 + 2 * (lane % 4);
        const uint32_t lo = c < a.head_dim_v ? vb[c] : 0u;
        const uint32_t hi = c + 1 < a.head_dim_v ? vb[c + 1] : 0u;
        vb_pair[i] = lo | (hi << 16);
      }
      vb_loaded = true;
    };
    // The Q bias is added in 16-byte chunks of Q's rows (kRowChunks a row), each thread keeping the
    // bias of one column group (qb_col): the threads that walk the rows are a multiple of the row's
    // chunks, so that a thread's chunk stays in its column group from row to row -- all 128 at
    // D = 64, 128 and 256, 120 at D = 192 (24 chunks a row).
    constexpr int kRowChunks = kRegions * 8;
    constexpr int kBiasWalkers = 128 / kRowChunks * kRowChunks;
    const int qb_col = ((t % kRowChunks) / 8) * 64 + (t % 8) * 8;
    uint32_t qb_pair[4];
    if (add_q_bias) {
      const unsigned short* qb = static_cast<const unsigned short*>(a.q_bias) + h * a.head_dim + qb_col;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t lo = qb_col + 2 * e < a.head_dim ? qb[2 * e] : 0u;
        const uint32_t hi = qb_col + 2 * e + 1 < a.head_dim ? qb[2 * e + 1] : 0u;
        qb_pair[e] = lo | (hi << 16);
      }
    }
    mbar_wait(bar_q(round), q_parity(round));
    OPSFUSE_HOPPER_STAMP(1);  // Q is in
    __syncwarp();
    if (add_q_bias) {
      const int c0 = kBiasWalkers == 128 || t < kBiasWalkers ? t : 64 * kRowChunks;
#pragma unroll 1
      for (int c = c0; c < 64 * kRowChunks; c += kBiasWalkers) {
        const int r = c / kRowChunks, lc = c % kRowChunks;
        const uint32_t addr = q_off + (lc / 8) * (kBM * 128) + r * 128 + (((lc % 8) ^ (r % 8)) << 4);
        uint32_t x[4];
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
                     : "r"(addr));
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 v = unpack2<T>(x[e]), bias = unpack2<T>(qb_pair[e]);
          x[e] = pack2<T>(v.x + bias.x, v.y + bias.y);
        }
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(x[0]), "r"(x[1]), "r"(x[2]),
                     "r"(x[3])
                     : "memory");
      }
      fence_proxy_async_smem();
      wg_sync();
    }
    // Q is released (for the item kQBuffers rounds later) after the item's last S = Q K^T.
    if (n_mine == 0 && lane == 0) mbar_arrive(bar_qempty(round));
    if (n_mine > 0) {
      int cls_next = class_vote(my_begin);  // the class of the tile the loop takes next
      if constexpr (!kFirstInLoop && !kSeq) {
        // First tile (the plain kernel: no classes, no mask): S, softmax, P.
        const int st0 = stage_of(my_begin);
        mbar_wait(bar_kfull(st0), parity_of(my_begin));
        OPSFUSE_HOPPER_STAMP(2);  // the first K tile is in
        __syncwarp();
        turn_wait();
        OPSFUSE_HOPPER_STAMP(3);  // this warpgroup's turn: the first S product issues
        wgmma_fence();
        issue_qk(st0);
        wgmma_commit();
        turn_pass(false);
        wgmma_wait<0>();
        reg_fence(s);
        if (lane == 0) release(bar_kempty(st0));
        if (n_mine == 1 && lane == 0) mbar_arrive(bar_qempty(round));
        with_scoring(my_begin, kTileMixed, [&](auto variant) { softmax(my_begin, variant, std::false_type{}); });
        pack_into(p);
        OPSFUSE_HOPPER_STAMP(4);  // the first tile's softmax is done
      }
      // One step per key tile: S(it) and P(it-1) V(it-1) issued together; the warpgroup waits for
      // S(it) only, then scores it while P(it-1) V(it-1) runs (ptxas places the wait for that
      // product part-way through the exponentials), and the other warpgroup's batch (pingpong)
      // keeps the tensor cores busy too. The first tile's step has no P V product (an empty wgmma
      // group keeps the group count) and no V stage to wait for or release.
      // `first_it` is t_begin through an opaque move, so that the compiler cannot peel the first
      // iteration back into a copy of its own.
      // A tile whose keys are all masked (kScoreNone) skips its S = Q K^T (an empty wgmma group
      // keeps the group count); its K/V stages are still waited for and released.
      int first_it;
      asm("mov.b32 %0, %1;\n" : "=r"(first_it) : "r"(my_begin));
      // kPlainChain: the step takes the first tile of the block's next item (chain_boundary; the
      // chained loop below set it up), whose S product goes out with the previous item's last P V;
      // that item's row sums (l_prev) and coordinates (prev_*) wait for its store after the P V wait.
      [[maybe_unused]] float l_prev[2];
      [[maybe_unused]] int prev_b = 0, prev_h = 0, prev_row0 = 0;
      auto step = [&](int it, auto variant, auto chain_boundary) {
        constexpr int kV = decltype(variant)::value;
        const bool first = kFirstInLoop && it == first_it;
        const int st = stage_of(it), prev = stage_of(it - kStride);  // prev: this warpgroup's previous tile
        if constexpr (kV == kScoreMask) load_mask(it);  // independent of S(it): in flight while the wgmmas run
        if constexpr (kElementwise && kClassEarly) general_class_load(it);
        if (it + 1 < t_end) class_load(it + 1);
        if (!kLazy || rescale_due) rescale_o();  // O *= alpha(it - 1), before P(it-1) V(it-1) is added (first: O = 0, alpha = 1)
        OPSFUSE_HOPPER_TIMED(0, mbar_wait(bar_kfull(st), parity_of(it)));
        if (!first) OPSFUSE_HOPPER_TIMED(1, mbar_wait(bar_vfull(prev), parity_of(it - kStride)));
        __syncwarp();
        if (first || decltype(chain_boundary)::value) OPSFUSE_HOPPER_STAMP(2);  // the first K tile is in
        if (!first) zero_v_tail(prev, it - kStride);
        OPSFUSE_HOPPER_TIMED(2, turn_wait());
        if (first || decltype(chain_boundary)::value) OPSFUSE_HOPPER_STAMP(3);  // the first S product issues
        // Each branch fences and issues its own products: a wgmma that a branch separates from its
        // fence gets another fence from ptxas (warning C7519).
        if (first) {
          wgmma_fence();
          if constexpr (kV != kScoreNone) issue_qk(st);
          wgmma_commit();
          wgmma_commit();  // no P V product: an empty group
        } else {
          wgmma_fence();
          if constexpr (kV != kScoreNone) issue_qk(st);
          wgmma_commit();
          issue_pv_all(prev, p);
          wgmma_commit();
        }
        turn_pass(false);
        OPSFUSE_HOPPER_TIMED(3, wgmma_wait<1>());  // S(it) done; P(it-1) V(it-1) may still run
        reg_fence(s);
        if (lane == 0) release(bar_kempty(st));
        if (it == my_last && lane == 0) mbar_arrive(bar_qempty(round));
        // The next tile's class, before the scoring needs the registers (its loads went out at the
        // start of this step, ahead of the barrier waits and the S product).
        if (it + 1 < t_end) cls_next = class_vote(it + 1);
        if constexpr (decltype(chain_boundary)::value) {
          // The new item's softmax starts afresh; the old one's sums wait for its store.
          l_prev[0] = l_run[0];
          l_prev[1] = l_run[1];
          m_run[0] = m_run[1] = -INFINITY;
          l_run[0] = l_run[1] = 0.0f;
        }
        // Masks / softcap: the scoring needs more registers than an overlap with P(it-1) V(it-1)
        // leaves (P(it-1) live), so that variant waits for the product first.
        // The row sums come after the wait (the same additions, the same bits). ptxas puts the wait
        // after ~7 of the 64 exponentials either way; with the sums ahead of it, it gave them
        // registers of P and interleaved them with the exponentials (session 13's A/B: 1-3 %
        // faster at D = 64 and at S=1024 D = 128 with them after the wait).
        if constexpr (!kElementwise) softmax(it, variant, std::true_type{});
        OPSFUSE_HOPPER_TIMED(4, wgmma_wait<0>());  // P(it-1) V(it-1) done: O and the P registers are free again
        reg_fence(o);
        reg_fence(p);
        if (lane == 0 && !first) release(bar_vempty(prev));
        if constexpr (decltype(chain_boundary)::value) {
          // O is the previous item's whole output: store it, start afresh.
          OPSFUSE_HOPPER_STAMP_AT(round - 1, 5);  // the previous item's last P V is done
          store_staged(l_prev, prev_row0, prev_h, prev_b);
          OPSFUSE_HOPPER_STAMP_AT(round - 1, 6);  // its stores are issued
#pragma unroll
          for (int i = 0; i < kDv / 2; ++i) o[i] = 0.0f;
        }
        if constexpr (!kElementwise && kV != kScoreNone) row_sums();
        if constexpr (kElementwise) softmax(it, variant, std::false_type{});
        pack_into(p);
        if (first || decltype(chain_boundary)::value) OPSFUSE_HOPPER_STAMP(4);  // the first tile's softmax is done
      };
      if constexpr (kChain) {
        // One sequence of steps over the block's items: when an item's tiles are done, the block's
        // next item (if any) becomes the current one and its first tile the next step
        // (chain_boundary), as any further tile would. (A loop over items around the tile loop,
        // with the next item's first S issued at the inner loop's exit, made ptxas serialize every
        // wgmma: session 8.)
        for (int it = my_begin + 1;; ++it) {
          if (it == t_end) {
            OPSFUSE_HOPPER_STAMP(7);  // this item's last tile's step has ended: its waits
            const int w_next = consumer_item(round + 1);  // waits for its Q: loaded during this item
            if (w_next >= n_work) break;  // the outer loop reads round + 1's slot again, at once
            prev_b = b, prev_h = h, prev_row0 = row0;
            kv_base = ring0 + t_end;
            ++round;
            OPSFUSE_HOPPER_STAMP(0);  // the next item's start
            OPSFUSE_HOPPER_STAMP(1);  // its Q is in (consumer_item waited for it)
            const Work nw = published_work(round);
            b = nw.b, h = nw.h, row0 = nw.row0, len = nw.len;
            t_begin = nw.t_begin, t_end = nw.t_end;
            kr = nw.kr;
            my_begin = t_begin, my_last = t_end - 1;
            ring0 = kv_base - t_begin;
            rbase = rows_base(row0);
            key_limit[0] = row_info(0).key_limit;
            key_limit[1] = row_info(1).key_limit;
            q_off = q_tile_of(round);
            q_desc = smem_desc(q_off, 16, 1024);
            it = t_begin;
            with_scoring(it, kTileMixed, [&](auto variant) { step(it, variant, std::true_type{}); });
            continue;
          }
          with_scoring(it, kTileMixed, [&](auto variant) { step(it, variant, std::false_type{}); });
        }
      } else if constexpr (kSeq) {
        // Tile it in sequence: S, then its softmax under the turn (the other warpgroup's products
        // run meanwhile), O's rescale (P(it-1) V(it-1) is done), P V, waited for. Each warpgroup
        // takes n_tiles turns (the steps' passes; warpgroup 1 skips its last), as the pairing above
        // counts them. The same arithmetic as the overlapped step, in the same order.
        for (int it = my_begin; it < t_end; ++it) {
          with_scoring(it, kTileMixed, [&](auto variant) {
            const int st = stage_of(it);
            mbar_wait(bar_kfull(st), parity_of(it));
            __syncwarp();
            if constexpr (kSeqWide) reg_define(s);
            wgmma_fence();
            issue_qk(st);
            wgmma_commit();
            wgmma_wait<0>();
            reg_fence(s);
            if (lane == 0) release(bar_kempty(st));
            if (it == my_last && lane == 0) mbar_arrive(bar_qempty(round));
            turn_wait();
            softmax(it, variant, std::false_type{});
            if (!kLazy || rescale_due) rescale_o();
            // kPlainSeqWide packs and issues P V in two halves, the first half's product running
            // while the second is packed: P's 64 registers are never all live beside S's.
            if constexpr (kSeqWide) pack_range(p, KFirst{}, KHalf{});
            else pack_into(p);
            turn_pass(it == my_last);
            mbar_wait(bar_vfull(st), parity_of(it));
            __syncwarp();
            zero_v_tail(st, it);
            wgmma_fence();
            if constexpr (kSeqWide) {
              issue_pv(st, p, KFirst{}, KHalf{});
              pack_range(p, KHalf{}, KAll{});
              wgmma_fence();
              issue_pv(st, p, KHalf{}, KAll{});
            } else {
              issue_pv_all(st, p);
            }
            wgmma_commit();
            // The last tile's product is waited for below, where V's bias loads beside it.
            if (it != my_last) {
              wgmma_wait<0>();
              reg_fence(o);
              reg_fence(p);
              if (lane == 0) release(bar_vempty(st));
            }
          });
          // kPlainSeqWide: the loop visibly ends with the product still running, so that ptxas need
          // not keep P's registers apart from the next S (they share them: with 128 S registers
          // apart from P's 64 it serialized every wgmma, C7512).
          if constexpr (kSeqWide) {
            if (it == my_last) break;
          }
        }
      } else {
        for (int it = kFirstInLoop ? my_begin : my_begin + kStride; it < t_end; it += kStride) {
          with_scoring(it, cls_next, [&](auto variant) { step(it, variant, std::false_type{}); });
        }
      }
      const int last = stage_of(my_last);
      if constexpr (!kSeq) {  // kSeq: the last tile's P V is already issued
        if (!kLazy || rescale_due) rescale_o();
        mbar_wait(bar_vfull(last), parity_of(my_last));
        __syncwarp();
        zero_v_tail(last, my_last);
        turn_wait();
        wgmma_fence();
        issue_pv_all(last, p);
        wgmma_commit();
        turn_pass(true);
        if (odd_turn) turn_wait();
      }
      // V's bias while the product runs (D = 64: at 128 and 256 the 16 / 32 registers spilled).
      if constexpr (kD == 64) {
        if (a.v_bias != nullptr) load_v_bias();
      }
      wgmma_wait<0>();
      reg_fence(o);
      OPSFUSE_HOPPER_STAMP(5);  // the last P V product is done
      if constexpr (kSumTensor) {
        // The whole row's sum, in every lane of the quad: one lane's share, so that the quad sums
        // below (and the merges) see l exactly.
        l_run[0] = lane % 4 == 0 ? o[kDv / 2] : 0.0f;
        l_run[1] = lane % 4 == 0 ? o[kDv / 2 + 2] : 0.0f;
      }
      // The last tile's V stage goes back to the producer too: with a persistent grid the ring
      // continues into the block's next item, whose producer waits for this stage's release when
      // the ring comes round to it (kStages tiles later); without this arrive it waits forever.
      if (lane == 0) release(bar_vempty(last));
    }

    // Folds another part's (O, max, per-thread sum) of the same rows and columns into this thread's
    // registers: max M, O = O 2^(m - M) + O' 2^(m' - M), l likewise (m = -inf: weight 0).
    // `other(c)` is its float4 chunk c (O[4c .. 4c + 3], rows hh 0, 0, 1, 1; c = kDv / 8: (m0, m1,
    // l0, l1)). `rounded` (std::true_type): each product rounded before the one sum, so that
    // a + b = b + a bit for bit (stream-K: either part may merge); else FMAs may fuse.
    auto fold_partial = [&](auto other, auto rounded) {
      constexpr int kOChunks = kDv / 8;
      auto mix = [](float wa, float x, float wb, float y) {
        if constexpr (decltype(rounded)::value) return __fadd_rn(__fmul_rn(wa, x), __fmul_rn(wb, y));
        else return wa * x + wb * y;
      };
      const float4 ml = other(kOChunks);
      float wo[2], wx[2];
      const float mx[2] = {fmaxf(m_run[0], ml.x), fmaxf(m_run[1], ml.y)};
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float mb = mx[hh] == -INFINITY ? 0.0f : mx[hh];
        wo[hh] = ex2(m_run[hh] - mb);
        wx[hh] = ex2((hh == 0 ? ml.x : ml.y) - mb);
        l_run[hh] = mix(wo[hh], l_run[hh], wx[hh], hh == 0 ? ml.z : ml.w);
      }
#pragma unroll
      for (int c = 0; c < kOChunks; ++c) {
        const float4 v = other(c);
        o[4 * c] = mix(wo[0], o[4 * c], wx[0], v.x);
        o[4 * c + 1] = mix(wo[0], o[4 * c + 1], wx[0], v.y);
        o[4 * c + 2] = mix(wo[1], o[4 * c + 2], wx[1], v.z);
        o[4 * c + 3] = mix(wo[1], o[4 * c + 3], wx[1], v.w);
      }
    };

    // kPlainSplit merge: warpgroup 1's partial result (O, max, per-thread sum; its threads hold the
    // same rows and columns as warpgroup 0's) goes to shared memory over the K ring as float4
    // chunks, chunk c of thread t at c * 128 + t (named barrier 1 first: both warpgroups' last
    // products are done, and the block's one item has no loads left); warpgroup 0 folds it into its
    // registers (fold_partial, unrounded: the order is fixed) and stores the rows, warpgroup 1 is
    // done.
    if constexpr (kSplitWG) {
      constexpr int kOChunks = kDv / 8;
      float4* const part = reinterpret_cast<float4*>(smem_raw + (sK - smem_u32(smem_raw))) + t;
      asm volatile("bar.sync 1, 256;\n" ::: "memory");
      if (cw == 1) {
#pragma unroll
        for (int c = 0; c < kOChunks; ++c) part[c * 128] = make_float4(o[4 * c], o[4 * c + 1], o[4 * c + 2], o[4 * c + 3]);
        part[kOChunks * 128] = make_float4(m_run[0], m_run[1], l_run[0], l_run[1]);
      }
      asm volatile("bar.sync 1, 256;\n" ::: "memory");
      if (cw == 1) return;
      fold_partial([&](int c) { return part[c * 128]; }, std::false_type{});
    }

    // Stream-K exchange of a cut item (see item_of): each part's consumers put (O, max, per-thread
    // sum) in their slot of a.sk_part (block x: slot 2x for its first stream-K round, 2x + 1 for
    // its last; the split merge's chunk layout, stored to L2) and count the part in the item's
    // a.sk_count; the part that counts second merges the other's slot into its registers and
    // stores the rows, the first is done with the item. No block ever waits for another (a grid
    // that is not all resident, e.g. beside other streams' kernels, cannot hang). A part that
    // finds the other already counted merges at once, without writing its own. Products are
    // rounded before the one sum (no FMA): a + b = b + a, so the output bits do not depend on
    // which part merges.
    if (stream_k() && (t_begin > 0 || t_end < sk_tiles())) {
      constexpr int kOChunks = kDv / 8;
      constexpr int64_t kSlot = (kOChunks + 1) * 256;  // float4s per slot
      const bool head = t_begin == 0;                  // the item's first part: this block's last round
      const int64_t x = blockIdx.x;
      float4* const slots = reinterpret_cast<float4*>(a.sk_part) + cw * 128 + t;
      float4* const mine = slots + (2 * x + (head ? 1 : 0)) * kSlot;
      const float4* const other = slots + (head ? 2 * x + 2 : 2 * x - 1) * kSlot;
      int* const count = a.sk_count + (w - sk_base());
      // Thread 0 of the consumers reads the count (and later adds to it) between named barriers:
      // the first makes sure every consumer thread has read sk_flag's previous value.
      asm volatile("bar.sync 1, 256;\n" ::: "memory");
      if (tid == 128) {
        const int c = *reinterpret_cast<volatile int*>(count);
        __threadfence();  // acquire: the other part's slot is read after this
        sk_flag = c;
      }
      asm volatile("bar.sync 1, 256;\n" ::: "memory");
      if (sk_flag == 0) {
#pragma unroll
        for (int c = 0; c < kOChunks; ++c)
          __stcg(mine + c * 256, make_float4(o[4 * c], o[4 * c + 1], o[4 * c + 2], o[4 * c + 3]));
        __stcg(mine + kOChunks * 256, make_float4(m_run[0], m_run[1], l_run[0], l_run[1]));
        __threadfence();  // release: the slot before the count
        asm volatile("bar.sync 1, 256;\n" ::: "memory");
        if (tid == 128) {
          const int c = atomicAdd(count, 1);
          __threadfence();
          sk_flag = c;
        }
        asm volatile("bar.sync 1, 256;\n" ::: "memory");
        if (sk_flag == 0) {  // the other part merges
          kv_base = ring0 + t_end;
          continue;
        }
      }
      fold_partial([&](int c) { return __ldcg(other + c * 256); }, std::true_type{});
    }

    const int ns = splits_in(round);  // recomputed here: not a register through the key loop
    // (Wide heads are never split: D = 256's merge would not fit the ring, launch_hopper refuses it.)
    if (!kNoSplit && ns > 1) {
      // Split merge. Every rank's thread holds the same rows and columns of O (the accumulator
      // layout does not depend on the keys), so ranks > 0 put their (O, max, per-thread sum) in
      // their shared memory over the K/V ring (both warpgroups' last products are done: named
      // barrier 1; a split item is the block's last, so the producer loads nothing more) as
      // float4 chunks, chunk c of thread `slot` at c * 256 + slot: O[4c .. 4c + 3]
      // (rows: hh 0, 0, 1, 1), then (m0, m1, l0, l1). Rank 0 reads the chunks through distributed
      // shared memory and folds them into its registers in rank order (deterministic): max M,
      // O = sum_r O_r 2^(m_r - M), l likewise (m = -inf: weight 0).
      constexpr int kOChunks = kDv / 8;
      asm volatile("bar.sync 1, 256;\n" ::: "memory");
      float4* part = reinterpret_cast<float4*>(smem_raw + (sK - smem_u32(smem_raw))) + cw * 128 + t;
      const int split = static_cast<int>(blockIdx.x) % ns;
      if (split > 0) {
#pragma unroll
        for (int c = 0; c < kOChunks; ++c)
          part[c * 256] = make_float4(o[4 * c], o[4 * c + 1], o[4 * c + 2], o[4 * c + 3]);
        part[kOChunks * 256] = make_float4(m_run[0], m_run[1], l_run[0], l_run[1]);
      }
      cluster_sync();
      if (split == 0) {
        float mx[2] = {m_run[0], m_run[1]};
        for (int z = 1; z < ns; ++z) {
          const float4 ml = map_cluster_rank(part, z)[kOChunks * 256];
          mx[0] = fmaxf(mx[0], ml.x);
          mx[1] = fmaxf(mx[1], ml.y);
        }
        const float mb[2] = {mx[0] == -INFINITY ? 0.0f : mx[0], mx[1] == -INFINITY ? 0.0f : mx[1]};
        float w[2] = {ex2(m_run[0] - mb[0]), ex2(m_run[1] - mb[1])};
        l_run[0] *= w[0];
        l_run[1] *= w[1];
        rescale_o_by(w);
        for (int z = 1; z < ns; ++z) {
          const float4* peer = map_cluster_rank(part, z);
          const float4 ml = peer[kOChunks * 256];
          w[0] = ex2(ml.x - mb[0]);
          w[1] = ex2(ml.y - mb[1]);
          l_run[0] += w[0] * ml.z;
          l_run[1] += w[1] * ml.w;
#pragma unroll
          for (int c = 0; c < kOChunks; ++c) {
            const float4 v = peer[c * 256];
            o[4 * c] += w[0] * v.x;
            o[4 * c + 1] += w[0] * v.y;
            o[4 * c + 2] += w[1] * v.z;
            o[4 * c + 3] += w[1] * v.w;
          }
        }
      }
      cluster_sync();  // no block leaves (freeing its shared memory) while rank 0 still reads it
      if (split > 0) {
        if (Cfg::kOStage && tma_store && t == 0) bulk_wait_read();  // earlier rounds' output stores
        return;
      }
    }

    // Epilogue: row sums across the quad, normalize, store (fully masked rows: l = 0 -> 0). It runs
    // once per item from instruction-cache lines that no loop keeps warm, so it is kept short
    // (Nsight Compute, seed S=1024: the per-pair bounds checks and the IEEE division's slow path made
    // it ~500 instructions and ~18 % of the warps' stall samples, "no instruction"). A row with a
    // visible key has l >= 1 (its max scores exp2(0)), where the approximate reciprocal is within
    // 1 ulp; full rows (Dv = the bucket, paired stores allowed) store without per-pair checks.
    // The sum of row hh (0 / 1) over the quad's four lanes.
    auto row_sum = [&](int hh) { return quad_sum(l_run[hh]); };
    // V's bias (a.v_bias): O / l + b = (O + l b) / l, so it goes into the unnormalized O here and
    // both stores below stay as they are; a fully masked row (l = 0) stays 0.
    if (a.v_bias != nullptr) {
      if (!vb_loaded) load_v_bias();
      const float l0 = row_sum(0), l1 = row_sum(1);
#pragma unroll
      for (int i = 0; i < kDv / 8; ++i) {
        const float2 bias = unpack2<T>(vb_pair[i]);
        o[i * 4 + 0] = fmaf(l0, bias.x, o[i * 4 + 0]);
        o[i * 4 + 1] = fmaf(l0, bias.y, o[i * 4 + 1]);
        o[i * 4 + 2] = fmaf(l1, bias.x, o[i * 4 + 2]);
        o[i * 4 + 3] = fmaf(l1, bias.y, o[i * 4 + 3]);
      }
    }
    if (Cfg::kOStage && tma_store) {
      store_staged(l_run, row0, h, b);
      OPSFUSE_HOPPER_STAMP(6);  // the output's stores are issued
      kv_base = ring0 + t_end;
      continue;
    }
    const bool full_rows = a.head_dim_v == kDv && a.vec_store != 0;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float l = row_sum(hh);
      const int pos = rbase + hh * 8;
      if (pos >= a.seq_q) continue;
      const float inv = inverse(l);
      T* yrow = static_cast<T*>(a.y) + b * a.y_stride[0] + h * a.y_stride[1] + pos * a.y_stride[2];
      if (full_rows) {
#pragma unroll
        for (int i = 0; i < kDv / 8; ++i)
          *reinterpret_cast<uint32_t*>(yrow + i * 8 + 2 * (lane % 4)) =
              pack2<T>(o[i * 4 + 2 * hh] * inv, o[i * 4 + 2 * hh + 1] * inv);
      } else {
#pragma unroll
        for (int i = 0; i < kDv / 8; ++i) {
          const int c = i * 8 + 2 * (lane % 4);
          if (c < a.head_dim_v)
            store_pair<T>(yrow + c, o[i * 4 + 2 * hh] * inv, o[i * 4 + 2 * hh + 1] * inv, c + 1 < a.head_dim_v,
                          a.vec_store != 0);
        }
      }
    }
    OPSFUSE_HOPPER_STAMP(6);  // the output's stores are done (from registers)
    kv_base = ring0 + t_end;
  }  // work items
  // The output tile's last TMA stores must have read it before the block (and its shared memory)
  // is gone; their global writes need no wait here: they complete before the grid does.
  if (Cfg::kOStage && tma_store && t == 0) bulk_wait_read();
}

#undef OPSFUSE_HOPPER_STAMP
#undef OPSFUSE_HOPPER_STAMP_AT
#undef OPSFUSE_HOPPER_TIMED
}  // namespace opsfuse::cuda::detail::hopper
