// sm90_moe_gemm.cuh — the expert-grouped W4A16 GEMM of the MoE layer (both GEMMs), sm_90a.
//
// C[rows, tokens] = W_e[rows, K] · B[tokens, K]ᵀ for each scheduled tile (expert e, up to BN
// sorted token-expert pairs). The MXFP4 weights are the M operand (mma.sync.m16n8k16 A, row
// major), the bf16 activations the N operand (B, K-major). One CTA computes BM weight rows x
// BN tokens; warps split it into WM x WN. A K-step is one 16x64 fragment tile (layout.h,
// sm90_fragment): per stage the CTA copies BM/16 tiles of 512 code bytes + 32 scale bytes and
// BN activation rows of 128 bytes (swizzled 16-byte chunks, so ldmatrix is conflict-free) with
// cp.async, STAGES deep. Each lane then reads its own A fragment with one 16-byte shared load,
// turns 8 E2M1 codes into four bf16x2 registers with integer ops (mx::e2m1x2_to_bf16x2_pow2m126)
// and two bf16x2 multiplies (by 2^126, then by the block scale: both exact), and issues
// WN/8 mmas per 16 rows. fp32 accumulation over the whole K (no split-K: deterministic).
//
// Epilogues (runtime, uniform per launch):
//   gate_up_activation: rows come in layout::gate_up_rows order, so accumulator rows g and
//     g+8 are gate and up of output j = 16-row-tile*8 + g: act(gate + b, up + b) -> act[s, j].
//   weighted_down: (acc + b2) * routing weight -> ybuf[pair, n] (bf16).
// Limits: K a multiple of 32 (the last K-step may be half empty: zero-filled); rows a multiple
// of 16; B rows 16-byte aligned (K*2 bytes apart). Shapes are runtime values; the tile shape is
// one of three instantiations (sm90_moe_gemm_{decode,mid,large}.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include <cute/arch/copy_sm75.hpp>
#include <cute/arch/copy_sm80.hpp>
#include <cute/arch/mma_sm80.hpp>

#include "mxmoe/activation.h"
#include "mxmoe/dtype.h"
#include "mxmoe/layout.h"
#include "mxmoe/mx.h"
#include "sm90_moe.h"

namespace mxmoe::cuda::sm90 {

template <int BM_, int BN_, int WM_, int WN_, int STAGES_>
struct gemm_tile {
  static constexpr int BM = BM_, BN = BN_, WM = WM_, WN = WN_, STAGES = STAGES_;
  static constexpr int BK = layout::sm90_fragment::kTileCols;  // 64
  static constexpr int WARPS_M = BM / WM, WARPS_N = BN / WN;
  static constexpr int THREADS = WARPS_M * WARPS_N * 32;
  static constexpr int MT = WM / 16;  // 16-row fragment tiles per warp
  static constexpr int NT = WN / 8;   // n8 token tiles per warp
  static constexpr int A_TILES = BM / 16;
  static constexpr int A_BYTES = A_TILES * layout::sm90_fragment::kTileBytes;
  static constexpr int S_BYTES = A_TILES * layout::sm90_fragment::kTileScaleBytes;
  static constexpr int B_BYTES = BN * BK * 2;
  static constexpr int STAGE_BYTES = A_BYTES + S_BYTES + B_BYTES;
  static constexpr int SMEM_BYTES = STAGES * STAGE_BYTES + BN * 8;  // + per-row indices
  static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 16 == 0, "tile shape");
  static_assert(STAGE_BYTES % 128 == 0, "stages stay 128-byte aligned");
};

// The three instantiations (one per translation unit) and what they are for.
using decode_tile = gemm_tile<64, 16, 16, 16, 8>;   // few tokens per expert: DRAM-bound, deep pipeline
using mid_tile = gemm_tile<128, 64, 32, 32, 4>;     // the 64-token transition
using large_tile = gemm_tile<128, 128, 32, 64, 4>;  // prefill: tensor-core bound

cudaError_t allow_gemm_smem_decode();
cudaError_t allow_gemm_smem_mid();
cudaError_t allow_gemm_smem_large();
void launch_gemm_decode(const gemm_weights&, const uint16_t*, const moe_workspace&, int, epilogue_kind,
                        const activation_config&, int64_t, cudaStream_t);
void launch_gemm_mid(const gemm_weights&, const uint16_t*, const moe_workspace&, int, epilogue_kind,
                     const activation_config&, int64_t, cudaStream_t);
void launch_gemm_large(const gemm_weights&, const uint16_t*, const moe_workspace&, int, epilogue_kind,
                       const activation_config&, int64_t, cudaStream_t);

namespace detail {

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

__device__ __forceinline__ uint32_t scale_bf16x2(uint32_t scale_byte) {
  const uint32_t h = mx::e8m0_to_bf16_bits(static_cast<uint8_t>(scale_byte));
  return h | (h << 16);
}

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool pred) {
  cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>::copy(
      *static_cast<const cute::uint128_t*>(gmem), *static_cast<cute::uint128_t*>(smem), pred);
}

}  // namespace detail

template <class Cfg>
__device__ __forceinline__ void gemm_tile_body(uint8_t* smem, const tile_desc td, const gemm_weights& w,
                                               const uint16_t* __restrict__ b_rows, const moe_workspace& ws,
                                               int top_k, epilogue_kind ep, const activation_config& act) {
  const layout::sm90_fragment frag{w.rows, w.cols};
  const int row_tiles = static_cast<int>(frag.row_tiles()), col_tiles = static_cast<int>(frag.col_tiles());
  const int row_tile0 = blockIdx.x * Cfg::A_TILES;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp % Cfg::WARPS_M, wn = warp / Cfg::WARPS_M;
  const int K = static_cast<int>(w.cols);

  // Per B row: the activation row it reads, and (GEMM2) the pair it writes.
  int* row_src = reinterpret_cast<int*>(smem + Cfg::STAGES * Cfg::STAGE_BYTES);
  int* row_pair = row_src + Cfg::BN;
  for (int r = tid; r < Cfg::BN; r += Cfg::THREADS) {
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

  const uint8_t* a_codes = w.codes + td.expert * w.expert_code_stride;
  const uint8_t* a_scales = w.scales + td.expert * w.expert_scale_stride;

  auto load_stage = [&](int stage, int kt) {
    uint8_t* sa = smem + stage * Cfg::STAGE_BYTES;
    uint8_t* ss = sa + Cfg::A_BYTES;
    uint8_t* sb = ss + Cfg::S_BYTES;
    for (int c = tid; c < Cfg::A_TILES * 32; c += Cfg::THREADS) {
      const int t = c >> 5, rt = row_tile0 + t;
      const bool ok = rt < row_tiles;
      const uint8_t* src = a_codes + (static_cast<int64_t>(ok ? rt : 0) * col_tiles + kt) * 512 + (c & 31) * 16;
      detail::cp_async_16(sa + c * 16, src, ok);
    }
    for (int c = tid; c < Cfg::A_TILES * 2; c += Cfg::THREADS) {
      const int t = c >> 1, rt = row_tile0 + t;
      const bool ok = rt < row_tiles;
      const uint8_t* src = a_scales + (static_cast<int64_t>(ok ? rt : 0) * col_tiles + kt) * 32 + (c & 1) * 16;
      detail::cp_async_16(ss + c * 16, src, ok);
    }
    for (int c = tid; c < Cfg::BN * 8; c += Cfg::THREADS) {
      const int r = c >> 3, q = c & 7;
      const int src_row = row_src[r];
      const int k0 = kt * Cfg::BK + q * 8;
      const bool ok = src_row >= 0 && k0 < K;
      const uint16_t* src = b_rows + (ok ? static_cast<int64_t>(src_row) * K + k0 : 0);
      detail::cp_async_16(sb + r * 128 + ((q ^ (r & 7)) << 4), src, ok);
    }
  };

  float acc[Cfg::MT][Cfg::NT][4];
#pragma unroll
  for (int mi = 0; mi < Cfg::MT; ++mi)
#pragma unroll
    for (int ni = 0; ni < Cfg::NT; ++ni)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mi][ni][q] = 0.0f;

  const uint32_t pow2_126 = static_cast<uint32_t>(mx::kBf16Pow2_126) * 0x00010001u;
  const int g = lane >> 2;

#pragma unroll
  for (int s = 0; s < Cfg::STAGES - 1; ++s) {
    if (s < col_tiles) load_stage(s, s);
    cute::cp_async_fence();
  }

  for (int kt = 0; kt < col_tiles; ++kt) {
    cute::cp_async_wait<Cfg::STAGES - 2>();
    __syncthreads();
    {
      const int nk = kt + Cfg::STAGES - 1;
      if (nk < col_tiles) load_stage(nk % Cfg::STAGES, nk);
      cute::cp_async_fence();
    }
    const uint8_t* sa = smem + (kt % Cfg::STAGES) * Cfg::STAGE_BYTES;
    const uint8_t* ss = sa + Cfg::A_BYTES;
    const uint8_t* sb = ss + Cfg::S_BYTES;

    uint4 af[Cfg::MT];
    uint32_t sc[Cfg::MT][4];  // [kb*2 + row half]: bf16x2 scale multipliers
#pragma unroll
    for (int mi = 0; mi < Cfg::MT; ++mi) {
      const int t = wm * Cfg::MT + mi;
      af[mi] = *reinterpret_cast<const uint4*>(sa + t * 512 + lane * 16);
      const uint32_t sw = *reinterpret_cast<const uint32_t*>(ss + t * 32 + g * 4);
#pragma unroll
      for (int q = 0; q < 4; ++q) sc[mi][q] = detail::scale_bf16x2((sw >> (8 * q)) & 0xFFu);
    }

#pragma unroll
    for (int j = 0; j < 4; ++j) {  // k16 steps of this 64-wide K-step
      uint32_t bf[Cfg::NT][2];
#pragma unroll
      for (int np = 0; np < Cfg::NT / 2; ++np) {
        const int row = wn * Cfg::WN + np * 16 + (lane & 7) + ((lane >> 4) << 3);
        const int chunk = j * 2 + ((lane >> 3) & 1);
        const void* addr = sb + row * 128 + ((chunk ^ (row & 7)) << 4);
        cute::SM75_U32x4_LDSM_N::copy(*static_cast<const cute::uint128_t*>(addr), bf[2 * np][0], bf[2 * np][1],
                                      bf[2 * np + 1][0], bf[2 * np + 1][1]);
      }
#pragma unroll
      for (int mi = 0; mi < Cfg::MT; ++mi) {
        const uint32_t word = j == 0 ? af[mi].x : j == 1 ? af[mi].y : j == 2 ? af[mi].z : af[mi].w;
        const uint32_t s_lo = sc[mi][(j >> 1) * 2 + 0], s_hi = sc[mi][(j >> 1) * 2 + 1];
        const uint32_t a0 = detail::bf16x2_mul(detail::bf16x2_mul(mx::e2m1x2_to_bf16x2_pow2m126(word, 0), pow2_126), s_lo);
        const uint32_t a1 = detail::bf16x2_mul(detail::bf16x2_mul(mx::e2m1x2_to_bf16x2_pow2m126(word, 4), pow2_126), s_hi);
        const uint32_t a2 = detail::bf16x2_mul(detail::bf16x2_mul(mx::e2m1x2_to_bf16x2_pow2m126(word, 8), pow2_126), s_lo);
        const uint32_t a3 = detail::bf16x2_mul(detail::bf16x2_mul(mx::e2m1x2_to_bf16x2_pow2m126(word, 12), pow2_126), s_hi);
#pragma unroll
        for (int ni = 0; ni < Cfg::NT; ++ni) {
          float* c = acc[mi][ni];
          cute::SM80_16x8x16_F32BF16BF16F32_TN::fma(c[0], c[1], c[2], c[3], a0, a1, a2, a3, bf[ni][0], bf[ni][1],
                                                    c[0], c[1], c[2], c[3]);
        }
      }
    }
  }
  cute::cp_async_wait<0>();

  // ---- epilogue ----
  const int t4 = lane & 3;
  const int64_t expert = td.expert;
#pragma unroll
  for (int mi = 0; mi < Cfg::MT; ++mi) {
    const int rt = row_tile0 + wm * Cfg::MT + mi;
    if (rt >= row_tiles) continue;
    const int64_t r0 = static_cast<int64_t>(rt) * 16 + g, r1 = r0 + 8;
    const float b0 = w.bias ? w.bias[expert * w.rows + r0] : 0.0f;
    const float b1 = w.bias ? w.bias[expert * w.rows + r1] : 0.0f;
#pragma unroll
    for (int ni = 0; ni < Cfg::NT; ++ni) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = wn * Cfg::WN + ni * 8 + 2 * t4 + h;
        if (r >= td.count) continue;
        const float v0 = acc[mi][ni][h] + b0, v1 = acc[mi][ni][2 + h] + b1;
        if (ep == epilogue_kind::gate_up_activation) {
          const int64_t inter = w.rows / 2;
          const int64_t j_out = static_cast<int64_t>(rt) * 8 + g;
          ws.act[static_cast<int64_t>(td.start + r) * inter + j_out] = float_to_bf16(activate(v0, v1, act));
        } else {
          const int pair = row_pair[r];
          const float wt = ws.weights[pair];
          uint16_t* y = ws.ybuf + static_cast<int64_t>(pair) * w.rows;
          y[r0] = float_to_bf16(v0 * wt);
          y[r1] = float_to_bf16(v1 * wt);
        }
      }
    }
  }
  __syncthreads();  // the next tile reuses shared memory
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS)
    moe_gemm_kernel(gemm_weights w, const uint16_t* __restrict__ b_rows, moe_workspace ws, int top_k,
                    epilogue_kind ep, activation_config act) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int num_tiles = *ws.num_tiles;
  for (int tile_id = blockIdx.y; tile_id < num_tiles; tile_id += gridDim.y)
    gemm_tile_body<Cfg>(smem, ws.tiles[tile_id], w, b_rows, ws, top_k, ep, act);
}

// Outside any stream capture (moe_layer's constructor): more than 48 KB of shared memory.
template <class Cfg>
cudaError_t allow_gemm_smem() {
  return cudaFuncSetAttribute(moe_gemm_kernel<Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SMEM_BYTES);
}

template <class Cfg>
void launch_gemm_with(const gemm_weights& w, const uint16_t* b_rows, const moe_workspace& ws, int top_k,
                      epilogue_kind ep, const activation_config& act, int64_t max_tiles, cudaStream_t stream) {
  const layout::sm90_fragment frag{w.rows, w.cols};
  const dim3 grid(static_cast<unsigned>(layout::ceil_div(frag.row_tiles(), Cfg::A_TILES)),
                  static_cast<unsigned>(max_tiles < 65535 ? max_tiles : 65535));
  moe_gemm_kernel<Cfg><<<grid, Cfg::THREADS, Cfg::SMEM_BYTES, stream>>>(w, b_rows, ws, top_k, ep, act);
}

}  // namespace mxmoe::cuda::sm90
