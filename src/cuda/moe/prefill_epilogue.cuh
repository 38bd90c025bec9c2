// moe/prefill_epilogue.cuh — the stores of one prefill work item, from a consumer thread's
// wgmma accumulators (m64nNk16: warp q of the warpgroup holds rows 16q + g and 16q + g + 8 of its
// 64, g = lane / 4; register 4i + h is (row g, token 8i + 2(lane % 4) + h), 4i + 2 + h the same
// token at row g + 8). The row of a thread is therefore one 16-row fragment tile rt and:
//   gate_up_activation: rows come in layout::gate_up_rows order, so rows g and g + 8 are gate and
//     up of output j = 8 rt + g: act(gate + b, up + b) -> act[sorted position, j] (bf16);
//   weighted_down: (acc + b2) * routing weight -> ybuf[pair, row] (bf16).
// Token columns at or past the tile's count hold other experts' rows (or zeros) and are dropped;
// NMAX is the accumulator width, the tile's count decides how much of it is stored.
#pragma once

#include <cstdint>

#include "mxmoe/activation.h"
#include "mxmoe/dtype.h"

#include "kernels.h"
#include "prefill_schedule.cuh"

namespace mxmoe::cuda::sm90 {

// What the stores of a work item read from global memory besides the accumulators: the two rows'
// biases and (weighted_down) the pair and routing weight of each token column, column 32 i + lane
// in round i. consume_item loads them before it waits for the item's last wgmmas, in two waves of
// independent loads (the pairs, then their weights): the stores then wait for no load. Loaded
// round by round inside the stores instead (until 2026-12-05), each round waited for two dependent
// loads: with K = 768 (Qwen3-30B-A3B's GEMM2) stall sampling put ~48 % of the consumers' samples
// in that epilogue (docs/performance.md, "2026-12-05 (fifth session)").
template <int NMAX>
struct prefill_epilogue_inputs {
  static constexpr int ROUNDS = (NMAX + 31) / 32;
  float bias0 = 0.0f, bias1 = 0.0f;  // rows r0 = 16 rt + g and r1 = r0 + 8
  int32_t pair[ROUNDS] = {};
  float weight[ROUNDS] = {};
};

template <int NMAX>
__device__ __forceinline__ prefill_epilogue_inputs<NMAX> load_prefill_epilogue_inputs(const prefill_item& it,
                                                                                      int local_tile,
                                                                                      const gemm_weights& w,
                                                                                      const moe_workspace& ws,
                                                                                      epilogue_kind ep) {
  prefill_epilogue_inputs<NMAX> in;
  if (local_tile >= it.row_tiles) return in;  // a warp past the last row tile stores nothing
  const int lane = threadIdx.x & 31;
  const int64_t r0 = (static_cast<int64_t>(it.row_tile0) + local_tile) * 16 + (lane >> 2);
  if (w.bias) {
    in.bias0 = w.bias[it.expert * w.rows + r0];
    in.bias1 = w.bias[it.expert * w.rows + r0 + 8];
  }
  if (ep == epilogue_kind::weighted_down) {
#pragma unroll
    for (int i = 0; i < in.ROUNDS; ++i)
      if (32 * i + lane < it.count) in.pair[i] = ws.sorted[it.start + 32 * i + lane];
#pragma unroll
    for (int i = 0; i < in.ROUNDS; ++i)
      if (32 * i + lane < it.count) in.weight[i] = ws.weights[in.pair[i]];
  }
  return in;
}

template <int NMAX>
__device__ __forceinline__ void store_prefill_item(const float (&acc)[NMAX / 2], const prefill_epilogue_inputs<NMAX>& in,
                                                   const prefill_item& it, int local_tile, const gemm_weights& w,
                                                   const moe_workspace& ws, epilogue_kind ep,
                                                   const activation_config& act) {
  if (local_tile >= it.row_tiles) return;  // a warp past the last row tile of the matrix (the whole warp)
  const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int64_t rt = it.row_tile0 + local_tile;
  const int64_t r0 = rt * 16 + g, r1 = r0 + 8;
  // weighted_down: the lane that stores a column gets its pair and weight by shuffles from the
  // lane that loaded them.
  const bool down = ep == epilogue_kind::weighted_down;
#pragma unroll
  for (int i = 0; i < in.ROUNDS; ++i) {
    if (32 * i >= it.count) break;  // uniform: the shuffles below see every lane
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int ni = 4 * i + q;  // block of 8 token columns
      if (ni >= NMAX / 8 || ni * 8 >= it.count) break;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = ni * 8 + 2 * t4 + h;  // held by lane r % 32 = 8 q + 2 t4 + h in round i
        const float v0 = acc[4 * ni + h] + in.bias0, v1 = acc[4 * ni + 2 + h] + in.bias1;
        if (down) {
          const int32_t pair = __shfl_sync(0xFFFFFFFFu, in.pair[i], 8 * q + 2 * t4 + h);
          const float wt = __shfl_sync(0xFFFFFFFFu, in.weight[i], 8 * q + 2 * t4 + h);
          if (r >= it.count) continue;
          uint16_t* y = ws.ybuf + static_cast<int64_t>(pair) * w.rows;
          y[r0] = float_to_bf16(v0 * wt);
          y[r1] = float_to_bf16(v1 * wt);
        } else {
          if (r >= it.count) continue;
          const int64_t s = it.start + r;  // sorted position of the token column
          const int64_t inter = w.rows / 2;
          ws.act[s * inter + rt * 8 + g] = float_to_bf16(activate(v0, v1, act));
        }
      }
    }
  }
}

}  // namespace mxmoe::cuda::sm90
