// moe/gemm_prefill.cuh — the persistent, warp-specialized W4A16 expert GEMM of the MoE layer for
// prefill and the 512–2048-token transition (both GEMMs), sm_90a.
//
// C[rows, tokens] = W_e[rows, K] · B[tokens, K]ᵀ per work item (prefill_schedule.cuh): one
// scheduled tile of expert e (count <= NMAX expert-sorted pairs) times 128 weight rows. B rows
// are contiguous in sorted order (GEMM1: x gathered by gather_rows.cu; GEMM2: act), so the
// tensor-memory-access engine (TMA) loads them.
//
// One CTA per SM, 10 warps, no CTA-wide barrier after set-up:
//   warp 8, one lane — weights: per stage 2 K-steps (128 k) of the block's 8 fragment row tiles
//     (layout::sm90_fragment, [N/16][K/64] tiles of 512 code + 32 scale bytes: a row tile's
//     K-steps are contiguous), 16 bulk copies (cp.async.bulk) into a ring of A_STAGES slots;
//   warp 9, one lane — activations: per K-step ceil(count/16) TMA boxes of 16 rows x 64 k,
//     128-byte swizzled (chunk c of row r at c ^ (r % 8): what the wgmma descriptor reads), into a
//     ring of B_STAGES slots; rows past the tensor arrive as zeros, the K tail too;
//   warps 0-7 — two consumer warpgroups of 64 weight rows (warp q of warpgroup h owns row tile
//     4h + q). Per K-step a warp reads its 16-byte fragment share and 4 scale bytes, turns them
//     into bf16 A registers (dequant.cuh) and its warpgroup issues four wgmma m64nNk16 with A from
//     registers. The A registers are double-buffered: the conversion for step s+1 runs while the
//     tensor cores work on step s (wgmma.wait_group 1). A weight slot is released as soon as its
//     bytes are in registers; an activation slot when the wgmmas that read it completed.
// N = 16·ceil(count/16) per tile (the K-step picks the wgmma instruction): a tile of 18 pairs
// costs a 32-wide product, not an NMAX-wide one; NMAX sets the ring slot and the accumulators
// (NMAX/2 floats per thread). fp32 accumulation over the whole K, one CTA per output: deterministic.
// Epilogues: prefill_epilogue.cuh (activation fused in GEMM1, routing weight in GEMM2).
//
// Limits (launchers check): K a multiple of 32, rows a multiple of 16 (layout::sm90_fragment),
// B rows 16-byte aligned with at least one row; tiles as routing.cu's schedule writes them with
// tokens_per_tile = NMAX. Two instantiations (one translation unit each): prefill_narrow_tile for
// up to 48 pairs per expert (weight streaming: deep weight ring), prefill_wide_tile above.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>

#include "mxmoe/layout.h"

#include "dequant.cuh"
#include "kernels.h"
#include "mma.cuh"
#include "prefill_epilogue.cuh"
#include "prefill_pipeline.cuh"
#include "prefill_schedule.cuh"

namespace mxmoe::cuda::sm90 {

// The activation box of the tensor maps (prefill_launch.cu encodes them, the kernel loads them).
inline constexpr int kPrefillBoxRows = 16;
inline constexpr int kPrefillBoxCols = 64;  // one K-step of bf16: a 128-byte swizzle row

template <int NMAX_, int A_STAGES_, int B_STAGES_>
struct prefill_tile {
  static constexpr int ROW_TILES = 8;  // 16-row fragment tiles per CTA: 128 weight rows
  static constexpr int NMAX = NMAX_;   // pairs per scheduled tile
  static constexpr int N_STEP = kPrefillBoxRows;
  static constexpr int A_STAGES = A_STAGES_, B_STAGES = B_STAGES_;
  static constexpr int A_KSTEPS = 2;  // K-steps per weight stage
  static constexpr int TILE_CODES = layout::sm90_fragment::kTileBytes;
  static constexpr int TILE_SCALES = layout::sm90_fragment::kTileScaleBytes;
  // Weight stage: codes [ROW_TILES][A_KSTEPS][512], then scales [ROW_TILES][A_KSTEPS][32].
  static constexpr int A_CODE_BYTES = ROW_TILES * A_KSTEPS * TILE_CODES;
  static constexpr int A_STAGE_BYTES = A_CODE_BYTES + ROW_TILES * A_KSTEPS * TILE_SCALES;
  static constexpr int B_ROW_BYTES = kPrefillBoxCols * 2;
  static constexpr int B_BOX_BYTES = kPrefillBoxRows * B_ROW_BYTES;
  static constexpr int B_STAGE_BYTES = NMAX * B_ROW_BYTES;
  static constexpr int CONSUMER_WARPS = 8, WEIGHT_WARP = 8, ACTIVATION_WARP = 9, THREADS = 320;
  // Shared memory, from a 1024-byte aligned base: [B slots][A slots][barriers].
  static constexpr int A_OFFSET = B_STAGES * B_STAGE_BYTES;
  static constexpr int BAR_OFFSET = A_OFFSET + A_STAGES * A_STAGE_BYTES;
  static constexpr int SMEM_BYTES = 1024 + BAR_OFFSET + 2 * (A_STAGES + B_STAGES) * 8;
  static_assert(NMAX % N_STEP == 0 && NMAX <= 192, "per-tile wgmma widths: multiples of 16 up to 192 (mma.cuh)");
  static_assert(B_STAGE_BYTES % 1024 == 0, "B slots stay 1024-byte aligned: the swizzle is a function of address bits 4..9");
  static_assert(A_STAGE_BYTES % 16 == 0, "bulk copies land on 16-byte boundaries");
  static_assert(SMEM_BYTES <= 232448, "sm_90 dynamic shared memory per block");
};

// The two instantiations (one per translation unit); rings sized to fill the 227 KB.
using prefill_narrow_tile = prefill_tile<64, 18, 8>;  // 8..48 pairs per expert: weight streaming
using prefill_wide_tile = prefill_tile<192, 11, 5>;   // more: tensor-core bound

cudaError_t allow_prefill_smem_narrow();
cudaError_t allow_prefill_smem_wide();
void launch_gemm_prefill_narrow(const gemm_weights&, const CUtensorMap&, const moe_workspace&, epilogue_kind,
                                const activation_config&, int64_t, int, cudaStream_t);
void launch_gemm_prefill_wide(const gemm_weights&, const CUtensorMap&, const moe_workspace&, epilogue_kind,
                              const activation_config&, int64_t, int, cudaStream_t);

template <class Cfg>
struct prefill_smem {
  uint8_t* base;  // 1024-byte aligned
  __device__ uint8_t* b_slot(int s) const { return base + s * Cfg::B_STAGE_BYTES; }
  __device__ uint8_t* a_slot(int s) const { return base + Cfg::A_OFFSET + s * Cfg::A_STAGE_BYTES; }
  __device__ uint64_t* bar(int i) const { return reinterpret_cast<uint64_t*>(base + Cfg::BAR_OFFSET) + i; }
  __device__ uint64_t* a_full(int s) const { return bar(s); }
  __device__ uint64_t* a_empty(int s) const { return bar(Cfg::A_STAGES + s); }
  __device__ uint64_t* b_full(int s) const { return bar(2 * Cfg::A_STAGES + s); }
  __device__ uint64_t* b_empty(int s) const { return bar(2 * Cfg::A_STAGES + Cfg::B_STAGES + s); }
};

// ---- loaders (one lane each) -------------------------------------------------------------

template <class Cfg>
__device__ void load_weights(const prefill_smem<Cfg>& sm, const gemm_weights& w, const moe_workspace& ws,
                             const prefill_grid& pg) {
  detail::ring_pos<Cfg::A_STAGES> pos;
  for (int64_t i = blockIdx.x; i < pg.items; i += gridDim.x) {
    const prefill_item it = prefill_item_at<Cfg::ROW_TILES>(ws, pg, i);
    const int64_t first = static_cast<int64_t>(it.row_tile0) * pg.ksteps;  // fragment tile index
    const uint8_t* codes = w.codes + it.expert * w.expert_code_stride + first * Cfg::TILE_CODES;
    const uint8_t* scales = w.scales + it.expert * w.expert_scale_stride + first * Cfg::TILE_SCALES;
    for (int ks = 0; ks < pg.ksteps; ks += Cfg::A_KSTEPS) {
      const int steps = pg.ksteps - ks < Cfg::A_KSTEPS ? pg.ksteps - ks : Cfg::A_KSTEPS;
      detail::wait_empty(sm.a_empty(pos.slot), pos.phase);
      uint64_t* full = sm.a_full(pos.slot);
      detail::arrive_expect_bytes(full, it.row_tiles * steps * (Cfg::TILE_CODES + Cfg::TILE_SCALES));
      uint8_t* dst = sm.a_slot(pos.slot);
      for (int t = 0; t < it.row_tiles; ++t) {
        const int64_t tile = static_cast<int64_t>(t) * pg.ksteps + ks;
        detail::bulk_load(dst + t * Cfg::A_KSTEPS * Cfg::TILE_CODES, codes + tile * Cfg::TILE_CODES,
                          steps * Cfg::TILE_CODES, full);
        detail::bulk_load(dst + Cfg::A_CODE_BYTES + t * Cfg::A_KSTEPS * Cfg::TILE_SCALES,
                          scales + tile * Cfg::TILE_SCALES, steps * Cfg::TILE_SCALES, full);
      }
      pos.advance();
    }
  }
}

template <class Cfg>
__device__ void load_activations(const prefill_smem<Cfg>& sm, const CUtensorMap* b_map, const moe_workspace& ws,
                                 const prefill_grid& pg) {
  detail::ring_pos<Cfg::B_STAGES> pos;
  for (int64_t i = blockIdx.x; i < pg.items; i += gridDim.x) {
    const prefill_item it = prefill_item_at<Cfg::ROW_TILES>(ws, pg, i);
    const int boxes = (it.count + kPrefillBoxRows - 1) / kPrefillBoxRows;
    for (int ks = 0; ks < pg.ksteps; ++ks) {
      detail::wait_empty(sm.b_empty(pos.slot), pos.phase);
      uint64_t* full = sm.b_full(pos.slot);
      detail::arrive_expect_bytes(full, boxes * Cfg::B_BOX_BYTES);
      for (int q = 0; q < boxes; ++q)
        detail::tma_load_2d(sm.b_slot(pos.slot) + q * Cfg::B_BOX_BYTES, b_map, ks * kPrefillBoxCols,
                            it.start + q * kPrefillBoxRows, full);
      pos.advance();
    }
  }
}

// ---- consumers ---------------------------------------------------------------------------

template <class Cfg>
__device__ __forceinline__ void release_activations(const prefill_smem<Cfg>& sm, int slot) {
  __syncwarp();
  if ((threadIdx.x & 31) == 0) detail::arrive(sm.b_empty(slot));
}

// The four wgmma m64nNk16 of one K-step (k16 steps j = 0..3 of the slot's 64 k), N = 16·n16:
// acc[0, N/2) accumulate, the rest of acc is not touched.
// The fence and the commit sit in the same branch as the wgmmas (else ptxas injects fences).
template <int N>
__device__ __forceinline__ void wgmma_kstep(const uint32_t (&a)[4][4], const uint8_t* sb, float* acc) {
  cute::warpgroup_arrive();
#pragma unroll
  for (int j = 0; j < 4; ++j)
    detail::wgmma_call<N>(a[j], detail::sw128_desc(sb + j * 32), acc, std::make_index_sequence<N / 2>{});
  cute::warpgroup_commit_batch();
}
// Widest first: full tiles are the common case.
template <class Cfg, int... I>
__device__ __forceinline__ void wgmma_kstep(int n16, const uint32_t (&a)[4][4], const uint8_t* sb, float* acc,
                                            std::integer_sequence<int, I...>) {
  constexpr int kWidths = Cfg::NMAX / Cfg::N_STEP;
  ((n16 == kWidths - I ? wgmma_kstep<(kWidths - I) * Cfg::N_STEP>(a, sb, acc) : void()), ...);
}

// One K-step of a warpgroup on the activation slot, then a wait until only these wgmmas are in
// flight: the previous step's are complete, so its slot is released and its A registers may be
// overwritten. One main loop serves every tile width (a uniform branch per K-step picks the
// instruction), so all widths share the accumulators and ptxas pipelines the wgmmas.
template <class Cfg>
__device__ __forceinline__ void mma_kstep(const prefill_smem<Cfg>& sm, int n16, uint32_t (&a)[4][4],
                                          float (&acc)[Cfg::NMAX / 2], detail::ring_pos<Cfg::B_STAGES>& b,
                                          int& b_prev) {
  detail::wait_full(sm.b_full(b.slot), b.phase);
#pragma unroll
  for (int i = 0; i < Cfg::NMAX / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) cute::warpgroup_fence_operand(a[j][r]);
  wgmma_kstep<Cfg>(n16, a, sm.b_slot(b.slot), acc, std::make_integer_sequence<int, Cfg::NMAX / Cfg::N_STEP>{});
  cute::warpgroup_wait<1>();
#pragma unroll
  for (int i = 0; i < Cfg::NMAX / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
  if (b_prev >= 0) release_activations(sm, b_prev);
  b_prev = b.slot;
  b.advance();
}

// A warp's share of a weight stage: 16 code bytes and 4 scale bytes per K-step.
template <class Cfg>
__device__ __forceinline__ const uint8_t* fragment_codes(const prefill_smem<Cfg>& sm, int slot, int local_tile,
                                                         int kstep) {
  return sm.a_slot(slot) + (local_tile * Cfg::A_KSTEPS + kstep) * Cfg::TILE_CODES + (threadIdx.x & 31) * 16;
}
template <class Cfg>
__device__ __forceinline__ const uint8_t* fragment_scales(const prefill_smem<Cfg>& sm, int slot, int local_tile,
                                                          int kstep) {
  return sm.a_slot(slot) + Cfg::A_CODE_BYTES + (local_tile * Cfg::A_KSTEPS + kstep) * Cfg::TILE_SCALES +
         ((threadIdx.x & 31) >> 2) * 4;
}

template <class Cfg>
__device__ void consume_item(const prefill_smem<Cfg>& sm, const prefill_item& it, int ksteps, const gemm_weights& w,
                             const moe_workspace& ws, epilogue_kind ep, const activation_config& act,
                             detail::ring_pos<Cfg::A_STAGES>& a_pos, detail::ring_pos<Cfg::B_STAGES>& b_pos) {
  const int local_tile = threadIdx.x >> 5;  // warp q of warpgroup h: row tile 4h + q of the block
  const bool rows_valid = local_tile < it.row_tiles;
  const int n16 = __shfl_sync(0xFFFFFFFFu, (it.count + Cfg::N_STEP - 1) / Cfg::N_STEP, 0);
  float acc[Cfg::NMAX / 2];
#pragma unroll
  for (int i = 0; i < Cfg::NMAX / 2; ++i) acc[i] = 0.0f;
  // Zero A for a warp past the matrix's last row tile: its rows are computed and dropped.
  uint32_t a0[4][4] = {}, a1[4][4] = {};
  int b_prev = -1;
  for (int ks = 0; ks < ksteps; ks += Cfg::A_KSTEPS) {
    const bool second = ks + 1 < ksteps;
    detail::wait_full(sm.a_full(a_pos.slot), a_pos.phase);
    uint4 c0{}, c1{};
    uint32_t s0 = 0, s1 = 0;
    if (rows_valid) {
      c0 = *reinterpret_cast<const uint4*>(fragment_codes(sm, a_pos.slot, local_tile, 0));
      s0 = *reinterpret_cast<const uint32_t*>(fragment_scales(sm, a_pos.slot, local_tile, 0));
      if (second) {
        c1 = *reinterpret_cast<const uint4*>(fragment_codes(sm, a_pos.slot, local_tile, 1));
        s1 = *reinterpret_cast<const uint32_t*>(fragment_scales(sm, a_pos.slot, local_tile, 1));
      }
    }
    __syncwarp();
    if ((threadIdx.x & 31) == 0) detail::arrive(sm.a_empty(a_pos.slot));
    a_pos.advance();
    if (rows_valid) detail::dequant_fragment(c0, s0, a0);
    mma_kstep<Cfg>(sm, n16, a0, acc, b_pos, b_prev);
    if (second) {
      if (rows_valid) detail::dequant_fragment(c1, s1, a1);
      mma_kstep<Cfg>(sm, n16, a1, acc, b_pos, b_prev);
    }
  }
  cute::warpgroup_wait<0>();
#pragma unroll
  for (int i = 0; i < Cfg::NMAX / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
  release_activations(sm, b_prev);
  store_prefill_item<Cfg::NMAX>(acc, it, local_tile, w, ws, ep, act);
}

// A warpgroup whose 64 rows are all past the matrix (the last row block of a matrix with
// row_tiles % 8 <= 4) only keeps the rings' arrival counts.
template <class Cfg>
__device__ void skip_item(const prefill_smem<Cfg>& sm, int ksteps, detail::ring_pos<Cfg::A_STAGES>& a_pos,
                          detail::ring_pos<Cfg::B_STAGES>& b_pos) {
  const bool leader = (threadIdx.x & 31) == 0;
  for (int ks = 0; ks < ksteps; ++ks) {
    if (ks % Cfg::A_KSTEPS == 0) {
      detail::wait_full(sm.a_full(a_pos.slot), a_pos.phase);
      if (leader) detail::arrive(sm.a_empty(a_pos.slot));
      a_pos.advance();
    }
    detail::wait_full(sm.b_full(b_pos.slot), b_pos.phase);
    if (leader) detail::arrive(sm.b_empty(b_pos.slot));
    b_pos.advance();
  }
}

template <class Cfg>
__device__ void consume(const prefill_smem<Cfg>& sm, const gemm_weights& w, const moe_workspace& ws,
                        epilogue_kind ep, const activation_config& act, const prefill_grid& pg) {
  detail::ring_pos<Cfg::A_STAGES> a_pos;
  detail::ring_pos<Cfg::B_STAGES> b_pos;
  const int first_tile_of_group = (threadIdx.x >> 5) & ~3;
  for (int64_t i = blockIdx.x; i < pg.items; i += gridDim.x) {
    const prefill_item it = prefill_item_at<Cfg::ROW_TILES>(ws, pg, i);
    if (first_tile_of_group >= it.row_tiles) {
      skip_item<Cfg>(sm, pg.ksteps, a_pos, b_pos);
      continue;
    }
    consume_item<Cfg>(sm, it, pg.ksteps, w, ws, ep, act, a_pos, b_pos);
  }
}

// ---- kernel and launch -------------------------------------------------------------------

template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
    moe_gemm_prefill_kernel(const __grid_constant__ CUtensorMap b_map, gemm_weights w, moe_workspace ws,
                            epilogue_kind ep, activation_config act) {
  extern __shared__ uint8_t smem_raw[];
  // Aligned by offsetting smem_raw itself, so that the compiler still sees shared memory (LDS,
  // not generic loads, for the fragments).
  const uint32_t misalign = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023u;
  const prefill_smem<Cfg> sm{smem_raw + ((1024u - misalign) & 1023u)};
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int s = 0; s < Cfg::A_STAGES; ++s) {
      detail::barrier_init(sm.a_full(s), 1);
      detail::barrier_init(sm.a_empty(s), Cfg::CONSUMER_WARPS);
    }
    for (int s = 0; s < Cfg::B_STAGES; ++s) {
      detail::barrier_init(sm.b_full(s), 1);
      detail::barrier_init(sm.b_empty(s), Cfg::CONSUMER_WARPS);
    }
    detail::barrier_init_fence();
  }
  __syncthreads();
  const prefill_grid pg = make_prefill_grid<Cfg::ROW_TILES>(w, ws);
  if (warp == Cfg::WEIGHT_WARP) {
    if (lane == 0) load_weights<Cfg>(sm, w, ws, pg);
  } else if (warp == Cfg::ACTIVATION_WARP) {
    if (lane == 0) {
      cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&b_map));
      load_activations<Cfg>(sm, &b_map, ws, pg);
    }
  } else {
    consume<Cfg>(sm, w, ws, ep, act, pg);
  }
}

// Outside any stream capture (moe_layer's constructor): more than 48 KB of shared memory.
template <class Cfg>
cudaError_t allow_prefill_smem() {
  return cudaFuncSetAttribute(moe_gemm_prefill_kernel<Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              Cfg::SMEM_BYTES);
}

// One persistent CTA per SM, never more than the work items the schedule can make.
template <class Cfg>
void launch_gemm_prefill_with(const gemm_weights& w, const CUtensorMap& b_map, const moe_workspace& ws,
                              epilogue_kind ep, const activation_config& act, int64_t max_tiles, int sms,
                              cudaStream_t stream) {
  const layout::sm90_fragment frag{w.rows, w.cols};
  const int64_t items = max_tiles * layout::ceil_div(frag.row_tiles(), Cfg::ROW_TILES);
  const unsigned grid = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(sms, items)));
  moe_gemm_prefill_kernel<Cfg><<<grid, Cfg::THREADS, Cfg::SMEM_BYTES, stream>>>(b_map, w, ws, ep, act);
}

}  // namespace mxmoe::cuda::sm90
