// moe/plan_few.cu — the routing and schedule of a forward with few routed pairs, in one small
// kernel: T <= kPlanFewMaxTokens tokens routed from logits, T * k <= kPlanFewMaxPairs pairs.
//
// One CTA of kPlanFewWarps(T, E) warps. Warp t < T routes token t (route_token.cuh: the same
// function as the route kernel and the one-CTA plan, so the same experts and the same weight bits)
// and writes ids[p],
// weights[p] (through the expert map). Warp 0 then holds pair p in lane p and orders the pairs by
// (local expert, p): rank = how many keys are smaller (one shuffle per lane), the lanes of one
// expert by __match_any_sync. Each expert gets one tile: a routed token picks an expert once, so
// an expert has at most T <= tokens_per_tile pairs (the launcher checks). Written: tiles in expert
// order, num_tiles, sorted / sorted_weights, pos (each pair's rank within its expert), offsets
// [E + 1], the error flag (0: routed ids are never out of range). The offsets take one thread
// each, so the CTA has a warp per 32 of them (up to 16 warps) even where fewer tokens route: with T
// warps, one warp at T = 1 ran 13 passes of 32 comparisons for Kimi-K2's 385 offsets (ncu, H100:
// the kernel 15.3 -> 11.8 us, gpt-oss-120b's 5.7 -> 5.0; in the captured layer within the noise,
// where PDL hides part of the plan: docs/performance.md, thirty-third session).
//
// Why a kernel of its own: the one-CTA plan (routing.cu) that routes at T = 1 takes 5.5-7.8 µs
// under ncu (gpt-oss-120b, Qwen3-30B-A3B), and Kimi-K2's 384 experts need the route kernel before
// it (~10 + 3.4 µs). Its path runs once through ~4,300 instructions of code that is cold after the
// L2 is flushed, plus two 512-thread block scans; this one's is a few hundred instructions
// (docs/performance.md, "What cold code costs").
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "check.h"
#include "kernels.h"
#include "mxmoe/error.h"
#include "pdl.cuh"
#include "route_token.cuh"

namespace mxmoe::cuda::sm90 {
namespace {

static_assert(kPlanFewMaxPairs == 32, "one pair per lane of warp 0");
constexpr int kPlanFewMaxWarps = 16;

int plan_few_warps(int tokens, int experts) {
  const int for_offsets = std::min(kPlanFewMaxWarps, (experts + 1 + 31) / 32);
  return std::max(tokens, for_offsets);
}

template <int PER_LANE>
__global__ void __launch_bounds__(kPlanFewMaxWarps * 32) plan_few_kernel(plan_args a, moe_workspace ws) {
  extern __shared__ int few_scratch[];  // route_scratch_words per warp
  __shared__ int pair_expert[kPlanFewMaxPairs];  // local expert of pair p, -1: dropped
  __shared__ float pair_weight[kPlanFewMaxPairs];
  detail::wait_for_previous_grid();
  detail::allow_dependent_launch();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, k = a.r.top_k, pairs = a.tokens * k;

  if (warp < a.tokens) {
    const int words = detail::route_scratch_words(a.r, a.experts);
    float* choice = reinterpret_cast<float*>(few_scratch + warp * words);
    const detail::route_scratch scratch{choice, choice + a.experts, few_scratch + warp * words + a.experts + a.r.n_group};
    int e;
    float wt;
    detail::route_token<PER_LANE>(a.logits, a.logits_bf16, a.correction_bias, a.r, warp, a.experts, scratch, &e, &wt);
    if (lane < k) {
      const int p = warp * k + lane;
      const int local = detail::local_expert(a.expert_map, e);
      const float w = local >= 0 ? wt : 0.0f;
      ws.ids[p] = local;
      ws.weights[p] = w;
      pair_expert[p] = local;
      pair_weight[p] = w;
    }
  }
  __syncthreads();

  if (warp == 0) {
    const int p = lane;
    const int ex = p < pairs ? pair_expert[p] : -1;
    const bool valid = ex >= 0;
    // Keys order the valid pairs by (expert, p) and put the others last; experts < 2^26.
    const uint32_t key = valid ? (static_cast<uint32_t>(ex) << 5) | static_cast<uint32_t>(p) : 0xFFFFFFFFu;
    const uint32_t same = __match_any_sync(0xFFFFFFFFu, ex);  // lanes of this expert (or all dropped ones)
    const bool leader = valid && __ffs(same) - 1 == lane;       // the expert's first pair
    const uint32_t leaders = __ballot_sync(0xFFFFFFFFu, leader);
    int rank = 0, tile = 0;  // smaller keys; leaders of smaller experts
    // Fully unrolled (~290 instructions of code run once): its 32 shuffles overlap. Unrolled 4
    // times it ran eight dependent passes and the plan of 128 experts took 0.5-0.6 us longer
    // (docs/performance.md, twenty-ninth session).
    for (int q = 0; q < 32; ++q) {
      const uint32_t kq = __shfl_sync(0xFFFFFFFFu, key, q);
      rank += kq < key ? 1 : 0;
      tile += ((leaders >> q) & 1u) && kq < key ? 1 : 0;
    }
    if (valid) {
      ws.sorted[rank] = p;
      ws.sorted_weights[rank] = pair_weight[p];
      ws.pos[p] = __popc(same & ((1u << lane) - 1u));  // rank within the expert: its pairs in lane order
    }
    if (leader) {
      if (__popc(same) > a.tokens_per_tile) __trap();  // launch_plan_few's bound (T <= tokens_per_tile) was wrong
      ws.tiles[tile] = tile_desc{ex, rank, __popc(same)};
    }
    if (lane == 0) {
      *ws.num_tiles = __popc(leaders);
      *ws.error_flag = 0;
      ws.item_counters[0] = ws.item_counters[1] = 0;
    }
  }
  // offsets[e]: the valid pairs of smaller experts (offsets[E]: all of them).
  int ex[kPlanFewMaxPairs];
#pragma unroll
  for (int q = 0; q < kPlanFewMaxPairs; ++q) ex[q] = q < pairs ? pair_expert[q] : -1;
  for (int e0 = threadIdx.x; e0 <= a.experts; e0 += blockDim.x) {
    int below = 0;
#pragma unroll
    for (int q = 0; q < kPlanFewMaxPairs; ++q) below += ex[q] >= 0 && ex[q] < e0 ? 1 : 0;
    ws.offsets[e0] = below;
  }
}

}  // namespace

bool plan_few_applies(int64_t tokens, int top_k, int tokens_per_tile) {
  return tokens >= 1 && tokens <= kPlanFewMaxTokens && tokens * top_k <= kPlanFewMaxPairs && tokens <= tokens_per_tile;
}

void launch_plan_few(const plan_args& a, const moe_workspace& ws, cudaStream_t stream) {
  MXMOE_CHECK_ARG(a.source == plan_source::route, "plan_args.source", "route (logits) for the few-token plan",
                  std::to_string(static_cast<int>(a.source)));
  MXMOE_CHECK_ARG(plan_few_applies(a.tokens, a.r.top_k, a.tokens_per_tile), "plan_args.tokens",
                  "1 to " + std::to_string(kPlanFewMaxTokens) + " tokens, at most " + std::to_string(kPlanFewMaxPairs) +
                      " pairs and at most tokens_per_tile (" + std::to_string(a.tokens_per_tile) + ") tokens",
                  std::to_string(a.tokens) + " tokens of " + std::to_string(a.r.top_k) + " pairs");
  MXMOE_CHECK_ARG(a.experts >= 1 && a.experts <= 512, "plan_args.experts", "in [1, 512]", std::to_string(a.experts));
  const size_t smem = static_cast<size_t>(a.tokens) * detail::route_scratch_words(a.r, a.experts) * 4;
  auto kernel = a.experts <= 128   ? plan_few_kernel<4>
                : a.experts <= 256 ? plan_few_kernel<8>
                : a.experts <= 384 ? plan_few_kernel<12>
                                   : plan_few_kernel<16>;
  launch_pdl(kernel, dim3(1), dim3(static_cast<unsigned>(plan_few_warps(a.tokens, a.experts) * 32)), smem, stream, true,
             a, ws);
}

}  // namespace mxmoe::cuda::sm90
