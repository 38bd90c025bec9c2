// moe/l2_hint.cuh — 16-byte global loads and stores with an L2 cache policy (`.L2::cache_hint`,
// PTX ISA 7.4+, sm_80+): how long the L2 keeps the line relative to others, as a createpolicy
// encoding (cute::TMA::CacheHintSm90's, moe_workspace's policies). The MoE layer uses them where
// one kernel writes what the next one reads once: GEMM2's outputs, stored evict-last so that the
// combine finds them in the L2, and read there evict-first, since nothing reads them again.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mxmoe::cuda::sm90::detail {

__device__ __forceinline__ void store_16_l2_hint(void* p, uint4 v, uint64_t policy) {
  asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w), "l"(policy));
}

__device__ __forceinline__ uint4 load_16_l2_hint(const void* p, uint64_t policy) {
  uint4 v;
  // Not volatile and no memory clobber: the loads it serves are of data no kernel thread writes, so
  // the compiler may batch and schedule them as plain loads.
  asm("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "l"(policy));
  return v;
}

}  // namespace mxmoe::cuda::sm90::detail
