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
  if (local_tile >= it.row_tiles) return;  // a warp past the last row tile of the matrix
  const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int64_t rt = it.row_tile0 + local_tile;
  const int64_t r0 = rt * 16 + g, r1 = r0 + 8;
  const int64_t expert = it.expert;
  const float b0 = w.bias ? w.bias[expert * w.rows + r0] : 0.0f;
  const float b1 = w.bias ? w.bias[expert * w.rows + r1] : 0.0f;
#pragma unroll
  for (int ni = 0; ni < NMAX / 8; ++ni) {
    if (ni * 8 >= it.count) break;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = ni * 8 + 2 * t4 + h;
      if (r >= it.count) continue;
      const float v0 = acc[4 * ni + h] + b0, v1 = acc[4 * ni + 2 + h] + b1;
      const int64_t s = it.start + r;  // sorted position of the token column
      if (ep == epilogue_kind::gate_up_activation) {
        const int64_t inter = w.rows / 2;
        ws.act[s * inter + rt * 8 + g] = float_to_bf16(activate(v0, v1, act));
      } else {
        const int64_t pair = ws.sorted[s];
        const float wt = ws.weights[pair];
        uint16_t* y = ws.ybuf + pair * w.rows;
        y[r0] = float_to_bf16(v0 * wt);
        y[r1] = float_to_bf16(v1 * wt);
      }
    }
  }
}

}  // namespace mxmoe::cuda::sm90
