// moe/prefill_epilogue.cuh — the stores of one prefill work item, from a consumer thread's
// wgmma accumulators (m64nNk16: warp q of the warpgroup holds rows 16q + g and 16q + g + 8 of its
// 64, g = lane / 4; register 4i + h is (row g, token 8i + 2(lane % 4) + h), 4i + 2 + h the same
// token at row g + 8). The row of a thread is therefore one 16-row fragment tile rt and:
//   gate_up_activation: rows come in layout::gate_up_rows order, so rows g and g + 8 are gate and
//     up of output j = 8 rt + g: act(gate + b, up + b) -> act[sorted position, j] (bf16);
//   down_sorted: acc + b2 -> ybuf[sorted position, row] (bf16; the combine applies the routing
//     weight), stored with the L2 policy moe_workspace::ybuf_store_l2_policy.
// Token columns at or past the tile's count hold other experts' rows (or zeros) and are dropped;
// NMAX is the accumulator width, the tile's count decides how much of it is stored.
#pragma once

#include <cstdint>

#include <cute/arch/copy_sm90.hpp>

#include "mxmoe/activation.h"
#include "mxmoe/dtype.h"

#include "kernels.h"
#include "l2_hint.cuh"
#include "prefill_schedule.cuh"

namespace mxmoe::cuda::sm90 {

// What the stores of a work item read from global memory besides the accumulators: the two rows'
// biases. consume_item loads them before it waits for the item's last wgmmas, so the stores wait
// for no load. GEMM2's stores go to sorted positions (epilogue_kind::down_sorted), with no pair or
// routing weight per token column: the combine finds each pair's row and weighs it. Stored by pair
// with the weight applied here instead (until 2026-12-06), each 16 token columns took five
// shuffles (four weights, one pair) before their store, and each item six pair and weight loads
// per lane; ncu put 22 % of GEMM2's consumer samples in that epilogue at T = 2048 on
// Qwen3-30B-A3B, 60 % of them waiting on shuffle and shared-memory results (docs/performance.md,
// "2026-12-06 (twenty-sixth session)").
struct prefill_epilogue_inputs {
  float bias0 = 0.0f, bias1 = 0.0f;  // rows r0 = 16 rt + g and r1 = r0 + 8
};

__device__ __forceinline__ prefill_epilogue_inputs load_prefill_epilogue_inputs(const prefill_item& it, int local_tile,
                                                                               const gemm_weights& w) {
  prefill_epilogue_inputs in;
  if (local_tile >= it.row_tiles || !w.bias) return in;  // a warp past the last row tile stores nothing
  const int64_t r0 = (static_cast<int64_t>(it.row_tile0) + local_tile) * 16 + ((threadIdx.x & 31) >> 2);
  in.bias0 = w.bias[it.expert * w.rows + r0];
  in.bias1 = w.bias[it.expert * w.rows + r0 + 8];
  return in;
}

// Shared memory a consumer warp stages its stores through: four 8x8 bf16 matrices.
inline constexpr int kEpilogueStageBytes = 512;

// Four 8x8 b16 matrices from the accumulator layout (register j of lane l: row l / 4, columns
// 2 (l % 4) and 2 (l % 4) + 1 of matrix j) into `stage`, transposed: matrix j's column c becomes the
// 16 bytes at stage + 128 j + 16 c. stmatrix .trans: lane l names the address of row l % 8 of
// matrix l / 8.
__device__ __forceinline__ void stage_transposed(uint8_t* stage, uint32_t m0, uint32_t m1, uint32_t m2, uint32_t m3) {
  cute::SM90_U16x8_STSM_T::copy(m0, m1, m2, m3,
                                *reinterpret_cast<cute::uint128_t*>(stage + 16 * (threadIdx.x & 31)));
}

// The stores leave in 16-byte vectors, one per token column and eight consecutive output rows:
// the accumulators go through the warp's `stage` (stmatrix .trans) and come back with one 16-byte
// shared load per lane. Written as 2-byte stores straight from the accumulators instead (until
// 2026-12-05), a 176-wide tile took 88 store instructions per thread for GEMM2, each
// touching four half-filled sectors.
//   down_sorted: per 16 token columns (blocks ni0 = 2p, 2p + 1) the four matrices (ni0, rows g),
//     (ni0, rows g + 8), (ni0 + 1, rows g), (ni0 + 1, rows g + 8); lane l then holds token column
//     16 p + 8 (l / 16) + l % 8 at rows 8 ((l / 8) % 2) .. + 7 of the row tile.
//   gate_up_activation: per 32 token columns (blocks 4q .. 4q + 3) one matrix per block of the eight
//     activation outputs j of the row tile; lane l then holds token column 32 q + l.
template <int NMAX>
__device__ __forceinline__ void store_prefill_item(const float (&acc)[NMAX / 2], const prefill_epilogue_inputs& in,
                                                   const prefill_item& it, int local_tile, const gemm_weights& w,
                                                   const moe_workspace& ws, epilogue_kind ep,
                                                   const activation_config& act, uint8_t* stage) {
  if (local_tile >= it.row_tiles) return;  // a warp past the last row tile of the matrix (the whole warp)
  const int lane = threadIdx.x & 31;
  const int64_t rt = it.row_tile0 + local_tile;
  const uint4* staged = reinterpret_cast<const uint4*>(stage) + lane;
  if (ep == epilogue_kind::down_sorted) {
#pragma unroll
    for (int p = 0; p < NMAX / 16; ++p) {
      if (16 * p >= it.count) break;  // uniform
      uint32_t m[4];
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const int ni = 2 * p + b;
        m[2 * b] = float2_to_bf16x2(acc[4 * ni] + in.bias0, acc[4 * ni + 1] + in.bias0);
        m[2 * b + 1] = float2_to_bf16x2(acc[4 * ni + 2] + in.bias1, acc[4 * ni + 3] + in.bias1);
      }
      stage_transposed(stage, m[0], m[1], m[2], m[3]);
      __syncwarp();
      const uint4 v = *staged;
      __syncwarp();  // the next round's stmatrix overwrites the stage
      const int col = 16 * p + 8 * (lane >> 4) + (lane & 7);
      if (col < it.count)
        detail::store_16_l2_hint(ws.ybuf + (static_cast<int64_t>(it.start) + col) * w.rows + rt * 16 + 8 * ((lane >> 3) & 1),
                                 v, ws.ybuf_store_l2_policy);
    }
  } else {
    const int64_t inter = w.rows / 2;
#pragma unroll
    for (int q = 0; q < (NMAX + 31) / 32; ++q) {
      if (32 * q >= it.count) break;  // uniform
      uint32_t m[4];
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int ni = 4 * q + b;
        m[b] = ni < NMAX / 8 ? float2_to_bf16x2(activate(acc[4 * ni] + in.bias0, acc[4 * ni + 2] + in.bias1, act),
                                           activate(acc[4 * ni + 1] + in.bias0, acc[4 * ni + 3] + in.bias1, act))
                             : 0u;
      }
      stage_transposed(stage, m[0], m[1], m[2], m[3]);
      __syncwarp();
      const uint4 v = *staged;
      __syncwarp();
      const int col = 32 * q + lane;
      if (col < it.count)
        *reinterpret_cast<uint4*>(ws.act + (static_cast<int64_t>(it.start) + col) * inter + rt * 8) = v;
    }
  }
}

}  // namespace mxmoe::cuda::sm90
