// moe/gemm_decode.cuh — the decode GEMM of the MoE layer (both GEMMs), sm_90a: few tokens per
// expert, so the time is the time to stream the touched experts' MXFP4 weights.
//
// C[rows, tokens] = W_e[rows, K] · B[tokens, K]ᵀ for each scheduled tile (expert e, up to BN =
// 8 * NT sorted token-expert pairs). A CTA has 8 warps; each warp owns one 16-row fragment tile
// (layout::sm90_fragment) and one of k_groups contiguous K ranges (warps_m = 8 / k_groups row
// tiles per CTA; k_groups > 1 only when there are too few tiles to fill the GPU, e.g. T = 1).
//
//   weights (A): each lane loads its own 16 code bytes (one fragment tile = four k16 steps of its
//     mma A fragment; a warp reads 512 contiguous bytes) and 4 scale bytes straight from global
//     memory into registers, kRing fragment tiles ahead (~4.3 KB in flight per warp), and turns
//     them into bf16 with detail::dequant_fragment — no shared memory, no copies.
//   activations (B): BN rows x 64 k per fragment tile, gathered with cp.async into shared memory
//     (128-byte rows, 16-byte chunk c of row r at c ^ (r % 8): ldmatrix reads it without bank
//     conflicts), kStages stages of kSteps fragment tiles per K group; rows at or beyond the
//     tile's count are never loaded (the columns they feed are never stored), the K tail is
//     zero-filled (its weights are zero codes, and 0 * garbage could be NaN).
//   mma.sync.m16n8k16 per 8-token block in use (the tile's count, rounded up to 8).
// With k_groups > 1 the partial sums of the K groups are added through shared memory in group
// order before the epilogue: fixed order, deterministic. fp32 accumulation throughout.
//
// Launched as a programmatic dependent (pdl.cuh): GEMM2 (early_weights) reads its tile and starts
// streaming weights before waiting for GEMM1.
// Limits: K a multiple of 32; rows a multiple of 16; B rows 16-byte aligned; the tile list from
// the one-CTA plan (at most 65535 tiles).
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

template <int NT_>
struct decode_shape {
  static constexpr int NT = NT_;                   // 8-token blocks per tile
  static constexpr int BN = 8 * NT;                // tokens per tile
  static constexpr int kWarps = kDecodeWarps, kThreads = kWarps * 32;
  static constexpr int kSteps = 4;                 // fragment tiles per B stage and K group
  static constexpr int kStages = 4;                // B stages, kStages - 1 in flight
  static constexpr int kRing = 2 * kSteps;         // fragment tiles per warp in registers
  static constexpr int kMaxGroups = 4 / NT;        // so that k_groups * BN <= 32
  static constexpr int kRowBytes = 128;            // one B row of one fragment tile
  // cp.async chunks of a full stage, per thread (each thread always copies the same row and
  // 16-byte column, for kChunks of the stage's k_groups * kSteps fragment tiles).
  static constexpr int kChunks = kMaxGroups * kSteps * BN * 8 / kThreads;
  static constexpr int kTileStride = kThreads / 8 / BN;  // fragment tiles between a thread's chunks
  static_assert(kChunks * kTileStride == kMaxGroups * kSteps, "chunks cover a stage");
  static constexpr int stage_bytes(int k_groups) { return k_groups * kSteps * BN * kRowBytes; }
  static constexpr int smem_bytes(int k_groups) { return kStages * stage_bytes(k_groups) + 2 * BN * 4; }
};

using decode_8 = decode_shape<1>;
using decode_16 = decode_shape<2>;
using decode_32 = decode_shape<4>;

template <class S>
__global__ void __launch_bounds__(S::kThreads, 2)
    moe_gemm_decode_kernel(gemm_weights w, const uint16_t* __restrict__ b_rows, moe_workspace ws, int top_k,
                           epilogue_kind ep, activation_config act, int k_groups, bool early_weights) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warps_m = S::kWarps / k_groups;
  const int wm = warp % warps_m, wk = warp / warps_m;
  const layout::sm90_fragment frag{w.rows, w.cols};
  const int row_tiles = static_cast<int>(frag.row_tiles()), col_tiles = static_cast<int>(frag.col_tiles());
  const int K = static_cast<int>(w.cols);
  const int rt = blockIdx.x * warps_m + wm;
  const bool active = rt < row_tiles;  // warp-uniform; idle warps still copy B and meet barriers

  // K range of group g: col_tiles split as evenly as possible, the first `rem` groups one longer.
  const int per = col_tiles / k_groups, rem = col_tiles % k_groups;
  auto group_begin = [&](int g) { return g * per + (g < rem ? g : rem); };
  auto group_tiles = [&](int g) { return per + (g < rem ? 1 : 0); };
  const int kt0 = group_begin(wk), nk = group_tiles(wk);
  const int num_stages = (group_tiles(0) + S::kSteps - 1) / S::kSteps;

  if (!early_weights) detail::wait_for_previous_grid();
  if (static_cast<int>(blockIdx.y) >= __ldcg(ws.num_tiles)) return;
  const int* tdp = reinterpret_cast<const int*>(ws.tiles + blockIdx.y);
  const tile_desc td{__ldcg(tdp), __ldcg(tdp + 1), __ldcg(tdp + 2)};

  // Weights: this lane's bytes of fragment tile kt0 + i of row tile rt are at a_codes + i * 512.
  const int64_t tile0 = static_cast<int64_t>(rt) * col_tiles + kt0;
  const uint8_t* a_codes = w.codes + td.expert * w.expert_code_stride + tile0 * 512 + lane * 16;
  const uint8_t* a_scales = w.scales + td.expert * w.expert_scale_stride + tile0 * 32 + (lane >> 2) * 4;
  const uint64_t policy = detail::l2_evict_first_policy();
  uint4 ra[S::kRing];
  uint32_t rs[S::kRing];
#pragma unroll
  for (int i = 0; i < S::kRing; ++i) {
    ra[i] = make_uint4(0, 0, 0, 0);
    rs[i] = 0;
    if (active && i < nk) {
      ra[i] = detail::ldg_stream_v4(a_codes + i * 512, policy);
      rs[i] = detail::ldg_stream_u32(a_scales + i * 32, policy);
    }
  }
  if (early_weights) detail::wait_for_previous_grid();
  detail::allow_dependent_launch();

  // Per B row: the activation row it reads, and (GEMM2) the pair it writes.
  const int stage_bytes = S::stage_bytes(k_groups);
  int* row_src = reinterpret_cast<int*>(smem + S::kStages * stage_bytes);
  int* row_pair = row_src + S::BN;
  for (int r = tid; r < S::BN; r += S::kThreads) {
    int src = -1, pair = -1;
    if (r < td.count) {
      const int s = td.start + r;
      pair = ws.sorted[s];
      src = ep == epilogue_kind::gate_up_activation ? pair / top_k : s;
    }
    row_src[r] = src;
    row_pair[r] = pair;
  }
  __syncthreads();

  // This thread's B chunks: row cr, 16-byte column cq, fragment tiles ct0 + i * kTileStride of a
  // stage (stage tile index = group * kSteps + step). Offsets are in elements.
  const int cq = tid & 7, cr = (tid >> 3) % S::BN, ct0 = (tid >> 3) / S::BN;
  const bool c_row = cr < td.count;
  const uint16_t* c_src = b_rows + (c_row ? static_cast<int64_t>(row_src[cr]) * K : 0) + cq * 8;
  const uint32_t c_dst = static_cast<uint32_t>((ct0 * S::BN + cr) * S::kRowBytes + ((cq ^ (cr & 7)) << 4));
  int c_koff[S::kChunks], c_left[S::kChunks];  // K offset at stage 0; fragment tiles left in the group
#pragma unroll
  for (int i = 0; i < S::kChunks; ++i) {
    const int st = ct0 + i * S::kTileStride, g = st / S::kSteps, step = st % S::kSteps;
    const bool in = c_row && g < k_groups;
    c_koff[i] = in ? (group_begin(g) + step) * 64 : 0;
    c_left[i] = in ? group_tiles(g) - step : 0;
  }
  auto load_b_stage = [&](int stage) {
    uint8_t* base = smem + (stage % S::kStages) * stage_bytes + c_dst;
#pragma unroll
    for (int i = 0; i < S::kChunks; ++i) {
      if (stage * S::kSteps < c_left[i]) {
        const int k = c_koff[i] + stage * S::kSteps * 64;
        const bool in_k = k + cq * 8 < K;  // else the K tail: zero fill, read nothing
        detail::cp_async_16(base + i * S::kTileStride * S::BN * S::kRowBytes, in_k ? c_src + k : c_src, in_k);
      }
    }
  };
#pragma unroll
  for (int s = 0; s < S::kStages - 1; ++s) {
    if (s < num_stages) load_b_stage(s);
    cute::cp_async_fence();
  }

  // ldmatrix row addresses of each 8-token block: lane l reads row 8n + l % 8 (row 0 instead when
  // that token is beyond the count: its column is never stored) at 16-byte chunk 2j + l / 8 for
  // the k16 pair (j, j + 1), j = 0 or 2.
  const uint32_t smem_u32 = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  uint32_t b_off[S::NT][2];
#pragma unroll
  for (int n = 0; n < S::NT; ++n) {
    const int row = 8 * n + (lane & 7) < td.count ? 8 * n + (lane & 7) : 0;
#pragma unroll
    for (int h = 0; h < 2; ++h)
      b_off[n][h] = static_cast<uint32_t>(row * S::kRowBytes + (((4 * h + (lane >> 3)) ^ (row & 7)) << 4));
  }
  const int blocks_used = (td.count + 7) / 8;

  float acc[S::NT][4];
#pragma unroll
  for (int n = 0; n < S::NT; ++n)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[n][q] = 0.0f;

  for (int st0 = 0; st0 < num_stages; st0 += 2) {
    // This trip's fragment tiles kt = 2 * kSteps * trip + slot; the refills are kRing further on.
    const uint8_t* a_next = a_codes + (st0 * S::kSteps + S::kRing) * 512;
    const uint8_t* s_next = a_scales + (st0 * S::kSteps + S::kRing) * 32;
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // two stages per trip: register ring slots are constants
      const int st = st0 + half;
      if (st >= num_stages) break;
      cute::cp_async_wait<S::kStages - 2>();
      __syncthreads();
      if (st + S::kStages - 1 < num_stages) load_b_stage(st + S::kStages - 1);
      cute::cp_async_fence();
      if (!active) continue;
      const uint32_t sb = smem_u32 + (st % S::kStages) * stage_bytes + wk * S::kSteps * S::BN * S::kRowBytes;
      uint32_t sbn[S::NT][2];
#pragma unroll
      for (int n = 0; n < S::NT; ++n) sbn[n][0] = sb + b_off[n][0], sbn[n][1] = sb + b_off[n][1];
#pragma unroll
      for (int i = 0; i < S::kSteps; ++i) {
        const int kt = st * S::kSteps + i, slot = half * S::kSteps + i;
        if (kt >= nk) break;
        uint32_t a[4][4];
        detail::dequant_fragment(ra[slot], rs[slot], a);
        if (kt + S::kRing < nk) {
          ra[slot] = detail::ldg_stream_v4(a_next + slot * 512, policy);
          rs[slot] = detail::ldg_stream_u32(s_next + slot * 32, policy);
        }
#pragma unroll
        for (int n = 0; n < S::NT; ++n) {
          if (n >= blocks_used) break;
          uint32_t b[4][2];
          detail::ldsm_x4(sbn[n][0] + i * S::BN * S::kRowBytes, b[0][0], b[0][1], b[1][0], b[1][1]);
          detail::ldsm_x4(sbn[n][1] + i * S::BN * S::kRowBytes, b[2][0], b[2][1], b[3][0], b[3][1]);
          float* c = acc[n];
#pragma unroll
          for (int j = 0; j < 4; ++j)
            cute::SM80_16x8x16_F32BF16BF16F32_TN::fma(c[0], c[1], c[2], c[3], a[j][0], a[j][1], a[j][2], a[j][3],
                                                      b[j][0], b[j][1], c[0], c[1], c[2], c[3]);
        }
      }
    }
  }
  cute::cp_async_wait<0>();
  __syncthreads();  // the stages are free: the K groups' partial sums go there

  if (k_groups > 1) {
    float* red = reinterpret_cast<float*>(smem);  // [k_groups - 1][warps_m][NT][4][32]
    if (wk > 0 && active)
#pragma unroll
      for (int n = 0; n < S::NT; ++n)
#pragma unroll
        for (int q = 0; q < 4; ++q) red[((((wk - 1) * warps_m + wm) * S::NT + n) * 4 + q) * 32 + lane] = acc[n][q];
    __syncthreads();
    if (wk == 0 && active)
      for (int g = 1; g < k_groups; ++g)
#pragma unroll
        for (int n = 0; n < S::NT; ++n)
#pragma unroll
          for (int q = 0; q < 4; ++q) acc[n][q] += red[((((g - 1) * warps_m + wm) * S::NT + n) * 4 + q) * 32 + lane];
  }
  if (wk == 0 && active) detail::store_row_tile<S::NT>(acc, rt, 0, td, row_pair, w, ws, ep, act);
}

}  // namespace mxmoe::cuda::sm90
