// Internal to plugin/cuda: the launch-ready form of AttentionParams that every kernel receives by
// value, the launch plan (which kernel, tile sizes, number of KV splits) and the declarations of
// the per-configuration launch functions that the instantiation files define.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace opsfuse::cuda::detail {

// Plain data copied to the device as a kernel parameter. Sizes fit in int (checked by the launcher).
struct KernelArgs {
  const void* q;  // (B, Hq, Sq, D), element strides q_stride
  const void* k;  // (B, Hkv, Sk, D)
  const void* v;  // (B, Hkv, Sk, Dv)
  void* y;        // (B, Hq, Sq, Dv)
  const void* mask;         // viewed as (B, Hq, Sq, Sk) through mask_stride; bool bytes or T
  const void* key_lengths;  // (B,) int32 or int64, or null
  int key_lengths_int64;
  int mask_kind;  // 0 none, 1 bool, 2 additive (MaskKind)
  // Biases the kernel adds itself (null where it reads biased copies, bias_fold.h). Q's (Hq*D,):
  // the Hopper prefill kernel only, into its Q tile (it leaves K's out: a per-row constant of the
  // scores, which softmax removes). V's (Hkv*Dv,): the Hopper prefill and float32 kernels, as
  // O + l b before the division by l (split partials included); the others read a copy.
  const void* q_bias;
  const void* v_bias;

  int batch, heads_q, heads_kv, group, seq_q, seq_k, head_dim, head_dim_v;
  // Rows of one (batch, kv head): the `group` query heads that share the kv head, times Sq.
  // Row r is query head kv_head * group + r / Sq at position r % Sq (GQA without repeating K/V).
  int rows;
  int causal;         // 0, 1 or 2
  int causal_offset;  // key j visible to query i iff j <= i + causal_offset (0 or Sk - Sq)
  int vec_loads;      // 1 when Q/K/V rows allow 16-byte loads (alignment of pointers and strides)
  int vec_store;      // 1 when Y allows paired (4- or 8-byte) stores

  int64_t q_stride[3], k_stride[3], v_stride[3], y_stride[3];
  int64_t mask_stride[4];

  float scale;       // multiplies q.k
  float scale_log2;  // scale * log2(e): the fast path when no softcap / additive mask
  float softcap;     // > 0: s <- softcap * tanh(s / softcap)

  // Split-KV (flash-decoding): blockIdx.z is the split; with num_splits > 1 each block writes its
  // unnormalized partial output and (max, sum) to the workspace and combine_splits() finishes.
  int num_splits;
  float* part_o;   // (num_splits, B*Hq*Sq, Dv) float32
  float* part_ml;  // (num_splits, B*Hq*Sq, 2) float32: running max (log2 domain) and sum

  // Dynamic schedule of a persistent Hopper grid (Plan::sched_heads > 0): a ticket counter in the
  // workspace, zeroed on the stream before the launch, that blocks draw their next row tile from;
  // tickets walk sections of sched_heads (batch, query head) pairs, heaviest row tiles first.
  int* tile_counter;  // null: the static snake order
  int sched_heads;

  // Stream-K schedule of a persistent Hopper grid (Plan::stream_k): after sk_rounds rounds of whole
  // items, the blocks share the last items' (row tile, key tile) units in contiguous ranges, block
  // x units [x q + min(x, r), (x + 1) q + min(x + 1, r)) (q >= key tiles: each item is split
  // between at most two blocks); a split item's two parts meet through sk_part (one slot of float32
  // (O, max, sum) per part, two per block) and sk_count (one arrival count per shared item, zeroed
  // on the stream before the launch): whichever part finishes second merges and stores
  // (hopper_fwd.cuh).
  int* sk_count;  // null: not stream-K
  float* sk_part;
  int sk_rounds;
  int sk_q, sk_r;  // units per block, and the first sk_r blocks one more (units < 2^31)
#ifdef OPSFUSE_HOPPER_TRACE
  // Diagnostic builds only (scripts/hopper_trace.py): globaltimer stamps of the Hopper kernel's
  // consumer warpgroups, at the address in OPSFUSE_HOPPER_TRACE_PTR (null: none).
  unsigned long long* trace;
#endif
};

// The launcher's A/B switches: OPSFUSE_CUDA_* environment variables that tests and measurement
// sweeps set to force or turn off one plan decision (each is documented where it is applied).
// They are read in one pass over the environment per launcher call (read_switches() in
// attention_cuda.cu) into this snapshot, which choose_plan() and the Plan carry from there, so that
// one table names them all and the launch functions take their decisions from the plan alone.
// (Measured on the H200's host, tools/launch_host_cost: a getenv() costs 0.12-0.14 us, but a launch
// read only ~5 of them; launch() stayed at 7.2 us, of which ~5.5 are the kernel launch itself.)
enum class Switch : int {
  kDisableHopper,       // OPSFUSE_CUDA_DISABLE_HOPPER
  kForceHopper,         // OPSFUSE_CUDA_FORCE_HOPPER
  kHopperDecode,        // OPSFUSE_CUDA_HOPPER_DECODE
  kHopperPersistent,    // OPSFUSE_CUDA_HOPPER_PERSISTENT
  kHopperSplits,        // OPSFUSE_CUDA_HOPPER_SPLITS
  kHopperTailSplit,     // OPSFUSE_CUDA_HOPPER_TAIL_SPLIT
  kHopperMaskPairs,     // OPSFUSE_CUDA_HOPPER_MASK_PAIRS
  kHopperPingpong,      // OPSFUSE_CUDA_HOPPER_PINGPONG
  kHopperMaskClasses,   // OPSFUSE_CUDA_HOPPER_MASK_CLASSES
  kHopperTmaStore,      // OPSFUSE_CUDA_HOPPER_TMA_STORE
  kHopperDynamic,       // OPSFUSE_CUDA_HOPPER_DYNAMIC
  kHopperSchedHeads,    // OPSFUSE_CUDA_HOPPER_SCHED_HEADS
  kHopperStreamK,       // OPSFUSE_CUDA_HOPPER_STREAM_K
  kHopperWgSplit,       // OPSFUSE_CUDA_HOPPER_WG_SPLIT
  kHopperChain,         // OPSFUSE_CUDA_HOPPER_CHAIN
  kHopperPdl,           // OPSFUSE_CUDA_HOPPER_PDL
  kHopperSeq,           // OPSFUSE_CUDA_HOPPER_SEQ
  kHopperSeqD128,       // OPSFUSE_CUDA_HOPPER_SEQ_D128
  kHopperSeqWide,       // OPSFUSE_CUDA_HOPPER_SEQ_WIDE
  kHopperDvBucket,      // OPSFUSE_CUDA_HOPPER_DV_BUCKET
  kHopperD192,          // OPSFUSE_CUDA_HOPPER_D192
  kHopperFast,          // OPSFUSE_CUDA_HOPPER_FAST
  kHopperSeq3,          // OPSFUSE_CUDA_HOPPER_SEQ3
  kDecodeSplits,        // OPSFUSE_CUDA_DECODE_SPLITS
  kDecodeNoCluster,     // OPSFUSE_CUDA_DECODE_NO_CLUSTER
  kDecodeL2Promotion,   // OPSFUSE_CUDA_DECODE_L2_PROMOTION
  kDecodeEvictFirst,    // OPSFUSE_CUDA_DECODE_EVICT_FIRST
  kCount
};

struct Switches {
  const char* value[static_cast<int>(Switch::kCount)] = {};  // the variable's value, or null when unset
  const char* get(Switch s) const { return value[static_cast<int>(s)]; }
  bool is(Switch s, char first) const {  // set, and its value starts with `first` ('0' off, '1' on)
    const char* v = get(s);
    return v != nullptr && v[0] == first;
  }
};

// Which compiled kernel runs, chosen by choose_plan() in attention_cuda.cu (the one heuristic).
// kHopper / kHopperDecode: the sm_90a prefill kernel (hopper/hopper_fwd.cuh) and the sm_90 TMA decode
// kernel (hopper/hopper_decode.cuh), compiled only when CMAKE_CUDA_ARCHITECTURES includes 90 (then
// OPSFUSE_CUDA_HOPPER is defined for attention_cuda.cu).
enum class KernelKind : int { kTensorCore = 0, kTensorCoreDecode = 1, kFloat32 = 2, kHopper = 3, kHopperDecode = 4 };

// Test hook (attention_cuda.cu): the KernelKind of the calling thread's last launched kernel, -1 if none.
int last_launch_kind();
// Test hook: the hopper::Mode (hopper_fwd.cuh) of the calling thread's last Hopper prefill launch,
// -1 if none; launch_hopper records it.
int last_hopper_mode();
void record_hopper_mode(int mode);

struct Plan {
  KernelKind kind = KernelKind::kTensorCore;
  int bucket = 64;      // compiled head size that D and Dv are rounded up to (64, 128, 256; kHopper
                        // also 192: latent attention's Q / K, see bucket_v)
  int bucket_v = 64;    // kHopper: Dv's own bucket, = bucket but for latent attention (D in (128, 256],
                        // Dv <= 128: 128, the (192, 128) or (256, 128) instantiation); other kinds: = bucket
  int block_m = 128;    // query rows per block
  int block_n = 64;     // keys per tile
  int num_splits = 1;   // > 1: split-KV with a combine pass
  int stages = 2;       // K/V cp.async ring depth: decode (decode_stages) and prefill (1 or 2)
  int row_tiles = 0;    // ceil(rows / block_m)
  int cluster = 1;      // decode with num_splits > 1 on sm_90: == num_splits when the splits of one
                        // (batch, kv head) form a thread-block cluster and merge in distributed
                        // shared memory (flash_decode.cuh; no combine launch); 1 otherwise.
                        // kHopper: > 1 = that many key splits per row tile, one cluster per tile,
                        // merged in distributed shared memory (num_splits stays 1: no workspace);
                        // with persistent > 0: 2 = the tail split (only the last, partial round's
                        // row tiles split between the two blocks of a cluster, choose_plan)
  int persistent = 0;   // kHopper: > 0 = a persistent grid of that many blocks looping over the row
                        // tiles (when there are more tiles than blocks); 0 = one block per tile
  int sched_heads = 0;  // kHopper persistent: > 0 = row tiles handed out dynamically (a ticket
                        // counter in the workspace), in sections of this many (batch, query head)
                        // pairs whose K/V fit in L2, heaviest first; 0 = the static snake
  bool stream_k = false;  // kHopper persistent, static: units of (row tile, key tile) shared in
                          // contiguous ranges, split items merged through the workspace
                          // (hopper_stream_k(), KernelArgs::sk_count)
  bool wg_split = false;  // kHopper, one block per row tile of 64 rows (block_m = 64), whose key
                          // tiles the two consumer warpgroups split (hopper_wg_split())
  // What the launch functions apply as the switches say (the shipped behaviour by default):
  bool pingpong = true;        // kHopper: the inter-warpgroup schedule
  bool mask_classes = true;    // kHopper: padding-mask tile classes
  bool mask_pairs = true;      // kHopper: masks read as aligned column pairs where the layout allows
  bool tma_store = true;       // kHopper: the output through shared memory and TMA stores (D <= 128)
  int chain_tiles = 16;        // kHopper: item chaining (kPlainChain, launch_hopper) for persistent plain
                               // launches at D = 128 over >= this many key tiles
  int chain_tiles_causal = 8;  // the same for causal launches (their items' key loops are shorter)
                               // (OPSFUSE_CUDA_HOPPER_CHAIN=0: never, =N >= 2: from N tiles, both)
  bool pdl = false;            // kHopper: a programmatic dependent launch (launch_hopper)
  int seq_tiles = 8;           // kHopper: plain launches at D <= 64 over <= this many key tiles run them in
                               // sequence (kPlainSeq, launch_hopper); 0 never
  int seq_tiles_d128 = 4;      // the same at D = 128 (OPSFUSE_CUDA_HOPPER_SEQ_D128)
  int seq_wide_tiles = 32;     // kHopper: plain launches at D <= 64 over 2 to this many whole 256-key
                               // tiles run in sequence on 256-key tiles (kPlainSeqWide, launch_hopper;
                               // OPSFUSE_CUDA_HOPPER_SEQ_WIDE); 0 never
  bool fast_plain = true;      // kHopper: plain D = 128 launches whose key tiles are all whole and visible
                               // in the kernel without the code they never run (kPlainFast, launch_hopper;
                               // OPSFUSE_CUDA_HOPPER_FAST=0: never)
  bool three_consumers = false;  // kHopper: one-round plain launches at D <= 64 over 3 to 8 whole 128-key
                                 // tiles in the three-consumer kernel (kPlainSeq3, launch_hopper;
                                 // hopper_three_consumers(); OPSFUSE_CUDA_HOPPER_SEQ3=0: never)
  int l2_promotion = 1;        // kHopperDecode: K/V tensor maps' L2 promotion (0 none, 1 128 B, 2 256 B)
  bool evict_first = true;     // kHopperDecode: K/V loads with an evict-first L2 policy
};

// Launch functions, one per compiled configuration (defined in the instantiation files).
// They set the shared-memory attribute, launch on `stream` and return cudaGetLastError().
#define OPSFUSE_DECLARE_TC(NAME) cudaError_t NAME(const KernelArgs& a, const Plan& plan, cudaStream_t stream)
OPSFUSE_DECLARE_TC(run_tc_f16_d64);
OPSFUSE_DECLARE_TC(run_tc_f16_d128);
OPSFUSE_DECLARE_TC(run_tc_f16_d256);
OPSFUSE_DECLARE_TC(run_tc_bf16_d64);
OPSFUSE_DECLARE_TC(run_tc_bf16_d128);
OPSFUSE_DECLARE_TC(run_tc_bf16_d256);
OPSFUSE_DECLARE_TC(run_tcdec_f16_d64);
OPSFUSE_DECLARE_TC(run_tcdec_f16_d128);
OPSFUSE_DECLARE_TC(run_tcdec_bf16_d64);
OPSFUSE_DECLARE_TC(run_tcdec_bf16_d128);
OPSFUSE_DECLARE_TC(run_f32_d64);
OPSFUSE_DECLARE_TC(run_f32_d128);
OPSFUSE_DECLARE_TC(run_f32_d256);
OPSFUSE_DECLARE_TC(run_hopper_f16_d64);  // hopper/*.cu, sm_90a only
OPSFUSE_DECLARE_TC(run_hopper_f16_d128);
OPSFUSE_DECLARE_TC(run_hopper_bf16_d64);
OPSFUSE_DECLARE_TC(run_hopper_bf16_d128);
OPSFUSE_DECLARE_TC(run_hopper_f16_d256);
OPSFUSE_DECLARE_TC(run_hopper_bf16_d256);
OPSFUSE_DECLARE_TC(run_hopper_f16_d256_v128);  // latent attention: Dv <= 128 < D (Plan::bucket_v)
OPSFUSE_DECLARE_TC(run_hopper_bf16_d256_v128);
OPSFUSE_DECLARE_TC(run_hopper_f16_d192_v128);  // ... with D <= 192
OPSFUSE_DECLARE_TC(run_hopper_bf16_d192_v128);
OPSFUSE_DECLARE_TC(run_hopper_dec_f16_d64);  // hopper/hopper_dec_*.cu, sm_90a only
OPSFUSE_DECLARE_TC(run_hopper_dec_f16_d128);
OPSFUSE_DECLARE_TC(run_hopper_dec_bf16_d64);
OPSFUSE_DECLARE_TC(run_hopper_dec_bf16_d128);
#undef OPSFUSE_DECLARE_TC
// Decode (dec_*.cu): how many clusters of `cluster` blocks of the `stages` deep decode kernel fit on
// the current device at once, 0 where the cluster merge is not available (flash_decode.cuh,
// max_active_clusters). Host-side queries, cached per device.
int clusters_tcdec_f16_d64(int stages, int cluster);
int clusters_tcdec_f16_d128(int stages, int cluster);
int clusters_tcdec_bf16_d64(int stages, int cluster);
int clusters_tcdec_bf16_d128(int stages, int cluster);
// The same for the sm_90 decode kernel (hopper/hopper_decode.cuh; sm_90a builds only).
int clusters_hopper_dec_f16_d64(int cluster);
int clusters_hopper_dec_f16_d128(int cluster);
int clusters_hopper_dec_bf16_d64(int cluster);
int clusters_hopper_dec_bf16_d128(int cluster);

// Tile shapes of each configuration, shared by the heuristic and the instantiations.
// per_sm_regs: resident blocks per multiprocessor allowed by registers (65536 / (threads x the
// registers ptxas reports for sm_90, rounded up to 8)); the heuristic also bounds it by shared memory.
struct TileShape {
  int block_m, block_n, warps, per_sm_regs;
};
// Tensor-core prefill tiles (flash_tc.cuh); per_sm_regs is also the kernel's __launch_bounds__
// minimum of resident blocks (ptxas must fit the registers to it with 0 bytes of spill).
// 64x64 for D <= 64: 1 m16 tile per warp with Q in registers, 3 blocks/SM, and twice the blocks of
// a 128-row tile for the small grids (B*H = 12 at S = 128..2048 is 12..192 128-row blocks).
constexpr TileShape kTcTile64{64, 64, 4, 3};    // 157 registers, 46 KB shared (2 stages)
constexpr TileShape kTcTile128{128, 64, 4, 2};  // 255 registers, 104 KB shared (2 stages)
constexpr TileShape kTcTile256{64, 32, 4, 2};   // 223 registers, 101 KB shared (2 stages)
// Shared memory of a tensor-core prefill block: the Q tile and `stages` x (K tile + V tile), 16-bit
// elements, rows padded by 16 bytes.
constexpr int tc_smem_bytes(int bucket, int block_m, int block_n, int stages) {
  return (block_m + 2 * stages * block_n) * (bucket + 8) * 2;
}
constexpr TileShape kTcDecodeTile{16, 64, 4, 3};  // flash_decode.cuh: 4 warps x 16 of 64 keys, 168 (D=64) / 184 registers
// Float32 tiles (flash_f32.cuh): a prefill tile and a 1-warp "small" tile per bucket; choose_plan()
// takes the small one when the prefill tile's grid leaves the multiprocessors unevenly loaded.
// Block threads = 32 x warps; each thread owns (block_m / (4 x warps)) rows x (block_n / 8) keys.
constexpr TileShape kF32Tile64{64, 64, 4, 3};     // 168 registers, 68 KB shared
constexpr TileShape kF32Small64{8, 64, 1, 13};    // 148 registers, 37 KB shared
constexpr TileShape kF32Tile128{64, 32, 4, 2};    // 238 registers, 76 KB shared
constexpr TileShape kF32Small128{8, 32, 1, 12};   // 162 registers, 38 KB shared
constexpr TileShape kF32Tile256{32, 32, 4, 3};    // 168 registers, 102 KB shared
constexpr TileShape kF32Small256 = kF32Tile256;   // none: the 32-row tile already has 8 rows per warp
// Shared memory of a float32 tile (bytes): Q [block_m][D+4], K [block_n][D+4], V [block_n][D],
// P [block_m][block_n+8], float32.
constexpr int f32_smem_bytes(int bucket, int block_m, int block_n) {
  return 4 * (block_m * (bucket + 4) + block_n * (bucket + 4) + block_n * bucket + block_m * (block_n + 8));
}

// Decode kernel (flash_decode.cuh): shared memory of one block (Q tile + a ring of `stages` K and V
// tiles, rows padded by 16 bytes), and the
// ring depth for a device: the deepest of 2..4 that keeps
// two blocks resident per multiprocessor (H100/H200: 3 at D=128, 4 at D=64; A100: 2 at D=128),
// else 2 (74 KB at D=128: within every sm_80+ per-block limit).
constexpr int kDecodeMaxStages = 4;
__host__ __device__ constexpr int decode_smem_bytes(int bucket, int stages) {
  return (kTcDecodeTile.block_m + 2 * stages * kTcDecodeTile.block_n) * (bucket + 8) * 2;
}
inline int decode_stages(int bucket, int smem_per_sm) {
  for (int s = kDecodeMaxStages; s > 2; --s)
    if (smem_per_sm / (decode_smem_bytes(bucket, s) + 1024) >= 2) return s;
  return 2;
}

}  // namespace opsfuse::cuda::detail
