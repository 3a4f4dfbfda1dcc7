// Internal to plugin/cuda/hopper: the Hopper prefill kernel's compile-time traits -- its tile sizes,
// shared-memory budget per head size and mode (Config / ModeConfig), and the compile-time A/B
// switches of its arithmetic. Read by the kernel (hopper_fwd.cuh) and its launcher (hopper_launch.cuh).
#pragma once

#include <type_traits>

#include "hopper_modes.h"

namespace opsfuse::cuda::detail::hopper {

// Lazy rescale (docs/notes/cuda_kernel.md, session 20): the running max, the exponent base of P,
// moves only when a row of the warp outgrows it by more than kRescaleSlack (log2 units; P <= 2^8
// otherwise), so that most tiles skip O's rescale (64 multiplies per thread at D = 128, right
// ahead of the next products) and alpha's exponentials. O and l share the base, so O / l is the
// same quotient. Taken in the plain kernels at D = 128 (the H200 A/B: S=4096 -4 %, causal -3 %,
// S=1024 -2 %) and D = 256 (S=4096 -8 %, causal -7 to -13 %, S=1024 -4 %; session 21); at D = 64
// the same code measured 6-10 % slower. The macro (compile time, A/B builds): 0 turns it off.
#ifndef OPSFUSE_HOPPER_LAZY_RESCALE
#define OPSFUSE_HOPPER_LAZY_RESCALE 1
#endif
constexpr bool kLazyRescale = OPSFUSE_HOPPER_LAZY_RESCALE != 0;
constexpr float kRescaleSlack = 8.0f;

// Row sums on the tensor cores, in kPlainSeqWide (D = 64 on 256-key tiles): O += P V runs as
// m64n72k16, whose ninth 8-column group reads a block of ones in shared memory, so that O's extra
// accumulators hold l = the sum of the rounded P, rescaled with O by alpha. Its softmax, which runs
// under the pingpong's turn, drops its 128 additions per thread and tile; the tensor cores take
// 12.5 % more P V work. The H200 A/B (docs/notes/cuda_kernel.md, session 30): -2.3 to -3.4 % at 2-16
// wide tiles; in kPlainSeq on 128-key tiles level to +1.3 %, so that kernel keeps float32 sums (as
// does kPlain, where the same change measured +2-4 %: session 20). The macro (compile time, A/B
// builds): 0 turns it off.
#ifndef OPSFUSE_HOPPER_SUM_ON_TENSOR
#define OPSFUSE_HOPPER_SUM_ON_TENSOR 1
#endif
constexpr bool kSumOnTensor = OPSFUSE_HOPPER_SUM_ON_TENSOR != 0;

// Each round's Q tile loaded by the producer's work thread as soon as the round's item is published,
// instead of by the loading thread after it has issued the previous item's last K/V tile: a
// persistent block's next Q then starts about an item ahead rather than ~1.5 key-tile steps (round
// 0 stays with the loading thread). Where rounds start together on every SM (S=1024: 132 items of
// new heads at once), the Q tiles come from DRAM in one burst beside the new heads' K/V. Measured
// at D = 128 (H100, session 33, two rounds against the build without it, B=8 H=16 bf16): S=4096 and
// causal S=4096 -0.6 to -1.9 %, causal S=1024 -1 to -2 %, S=1024 -1 % to level; taken at D = 128
// only (the kernels of D = 64 and 256 were not measured with it). The macro (compile time, A/B
// builds): 0 turns it off.
#ifndef OPSFUSE_HOPPER_EARLY_Q
#define OPSFUSE_HOPPER_EARLY_Q 1
#endif
constexpr bool kEarlyQ = OPSFUSE_HOPPER_EARLY_Q != 0;

// D = 256's general kernel takes its shared-memory base through a lane-0 shuffle (hopper_fwd.cuh;
// session 40, H100: -0.5 to -1.3 % with masks and softcap). The macro (compile time, A/B builds): 0
// turns it off.
#ifndef OPSFUSE_HOPPER_UNIFORM_BASE
#define OPSFUSE_HOPPER_UNIFORM_BASE 1
#endif

// The next item decided a round ahead also with one Q buffer at D = 192 (two item slots,
// hopper_fwd.cuh), so that its first K / V tile loads before the current item releases Q and only
// Q's own load waits for that release (session 44). The macro (compile time, A/B builds): 0 gives
// one slot per Q buffer there, as before.
#ifndef OPSFUSE_HOPPER_SLOT_AHEAD
#define OPSFUSE_HOPPER_SLOT_AHEAD 1
#endif

constexpr int kBM = 128;          // query rows per block (2 consumer warpgroups x 64)
constexpr int kBN = 128;          // keys per tile at D <= 128 (Config<kD>::kBN: 64 at D = 256)
constexpr int kThreads = 384;     // producer warpgroup + 2 consumer warpgroups
constexpr int kConsumerWarps = 8;

// D = 256 takes 64-key tiles: a consumer thread holds O (kD / 2 = 128 floats) and, while P V of
// one tile overlaps S of the next, that S and the P operand: 64 + 32 registers at 128 keys do not
// fit beside O in setmaxnreg's 240, 32 + 16 at 64 keys do. Two stages of 64-key K and V tiles plus
// Q fill 193 KB of shared memory.
// kQBuffers: Q tiles in flight. With two (D <= 128: 129 / 193 KB in all), a persistent block's
// producer loads the next item's Q as soon as it has issued the current item's last K/V tile, not
// when the consumers release Q after the item's last S product (Nsight Compute, prefill B=8 H=16
// S=1024 D=128: ~13 % of the warps' stall samples were the first tile's waits); D = 256 has no room.
// kOStage: the output tile is staged in shared memory (the Q tile's layout) and written by TMA
// stores, one per 64-column region and consumer warpgroup (the same profile: ~13 % of the samples in
// the epilogue's 32 four-byte global stores per thread at D = 128, which throttle the LSU); D <= 128
// (225 KB in all at D = 128), D = 256 stores from registers.
// kKeys: keys per tile; 256 for kPlainSeqWide (D = 64 only), whose 32 KB K and V tiles take two
// stages (176 KB in all; three would need 240).
// kDv: V's and the output's column bucket, kD but for latent attention (D = 192, Dv = 128:
// DeepSeek-V3), whose instantiations (192, 128) and (256, 128) keep V tiles, O's accumulators and
// the P V product at 128 columns instead of padding them to 256. (192, 128) takes 128-key tiles (O's
// 64 accumulators leave D = 128's registers) and one Q buffer: 48 + 2 x (48 + 32) KB.
template <int kD, int kKeys = (kD == 256 ? 64 : hopper::kBN), int kDv = kD>
struct Config {
  static_assert(kDv <= kD && kDv % 64 == 0, "V's bucket: a multiple of 64, at most Q / K's");
  static constexpr int kBN = kKeys;
  static constexpr int kStages = kD == 64 && kKeys == 128 ? 3 : 2;
  static constexpr int kQBuffers = kD > 128 ? 1 : 2;
  static constexpr bool kOStage = kD <= 128 && kDv == kD;
  static constexpr int kQBytes = kBM * kD * 2;  // also the output tile's (kOStage)
  static constexpr int kKVBytes = kBN * kD * 2;  // one K tile
  static constexpr int kVBytes = kBN * kDv * 2;  // one V tile
  // kSumOnTensor (kPlainSeqWide): a 2 KB block of ones (16 keys x 64 columns) per consumer warpgroup
  // after the output tile.
  static constexpr int kOnesBytes = kSumOnTensor && kD == 64 && kKeys == 256 ? 2 * 2048 : 0;
  static constexpr int kSmem =
      (kQBuffers + (kOStage ? 1 : 0)) * kQBytes + kStages * (kKVBytes + kVBytes) + kOnesBytes + 1024;  // + alignment slack
};
// The configuration of mode kMode's instantiation (hopper_modes.h).
template <int kD, int kMode, int kDv = kD>
using ModeConfig = std::conditional_t<kMode == kPlainSeqWide, Config<kD, 256>,
                                      Config<kD, (kD == 256 ? 64 : hopper::kBN), kDv>>;

}  // namespace opsfuse::cuda::detail::hopper
