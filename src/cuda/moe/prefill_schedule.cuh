// moe/prefill_schedule.cuh — the work items of one prefill GEMM launch and their order.
//
// Item i = (tile i / row_blocks, row block i % row_blocks): one scheduled tile of an expert
// (ws.tiles: up to NMAX expert-sorted pairs, in expert order; routing.cu) times one block of
// ROW_TILES fragment row tiles (16 weight rows each). The persistent CTAs take items in index
// order as they become free (gemm_prefill.cuh, "work items"): the row blocks of one tile run
// side by side, so its activations are read from DRAM once and from L2 by every row block, and
// consecutive tiles of an expert follow each other while its weights are still in L2.
#pragma once

#include <cstdint>

#include "mxmoe/layout.h"

#include "kernels.h"

namespace mxmoe::cuda::sm90 {

// The warp's index, and a value every lane of the warp holds, as values ptxas knows to be
// warp-uniform (a broadcast from lane 0): branches on them need no reconvergence bookkeeping and
// what depends on them only (ring slots, barrier addresses, wgmma descriptors) can live in
// uniform registers. Without it every K-step paid ~8 R2UR moves of descriptor halves, and
// reconvergence around each of its branches (ncu, Qwen3-30B-A3B T = 512, 2026-12-05).
// Both are whole-warp shuffles: every lane must call them together, never inside a branch that
// some lanes skip (`if (leader)`, `if (elect_one_sync())`): a lane alone at one waits for lanes
// that went on, and the kernel hangs (docs/performance.md, thirty-seventh session).
__device__ __forceinline__ int warp_uniform(int v) { return __shfl_sync(0xFFFFFFFFu, v, 0); }
__device__ __forceinline__ int warp_index() { return warp_uniform(static_cast<int>(threadIdx.x >> 5)); }

struct prefill_grid {
  int row_tiles;   // fragment row tiles of the weight matrix
  int ksteps;      // fragment column tiles (64 k each)
  int row_blocks;  // ceil(row_tiles / ROW_TILES)
  int64_t items;   // scheduled tiles x row blocks
};

struct prefill_item {
  int expert, start, count;  // the tile (kernels.h tile_desc)
  int row_tile0;             // first fragment row tile of the block
  int row_tiles;             // row tiles of the block inside the matrix (1..ROW_TILES)
};

// Called by every thread of the CTA (the loaders take it before their roles split: it shuffles).
template <int ROW_TILES>
__device__ __forceinline__ prefill_grid make_prefill_grid(const gemm_weights& w, const moe_workspace& ws) {
  const layout::sm90_fragment frag{w.rows, w.cols};
  prefill_grid g;
  g.row_tiles = static_cast<int>(frag.row_tiles());
  g.ksteps = static_cast<int>(frag.col_tiles());
  g.row_blocks = (g.row_tiles + ROW_TILES - 1) / ROW_TILES;
  g.items = static_cast<int64_t>(warp_uniform(*ws.num_tiles)) * g.row_blocks;
  return g;
}

template <int ROW_TILES>
__device__ __forceinline__ prefill_item prefill_item_at(const moe_workspace& ws, const prefill_grid& g, int64_t i) {
  const tile_desc td = ws.tiles[i / g.row_blocks];
  const int row_tile0 = static_cast<int>(i % g.row_blocks) * ROW_TILES;
  const int left = g.row_tiles - row_tile0;
  return {td.expert, td.start, td.count, row_tile0, left < ROW_TILES ? left : ROW_TILES};
}

}  // namespace mxmoe::cuda::sm90
