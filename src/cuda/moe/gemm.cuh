// moe/gemm.cuh — the expert-grouped W4A16 GEMM of the MoE layer (both GEMMs), sm_90a.
//
// C[rows, tokens] = W_e[rows, K] · B[tokens, K]ᵀ for each scheduled tile (expert e, up to BN
// sorted token-expert pairs). The MXFP4 weights are the M operand (A, from registers), the bf16
// activations the N operand (B, K-major, from shared memory). One CTA computes BM weight rows x
// BN tokens. A pipeline stage holds KSTEPS K-steps of 64: per 16-row tile KSTEPS fragment tiles
// (layout::sm90_fragment, contiguous in memory: 512 code bytes + 32 scale bytes each) and BN
// activation rows of 128 bytes per K-step in the 128-byte-swizzled K-major layout that wgmma
// and ldmatrix read without bank conflicts (layout::sw128_rows).
// Stages are filled with cp.async, STAGES deep. Each lane reads its own A fragment with one
// 16-byte shared load and turns its four fragment words into bf16x2 registers with
// detail::dequant_fragment.
//
// Two tensor-core paths, one per tile shape:
//   mma.sync.m16n8k16 (legacy_decode: BN = 16): each warp WM x WN, B fragments by ldmatrix.
//     The decode path is gemm_decode.cuh; this one is kept selectable (docs/moe_layer.md).
//   wgmma.m64nBNk16 with A from registers (mid/large: BN = 64/128): each warpgroup 64 rows x BN;
//     a warp's register A fragment is exactly its 16-row fragment tile.
// fp32 accumulation over the whole K (no split-K: deterministic). Epilogues: epilogue.cuh.
// Launched as programmatic dependents (pdl.cuh): every CTA waits for the previous kernel first.
// Limits: K a multiple of 32 (the tail is zero-filled); rows a multiple of 16; B rows 16-byte
// aligned. Shapes are runtime values; the tile shapes are the three instantiations below.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include <cute/arch/copy_sm75.hpp>
#include <cute/arch/mma_sm80.hpp>

#include "mxmoe/activation.h"
#include "mxmoe/dtype.h"
#include "mxmoe/layout.h"
#include "mxmoe/mx.h"

#include "dequant.cuh"
#include "epilogue.cuh"
#include "kernels.h"
#include "mma.cuh"
#include "pdl.cuh"

namespace mxmoe::cuda::sm90 {

template <int BM_, int BN_, int WM_, int WN_, int STAGES_, int KSTEPS_, bool WGMMA_>
struct gemm_tile {
  static constexpr int BM = BM_, BN = BN_, WM = WM_, WN = WN_, STAGES = STAGES_, KSTEPS = KSTEPS_;
  static constexpr bool WGMMA = WGMMA_;
  static constexpr int WARPS_M = BM / WM, WARPS_N = BN / WN;
  static constexpr int THREADS = WARPS_M * WARPS_N * 32;
  static constexpr int MT = WM / 16;  // 16-row fragment tiles per warp
  static constexpr int NT = WN / 8;   // n8 token tiles per warp
  static constexpr int A_TILES = BM / 16;
  static constexpr int B_BYTES = KSTEPS * BN * 128;  // first: 1024-aligned for wgmma descriptors
  static constexpr int A_BYTES = A_TILES * KSTEPS * layout::sm90_fragment::kTileBytes;
  static constexpr int S_BYTES = A_TILES * KSTEPS * layout::sm90_fragment::kTileScaleBytes;
  static constexpr int STAGE_BYTES = (B_BYTES + A_BYTES + S_BYTES + 1023) / 1024 * 1024;
  static constexpr int SMEM_BYTES = 1024 + STAGES * STAGE_BYTES + BN * 8;  // + alignment, row indices
  static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 16 == 0, "tile shape");
  static_assert(!WGMMA || (WM == 16 && WN == BN && (BN == 64 || BN == 128) && WARPS_M % 4 == 0),
                "wgmma: each warp one 16-row tile, warpgroups of 64 rows x BN");
};

// The three instantiations (one per translation unit) and what they are for.
using legacy_decode_tile = gemm_tile<64, 16, 16, 16, 4, 4, false>;  // the decode path before gemm_decode.cuh
using mid_tile = gemm_tile<128, 64, 16, 64, 4, 1, true>;            // the 64-token transition
using large_tile = gemm_tile<128, 128, 16, 128, 4, 1, true>;        // prefill: tensor-core bound

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
  const int ksteps = (col_tiles + Cfg::KSTEPS - 1) / Cfg::KSTEPS;

  // Per B row: the activation row it reads, and (GEMM2) the pair it writes.
  int* row_src = reinterpret_cast<int*>(smem + Cfg::STAGES * Cfg::STAGE_BYTES);
  int* row_pair = row_src + Cfg::BN;
  detail::load_tile_rows(td, ws, ep, top_k, Cfg::BN, row_src, row_pair);
  __syncthreads();

  const uint8_t* a_codes = w.codes + td.expert * w.expert_code_stride;
  const uint8_t* a_scales = w.scales + td.expert * w.expert_scale_stride;

  // Stage layout: [B: KSTEPS][BN][128 B] [A: A_TILES][KSTEPS][512 B] [S: A_TILES][KSTEPS][32 B].
  // Each thread copies the same chunks of every stage: their sources and destinations are
  // worked out once here, so a stage costs an add and a cp.async per chunk.
  constexpr int kAChunks = Cfg::A_TILES * Cfg::KSTEPS * 32, kSChunks = Cfg::A_TILES * Cfg::KSTEPS * 2;
  constexpr int kBChunks = Cfg::KSTEPS * Cfg::BN * 8;
  constexpr int kAPer = (kAChunks + Cfg::THREADS - 1) / Cfg::THREADS;
  constexpr int kBPer = (kBChunks + Cfg::THREADS - 1) / Cfg::THREADS;
  const uint8_t* a_src[kAPer];  // nullptr: chunk out of range or beyond the matrix rows
  int a_kt[kAPer];              // K-step (fragment column tile) of the chunk within a stage
  const uint16_t* b_src[kBPer];
  int b_k[kBPer];  // element offset of the chunk within a stage's K range
#pragma unroll
  for (int i = 0; i < kAPer; ++i) {
    const int c = tid + i * Cfg::THREADS;
    const int t = c / (Cfg::KSTEPS * 32), q = c % (Cfg::KSTEPS * 32), rt = row_tile0 + t;
    a_kt[i] = q / 32;
    a_src[i] = c < kAChunks && rt < row_tiles ? a_codes + static_cast<int64_t>(rt) * col_tiles * 512 + q * 16 : nullptr;
  }
  const bool s_active = tid < kSChunks;
  const int s_t = tid / (Cfg::KSTEPS * 2), s_q = tid % (Cfg::KSTEPS * 2);
  const uint8_t* s_src =
      s_active && row_tile0 + s_t < row_tiles ? a_scales + static_cast<int64_t>(row_tile0 + s_t) * col_tiles * 32 + s_q * 16
                                             : nullptr;
#pragma unroll
  for (int i = 0; i < kBPer; ++i) {
    const int c = tid + i * Cfg::THREADS;
    const int st = c / (Cfg::BN * 8), r = (c / 8) % Cfg::BN, q = c & 7;
    const int src_row = c < kBChunks ? row_src[r] : -1;
    b_k[i] = st * 64 + q * 8;
    b_src[i] = src_row >= 0 ? b_rows + static_cast<int64_t>(src_row) * K + b_k[i] : nullptr;
  }
  static_assert(Cfg::A_TILES * Cfg::KSTEPS * 2 <= Cfg::THREADS, "one scale chunk per thread at most");

  auto load_stage = [&](int stage, int ks0) {
    uint8_t* sb = smem + stage * Cfg::STAGE_BYTES;
    uint8_t* sa = sb + Cfg::B_BYTES;
    uint8_t* ss = sa + Cfg::A_BYTES;
    const int kt0 = ks0 * Cfg::KSTEPS;
#pragma unroll
    for (int i = 0; i < kAPer; ++i) {
      const int c = tid + i * Cfg::THREADS;
      if (kAChunks % Cfg::THREADS == 0 || c < kAChunks) {
        const bool ok = a_src[i] != nullptr && kt0 + a_kt[i] < col_tiles;
        detail::cp_async_16(sa + c * 16, ok ? a_src[i] + static_cast<int64_t>(kt0) * 512 : a_codes, ok);
      }
    }
    if (s_active) {
      const bool ok = s_src != nullptr && kt0 + s_q / 2 < col_tiles;
      detail::cp_async_16(ss + tid * 16, ok ? s_src + static_cast<int64_t>(kt0) * 32 : a_scales, ok);
    }
#pragma unroll
    for (int i = 0; i < kBPer; ++i) {
      const int c = tid + i * Cfg::THREADS;
      if (kBChunks % Cfg::THREADS == 0 || c < kBChunks) {
        const int st = c / (Cfg::BN * 8), r = (c / 8) % Cfg::BN, q = c & 7;
        const bool ok = b_src[i] != nullptr && kt0 * 64 + b_k[i] < K;
        detail::cp_async_16(sb + st * Cfg::BN * 128 + layout::sw128_rows::offset(r, q), ok ? b_src[i] + kt0 * 64 : b_rows,
                            ok);
      }
    }
  };

  float acc[Cfg::MT][Cfg::NT][4];
#pragma unroll
  for (int mi = 0; mi < Cfg::MT; ++mi)
#pragma unroll
    for (int ni = 0; ni < Cfg::NT; ++ni)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mi][ni][q] = 0.0f;

  const int g = lane >> 2;

#pragma unroll
  for (int s = 0; s < Cfg::STAGES - 1; ++s) {
    if (s < ksteps) load_stage(s, s);
    cute::cp_async_fence();
  }

  for (int ks = 0; ks < ksteps; ++ks) {
    cute::cp_async_wait<Cfg::STAGES - 2>();
    if constexpr (Cfg::WGMMA) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    {
      const int nk = ks + Cfg::STAGES - 1;
      if (nk < ksteps) load_stage(nk % Cfg::STAGES, nk);
      cute::cp_async_fence();
    }
    const uint8_t* sb = smem + (ks % Cfg::STAGES) * Cfg::STAGE_BYTES;
    const uint8_t* sa = sb + Cfg::B_BYTES;
    const uint8_t* ss = sa + Cfg::A_BYTES;

#pragma unroll
    for (int kk = 0; kk < Cfg::KSTEPS; ++kk) {
      uint32_t a[Cfg::MT][4][4];
#pragma unroll
      for (int mi = 0; mi < Cfg::MT; ++mi) {
        const int t = wm * Cfg::MT + mi;
        detail::dequant_fragment(*reinterpret_cast<const uint4*>(sa + (t * Cfg::KSTEPS + kk) * 512 + lane * 16),
                                 *reinterpret_cast<const uint32_t*>(ss + (t * Cfg::KSTEPS + kk) * 32 + g * 4), a[mi]);
      }
      const uint8_t* sbk = sb + kk * Cfg::BN * 128;
      if constexpr (Cfg::WGMMA) {
        float* d = &acc[0][0][0];
#pragma unroll
        for (int i = 0; i < Cfg::NT * 4; ++i) cute::warpgroup_fence_operand(d[i]);
        cute::warpgroup_arrive();
#pragma unroll
        for (int j = 0; j < 4; ++j)
          detail::wgmma_call<Cfg::BN>(a[0][j], detail::sw128_desc(sbk + j * 32), d,
                                      std::make_index_sequence<Cfg::BN / 2>{});
        cute::warpgroup_commit_batch();
        cute::warpgroup_wait<0>();
#pragma unroll
        for (int i = 0; i < Cfg::NT * 4; ++i) cute::warpgroup_fence_operand(d[i]);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint32_t bf[Cfg::NT][2];
#pragma unroll
          for (int np = 0; np < Cfg::NT / 2; ++np) {
            const int row = wn * Cfg::WN + np * 16 + (lane & 7) + ((lane >> 4) << 3);
            const int chunk = j * 2 + ((lane >> 3) & 1);
            const void* addr = sbk + layout::sw128_rows::offset(row, chunk);
            cute::SM75_U32x4_LDSM_N::copy(*static_cast<const cute::uint128_t*>(addr), bf[2 * np][0], bf[2 * np][1],
                                          bf[2 * np + 1][0], bf[2 * np + 1][1]);
          }
#pragma unroll
          for (int mi = 0; mi < Cfg::MT; ++mi)
#pragma unroll
            for (int ni = 0; ni < Cfg::NT; ++ni) {
              float* c = acc[mi][ni];
              cute::SM80_16x8x16_F32BF16BF16F32_TN::fma(c[0], c[1], c[2], c[3], a[mi][j][0], a[mi][j][1], a[mi][j][2],
                                                        a[mi][j][3], bf[ni][0], bf[ni][1], c[0], c[1], c[2], c[3]);
            }
        }
      }
    }
  }
  cute::cp_async_wait<0>();

#pragma unroll
  for (int mi = 0; mi < Cfg::MT; ++mi) {
    const int rt = row_tile0 + wm * Cfg::MT + mi;
    if (rt < row_tiles) detail::store_row_tile<Cfg::NT>(acc[mi], rt, wn * Cfg::WN, td,
                                                        detail::pairs_from_rows{row_pair, ws.weights}, w, ws, ep, act);
  }
  __syncthreads();  // the next tile reuses shared memory
}

// Two CTAs per SM for the wgmma shapes (one's barrier and dequantization overlap the other's
// tensor-core work), three for decode (more loads in flight).
template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::WGMMA ? 2 : 3)
    moe_gemm_kernel(gemm_weights w, const uint16_t* __restrict__ b_rows, moe_workspace ws, int top_k,
                    epilogue_kind ep, activation_config act) {
  extern __shared__ uint8_t smem_raw[];
  // wgmma's 128-byte swizzle is a function of address bits 4..9: stages start 1024-aligned.
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  detail::wait_for_previous_grid();
  detail::allow_dependent_launch();
  const int num_tiles = *ws.num_tiles;
  for (int tile_id = blockIdx.y; tile_id < num_tiles; tile_id += gridDim.y)
    gemm_tile_body<Cfg>(smem, ws.tiles[tile_id], w, b_rows, ws, top_k, ep, act);
}

// Outside any stream capture (moe_layer's constructor): more than 48 KB of shared memory.
// The whole carveout goes to shared memory so that several CTAs fit on an SM.
template <class Cfg>
cudaError_t allow_gemm_smem() {
  const cudaError_t e =
      cudaFuncSetAttribute(moe_gemm_kernel<Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SMEM_BYTES);
  if (e != cudaSuccess) return e;
  return cudaFuncSetAttribute(moe_gemm_kernel<Cfg>, cudaFuncAttributePreferredSharedMemoryCarveout,
                              cudaSharedmemCarveoutMaxShared);
}

template <class Cfg>
void launch_gemm_with(const gemm_launch& l, const gemm_weights& w, const uint16_t* b_rows, const moe_workspace& ws,
                      int top_k, epilogue_kind ep, const activation_config& act, cudaStream_t stream) {
  const layout::sm90_fragment frag{w.rows, w.cols};
  const dim3 grid(static_cast<unsigned>(layout::ceil_div(frag.row_tiles(), Cfg::A_TILES)),
                  static_cast<unsigned>(l.max_tiles < 65535 ? l.max_tiles : 65535));
  launch_pdl(moe_gemm_kernel<Cfg>, grid, dim3(Cfg::THREADS), Cfg::SMEM_BYTES, stream, l.dependent, w, b_rows, ws,
             top_k, ep, act);
}

}  // namespace mxmoe::cuda::sm90
