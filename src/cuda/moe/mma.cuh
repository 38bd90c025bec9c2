// moe/mma.cuh — the tensor-core and copy primitives the MoE GEMMs issue: cp.async with zero
// fill, cp.async by shared address, ldmatrix by shared address, the wgmma shared-memory
// descriptor of a 128-byte-swizzled K-major bf16 tile, and the wgmma m64nNk16 (A from
// registers) calls, through CuTe's wrappers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include <cute/arch/copy_sm80.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/arch/mma_sm90_gmma_ext.hpp>

namespace mxmoe::cuda::sm90::detail {

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool pred) {
  cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>::copy(
      *static_cast<const cute::uint128_t*>(gmem), *static_cast<cute::uint128_t*>(smem), pred);
}

// cp.async of 16 bytes by shared address; with pred false nothing is read and 16 zero bytes land.
__device__ __forceinline__ void cp_async_16_zfill(uint32_t smem_addr, const void* gmem, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr), "l"(gmem), "r"(pred ? 16 : 0)
               : "memory");
}

// cp.async of 16 bytes by shared address, bypassing L1. No L2 cache hint: the same copies with
// `.L2::cache_hint` and an evict-first policy (createpolicy) raised "an illegal instruction was
// encountered" at their first launch on an H200 (driver 580, nvcc 13.0; commit eba76a8,
// 2026-12-01), and without the hint they run and pass.
__device__ __forceinline__ void cp_async_16_shared(uint32_t smem_addr, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr), "l"(gmem) : "memory");
}

// ldmatrix .x4 (four 8x8 b16 matrices; lane l gives the row address of matrix l / 8).
__device__ __forceinline__ void ldsm_x4(uint32_t smem_addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(smem_addr));
}

// wgmma descriptor of a K-major, 128-byte-swizzled bf16 tile (8-row atoms 1024 bytes apart).
__device__ __forceinline__ uint64_t sw128_desc(const void* smem) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

// wgmma m64nNk16 (bf16 in, f32 accumulators, A from registers) for every N the GEMMs issue:
// 64 and 128 (the fixed tiles of gemm.cuh) and every multiple of 16 up to 176 (the per-tile
// widths of gemm_prefill.cuh).
template <int BN>
struct wgmma_rs;
#define MXMOE_WGMMA_RS(N)                                                                        \
  template <>                                                                                    \
  struct wgmma_rs<N> {                                                                           \
    using op = cute::SM90::GMMA::MMA_64x##N##x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K,      \
                                                                cute::SM90::GMMA::Major::K>;     \
  };
MXMOE_WGMMA_RS(16)
MXMOE_WGMMA_RS(32)
MXMOE_WGMMA_RS(48)
MXMOE_WGMMA_RS(64)
MXMOE_WGMMA_RS(80)
MXMOE_WGMMA_RS(96)
MXMOE_WGMMA_RS(112)
MXMOE_WGMMA_RS(128)
MXMOE_WGMMA_RS(144)
MXMOE_WGMMA_RS(160)
MXMOE_WGMMA_RS(176)
#undef MXMOE_WGMMA_RS

template <int BN, size_t... I>
__device__ __forceinline__ void wgmma_call(const uint32_t (&a)[4], uint64_t desc, float* d, std::index_sequence<I...>) {
  wgmma_rs<BN>::op::fma(a[0], a[1], a[2], a[3], desc, d[I]...);
}

}  // namespace mxmoe::cuda::sm90::detail
