// Internal to plugin/cuda: the Hopper prefill kernel's instantiations (hopper_fwd.cuh), apart so
// that the launcher's test hook (last_hopper_mode(), kernel_args.h) and the check driver can name
// them without the kernel's header.
#pragma once

namespace opsfuse::cuda::detail::hopper {

// kMode (each a separate instantiation, so that the common path carries none of the others' registers):
//  kPlain     no mask, no softcap.
//  kGeneral   softcap, or a mask whose layout the pair loads (mask_tiles.cuh) cannot read: every
//             score goes through full_score() after the P V product it overlaps with is done.
//  kMaskAdd / kMaskBool  a mask (additive T / bool) without softcap, read as aligned column pairs
//             (mask_stride[3] == 1, even element offsets, rows of even length: one 32-bit load
//             per T pair, one 16-bit load per bool pair), per thread from two row pointers
//             computed once; a tile's loads are issued before its S wgmma is waited for, so
//             their latency hides behind the matrix products. The values added are full_score()'s,
//             bit for bit. A mask that is the same for every query row (mask_stride[2] == 0,
//             padding masks) is first classified per key tile (tile_class_vote): uniform tiles
//             skip the pair loads and the per-score mask work (kScoreFast / kScoreNone).
//  kPlainSplit  kPlain's scoring on items of 64 rows, whose key tiles the two consumer warpgroups
//             split between them (warpgroup cw takes tiles t_begin + cw, + 2, ...) and merge in
//             shared memory at the end (choose_plan's hopper_wg_split(): launches whose 64-row
//             items fit in one round, where a block's time is its item's key loop).
//  kPlainChain  kPlain's scoring on a persistent block's items as one sequence of key-tile steps
//             (item chaining): the step that takes an item's first tile pairs its S product with
//             the previous item's last P V, and stores that item after the P V wait, so that no
//             item boundary leaves the tensor cores without a queued product (see the key loop).
//  kPlainSeq  kPlain's scoring at D = 64 and 128 with each key tile's work in sequence: S, the
//             softmax (with O's rescale, the sums and P's packing; the pingpong's turn around it),
//             then P V, waited for before the next tile. No first tile of its own and no trailing
//             P V: a smaller kernel, faster on short items (launch_hopper: <= 8 key tiles by
//             default at D = 64, <= 4 at D = 128); on longer ones kPlain's overlapped step is faster.
//  kPlainSeqWide  kPlainSeq at D = 64 on key tiles of 256 keys instead of 128 (launch_hopper, where
//             Plan::seq_wide_tiles allows it): half the steps per item, so half the per-tile
//             latencies that pace the D = 64 step (the S and P V waits, the row max's shuffles, the
//             turn), with twice the independent work in each softmax.
//  kPlainFast  kPlain at D = 128 for launches whose key tiles are all whole and visible (launch_hopper:
//             no causal, no key_lengths, Sk a multiple of 128, a positive scale), unsplit and without
//             stream-K: the fast scoring only, none of the split / tail / stream-K code -- 4,904 SASS
//             instructions against kPlain's 7,768, its key-tile loop 859 against 1,907 (the fast and
//             limits steps laid out one after the other). Code that never runs still costs (its
//             instruction fetch; session 14 at D = 64): the H100's same-process A/B (session 45)
//             measured S=1024 -3 to -5 % against kPlain, S=2048 / 4096 (chaining off) -3 to -4 %.
//             It takes these launches before kPlainChain too (S=2048 -0.9 % against the chain,
//             S=4096 level; session 46), which keeps causal ones and those with a partial last tile.
//  kPlainSeq3  kPlainSeq at D = 64 in a kernel of its own (hopper_seq3.cuh: hopper_seq3_kernel, 512
//             threads) whose third consumer warpgroup takes the last key tiles of both 64-row strips,
//             so that an item's critical path is fewer steps (launch_hopper: one-round launches of
//             3 to 8 whole, visible 128-key tiles, Plan::three_consumers).
enum Mode : int {
  kPlain = 0,
  kGeneral = 1,
  kMaskAdd = 2,
  kMaskBool = 3,
  kPlainSplit = 4,
  kPlainChain = 5,
  kPlainSeq = 6,
  kPlainSeqWide = 7,
  kPlainFast = 8,
  kPlainSeq3 = 9
};
constexpr int kModes = 10;

}  // namespace opsfuse::cuda::detail::hopper
