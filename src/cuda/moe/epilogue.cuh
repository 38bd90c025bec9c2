// moe/epilogue.cuh — a tile's rows and the two epilogues of the MoE GEMMs, shared by every tile
// shape. load_tile_rows: per B row of a tile, the activation row it reads and the pair it writes.
// store_row_tile: a warp owns
// one 16-row fragment tile rt and NB blocks of 8 tokens in the mma accumulator layout (per block:
// c[0], c[1] = row g, tokens 2t, 2t+1; c[2], c[3] = row g+8, same tokens — the layout of
// mma.sync m16n8 and of each warp's part of a wgmma m64 tile).
//   gate_up_activation: rows come in layout::gate_up_rows order, so rows g and g+8 are gate and
//     up of output j = rt*8 + g: act(gate + b, up + b) -> act[s, j] (bf16).
//   weighted_down: (acc + b2) * routing weight -> ybuf[pair, n] (bf16).
// Tokens at or beyond the tile's count are never stored (their accumulators may hold anything).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "mxmoe/activation.h"
#include "mxmoe/dtype.h"
#include "kernels.h"

namespace mxmoe::cuda::sm90::detail {

// Row r < count of tile td reads activation row row_src[r] (GEMM1: token pair / k of x; GEMM2:
// sorted position start + r of act) and writes pair row_pair[r]; -1 beyond the count. All
// threads of the CTA call it; the caller synchronizes before reading the arrays. Without row_pair
// (GEMM2 of the decode GEMM, which keeps its pairs in registers: pairs_in_registers) no global
// memory is read: GEMM2's rows are the sorted positions themselves. one_b_row (GEMM1 at T = 1,
// without row_pair): every row reads activation row 0, and nothing is loaded either.
__device__ __forceinline__ void load_tile_rows(const tile_desc& td, const moe_workspace& ws, epilogue_kind ep,
                                               int top_k, int bn, int* row_src, int* row_pair, bool one_b_row = false) {
  const bool gate_up = ep == epilogue_kind::gate_up_activation;
  for (int r = threadIdx.x; r < bn; r += blockDim.x) {
    int src = -1, pair = -1;
    if (r < td.count) {
      const int s = td.start + r;
      if (row_pair != nullptr || (gate_up && !one_b_row)) pair = ws.sorted[s];
      src = !gate_up ? s : one_b_row ? 0 : pair / top_k;
    }
    row_src[r] = src;
    if (row_pair != nullptr) row_pair[r] = pair;
  }
}

struct pair_weight {
  int pair;
  float weight;
};

// GEMM2's pair and routing weight of tile token r, from the tile's row arrays (load_tile_rows).
struct pairs_from_rows {
  const int* row_pair;
  const float* weights;  // moe_workspace::weights, by pair
  __device__ __forceinline__ pair_weight operator()(int, int, int r) const {
    const int p = row_pair[r];
    return {p, weights[p]};
  }
};

// GEMM2's pairs and routing weights of the tokens a lane stores (block nb, column 2 t4 + h), read
// from sorted / sorted_weights into registers once the tile is known, so that the epilogue waits
// for no load (the decode GEMM: with its rows in smem, the epilogue reloaded them and then the
// weight by pair, two dependent round trips per CTA, ~8 % of GEMM2's stall samples at
// Qwen3-30B-A3B T = 128, docs/performance.md, 2026-12-06 sixteenth session).
template <int NB>
struct pairs_in_registers {
  int pair[NB][2];
  float weight[NB][2];
  __device__ __forceinline__ void load(const tile_desc& td, const moe_workspace& ws, int tok0) {
    const int t4 = threadIdx.x & 3;
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = tok0 + nb * 8 + 2 * t4 + h;
        const bool in = r < td.count;
        pair[nb][h] = in ? __ldcg(ws.sorted + td.start + r) : -1;
        weight[nb][h] = in ? __ldcg(ws.sorted_weights + td.start + r) : 0.0f;
      }
  }
  __device__ __forceinline__ pair_weight operator()(int nb, int h, int) const { return {pair[nb][h], weight[nb][h]}; }
};

// tok0: the tile-relative token of block 0's column 0; pair_of(nb, h, r): the pair and routing
// weight of tile token r (block nb, column 2 t4 + h) for GEMM2.
template <int NB, class PairOf>
__device__ __forceinline__ void store_row_tile(const float (&acc)[NB][4], int rt, int tok0, const tile_desc& td,
                                               const PairOf& pair_of, const gemm_weights& w, const moe_workspace& ws,
                                               epilogue_kind ep, const activation_config& act) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int64_t r0 = static_cast<int64_t>(rt) * 16 + g, r1 = r0 + 8;
  const float b0 = w.bias ? w.bias[td.expert * w.rows + r0] : 0.0f;
  const float b1 = w.bias ? w.bias[td.expert * w.rows + r1] : 0.0f;
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = tok0 + nb * 8 + 2 * t4 + h;
      if (r >= td.count) continue;
      const float v0 = acc[nb][h] + b0, v1 = acc[nb][2 + h] + b1;
      if (ep == epilogue_kind::gate_up_activation) {
        const int64_t inter = w.rows / 2;
        const int64_t j_out = static_cast<int64_t>(rt) * 8 + g;
        ws.act[static_cast<int64_t>(td.start + r) * inter + j_out] = float_to_bf16(activate(v0, v1, act));
      } else {
        const pair_weight pw = pair_of(nb, h, r);
        uint16_t* y = ws.ybuf + static_cast<int64_t>(pw.pair) * w.rows;
        y[r0] = float_to_bf16(v0 * pw.weight);
        y[r1] = float_to_bf16(v1 * pw.weight);
      }
    }
  }
}

}  // namespace mxmoe::cuda::sm90::detail
