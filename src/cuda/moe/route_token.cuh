// moe/route_token.cuh — routing one token with one warp (route_token), shared by the route kernel,
// the one-CTA plan (routing.cu) and the few-token plan (plan_few.cu), so that every path selects the
// same experts and computes the same weight bits.
//
// route_token: each lane holds up to PER_LANE (4, 8, 12, 16) of the E <= 512 logits. Top-k by k
// rounds of a warp arg-max (ties: lower expert index), then the routing kind's weights
// (docs/models.md; the CPU reference cpu::route defines them).
#pragma once

#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "kernels.h"
#include "mxmoe/dtype.h"

namespace mxmoe::cuda::sm90::detail {

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

}  // namespace mxmoe::cuda::sm90::detail
