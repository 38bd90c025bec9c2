// moe/decode_split.cu — the decode GEMM's ring rows and K split (decode_split.h): host code, compiled
// with the launchers for kernels.h's CTA geometry.
#include "decode_split.h"

#include <algorithm>

#include "kernels.h"
#include "mxmoe/layout.h"

namespace mxmoe::cuda {

int decode_ring_rows(int64_t tokens, int top_k, bool precomputed, int bn) {
  const int64_t bound = std::min<int64_t>(bn, precomputed ? tokens * top_k : tokens);
  int rows = 1;
  while (rows < bound) rows *= 2;
  return rows;
}

// The K split: 2, then 4 warp groups
//   while every K group keeps >= 8 fragment tiles (the two stages in flight) and the CTAs of the
//   (at most min(E, pairs)) tiles fit two per SM: sweeps at T = 8-128 found more split slower
//   (performance.md, 2026-12-02);
//   beyond that, once more only where it evens the SMs out: every K group keeps >= 16 fragment
//   tiles, every CTA is resident at once, and the mean CTAs per SM over the most any SM gets rises
//   by >= 0.15 (gpt-oss-120b's GEMM1 at T = 1: 180 CTAs on 132 SMs, 0.68, becomes 360, 0.91:
//   20.8 -> 19.3 us on an H200; splitting where the SMs were already even was slower: Qwen3-30B-A3B
//   and Kimi-K2 at T = 1, performance.md, 2026-12-05 eighth session; 8 tiles instead of 16 lost
//   there and again on an H100, Qwen3-30B-A3B T = 1 +3 %, thirtieth session);
//   and 2 groups for 8-token tiles of a long K (>= 96 fragment tiles, K >= 6144) once there are
//   >= 32 tiles, even though the CTAs then exceed two per SM: Kimi-K2's and DeepSeek-V3's GEMM1
//   (K = 7168) at T = 4-8 took 0.945-0.971 of the layer time on three H100s, T = 1-2 (fewer tiles)
//   lost up to 4 %, K <= 4096 gained nothing (performance.md, 2026-12-06 fifteenth session).
// Then the narrow CTA (4 warps, 8-token tiles, k_groups <= 2) where the same split in CTAs of
// half the rows evens the SMs out by the same margin with every CTA resident, and each warp's K
// range is long (>= 20 fragment tiles): more CTAs without shortening any warp's K range, which a
// third split did. gpt-oss-120b's and gpt-oss-20b's GEMM2 at T = 1 (22-23 tiles per warp: 180
// CTAs, 0.68 of the busiest SM, become 360, 0.91) took 0.987-0.996 of the layer time on three
// H100s (medians over the rounds, as below). With 16 tiles per warp it lost: Qwen3-30B-A3B's GEMM1
// at T = 1 (192 -> 384 CTAs) 1.013 of the layer, Kimi-K2's GEMM2 (448 -> 896 at a 0.10 gain) 1.025. A narrow CTA pays the same start (tile,
// rows, first stages) for half the rows, so it pays off only over a long K range
// (performance.md, thirty-second session).
// And GEMM1's narrow CTA wherever its 8-warp CTAs do not all fit at once (several waves), there
// are >= 24 tiles and each warp's K range is at most 48 fragment tiles: smaller CTAs fill the SMs
// in finer steps and a stage's barrier waits for 4 warps, not 8. Forced on every 8-token GEMM1
// launch (H100, thirty-second session), it took 0.960-0.999 of the layer time in gpt-oss-120b's,
// gpt-oss-20b's and Qwen3-30B-A3B's at T = 8-64 (K = 2880, 2048; by this rule, measured again:
// Qwen3-30B-A3B 0.978-0.989, gpt-oss-120b 0.991-0.998); it lost with a longer K range or fewer
// tiles: Kimi-K2 at T = 2 1.166 (112 fragment tiles per warp, 16 tiles),
// DeepSeek-V4-Flash-like at T = 4 1.012 (64 per warp). GEMM2 in waves stays wide: forced narrow
// it ranged from 0.963 to 1.017 (Kimi-K2 T = 2), and with GEMM1's narrow CTAs as well
// gpt-oss-20b T = 16-32 took 1.010-1.013: its CTAs start before GEMM1 ends, so their shape
// changes what they overlap rather than how they stream.
// Where GEMM1's 8-warp CTAs run in waves but the tiles are too few for the narrow CTA (< 24), its
// K is split over 2 groups if each keeps 20-48 fragment tiles: forced on every 8-token GEMM1
// launch (H100, thirty-second session), 2 groups took 0.977 and 0.951 of the layer time at
// gpt-oss-120b and gpt-oss-20b T = 4 (16 tiles, 720 CTAs: 1.8 waves) and lost where the narrow
// CTA runs (T >= 16: 1.037-1.051) and at Kimi-K2 T = 2 (56 tiles per group: 1.028). By this rule,
// on another H100 (thirty-third session, five rounds): 0.969 and 0.965, every other launch at
// T = 1-16 within the run's noise.
// The shared memory: no SM should take more CTAs than its even share, ceil(CTAs / SMs): asking for
// smem_per_sm / share keeps the block scheduler from stacking CTAs on some SMs while others idle,
// which a ring of few B rows (three or four CTAs fit per SM) would otherwise allow.
decode_split pick_decode_split(decode_gemm gemm, int bn, int ring_rows, int64_t est_tiles, int64_t rows,
                               int64_t cols, const decode_device& dev) {
  constexpr int kCtasPerSmForSplit = 2;
  constexpr int64_t kLongKMinTiles = 32, kLongKMinColTiles = 96;
  constexpr double kBalanceGain = 0.15;
  constexpr int64_t kNarrowMinWarpTiles = 20, kNarrowMaxWarpTilesInWaves = 48, kNarrowMinTilesInWaves = 24;
  const layout::sm90_fragment frag{rows, cols};
  const int64_t sms = dev.sms;
  auto ctas_with = [&](int kg, int warps) { return layout::ceil_div(frag.row_tiles(), warps / kg) * est_tiles; };
  auto ctas_of = [&](int kg) { return ctas_with(kg, sm90::kDecodeWarps); };
  auto balance = [&](int64_t ctas) { return static_cast<double>(ctas) / static_cast<double>(sms * layout::ceil_div(ctas, sms)); };
  decode_split d;
  while (2 * d.k_groups * bn <= 32) {
    const int next = 2 * d.k_groups;
    const int64_t ctas = ctas_of(next);
    const bool fits = frag.col_tiles() >= 8 * next && ctas <= kCtasPerSmForSplit * sms;
    const bool evens = frag.col_tiles() >= 16 * next &&
                       ctas <= sms * dev.occupancy.ctas_per_sm(bn, next, ring_rows, sm90::kDecodeWarps) &&
                       balance(ctas) >= balance(ctas_of(d.k_groups)) + kBalanceGain;
    if (!fits && !evens) break;
    d.k_groups = next;
  }
  if (d.k_groups == 1 && bn == 8 && est_tiles >= kLongKMinTiles && frag.col_tiles() >= kLongKMinColTiles) d.k_groups = 2;
  if (bn == 8 && d.k_groups <= 2) {
    const int64_t warp_tiles = layout::ceil_div(frag.col_tiles(), d.k_groups);
    const int64_t wide = ctas_of(d.k_groups), narrow = ctas_with(d.k_groups, sm90::kDecodeWarpsNarrow);
    const bool in_waves = wide > sms * dev.occupancy.ctas_per_sm(bn, d.k_groups, ring_rows, sm90::kDecodeWarps);
    const bool evens = warp_tiles >= kNarrowMinWarpTiles &&
                       narrow <= sms * dev.occupancy.ctas_per_sm(bn, d.k_groups, ring_rows, sm90::kDecodeWarpsNarrow) &&
                       balance(narrow) >= balance(wide) + kBalanceGain;
    const bool waves = gemm == decode_gemm::gate_up && in_waves && est_tiles >= kNarrowMinTilesInWaves &&
                       warp_tiles <= kNarrowMaxWarpTilesInWaves;
    if (evens || waves) d.warps = sm90::kDecodeWarpsNarrow;
    const int64_t group_tiles = layout::ceil_div(frag.col_tiles(), 2);
    if (gemm == decode_gemm::gate_up && d.k_groups == 1 && d.warps == sm90::kDecodeWarps && in_waves &&
        est_tiles < kNarrowMinTilesInWaves && group_tiles >= kNarrowMinWarpTiles && group_tiles <= kNarrowMaxWarpTilesInWaves)
      d.k_groups = 2;
  }
  const int64_t share = layout::ceil_div(ctas_with(d.k_groups, d.warps), sms);
  if (share < dev.occupancy.ctas_per_sm(bn, d.k_groups, ring_rows, d.warps))
    d.min_smem_bytes = (dev.smem_per_sm / static_cast<size_t>(share) - dev.smem_reserved_per_cta) / 128 * 128;
  return d;
}

}  // namespace mxmoe::cuda
