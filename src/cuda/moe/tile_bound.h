// moe/tile_bound.h — the most tiles a routing can schedule: the grid bound (y) of every GEMM
// launch of the layer and the size of the workspace's tile list. Host code only; tested by
// tests/cpu/test_tile_bound.cpp.
#pragma once

#include <algorithm>
#include <cstdint>

namespace mxmoe::cuda {

// The schedule gives expert e with c_e > 0 pairs ceil(c_e / BN) tiles (routing.cu, plan_few.cu).
// With n experts holding any of the P pairs:
//   sum ceil(c_e / BN) = n + sum floor((c_e - 1) / BN) <= n + floor((P - n) / BN),
// which does not decrease with n (one more expert: +1, and the floor loses at most 1), so with
// m = min(E, P) experts at most, the bound is m + floor((P - m) / BN). It is reached: m experts of
// one pair, the other P - m added BN at a time to experts of 1 mod BN. The grid's rows beyond the
// tile count only read it and leave; each holds a CTA slot for a round trip, up to 14,000 CTAs a
// forward at Kimi-K2 T = 64 under the earlier bound P / BN + m (docs/performance.md,
// thirty-third session), which this one never exceeds.
inline int64_t max_tiles(int64_t pairs, int64_t experts, int tokens_per_tile) {
  const int64_t m = std::min(experts, pairs);
  return m + (pairs - m) / tokens_per_tile;
}

}  // namespace mxmoe::cuda
