// The decode GEMM's launch choices (src/cuda/moe/decode_split.h): the ring rows and the K split
// that the comments of decode_split.cu name for the model shapes, on a device described by hand
// (no GPU needed). The device: 132 SMs, 228 KB of shared memory per SM and 1 KB reserved per CTA
// (an H100 or H200), three decode CTAs of 8 warps resident per SM at every split and seven narrow
// ones of 4 (what the registers of the 8-token kernels allow on those GPUs).
#include <gtest/gtest.h>

#include "cuda/moe/decode_split.h"

namespace {

using mxmoe::cuda::decode_device;
using mxmoe::cuda::decode_ring_rows;
using mxmoe::cuda::decode_split;
using mxmoe::cuda::pick_decode_split;

constexpr auto G1 = mxmoe::cuda::decode_gemm::gate_up, G2 = mxmoe::cuda::decode_gemm::down;

constexpr size_t kSmemPerSm = 233472, kReserved = 1024;
constexpr int kWide = mxmoe::cuda::sm90::kDecodeWarps, kNarrow = mxmoe::cuda::sm90::kDecodeWarpsNarrow;

decode_device hopper() {
  decode_device d;
  d.sms = 132;
  d.smem_per_sm = kSmemPerSm;
  d.smem_reserved_per_cta = kReserved;
  for (int bn : {8, 16})
    for (int kg : {1, 2, 4})
      for (int rows = 1; rows <= bn; rows *= 2)
        if (kg * bn <= 32) {
          d.occupancy.set(bn, kg, rows, mxmoe::cuda::sm90::kDecodeWarps, 3);
          if (bn == 8 && kg <= 2) d.occupancy.set(bn, kg, rows, mxmoe::cuda::sm90::kDecodeWarpsNarrow, 7);
        }
  return d;
}

// The shared memory that caps an SM at `share` CTAs.
size_t cap(int share) { return (kSmemPerSm / share - kReserved) / 128 * 128; }

TEST(DecodeRingRows, TheMostPairsATileHoldsRoundedUpToAPowerOfTwo) {
  EXPECT_EQ(decode_ring_rows(1, 4, false, 8), 1);   // a routed token picks an expert once
  EXPECT_EQ(decode_ring_rows(3, 4, false, 8), 4);
  EXPECT_EQ(decode_ring_rows(5, 8, false, 8), 8);
  EXPECT_EQ(decode_ring_rows(9, 8, false, 8), 8);   // never beyond the tile
  EXPECT_EQ(decode_ring_rows(12, 8, false, 16), 16);
  EXPECT_EQ(decode_ring_rows(1, 4, true, 8), 4);    // caller-provided ids may repeat an expert: T * k
  EXPECT_EQ(decode_ring_rows(3, 4, true, 16), 16);
}

TEST(DecodeSplit, GptOss120bAtOneToken) {
  const decode_device dev = hopper();
  // GEMM1 (5760 x 2880): 180 CTAs would leave 48 SMs with two; 2 groups give 360 (0.68 -> 0.91 of
  // the busiest SM), all resident, and 22-23 fragment tiles per group.
  const decode_split g1 = pick_decode_split(G1, 8, 1, 4, 5760, 2880, dev);
  EXPECT_EQ(g1.k_groups, 2);
  EXPECT_EQ(g1.min_smem_bytes, 0u);  // ceil(360 / 132) = 3 = what fits anyway
  EXPECT_EQ(g1.warps, kWide);        // 720 narrow CTAs would be no more even
  // GEMM2 (2880 x 2880): 2 groups fit two CTAs per SM (180); a third split would leave 11 fragment
  // tiles per group (< 16), so it stays at 2, in narrow CTAs: 360, no SM taking more than 3.
  const decode_split g2 = pick_decode_split(G2, 8, 1, 4, 2880, 2880, dev);
  EXPECT_EQ(g2.k_groups, 2);
  EXPECT_EQ(g2.warps, kNarrow);
  EXPECT_EQ(g2.min_smem_bytes, cap(3));
}

TEST(DecodeSplit, Qwen3AtOneToken) {
  const decode_device dev = hopper();
  // GEMM1: 2 groups fit two 8-warp CTAs per SM (192, 0.73 of the busiest SM). 384 narrow ones
  // would be 0.97, but each warp's K range is 16 fragment tiles (< 20): measured slower.
  const decode_split g1 = pick_decode_split(G1, 8, 1, 8, 1536, 2048, dev);
  EXPECT_EQ(g1.k_groups, 2);
  EXPECT_EQ(g1.warps, kWide);
  EXPECT_EQ(g1.min_smem_bytes, cap(2));
  const decode_split g2 = pick_decode_split(G2, 8, 1, 8, 2048, 768, dev);  // K = 768: 12 fragment tiles, no split
  EXPECT_EQ(g2.k_groups, 1);
  EXPECT_EQ(g2.warps, kWide);            // 128 CTAs, one per SM: as even as 256
  EXPECT_EQ(g2.min_smem_bytes, cap(1));
}

TEST(DecodeSplit, NarrowCtaOnlyForAClearGain) {
  const decode_device dev = hopper();
  // Kimi-K2's GEMM2 at T = 1 (7168 x 2048, 8 tiles): 448 CTAs, 0.85; 896 narrow ones would be 0.97,
  // less than the 0.15 the rule asks (and its 16 tiles per warp are too short: at 0.10 it lost).
  EXPECT_EQ(pick_decode_split(G2, 8, 1, 8, 7168, 2048, dev).warps, kWide);
  // gpt-oss-20b's GEMM2 is gpt-oss-120b's (2880 x 2880, 4 tiles): narrow.
  EXPECT_EQ(pick_decode_split(G2, 8, 1, 4, 2880, 2880, dev).warps, kNarrow);
  // 16-token tiles have no narrow CTA.
  EXPECT_EQ(pick_decode_split(G2, 16, 16, 4, 2880, 2880, dev).warps, kWide);
  // Nor a split over 4 groups (a narrow CTA keeps 2 row tiles).
  const decode_split four = pick_decode_split(G2, 8, 8, 1, 64, 2080, dev);
  EXPECT_EQ(four.k_groups, 4);
  EXPECT_EQ(four.warps, kWide);
}

TEST(DecodeSplit, NarrowGemm1CtaInWavesOverShortKRanges) {
  const decode_device dev = hopper();
  // gpt-oss-120b at T = 8 (32 tiles at most): GEMM1's 1440 8-warp CTAs are more than the 396 that
  // fit; 45 fragment tiles per warp: narrow, no cap. GEMM2 (736 CTAs) stays wide.
  const decode_split g1 = pick_decode_split(G1, 8, 8, 32, 5760, 2880, dev);
  EXPECT_EQ(g1.k_groups, 1);
  EXPECT_EQ(g1.warps, kNarrow);
  EXPECT_EQ(g1.min_smem_bytes, 0u);
  EXPECT_EQ(pick_decode_split(G2, 8, 8, 32, 2880, 2880, dev).warps, kWide);
  // Qwen3-30B-A3B: GEMM1 at T = 8 (64 tiles, 768 CTAs) narrow; at T = 4 its 384 CTAs fit at once,
  // as even as 768 narrow ones: wide. GEMM2 at T = 4 (512 CTAs, K = 768) stays wide.
  EXPECT_EQ(pick_decode_split(G1, 8, 8, 64, 1536, 2048, dev).warps, kNarrow);
  EXPECT_EQ(pick_decode_split(G1, 8, 4, 32, 1536, 2048, dev).warps, kWide);
  EXPECT_EQ(pick_decode_split(G2, 8, 4, 32, 2048, 768, dev).warps, kWide);
  // Kimi-K2's GEMM1 at T = 2 (16 tiles, 512 CTAs) keeps 112 fragment tiles per warp, and at T = 4
  // the long-K split leaves 56: wide.
  EXPECT_EQ(pick_decode_split(G1, 8, 2, 16, 4096, 7168, dev).warps, kWide);
  const decode_split k4 = pick_decode_split(G1, 8, 4, 32, 4096, 7168, dev);
  EXPECT_EQ(k4.k_groups, 2);
  EXPECT_EQ(k4.warps, kWide);
  // gpt-oss-120b's GEMM1 at T = 4: 720 CTAs in waves, but 16 tiles (< 24): wide, its K split over
  // 2 groups of 22-23 fragment tiles instead.
  const decode_split t4 = pick_decode_split(G1, 8, 4, 16, 5760, 2880, dev);
  EXPECT_EQ(t4.warps, kWide);
  EXPECT_EQ(t4.k_groups, 2);
  // Not GEMM2, not Kimi-K2's GEMM1 at T = 2 (56 tiles per group), not a launch in one wave.
  EXPECT_EQ(pick_decode_split(G2, 8, 4, 16, 2880, 2880, dev).k_groups, 1);
  EXPECT_EQ(pick_decode_split(G1, 8, 2, 16, 4096, 7168, dev).k_groups, 1);
  EXPECT_EQ(pick_decode_split(G1, 8, 2, 8, 5760, 2880, dev).k_groups, 1);
  // 16-token tiles stay wide in waves too.
  EXPECT_EQ(pick_decode_split(G1, 16, 16, 64, 5760, 2880, dev).warps, kWide);
}

TEST(DecodeSplit, LongKSplitsOnlyWithManyTiles) {
  const decode_device dev = hopper();
  // Kimi-K2's GEMM1 (4096 x 7168: 112 fragment tiles of K): 8 tiles at T = 1 stay whole, 32 tiles
  // at T = 4 split over 2 groups although the CTAs then exceed what is resident.
  EXPECT_EQ(pick_decode_split(G1, 8, 1, 8, 4096, 7168, dev).k_groups, 1);
  EXPECT_EQ(pick_decode_split(G1, 8, 4, 32, 4096, 7168, dev).k_groups, 2);
  // ... and only for 8-token tiles, only for K >= 6144.
  EXPECT_EQ(pick_decode_split(G1, 16, 16, 32, 4096, 7168, dev).k_groups, 1);
  EXPECT_EQ(pick_decode_split(G1, 8, 4, 32, 4096, 4096, dev).k_groups, 1);
}

TEST(DecodeSplit, SixteenTokenTilesSplitInTwoAtMost) {
  const decode_device dev = hopper();
  // A long K and a single tile: 8-token tiles split over 4 groups, 16-token tiles over 2 (k_groups
  // * BN <= 32).
  EXPECT_EQ(pick_decode_split(G2, 8, 8, 1, 64, 2080, dev).k_groups, 4);
  EXPECT_EQ(pick_decode_split(G2, 16, 16, 1, 64, 2080, dev).k_groups, 2);
}

TEST(DecodeSplit, NoCapWhereTheCtasOutnumberWhatFits) {
  const decode_device dev = hopper();
  // Kimi-K2's GEMM2 at T = 8 (7168 x 2048, 64 tiles): 3584 CTAs, more than 3 per SM.
  const decode_split g2 = pick_decode_split(G2, 8, 8, 64, 7168, 2048, dev);
  EXPECT_EQ(g2.k_groups, 1);
  EXPECT_EQ(g2.min_smem_bytes, 0u);
}

}  // namespace
