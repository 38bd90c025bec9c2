// moe/routing.cu — routing and the expert-grouped tile schedule of the MoE layer.
//
// route_token: one warp routes one token; each lane holds up to 16 of the E <= 512 logits. Top-k
//           by k rounds of a warp arg-max (ties: lower expert index), then the routing kind's
//           weights (docs/models.md; the CPU reference cpu::route defines them).
//
// Up to kPlanMaxPairs token-expert pairs (decode and the transition), no memset:
//   route:  (T > kPlanRouteMaxTokens) route_token per warp, ids[p] and weights[p] only.
//   plan:   one CTA does the rest: routes the tokens itself when there are few, or takes the ids
//           of route, or imports caller-provided ids; counts pairs per expert in shared memory,
//           scans (cub::BlockScan) to offsets and tiles, writes tile_desc{expert, start,
//           count <= BN} in expert order, the error flag, and sorted[offsets[e] + rank] = p
//           (with sorted_weights[offsets[e] + rank] = weights[p]).
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

#include <cfloat>
#include <cstdint>

#include <cub/block/block_scan.cuh>

#include <string>

#include "check.h"
#include "kernels.h"
#include "mxmoe/error.h"
#include "pdl.cuh"

namespace mxmoe::cuda::sm90 {
namespace {

constexpr int kRouteWarps = 4;

// The order route_token selects in, as an unsigned key: a larger value ranks higher, -0 and +0 are
// equal (as float compares see them; ties go to the lower expert index), NaN ranks below -inf
// (cpu::route's rank_key), and 0 is left for "nothing left to select".
__device__ __forceinline__ uint32_t selection_key(float v) {
  if (v != v) return 1u;
  const uint32_t b = __float_as_uint(v + 0.0f);  // -0 -> +0
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);  // -inf -> 0x007FFFFF, +inf -> 0xFF800000
}

// Top-k of key[] (lane-strided: element lane + 32*q); `allowed` masks experts out.
// Writes the chosen expert indices, best first, into sel[0..k), and returns to lane j < k the key
// of slot j (the arg-max's own value: a lane never looks a key up by a run-time index, which
// ptxas turned into a local-memory array and a chain of dependent loads).
// A round: each lane's best available key (a scan in q order keeps the lower index on ties), the
// warp's maximum and then the lowest expert index holding it, by two redux.sync; the lane that
// owns the winner marks it taken. (A shuffle butterfly of (value, index) pairs per round cost ~330
// instructions per round at 16 keys per lane: ncu, Kimi-K2's route kernel, 2026-12-05.)
template <int PER_LANE>
__device__ float warp_topk(const float (&key)[PER_LANE], uint32_t allowed, int experts, int k, int* sel) {
  const int lane = threadIdx.x & 31;
  uint32_t keys[PER_LANE];
  uint32_t avail = 0;  // bit q: element lane + 32 q can still be selected
#pragma unroll
  for (int q = 0; q < PER_LANE; ++q) {
    keys[q] = selection_key(key[q]);
    if (lane + 32 * q < experts && ((allowed >> q) & 1u)) avail |= 1u << q;
  }
  float mine = 0.0f;
  for (int r = 0; r < k; ++r) {
    uint32_t best = 0;
    int best_q = 0;
    float best_v = 0.0f;
#pragma unroll
    for (int q = 0; q < PER_LANE; ++q) {
      const uint32_t kq = ((avail >> q) & 1u) ? keys[q] : 0u;
      if (kq > best) {
        best = kq;
        best_q = q;
        best_v = key[q];
      }
    }
    const uint32_t top = __reduce_max_sync(0xFFFFFFFFu, best);
    const uint32_t mine_index = best == top && top != 0 ? static_cast<uint32_t>(lane + 32 * best_q) : 0xFFFFFFFFu;
    const int e = top == 0 ? -1 : static_cast<int>(__reduce_min_sync(0xFFFFFFFFu, mine_index));
    const float v = __shfl_sync(0xFFFFFFFFu, best_v, e & 31);
    sel[r] = e;
    if (lane == r) mine = e >= 0 ? v : 0.0f;
    if (e >= 0 && (e & 31) == lane) avail &= ~(1u << (e >> 5));
  }
  return mine;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, off));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
  return v;
}

__device__ __forceinline__ float load_logit(const void* __restrict__ logits, bool bf16, int64_t idx) {
  return bf16 ? bf16_to_float(static_cast<const uint16_t*>(logits)[idx]) : static_cast<const float*>(logits)[idx];
}

// v of lanes 0, 1, ..., n-1 added in that order (every lane gets the sum): the order a loop over
// the slots adds them in, so the weights do not depend on how the warp reduces.
__device__ __forceinline__ float ordered_sum(float v, int n) {
  float sum = 0.0f;
  for (int j = 0; j < n; ++j) sum += __shfl_sync(0xFFFFFFFFu, v, j);
  return sum;
}

// The two largest of the values added (a value counts twice if added twice); -FLT_MAX, -inf and
// NaN are never taken, so a group of those scores -FLT_MAX.
struct top2 {
  float b1 = -FLT_MAX, b2 = -FLT_MAX;
  __device__ __forceinline__ void add(float c) {
    if (c > b1) {
      b2 = b1;
      b1 = c;
    } else if (c > b2) {
      b2 = c;
    }
  }
};

// A group score (the sum of its top-2 choices) for each group whose members are whole registers
// of the warp: group size gsize = 32 * regs_per_group, so element lane + 32 q is in group
// q / regs_per_group. Each lane takes the top 2 of its registers in the group, the warp merges
// them (the same two values as a pass over the group in order: they are a multiset's two
// largest). Lane 0 writes group_score[g].
template <int PER_LANE>
__device__ void group_scores_by_register(const float (&choice)[PER_LANE], int regs_per_group, int n_group,
                                         float* group_score) {
  for (int g = 0; g < n_group; ++g) {
    top2 t;
#pragma unroll
    for (int q = 0; q < PER_LANE; ++q)
      if (q / regs_per_group == g) t.add(choice[q]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float o1 = __shfl_xor_sync(0xFFFFFFFFu, t.b1, off), o2 = __shfl_xor_sync(0xFFFFFFFFu, t.b2, off);
      t.b2 = fmaxf(fminf(t.b1, o1), fmaxf(t.b2, o2));
      t.b1 = fmaxf(t.b1, o1);
    }
    if ((threadIdx.x & 31) == 0) group_score[g] = t.b1 + t.b2;
  }
}

// Per-warp scratch of route_token (shared memory): group choices [E], group scores [n_group],
// selections [max(k, topk_group)] (the top-k experts, or the top-k groups).
struct route_scratch {
  float* group_choice;
  float* group_score;
  int* sel;
};
__host__ __device__ inline int route_scratch_words(const routing_config& r, int experts) {
  return experts + r.n_group + (r.top_k > r.topk_group ? r.top_k : r.topk_group);
}

// Routes token t with the calling warp (all 32 lanes). Lane j < k ends with slot j's expert in
// *e_out and its weight in *w_out. PER_LANE = ceil(E / 32) rounded up to 4, 8, 12 or 16: the
// loops over a lane's experts are unrolled, so a small E should not pay for 512 (12: Kimi-K2's
// 384, whose routing warp is on the critical path of every forward at few tokens).
template <int PER_LANE>
__device__ void route_token(const void* __restrict__ logits, bool logits_bf16, const float* __restrict__ correction_bias,
                            const routing_config& r, int t, int experts, route_scratch scratch, int* e_out,
                            float* w_out) {
  const int lane = threadIdx.x & 31;
  float* group_choice = scratch.group_choice;
  float* group_score = scratch.group_score;
  int* sel = scratch.sel;

  float l[PER_LANE];
#pragma unroll
  for (int q = 0; q < PER_LANE; ++q) {
    const int e = lane + 32 * q;
    float v = -FLT_MAX;
    if (e < experts) {
      v = load_logit(logits, logits_bf16, static_cast<int64_t>(t) * experts + e);
    }
    l[q] = v;
  }
  const int k = r.top_k;
  float wsel = 0.0f;  // lane j < k holds slot j's weight

  if (r.kind == routing_kind::sigmoid_grouped_topk) {
    // Every bias load is issued before the first store to group_choice: ptxas may not move a load
    // past a store through a generic pointer, and loaded next to its use each bias cost a round
    // trip of its own (ncu, Kimi-K2 at T = 1: 16 in a row, a third of the route kernel's 18 us).
    float s[PER_LANE], choice[PER_LANE], bias[PER_LANE];
#pragma unroll
    for (int q = 0; q < PER_LANE; ++q) {
      const int e = lane + 32 * q;
      bias[q] = (correction_bias && e < experts) ? correction_bias[e] : 0.0f;
    }
#pragma unroll
    for (int q = 0; q < PER_LANE; ++q) {
      const int e = lane + 32 * q;
      s[q] = 1.0f / (1.0f + expf(-l[q]));
      choice[q] = s[q] + bias[q];
      if (e < experts) group_choice[e] = choice[q];
    }
    __syncwarp();
    const int gsize = experts / r.n_group;
    // Every group is kept when topk_group == n_group (Kimi-K2: one group of 384): the group
    // scores decide nothing then, and computing them cost one lane a serial pass over all E
    // choices (~30 us of the route kernel at E = 384, ncu, 2026-12-05).
    uint32_t allowed = 0xFFFFFFFFu;
    if (r.topk_group < r.n_group) {
      if (gsize % 32 == 0) {
        group_scores_by_register(choice, gsize / 32, r.n_group, group_score);
      } else {
        for (int gi = lane; gi < r.n_group; gi += 32) {  // group score: sum of its top-2 choices
          top2 t;
          for (int e = gi * gsize; e < (gi + 1) * gsize; ++e) t.add(group_choice[e]);
          group_score[gi] = gsize == 1 ? t.b1 : t.b1 + t.b2;
        }
      }
      __syncwarp();
      float gkey[PER_LANE];
#pragma unroll
      for (int q = 0; q < PER_LANE; ++q) {
        const int gi = lane + 32 * q;
        gkey[q] = gi < r.n_group ? group_score[gi] : -FLT_MAX;
      }
      warp_topk(gkey, 0xFFFFFFFFu, r.n_group, r.topk_group, sel);
      __syncwarp();
      allowed = 0;
#pragma unroll
      for (int q = 0; q < PER_LANE; ++q) {
        const int gi = (lane + 32 * q) / gsize;
        bool keep = false;
        for (int j = 0; j < r.topk_group; ++j) keep |= sel[j] == gi;
        allowed |= (keep ? 1u : 0u) << q;
      }
      __syncwarp();
    }
    warp_topk(choice, allowed, experts, k, sel);
    __syncwarp();
    // Lane j < k: the sigmoid of slot j's expert, computed from its logit as s[] was (the same
    // bits; the logit is read again, from the cache, rather than looked up by a run-time index).
    const int ej = lane < k ? sel[lane] : -1;
    const float sj = ej >= 0 ? 1.0f / (1.0f + expf(-load_logit(logits, logits_bf16, static_cast<int64_t>(t) * experts + ej)))
                             : 0.0f;
    const float sum = ordered_sum(sj, k);
    wsel = sj;
    if (r.renormalize) wsel /= sum;
    wsel *= r.routed_scaling_factor;
  } else {
    const float lj = warp_topk(l, 0xFFFFFFFFu, experts, k, sel);  // lane j < k: slot j's logit
    __syncwarp();
    if (r.kind == routing_kind::softmax_topk) {
      float mx = -FLT_MAX;
#pragma unroll
      for (int q = 0; q < PER_LANE; ++q) mx = fmaxf(mx, l[q]);
      mx = warp_max(mx);
      float den = 0.0f;
#pragma unroll
      for (int q = 0; q < PER_LANE; ++q)
        if (lane + 32 * q < experts) den += expf(l[q] - mx);
      den = warp_sum(den);
      const float p = expf(lj - mx) / den;
      const float sum = ordered_sum(p, k);
      wsel = p;
      if (r.renormalize) wsel /= sum;
    } else {  // topk_softmax: softmax over the k selected logits
      const float top = __shfl_sync(0xFFFFFFFFu, lj, 0);
      const float p = expf(lj - top);
      wsel = p / ordered_sum(p, k);
    }
  }
  if (lane >= k) wsel = 0.0f;
  *e_out = lane < k ? sel[lane] : -1;
  *w_out = wsel;
  __syncwarp();  // sel is reused by the warp's next token
}

// The local index of expert e (expert_map: null for a layer holding every expert).
__device__ __forceinline__ int local_expert(const int32_t* __restrict__ expert_map, int e) {
  return expert_map != nullptr ? expert_map[e] : e;
}

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
  if (e == 0) *ws.num_tiles = total_tiles <= max_tiles ? total_tiles : static_cast<int>(max_tiles);
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
// -1 per pair, the error flag, and (when it routes) route_token scratch per routing warp.
struct plan_smem {
  int* counts;
  int* offsets;
  int* pack;
  int* error;
  int* scratch;
  __host__ __device__ static size_t bytes(const plan_args& a) {
    const int route_warps = a.source == plan_source::route ? (a.tokens < kPlanThreads / 32 ? a.tokens : kPlanThreads / 32) : 0;
    return 4 * (2 * static_cast<size_t>(a.experts) + static_cast<size_t>(a.tokens) * a.r.top_k + 1 +
                static_cast<size_t>(route_warps) * route_scratch_words(a.r, a.experts));
  }
  __device__ explicit plan_smem(int* base, const plan_args& a)
      : counts(base), offsets(base + a.experts), pack(base + 2 * a.experts),
        error(pack + a.tokens * a.r.top_k), scratch(error + 1) {}
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
    // A thread's ids (and weights) of kPlanBatch pairs are loaded before any of them is counted:
    // a loop that loads, then counts, paid one memory round trip per pair (ncu: 7-11 us at 4,096
    // pairs, 2026-12-05).
    constexpr int kPlanBatch = 8;
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
  for (int p = tid; p < pairs; p += kPlanThreads) {
    const int pk = sm.pack[p];
    if (pk >= 0) {
      const int s = sm.offsets[pk & 0xFFFF] + (pk >> 16);
      ws.sorted[s] = p;
      ws.sorted_weights[s] = ws.weights[p];
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

bool plan_can_route(int64_t tokens, int64_t experts) {
  return tokens <= kPlanRouteMaxTokens && experts <= kPlanRouteMaxExperts;
}

void prepare_plan_kernel() {
  for (auto kernel : {plan_kernel<0>, plan_kernel<4>, plan_kernel<8>})
    MXMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kPlanMaxSmemBytes));
}

void launch_plan(const plan_args& a, const moe_workspace& ws, cudaStream_t stream) {
  auto kernel = plan_kernel<0>;
  if (a.source == plan_source::route) {
    MXMOE_CHECK_ARG(plan_can_route(a.tokens, a.experts), "plan_args",
                    "at most " + std::to_string(kPlanRouteMaxTokens) + " tokens and " +
                        std::to_string(kPlanRouteMaxExperts) + " experts when the plan kernel routes",
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
