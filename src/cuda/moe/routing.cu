// moe/routing.cu — routing and the expert-grouped tile schedule of the MoE layer.
//
// route:    one warp per token; each lane holds up to 16 of the E <= 512 logits. Top-k by k
//           rounds of a warp arg-max (ties: lower expert index), then the routing kind's
//           weights (BRIEF §4; the CPU reference cpu::route defines them). Each selected slot
//           bumps counts[e] and records its rank pos[p] within the expert.
// import:   the same bookkeeping for caller-provided ids / weights; an id outside [0, E) drops
//           its slot (ids[p] = -1, it contributes 0) and sets bit 0 of the workspace error flag.
// schedule: one CTA: exclusive scans (cub::BlockScan) of counts and of tiles per expert; writes
//           tile_desc{expert, start, count <= BN} for every tile, in expert order.
// scatter:  sorted[offsets[e] + pos[p]] = p.
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include <cub/block/block_scan.cuh>

#include "check.h"
#include "kernels.h"

namespace mxmoe::cuda::sm90 {
namespace {

constexpr int kRouteWarps = 4;

struct candidate {
  float v;
  int i;  // -1: none
};

__device__ __forceinline__ bool better(candidate a, candidate b) {
  if (a.i < 0) return false;
  if (b.i < 0) return true;
  return a.v > b.v || (a.v == b.v && a.i < b.i);
}

__device__ __forceinline__ candidate warp_best(candidate c) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    candidate o{__shfl_xor_sync(0xFFFFFFFFu, c.v, off), __shfl_xor_sync(0xFFFFFFFFu, c.i, off)};
    if (better(o, c)) c = o;
  }
  return c;
}

// Top-k of key[] (lane-strided: element lane + 32*q); `allowed` masks experts out.
// Writes the chosen expert indices, best first, into sel[0..k).
template <int PER_LANE>
__device__ void warp_topk(const float (&key)[PER_LANE], uint32_t allowed, int experts, int k, int* sel) {
  const int lane = threadIdx.x & 31;
  uint32_t taken = 0;
  for (int r = 0; r < k; ++r) {
    candidate c{0.0f, -1};
#pragma unroll
    for (int q = 0; q < PER_LANE; ++q) {
      const int e = lane + 32 * q;
      if (e < experts && ((allowed >> q) & 1u) && !((taken >> q) & 1u) && better({key[q], e}, c)) c = {key[q], e};
    }
    c = warp_best(c);
    sel[r] = c.i;
    if (c.i >= 0 && (c.i & 31) == lane) taken |= 1u << (c.i >> 5);
  }
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

template <int PER_LANE>
__device__ __forceinline__ float lane_value(const float (&a)[PER_LANE], int e) {
  float v = 0.0f;
#pragma unroll
  for (int q = 0; q < PER_LANE; ++q)
    if (q == (e >> 5)) v = a[q];
  return __shfl_sync(0xFFFFFFFFu, v, e & 31);
}

// PER_LANE = ceil(E / 32) rounded up to 4, 8 or 16: the loops over a lane's experts are
// unrolled, so a small E should not pay for 512.
template <int PER_LANE>
__global__ void __launch_bounds__(kRouteWarps * 32)
    route_kernel(const void* __restrict__ logits, bool logits_bf16, const float* __restrict__ correction_bias,
                 routing_config r, int tokens, int experts, moe_workspace ws) {
  __shared__ float group_choice[kRouteWarps][512];
  __shared__ float group_score[kRouteWarps][512];
  __shared__ int sel_s[kRouteWarps][512];  // top-k experts, or top-k groups (<= n_group <= 512)
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t = blockIdx.x * kRouteWarps + warp;
  if (t >= tokens) return;

  float l[PER_LANE];
#pragma unroll
  for (int q = 0; q < PER_LANE; ++q) {
    const int e = lane + 32 * q;
    float v = -FLT_MAX;
    if (e < experts) {
      const int64_t idx = static_cast<int64_t>(t) * experts + e;
      v = logits_bf16 ? bf16_to_float(static_cast<const uint16_t*>(logits)[idx]) : static_cast<const float*>(logits)[idx];
    }
    l[q] = v;
  }
  const int k = r.top_k;
  int* sel = sel_s[warp];
  float wsel = 0.0f;  // lane j < k holds slot j's weight

  if (r.kind == routing_kind::sigmoid_grouped_topk) {
    float s[PER_LANE], choice[PER_LANE];
#pragma unroll
    for (int q = 0; q < PER_LANE; ++q) {
      const int e = lane + 32 * q;
      s[q] = 1.0f / (1.0f + expf(-l[q]));
      choice[q] = s[q] + ((correction_bias && e < experts) ? correction_bias[e] : 0.0f);
      if (e < experts) group_choice[warp][e] = choice[q];
    }
    __syncwarp();
    const int gsize = experts / r.n_group;
    for (int gi = lane; gi < r.n_group; gi += 32) {  // group score: sum of its top-2 choices
      float b1 = -FLT_MAX, b2 = -FLT_MAX;
      for (int e = gi * gsize; e < (gi + 1) * gsize; ++e) {
        const float c = group_choice[warp][e];
        if (c > b1) {
          b2 = b1;
          b1 = c;
        } else if (c > b2) {
          b2 = c;
        }
      }
      group_score[warp][gi] = gsize == 1 ? b1 : b1 + b2;
    }
    __syncwarp();
    float gkey[PER_LANE];
#pragma unroll
    for (int q = 0; q < PER_LANE; ++q) {
      const int gi = lane + 32 * q;
      gkey[q] = gi < r.n_group ? group_score[warp][gi] : -FLT_MAX;
    }
    warp_topk(gkey, 0xFFFFFFFFu, r.n_group, r.topk_group, sel);
    __syncwarp();
    uint32_t allowed = 0;
#pragma unroll
    for (int q = 0; q < PER_LANE; ++q) {
      const int gi = (lane + 32 * q) / gsize;
      bool keep = false;
      for (int j = 0; j < r.topk_group; ++j) keep |= sel[j] == gi;
      allowed |= (keep ? 1u : 0u) << q;
    }
    __syncwarp();
    warp_topk(choice, allowed, experts, k, sel);
    __syncwarp();
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) {
      const float sj = lane_value(s, sel[j]);
      sum += sj;
      if (lane == j) wsel = sj;
    }
    if (r.renormalize) wsel /= sum;
    wsel *= r.routed_scaling_factor;
  } else {
    warp_topk(l, 0xFFFFFFFFu, experts, k, sel);
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
      float sum = 0.0f;
      for (int j = 0; j < k; ++j) {
        const float p = expf(lane_value(l, sel[j]) - mx) / den;
        sum += p;
        if (lane == j) wsel = p;
      }
      if (r.renormalize) wsel /= sum;
    } else {  // topk_softmax: softmax over the k selected logits
      const float top = lane_value(l, sel[0]);
      float den = 0.0f;
      for (int j = 0; j < k; ++j) {
        const float p = expf(lane_value(l, sel[j]) - top);
        den += p;
        if (lane == j) wsel = p;
      }
      wsel /= den;
    }
  }

  if (lane < k) {
    const int64_t p = static_cast<int64_t>(t) * k + lane;
    const int e = sel[lane];
    ws.ids[p] = e;
    ws.weights[p] = wsel;
    ws.pos[p] = atomicAdd(&ws.counts[e], 1);
  }
}

__global__ void import_kernel(const int32_t* __restrict__ ids, const float* __restrict__ weights, int64_t pairs,
                              int experts, moe_workspace ws) {
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= pairs) return;
  const int e = ids[p];
  if (e < 0 || e >= experts) {
    ws.ids[p] = -1;
    ws.weights[p] = 0.0f;
    atomicOr(ws.error_flag, 1);
    return;
  }
  ws.ids[p] = e;
  ws.weights[p] = weights[p];
  ws.pos[p] = atomicAdd(&ws.counts[e], 1);
}

constexpr int kScheduleThreads = 512;  // one thread per expert (E <= 512)

__global__ void __launch_bounds__(kScheduleThreads)
    schedule_kernel(int experts, int tokens_per_tile, int64_t max_tiles, moe_workspace ws) {
  using scan = cub::BlockScan<int, kScheduleThreads>;
  __shared__ typename scan::TempStorage tmp;
  const int e = threadIdx.x;
  const int count = e < experts ? ws.counts[e] : 0;
  const int tiles = (count + tokens_per_tile - 1) / tokens_per_tile;
  int offset, tile0, total_tiles;
  scan(tmp).ExclusiveSum(count, offset);
  __syncthreads();
  scan(tmp).ExclusiveSum(tiles, tile0, total_tiles);
  if (e < experts) ws.offsets[e] = offset;
  if (e == experts - 1) ws.offsets[experts] = offset + count;
  if (e == 0) *ws.num_tiles = total_tiles <= max_tiles ? total_tiles : static_cast<int>(max_tiles);
  for (int i = 0; i < tiles && tile0 + i < max_tiles; ++i) {
    const int start = i * tokens_per_tile;
    ws.tiles[tile0 + i] = tile_desc{e, offset + start, min(tokens_per_tile, count - start)};
  }
}

__global__ void scatter_kernel(int64_t pairs, moe_workspace ws) {
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= pairs) return;
  const int e = ws.ids[p];
  if (e >= 0) ws.sorted[ws.offsets[e] + ws.pos[p]] = static_cast<int32_t>(p);
}

unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace

void launch_route(const void* logits, bool logits_bf16, const float* correction_bias, const routing_config& r,
                  int64_t tokens, int64_t experts, const moe_workspace& ws, cudaStream_t stream) {
  const unsigned blocks = blocks_for(tokens, kRouteWarps);
  const int t = static_cast<int>(tokens), e = static_cast<int>(experts);
  if (experts <= 128)
    route_kernel<4><<<blocks, kRouteWarps * 32, 0, stream>>>(logits, logits_bf16, correction_bias, r, t, e, ws);
  else if (experts <= 256)
    route_kernel<8><<<blocks, kRouteWarps * 32, 0, stream>>>(logits, logits_bf16, correction_bias, r, t, e, ws);
  else
    route_kernel<16><<<blocks, kRouteWarps * 32, 0, stream>>>(logits, logits_bf16, correction_bias, r, t, e, ws);
  MXMOE_CUDA_CHECK(cudaGetLastError());
}

void launch_import_routing(const int32_t* ids, const float* weights, int64_t tokens, int top_k, int64_t experts,
                           const moe_workspace& ws, cudaStream_t stream) {
  const int64_t pairs = tokens * top_k;
  import_kernel<<<blocks_for(pairs, 256), 256, 0, stream>>>(ids, weights, pairs, static_cast<int>(experts), ws);
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
