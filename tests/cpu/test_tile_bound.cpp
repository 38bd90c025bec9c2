// The tile bound of the layer's GEMM launches (src/cuda/moe/tile_bound.h) against the schedule's
// own count, sum over experts of ceil(c_e / BN): never below it for any split of the pairs over the
// experts (exhaustively for small sizes, at random for larger ones), reached by the split its
// comment names, and never above the earlier bound P / BN + min(E, P) (the workspace never grows).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "cuda/moe/tile_bound.h"

namespace {

using mxmoe::cuda::max_tiles;

int64_t schedule_tiles(const std::vector<int64_t>& counts, int bn) {
  int64_t tiles = 0;
  for (const int64_t c : counts) tiles += (c + bn - 1) / bn;
  return tiles;
}

// Every split of `pairs` over `experts` experts (counts in non-increasing order: the tile count
// does not depend on which expert holds which count); returns the largest tile count.
int64_t most_tiles_of_any_split(int64_t pairs, int64_t experts, int bn) {
  std::vector<int64_t> counts;
  int64_t best = 0;
  std::function<void(int64_t, int64_t)> split = [&](int64_t left, int64_t cap) {
    if (left == 0) {
      best = std::max(best, schedule_tiles(counts, bn));
      return;
    }
    if (static_cast<int64_t>(counts.size()) == experts) return;
    for (int64_t c = std::min(left, cap); c >= 1; --c) {
      counts.push_back(c);
      split(left - c, c);
      counts.pop_back();
    }
  };
  split(pairs, pairs);
  return best;
}

TEST(TileBound, IsTheMostTilesOfAnySplitOfSmallRoutings) {
  for (const int bn : {1, 2, 3, 8})
    for (int64_t experts = 1; experts <= 7; ++experts)
      for (int64_t pairs = 0; pairs <= 18; ++pairs)
        EXPECT_EQ(max_tiles(pairs, experts, bn), most_tiles_of_any_split(pairs, experts, bn))
            << "pairs " << pairs << ", experts " << experts << ", BN " << bn;
}

TEST(TileBound, HoldsForRandomRoutingsOfTheModelShapes) {
  std::mt19937_64 rng(33);
  struct shape { int64_t experts; int top_k; };
  for (const shape s : {shape{128, 4}, shape{128, 8}, shape{384, 8}, shape{256, 8}, shape{32, 4}})
    for (const int64_t tokens : {1, 8, 37, 64, 128, 512, 2048})
      for (const int bn : {8, 16, 64, 96, 176}) {
        const int64_t pairs = tokens * s.top_k;
        const int64_t bound = max_tiles(pairs, s.experts, bn);
        EXPECT_LE(bound, pairs / bn + std::min(s.experts, pairs)) << "never above the earlier bound";
        for (int rep = 0; rep < 20; ++rep) {
          // Skewed at random: each pair picks expert floor(E * u^a), a = 1..4.
          std::vector<int64_t> counts(static_cast<size_t>(s.experts), 0);
          const double a = 1.0 + rep % 4;
          std::uniform_real_distribution<double> u(0.0, 1.0);
          for (int64_t p = 0; p < pairs; ++p)
            ++counts[static_cast<size_t>(std::min<int64_t>(s.experts - 1, static_cast<int64_t>(s.experts * std::pow(u(rng), a))))];
          EXPECT_LE(schedule_tiles(counts, bn), bound) << "E " << s.experts << ", T " << tokens << ", BN " << bn;
        }
      }
}

TEST(TileBound, IsReachedByOnePairPerExpertAndTheRestInWholeTiles) {
  for (const int bn : {8, 16})
    for (const int64_t experts : {4, 128, 384})
      for (const int64_t pairs : {int64_t{1}, int64_t{4}, int64_t{100}, int64_t{512}, int64_t{1000}}) {
        const int64_t m = std::min(experts, pairs);
        std::vector<int64_t> counts(static_cast<size_t>(m), 1);
        int64_t left = pairs - m;
        for (size_t e = 0; left > 0; e = (e + 1) % counts.size()) {
          const int64_t add = std::min<int64_t>(bn, left);
          counts[e] += add;
          left -= add;
        }
        EXPECT_EQ(schedule_tiles(counts, bn), max_tiles(pairs, experts, bn))
            << "pairs " << pairs << ", experts " << experts << ", BN " << bn;
      }
}

}  // namespace
