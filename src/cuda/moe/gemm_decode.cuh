// moe/gemm_decode.cuh — the decode GEMM of the MoE layer (both GEMMs), sm_90a: few tokens per
// expert, so the time is the time to stream the touched experts' MXFP4 weights.
//
// C[rows, tokens] = W_e[rows, K] · B[tokens, K]ᵀ for each scheduled tile (expert e, up to BN =
// 8 * NT sorted token-expert pairs). A CTA has 8 warps (4 in the narrow CTA of 8-token tiles);
// each warp owns one 16-row fragment tile (layout::sm90_fragment) and one of k_groups contiguous
// K ranges (warps_m = warps / k_groups row tiles per CTA; k_groups > 1 only when there are too
// few tiles to fill the GPU, e.g. T = 1).
//
// A pipeline stage is kSteps fragment tiles (64 k each) of every warp's K range:
//   weights (A): each warp's kSteps fragment tiles (a row tile's fragment tiles are contiguous
//     along K: 2 KB of codes and 128 bytes of scales per stage) copied by the warp's lanes with
//     cp.async (16 bytes each, kSteps + 1 copies a lane; no L2 hint: mma.cuh says why) and read back with one
//     16-byte and one 4-byte shared load per lane and tile; detail::dequant_fragment turns them
//     into bf16.
//   activations (B): BN rows x 64 k per fragment tile and K group, gathered with cp.async into
//     128-byte swizzled rows (layout::sw128_rows: ldmatrix reads them without bank
//     conflicts); rows at or beyond the tile's count are never loaded (the columns they feed are
//     never stored), the K tail is zero-filled (its weights are zero codes, and 0 * garbage
//     could be NaN).
// kStages stages, kStages - 1 in flight (~4.3 KB of weights per warp): one cp.async group per
// stage and thread, waited for with cp.async.wait_group, so the copies stay in flight across
// loop iterations. Filling the last slot too before the first wait made both GEMMs slower: it
// delays the first stage (docs/performance.md, thirtieth session). (Loads into registers do not: ptxas waits for every outstanding load at a
// loop head, which drained a register ring every trip — measured at ~50% of the copy rate.)
// mma.sync.m16n8k16 per 8-token block in use (the tile's count, rounded up to 8).
// With k_groups > 1 the partial sums of the K groups are added through shared memory in group
// order before the epilogue: fixed order, deterministic. fp32 accumulation throughout.
//
// Launched as a programmatic dependent (pdl.cuh): GEMM2 (early_weights) reads its tile, starts
// copying weights and reads its pairs and routing weights into registers (epilogue.cuh,
// pairs_in_registers) before waiting for GEMM1; its B rows are the sorted positions (no load).
// B rows beyond a tile's count take no shared memory either: the ring holds ring_rows rows per
// fragment tile (gemm_launch::ring_rows, e.g. 1 at T = 1), so that few-token launches fit three CTAs per SM
// with their K split over more warps.
// Limits: K a multiple of 32; rows a multiple of 16; B rows 16-byte aligned; the tile list from
// the one-CTA plan (at most 65535 tiles); no tile with more pairs than ring_rows.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include <cute/arch/copy_sm80.hpp>
#include <cute/arch/mma_sm80.hpp>

#include "mxmoe/layout.h"

#include "dequant.cuh"
#include "epilogue.cuh"
#include "kernels.h"
#include "mma.cuh"
#include "pdl.cuh"

namespace mxmoe::cuda::sm90 {

template <int NT_, int WARPS_ = kDecodeWarps>
struct decode_shape {
  static constexpr int NT = NT_;                   // 8-token blocks per tile
  static constexpr int BN = 8 * NT;                // tokens per tile
  static constexpr int kWarps = WARPS_, kThreads = kWarps * 32;
  static constexpr int kSteps = 4;                 // fragment tiles per stage and warp
  static constexpr int kStages = 3;                // stages, kStages - 1 in flight
  // k_groups * BN <= 32, and the narrow CTA keeps two row tiles at least.
  static constexpr int kMaxGroups = 4 / NT < kWarps / 2 ? 4 / NT : kWarps / 2;
  // CTAs per SM the registers are bounded for. The 16-token CTA fits 3 per SM (77 registers,
  // 3 x 75 KB of shared memory) only when its tile rows live in the ring (kRowsInRing); the
  // 8-token one fits 3 with 79 registers under the bound for 2, the narrow one 6 under 6.
  static constexpr int kMinBlocks = kWarps == kDecodeWarpsNarrow ? 6 : NT == 2 ? 3 : 2;
  // The tile's row array (BN ints) in the B part of the last ring slot, which no copy writes
  // before the main loop's first barrier, instead of after the ring: what a third 16-token CTA
  // per SM needs. (GEMM2's epilogue keeps its pairs in registers.)
  static constexpr bool kRowsInRing = NT == 2;
  static constexpr int kRowBytes = 128;            // one B row of one fragment tile
  static constexpr int kCodeBytes = kSteps * layout::sm90_fragment::kTileBytes;        // a warp's codes per stage
  static constexpr int kScaleBytes = kSteps * layout::sm90_fragment::kTileScaleBytes;  // ... and scales
  static constexpr int kAWarpBytes = kCodeBytes + kScaleBytes;
  static constexpr int kAStageBytes = kWarps * kAWarpBytes;  // [warp][codes: step][512 B] [scales: step][32 B]
  static_assert(kScaleBytes == 16 * 2 * kSteps, "two lanes' 16-byte copies per fragment tile's scales");
  // B cp.async chunks of a stage with k_groups K groups, per thread (each thread always copies
  // the same row and 16-byte column, for chunks(k_groups) of the stage's k_groups * kSteps
  // fragment tiles, kTileStride apart).
  static constexpr int kTileStride = kThreads / 8 / BN;
  static constexpr int chunks(int k_groups) { return k_groups * kSteps * BN * 8 / kThreads; }
  static_assert(chunks(1) * kTileStride == kSteps, "chunks cover a stage");
  // ring_rows: B rows per fragment tile in shared memory, a power of 2 <= BN that holds every
  // tile's count (rows at or beyond the count are never copied nor read: ldmatrix reads row 0 for
  // them).
  static constexpr int b_stage_bytes(int k_groups, int ring_rows) { return k_groups * kSteps * ring_rows * kRowBytes; }
  static constexpr int stage_bytes(int k_groups, int ring_rows) { return kAStageBytes + b_stage_bytes(k_groups, ring_rows); }
  static constexpr int smem_bytes(int k_groups, int ring_rows) {
    return kStages * stage_bytes(k_groups, ring_rows) + (kRowsInRing ? 0 : BN * 4);
  }
  static_assert(!kRowsInRing || b_stage_bytes(1, 1) >= BN * 4, "the rows fit in a slot's B part");
  static_assert(kAStageBytes % 128 == 0, "B stages stay 128-byte aligned");
};

using decode_8 = decode_shape<1>;
using decode_16 = decode_shape<2>;
using decode_8_narrow = decode_shape<1, kDecodeWarpsNarrow>;

// KG: K groups (k_groups); kScalesInRange: gemm_weights::scales_in_range (the dequantization's
// per-fragment test of the scale bytes left out).
template <class S, int KG, bool kScalesInRange>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    moe_gemm_decode_kernel(gemm_weights w, const uint16_t* __restrict__ b_rows, moe_workspace ws, int top_k,
                           epilogue_kind ep, activation_config act, bool early_weights, int ring_rows,
                           bool one_b_row) {
  static_assert(KG >= 1 && KG <= S::kMaxGroups && S::kWarps % KG == 0, "1, 2 or 4 K groups of whole warps");
  // The K groups are a template parameter so that a thread's B chunks of groups that do not exist
  // (and their copy state) are no code at all: the per-stage copy bookkeeping, not the tensor
  // cores, is what the kernel issues most besides the conversion.
  constexpr int kWarpsM = S::kWarps / KG;
  constexpr int kChunks = S::chunks(KG);
  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp % kWarpsM, wk = warp / kWarpsM;
  const layout::sm90_fragment frag{w.rows, w.cols};
  const int row_tiles = static_cast<int>(frag.row_tiles()), col_tiles = static_cast<int>(frag.col_tiles());
  const int K = static_cast<int>(w.cols);
  const int rt = blockIdx.x * kWarpsM + wm;
  const bool active = rt < row_tiles;  // warp-uniform; idle warps still copy B and meet barriers

  // K range of group g: col_tiles split as evenly as possible, the first `rem` groups one longer.
  const int per = col_tiles / KG, rem = col_tiles % KG;
  auto group_begin = [&](int g) { return g * per + (g < rem ? g : rem); };
  auto group_tiles = [&](int g) { return per + (g < rem ? 1 : 0); };
  const int kt0 = group_begin(wk), nk = group_tiles(wk);
  const int num_stages = (group_tiles(0) + S::kSteps - 1) / S::kSteps;

  // Stage s lives at smem + (s % kStages) * stage_bytes: [A: warps][2176 B] [B: tiles][ring_rows][128 B].
  const uint32_t stage_bytes = S::stage_bytes(KG, ring_rows), b_tile_bytes = ring_rows * S::kRowBytes;
  const uint32_t ring_bytes = S::kStages * stage_bytes;
  const uint32_t smem_u32 = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  auto next_slot = [&](uint32_t off) { return off + stage_bytes == ring_bytes ? 0u : off + stage_bytes; };

  if (!early_weights) detail::wait_for_previous_grid();
  if (static_cast<int>(blockIdx.y) >= __ldcg(ws.num_tiles)) return;
  const int* tdp = reinterpret_cast<const int*>(ws.tiles + blockIdx.y);
  const tile_desc td{__ldcg(tdp), __ldcg(tdp + 1), __ldcg(tdp + 2)};
  if (td.count > ring_rows) __trap();  // the launcher's bound on a tile's pairs (gemm_launch::ring_rows) was wrong

  // Weights: fragment tiles kt0.. of row tile rt. Per stage this lane copies its 16 code bytes of
  // each of the kSteps tiles, and lanes < 2 * kSteps 16 of the stage's kSteps * 32 scale bytes.
  // The copy state advances one stage per call (a_left <= 0: nothing left to copy); only the K
  // range's last stage can be partial, and only it tests each copy (a_left is warp-uniform).
  const int64_t tile0 = static_cast<int64_t>(rt) * col_tiles + kt0;
  const uint8_t* a_src = w.codes + td.expert * w.expert_code_stride + tile0 * 512 + lane * 16;
  const uint8_t* s_src = w.scales + td.expert * w.expert_scale_stride + tile0 * 32 + lane * 16;
  const uint32_t a_dst = smem_u32 + warp * S::kAWarpBytes + lane * 16;
  // The stage's fragment tile whose scale bytes this lane copies (lanes >= 2 * kSteps copy none).
  const bool s_lane = lane < 2 * S::kSteps;
  const int s_tile = s_lane ? lane / 2 : 1 << 30;
  int a_left = active ? nk : 0;
  auto load_a_stage = [&](uint32_t slot) {
    if (a_left >= S::kSteps) {
#pragma unroll
      for (int i = 0; i < S::kSteps; ++i) detail::cp_async_16_shared(a_dst + slot + i * 512, a_src + i * 512);
      if (s_lane) detail::cp_async_16_shared(a_dst + slot + S::kCodeBytes, s_src);
    } else {
#pragma unroll
      for (int i = 0; i < S::kSteps; ++i)
        if (i < a_left) detail::cp_async_16_shared(a_dst + slot + i * 512, a_src + i * 512);
      if (s_tile < a_left) detail::cp_async_16_shared(a_dst + slot + S::kCodeBytes, s_src);
    }
    a_src += S::kSteps * 512;
    s_src += S::kSteps * 32;
    a_left -= S::kSteps;
  };
  uint32_t load_slot = 0;
#pragma unroll
  for (int s = 0; s < S::kStages - 1; ++s) {
    load_a_stage(load_slot);
    load_slot = next_slot(load_slot);
  }
  // GEMM2's pairs and routing weights, in sorted order since the plan (before GEMM1): read now,
  // before the wait, so that the epilogue has them.
  detail::pairs_in_registers<S::NT> pairs;
  if (ep == epilogue_kind::weighted_down) pairs.load(td, ws, 0);
  if (early_weights) detail::wait_for_previous_grid();
  detail::allow_dependent_launch();

  // Per B row: the activation row it reads (GEMM2: its sorted position; GEMM1 at T = 1: row 0;
  // neither loads).
  int* row_src = reinterpret_cast<int*>(smem + ring_bytes - (S::kRowsInRing ? S::b_stage_bytes(KG, ring_rows) : 0));
  detail::load_tile_rows(td, ws, ep, top_k, S::BN, row_src, nullptr, one_b_row);
  __syncthreads();

  // This thread's B chunks: row cr, 16-byte column cq, fragment tiles ct0 + i * kTileStride of a
  // stage (stage tile index = group * kSteps + step). Per chunk, fixed for the kernel: its
  // element offset in the row at stage 0, the fragment tiles of its K group from there (a stage
  // copies it while its first tile is below that; 0 for rows beyond the count, which are never
  // loaded), and the elements of the row from there (below the stage's k: the K tail,
  // zero-filled). The stage's k is the only copy state that moves.
  const int cq = tid & 7, cr = (tid >> 3) % S::BN, ct0 = (tid >> 3) / S::BN;
  const bool c_row = cr < td.count;
  const uint16_t* c_row_src = b_rows + (c_row ? static_cast<int64_t>(row_src[cr]) * K : 0) + cq * 8;
  const uint32_t c_dst = smem_u32 + S::kAStageBytes + ct0 * b_tile_bytes + static_cast<uint32_t>(layout::sw128_rows::offset(cr, cq));
  int b_koff[kChunks], b_tiles[kChunks], b_kleft[kChunks];
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int st = ct0 + i * S::kTileStride, g = st / S::kSteps, step = st % S::kSteps;
    b_koff[i] = (group_begin(g) + step) * 64;
    b_tiles[i] = c_row ? group_tiles(g) - step : 0;
    b_kleft[i] = K - b_koff[i] - cq * 8;
  }
  int b_stage = 0;  // fragment tiles of each K group copied before this stage
  auto load_b_stage = [&](uint32_t slot) {
    const int k = b_stage * 64;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      if (b_stage < b_tiles[i]) {
        const bool in = k < b_kleft[i];
        detail::cp_async_16_zfill(c_dst + slot + i * S::kTileStride * b_tile_bytes,
                                  c_row_src + (in ? b_koff[i] + k : 0), in);
      }
    }
    b_stage += S::kSteps;
  };
  // One cp.async group per stage: group 0 = A stages 0 .. kStages-2 and B stage 0, group s = B
  // stage s for s < kStages - 1, then group s = A and B of stage s, committed kStages - 1 earlier.
  load_slot = 0;
#pragma unroll
  for (int s = 0; s < S::kStages - 1; ++s) {
    load_b_stage(load_slot);
    load_slot = next_slot(load_slot);
    cute::cp_async_fence();
  }

  // ldmatrix row address of block 0: lane l reads row l % 8 (row 0 instead when that token is
  // beyond the count: with ring_rows < 8 the row is not in the tile) at 16-byte chunk 2j + l / 8
  // for the k16 pair (j, j + 1), j = 0 or 2. Chunk 4 + c of a row is chunk c's address xor 64
  // (rows are 128 bytes, 128-byte aligned, and 4 + c = 4 ^ c for c < 4), so one address per block.
  // Block n > 0 is read only when the count exceeds 8n, so then ring_rows >= 8(n + 1) and block 0
  // was not clamped: its address is block 0's plus 8n rows (same swizzle, row % 8 = l % 8), an
  // immediate offset. Its rows at or beyond the count hold whatever an earlier stage left there;
  // they feed only columns that are never stored (an mma's columns do not mix).
  const int b_row0 = (lane & 7) < td.count ? (lane & 7) : 0;
  const uint32_t b_off = smem_u32 + S::kAStageBytes + wk * S::kSteps * b_tile_bytes +
                         static_cast<uint32_t>(layout::sw128_rows::offset(b_row0, lane >> 3));
  const int blocks_used = (td.count + 7) / 8;
  const uint8_t* a_codes = smem + warp * S::kAWarpBytes + lane * 16;
  const uint8_t* a_scales = smem + warp * S::kAWarpBytes + S::kCodeBytes + (lane >> 2) * 4;

  float acc[S::NT][4];
#pragma unroll
  for (int n = 0; n < S::NT; ++n)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[n][q] = 0.0f;

  uint32_t use_slot = 0;
  for (int st = 0; st < num_stages; ++st) {
    cute::cp_async_wait<S::kStages - 2>();
    __syncthreads();  // stage st is in; every warp is done with stage st - 1, whose slot is refilled
    if (st + S::kStages - 1 < num_stages) {
      load_a_stage(load_slot);
      load_b_stage(load_slot);
    }
    cute::cp_async_fence();
    load_slot = next_slot(load_slot);
    const uint32_t slot = use_slot;
    use_slot = next_slot(use_slot);
    if (!active) continue;
    // Fragment tile i of the stage: dequantize, then one mma per 8-token block in use.
    auto consume_tile = [&](int i) {
      uint32_t a[4][4];
      detail::dequant_fragment<kScalesInRange>(*reinterpret_cast<const uint4*>(a_codes + slot + i * 512),
                               *reinterpret_cast<const uint32_t*>(a_scales + slot + i * 32), a);
#pragma unroll
      for (int n = 0; n < S::NT; ++n) {
        if (n > 0 && n >= blocks_used) break;  // block 0 is always in use
        uint32_t b[4][2];
        const uint32_t bt = b_off + slot + i * b_tile_bytes + n * 8 * S::kRowBytes;
        detail::ldsm_x4(bt, b[0][0], b[0][1], b[1][0], b[1][1]);
        detail::ldsm_x4(bt ^ 64u, b[2][0], b[2][1], b[3][0], b[3][1]);
        float* c = acc[n];
#pragma unroll
        for (int j = 0; j < 4; ++j)
          cute::SM80_16x8x16_F32BF16BF16F32_TN::fma(c[0], c[1], c[2], c[3], a[j][0], a[j][1], a[j][2], a[j][3],
                                                    b[j][0], b[j][1], c[0], c[1], c[2], c[3]);
      }
    };
    const int tiles = nk - st * S::kSteps;  // >= 1
    if (tiles >= S::kSteps) {
#pragma unroll
      for (int i = 0; i < S::kSteps; ++i) consume_tile(i);
    } else {
      for (int i = 0; i < tiles; ++i) consume_tile(i);  // the K range's last, partial stage
    }
  }
  cute::cp_async_wait<0>();
  __syncthreads();  // the stages are free: the K groups' partial sums go there

  if constexpr (KG > 1) {
    float* red = reinterpret_cast<float*>(smem);  // [KG - 1][kWarpsM][NT][4][32]
    if (wk > 0 && active)
#pragma unroll
      for (int n = 0; n < S::NT; ++n)
#pragma unroll
        for (int q = 0; q < 4; ++q) red[((((wk - 1) * kWarpsM + wm) * S::NT + n) * 4 + q) * 32 + lane] = acc[n][q];
    __syncthreads();
    if (wk == 0 && active)
#pragma unroll
      for (int g = 1; g < KG; ++g)
#pragma unroll
        for (int n = 0; n < S::NT; ++n)
#pragma unroll
          for (int q = 0; q < 4; ++q) acc[n][q] += red[((((g - 1) * kWarpsM + wm) * S::NT + n) * 4 + q) * 32 + lane];
  }
  if (wk == 0 && active) detail::store_row_tile<S::NT>(acc, rt, 0, td, pairs, w, ws, ep, act);
}

}  // namespace mxmoe::cuda::sm90
