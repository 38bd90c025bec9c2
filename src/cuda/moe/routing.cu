// moe/routing.cu — routing and the expert-grouped tile schedule of the MoE layer.
//
// route_token (route_token.cuh): one warp routes one token.
// Up to kPlanFewMaxPairs routed pairs of at most kPlanFewMaxTokens tokens: plan_few.cu, one kernel
// (launch_plan picks it).
// Up to kPlanMaxPairs token-expert pairs (decode and the transition), no memset:
//   route:  (T > kPlanRouteMaxTokens) route_token per warp, ids[p] and weights[p] only.
//   plan:   one CTA does the rest: routes the tokens itself when there are few, or takes the ids
//           of route, or imports caller-provided ids; counts pairs per expert in shared memory,
//           scans (cub::BlockScan) to offsets and tiles, writes tile_desc{expert, start,
//           count <= BN} in expert order, the error flag, and sorted[offsets[e] + rank] = p
//           (with sorted_weights[offsets[e] + rank] = weights[p], and pos[p] = rank), staged in
//           shared memory and stored in sorted order.
// More pairs (prefill), the four-step path:
//   route:    as above, and each slot bumps counts[e] and records its rank pos[p] (atomics;
//             the counters were cleared by a memset).
//   import:   the same bookkeeping for caller-provided ids / weights.
//   schedule: one CTA: the scans and the tile list.
//   scatter:  sorted[offsets[e] + pos[p]] = p, sorted_weights[offsets[e] + pos[p]] = weights[p].
// An id outside [0, E) in caller-provided routing drops its slot (ids[p] = -1, weight 0, it
// contributes nothing) and sets bit 0 of the workspace error flag.
// Expert map (a layer holding a subset of the experts, moe.h): where an expert id is written
// (route, plan, import), it becomes the local index expert_map[e]; -1, an expert held elsewhere,
// drops the slot like a bad id but without the error flag. A null map (every expert) leaves ids
// as they are; the counts and the schedule then run over local indices < E.
// The rank of a pair within its expert comes from atomics and may differ between calls; the
// layer's output does not depend on it (kernels.h).
#include <cuda_runtime.h>

#include <cstdint>

#include <cub/block/block_scan.cuh>

#include <string>

#include "check.h"
#include "kernels.h"
#include "mxmoe/error.h"
#include "pdl.cuh"
#include "route_token.cuh"

namespace mxmoe::cuda::sm90 {
namespace {

using detail::local_expert;
using detail::route_scratch;
using detail::route_scratch_words;
using detail::route_token;

constexpr int kRouteWarps = 4;

// One warp per token. count_pairs: also bump counts[e] and record pos[p] (the four-step path).
template <int PER_LANE>
__global__ void __launch_bounds__(kRouteWarps * 32)
    route_kernel(const void* __restrict__ logits, bool logits_bf16, const float* __restrict__ correction_bias,
                 routing_config r, int tokens, int experts, bool count_pairs, const int32_t* __restrict__ expert_map,
                 moe_workspace ws) {
  __shared__ float group_choice[kRouteWarps][512];
  __shared__ float group_score[kRouteWarps][512];
  __shared__ int sel[kRouteWarps][512];
  detail::wait_for_previous_grid();
  detail::allow_dependent_launch();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t = blockIdx.x * kRouteWarps + warp;
  if (t >= tokens) return;
  int e;
  float wt;
  route_token<PER_LANE>(logits, logits_bf16, correction_bias, r, t, experts,
                        {group_choice[warp], group_score[warp], sel[warp]}, &e, &wt);
  if (lane < r.top_k) {
    const int64_t p = static_cast<int64_t>(t) * r.top_k + lane;
    const int local = local_expert(expert_map, e);
    ws.ids[p] = local;
    ws.weights[p] = local >= 0 ? wt : 0.0f;
    if (count_pairs && local >= 0) ws.pos[p] = atomicAdd(&ws.counts[local], 1);
  }
}

__global__ void import_kernel(const int32_t* __restrict__ ids, const float* __restrict__ weights, int64_t pairs,
                              int experts, const int32_t* __restrict__ expert_map, moe_workspace ws) {
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= pairs) return;
  const int id = ids[p];
  const bool bad = id < 0 || id >= experts;
  const int e = bad ? -1 : local_expert(expert_map, id);
  if (e < 0) {
    ws.ids[p] = -1;
    ws.weights[p] = 0.0f;
    if (bad) atomicOr(ws.error_flag, 1);
    return;
  }
  ws.ids[p] = e;
  ws.weights[p] = weights[p];
  ws.pos[p] = atomicAdd(&ws.counts[e], 1);
}

constexpr int kScheduleThreads = 512;  // one thread per expert (E <= 512)
using schedule_scan = cub::BlockScan<int, kScheduleThreads>;

// The scans and the tile list, by the kScheduleThreads threads of one CTA (thread e: expert e,
// `count` its pairs). Returns the expert's first sorted position.
__device__ int write_schedule(int count, int experts, int tokens_per_tile, int64_t max_tiles, const moe_workspace& ws,
                              typename schedule_scan::TempStorage& tmp) {
  const int e = threadIdx.x;
  const int tiles = (count + tokens_per_tile - 1) / tokens_per_tile;
  int offset, tile0, total_tiles;
  schedule_scan(tmp).ExclusiveSum(count, offset);
  __syncthreads();
  schedule_scan(tmp).ExclusiveSum(tiles, tile0, total_tiles);
  if (e < experts) ws.offsets[e] = offset;
  if (e == experts - 1) ws.offsets[experts] = offset + count;
  if (e == 0) {
    *ws.num_tiles = total_tiles <= max_tiles ? total_tiles : static_cast<int>(max_tiles);
    ws.item_counters[0] = ws.item_counters[1] = 0;
  }
  for (int i = 0; i < tiles && tile0 + i < max_tiles; ++i) {
    const int start = i * tokens_per_tile;
    ws.tiles[tile0 + i] = tile_desc{e, offset + start, min(tokens_per_tile, count - start)};
  }
  return offset;
}

__global__ void __launch_bounds__(kScheduleThreads)
    schedule_kernel(int experts, int tokens_per_tile, int64_t max_tiles, moe_workspace ws) {
  __shared__ typename schedule_scan::TempStorage tmp;
  const int e = threadIdx.x;
  write_schedule(e < experts ? ws.counts[e] : 0, experts, tokens_per_tile, max_tiles, ws, tmp);
}

// The plan kernel's shared memory: counts [E], offsets [E], one packed (expert | rank << 16) or
// -1 per pair, the pair and routing weight of each sorted position, the error flag, and (when it
// routes) route_token scratch per routing warp.
struct plan_smem {
  int* counts;
  int* offsets;
  int* pack;  // [pairs], then sorted [pairs] and sorted_weights [pairs] (sorted_at, weights_at)
  int* error;
  int* scratch;
  __host__ __device__ static size_t bytes(const plan_args& a) {
    const int route_warps = a.source == plan_source::route ? (a.tokens < kPlanThreads / 32 ? a.tokens : kPlanThreads / 32) : 0;
    return 4 * (2 * static_cast<size_t>(a.experts) + 3 * static_cast<size_t>(a.tokens) * a.r.top_k + 1 +
                static_cast<size_t>(route_warps) * route_scratch_words(a.r, a.experts));
  }
  __device__ explicit plan_smem(int* base, const plan_args& a)
      : counts(base), offsets(base + a.experts), pack(base + 2 * a.experts),
        error(pack + 3 * a.tokens * a.r.top_k), scratch(error + 1) {}
  __device__ int* sorted_at(int pairs) const { return pack + pairs; }
  __device__ float* weights_at(int pairs) const { return reinterpret_cast<float*>(pack + 2 * pairs); }
};

// Routing bookkeeping, schedule and scatter of up to kPlanMaxPairs pairs in one CTA (see the
// file header); PER_LANE > 0: routes the tokens itself (a.source == plan_source::route), one
// warp per token (PER_LANE <= 8: route_token of 512 experts needs more than the 128 registers a
// thread of this CTA can have).
template <int PER_LANE>
__global__ void __launch_bounds__(kPlanThreads) plan_kernel(plan_args a, moe_workspace ws) {
  extern __shared__ int plan_raw[];
  __shared__ typename schedule_scan::TempStorage tmp;
  static_assert(kPlanThreads == kScheduleThreads, "one thread per expert in the scans");
  const plan_smem sm(plan_raw, a);
  detail::wait_for_previous_grid();
  detail::allow_dependent_launch();
  const int tid = threadIdx.x, k = a.r.top_k, pairs = a.tokens * k;
  // A thread's global loads are issued kPlanBatch pairs at a time, before any of them is used: a
  // loop that loads, then uses, paid one memory round trip per pair (ncu: 7-11 us at 4,096 pairs,
  // 2026-12-05).
  constexpr int kPlanBatch = 8;
  if (tid < a.experts) sm.counts[tid] = 0;
  if (tid == 0) *sm.error = 0;
  __syncthreads();

  if constexpr (PER_LANE > 0) {
    const int warp = tid >> 5, lane = tid & 31;
    const int words = route_scratch_words(a.r, a.experts);
    float* choice = reinterpret_cast<float*>(sm.scratch + warp * words);
    const route_scratch scratch{choice, choice + a.experts, sm.scratch + warp * words + a.experts + a.r.n_group};
    for (int t = warp; t < a.tokens; t += kPlanThreads / 32) {
      int e;
      float wt;
      route_token<PER_LANE>(a.logits, a.logits_bf16, a.correction_bias, a.r, t, a.experts, scratch, &e, &wt);
      if (lane < k) {
        const int p = t * k + lane;
        const int local = local_expert(a.expert_map, e);
        ws.ids[p] = local;
        ws.weights[p] = local >= 0 ? wt : 0.0f;
        sm.pack[p] = local >= 0 ? local | (atomicAdd(&sm.counts[local], 1) << 16) : -1;
      }
    }
  } else {
    // A thread's ids (and weights) of kPlanBatch pairs are loaded before any of them is counted.
    const bool precomputed = a.source == plan_source::precomputed;
    for (int p0 = tid; p0 < pairs; p0 += kPlanBatch * kPlanThreads) {
      int id[kPlanBatch];
      float wt[kPlanBatch];
#pragma unroll
      for (int u = 0; u < kPlanBatch; ++u) {
        const int p = p0 + u * kPlanThreads;
        id[u] = p < pairs ? (precomputed ? a.ids[p] : ws.ids[p]) : -1;
        wt[u] = p < pairs && precomputed ? a.weights[p] : 0.0f;
      }
      // Caller-provided ids: their local indices, all loads again before the first use.
      int local[kPlanBatch];
#pragma unroll
      for (int u = 0; u < kPlanBatch; ++u)
        local[u] = precomputed && id[u] >= 0 && id[u] < a.experts ? local_expert(a.expert_map, id[u]) : id[u];
#pragma unroll
      for (int u = 0; u < kPlanBatch; ++u) {
        const int p = p0 + u * kPlanThreads;
        if (p >= pairs) break;
        int e = local[u];
        if (precomputed) {
          const bool bad = id[u] < 0 || id[u] >= a.experts;
          if (bad) e = -1;
          if (e < 0) {
            ws.ids[p] = -1;
            ws.weights[p] = 0.0f;
            sm.pack[p] = -1;
            if (bad) atomicOr(sm.error, 1);
            continue;
          }
          ws.ids[p] = e;
          ws.weights[p] = wt[u];
        } else if (e < 0) {  // route_kernel applied the map: -1 is held elsewhere
          sm.pack[p] = -1;
          continue;
        }
        sm.pack[p] = e | (atomicAdd(&sm.counts[e], 1) << 16);
      }
    }
  }
  __syncthreads();
  const int offset =
      write_schedule(tid < a.experts ? sm.counts[tid] : 0, a.experts, a.tokens_per_tile, a.max_tiles, ws, tmp);
  if (tid < a.experts) sm.offsets[tid] = offset;
  if (tid == 0) *ws.error_flag = *sm.error;
  __syncthreads();
  if constexpr (PER_LANE > 0) {  // at most kPlanRouteMaxTokens tokens: a few stores per thread
    for (int p = tid; p < pairs; p += kPlanThreads) {
      const int pk = sm.pack[p];
      if (pk >= 0) {
        const int s = sm.offsets[pk & 0xFFFF] + (pk >> 16);
        ws.sorted[s] = p;
        ws.sorted_weights[s] = ws.weights[p];
        ws.pos[p] = pk >> 16;  // the prefill path's gather finds s from it
      }
    }
  } else {
    // sorted[offsets[e] + rank] = p: scattered into shared memory first, then written to global
    // memory in sorted order. Scattered straight to global memory, every pair cost two 4-byte
    // stores to random lines from this one SM (ncu: 21 µs at 8,192 pairs, 12-13 at 4,096; batching
    // the weights' loads changed nothing, docs/performance.md, seventeenth session).
    // The routing weights too are loaded kPlanBatch pairs at a time before any is placed.
    int* const sorted = sm.sorted_at(pairs);
    float* const sorted_weights = sm.weights_at(pairs);
    for (int p0 = tid; p0 < pairs; p0 += kPlanBatch * kPlanThreads) {
      int pk[kPlanBatch];
      float wt[kPlanBatch];
#pragma unroll
      for (int u = 0; u < kPlanBatch; ++u) {
        const int p = p0 + u * kPlanThreads;
        pk[u] = p < pairs ? sm.pack[p] : -1;
        wt[u] = pk[u] >= 0 ? ws.weights[p] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kPlanBatch; ++u) {
        if (pk[u] < 0) continue;
        const int p = p0 + u * kPlanThreads;
        const int s = sm.offsets[pk[u] & 0xFFFF] + (pk[u] >> 16);
        sorted[s] = p;
        sorted_weights[s] = wt[u];
        ws.pos[p] = pk[u] >> 16;
      }
    }
    __syncthreads();
    const int placed = sm.offsets[a.experts - 1] + sm.counts[a.experts - 1];  // pairs with a local expert
    for (int s = tid; s < placed; s += kPlanThreads) {
      ws.sorted[s] = sorted[s];
      ws.sorted_weights[s] = sorted_weights[s];
    }
  }
}

__global__ void scatter_kernel(int64_t pairs, moe_workspace ws) {
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= pairs) return;
  const int e = ws.ids[p];
  if (e >= 0) {
    const int64_t s = ws.offsets[e] + ws.pos[p];
    ws.sorted[s] = static_cast<int32_t>(p);
    ws.sorted_weights[s] = ws.weights[p];
  }
}

unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace

void launch_route(const void* logits, bool logits_bf16, const float* correction_bias, const routing_config& r,
                  int64_t tokens, int64_t experts, bool count_pairs, bool dependent, const int32_t* expert_map,
                  const moe_workspace& ws, cudaStream_t stream) {
  const dim3 grid(blocks_for(tokens, kRouteWarps)), block(kRouteWarps * 32);
  const int t = static_cast<int>(tokens), e = static_cast<int>(experts);
  auto kernel = experts <= 128   ? route_kernel<4>
                : experts <= 256 ? route_kernel<8>
                : experts <= 384 ? route_kernel<12>
                                 : route_kernel<16>;
  launch_pdl(kernel, grid, block, 0, stream, dependent, logits, logits_bf16, correction_bias, r, t, e, count_pairs,
             expert_map, ws);
}

bool plan_can_route(int64_t tokens, int64_t experts, int top_k, int tokens_per_tile) {
  return plan_few_applies(tokens, top_k, tokens_per_tile) ||
         (tokens <= kPlanRouteMaxTokens && experts <= kPlanRouteMaxExperts);
}

void prepare_plan_kernel() {
  for (auto kernel : {plan_kernel<0>, plan_kernel<4>, plan_kernel<8>})
    MXMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kPlanMaxSmemBytes));
}

void launch_plan(const plan_args& a, const moe_workspace& ws, cudaStream_t stream) {
  if (a.source == plan_source::route && plan_few_applies(a.tokens, a.r.top_k, a.tokens_per_tile)) {
    launch_plan_few(a, ws, stream);
    return;
  }
  auto kernel = plan_kernel<0>;
  if (a.source == plan_source::route) {
    MXMOE_CHECK_ARG(a.tokens <= kPlanRouteMaxTokens && a.experts <= kPlanRouteMaxExperts, "plan_args",
                    "at most " + std::to_string(kPlanRouteMaxTokens) + " tokens and " +
                        std::to_string(kPlanRouteMaxExperts) + " experts when the plan kernel routes (or the few-token plan's bounds)",
                    std::to_string(a.tokens) + " tokens, " + std::to_string(a.experts) + " experts");
    kernel = a.experts <= 128 ? plan_kernel<4> : plan_kernel<8>;
  }
  MXMOE_CHECK_ARG(static_cast<int64_t>(a.tokens) * a.r.top_k <= kPlanMaxPairs, "plan_args.tokens",
                  "at most " + std::to_string(kPlanMaxPairs) + " pairs", std::to_string(a.tokens * a.r.top_k));
  const size_t smem = plan_smem::bytes(a);
  MXMOE_CHECK_ARG(smem <= kPlanMaxSmemBytes, "plan_args", "a plan within " + std::to_string(kPlanMaxSmemBytes) +
                  " bytes of shared memory", std::to_string(smem));
  launch_pdl(kernel, dim3(1), dim3(kPlanThreads), smem, stream, true, a, ws);
}

void launch_import_routing(const int32_t* ids, const float* weights, int64_t tokens, int top_k, int64_t experts,
                           const int32_t* expert_map, const moe_workspace& ws, cudaStream_t stream) {
  const int64_t pairs = tokens * top_k;
  import_kernel<<<blocks_for(pairs, 256), 256, 0, stream>>>(ids, weights, pairs, static_cast<int>(experts), expert_map,
                                                            ws);
  MXMOE_CUDA_CHECK(cudaGetLastError());
}

void launch_schedule(int64_t experts, int tokens_per_tile, int64_t max_tiles, const moe_workspace& ws,
                     cudaStream_t stream) {
  schedule_kernel<<<1, kScheduleThreads, 0, stream>>>(static_cast<int>(experts), tokens_per_tile, max_tiles, ws);
  MXMOE_CUDA_CHECK(cudaGetLastError());
}

void launch_scatter(int64_t pairs, const moe_workspace& ws, cudaStream_t stream) {
  scatter_kernel<<<blocks_for(pairs, 256), 256, 0, stream>>>(pairs, ws);
  MXMOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mxmoe::cuda::sm90
