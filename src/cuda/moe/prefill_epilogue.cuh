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

template <int NMAX>
__device__ __forceinline__ void store_prefill_item(const float (&acc)[NMAX / 2], const prefill_item& it, int local_tile,
                                                   const gemm_weights& w, const moe_workspace& ws, epilogue_kind ep,
                                                   const activation_config& act) {
  if (local_tile >= it.row_tiles) return;  // a warp past the last row tile of the matrix (the whole warp)
  const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int64_t rt = it.row_tile0 + local_tile;
  const int64_t r0 = rt * 16 + g, r1 = r0 + 8;
  const int64_t expert = it.expert;
  const float b0 = w.bias ? w.bias[expert * w.rows + r0] : 0.0f;
  const float b1 = w.bias ? w.bias[expert * w.rows + r1] : 0.0f;
  // weighted_down: the pair and routing weight of 32 token columns at a time, loaded by the warp
  // (lane l: column 32 i + l of round i) and handed to the lanes that store a column by shuffles:
  // two dependent global loads per round of 32 columns. Loaded column by column instead (the
  // first version), each stored column waited for its two loads (sorted, then weights) in program
  // order: 2 · count / 4 load latencies per thread and work item.
  const bool down = ep == epilogue_kind::weighted_down;
#pragma unroll
  for (int i = 0; i < (NMAX + 31) / 32; ++i) {
    if (32 * i >= it.count) break;  // uniform: the shuffles below see every lane
    int32_t pair_of = 0;
    float weight_of = 0.0f;
    if (down && 32 * i + lane < it.count) {
      pair_of = ws.sorted[it.start + 32 * i + lane];
      weight_of = ws.weights[pair_of];
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int ni = 4 * i + q;  // block of 8 token columns
      if (ni >= NMAX / 8 || ni * 8 >= it.count) break;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = ni * 8 + 2 * t4 + h;  // held by lane r % 32 = 8 q + 2 t4 + h in round i
        const float v0 = acc[4 * ni + h] + b0, v1 = acc[4 * ni + 2 + h] + b1;
        if (down) {
          const int32_t pair = __shfl_sync(0xFFFFFFFFu, pair_of, 8 * q + 2 * t4 + h);
          const float wt = __shfl_sync(0xFFFFFFFFu, weight_of, 8 * q + 2 * t4 + h);
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
