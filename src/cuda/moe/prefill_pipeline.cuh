// moe/prefill_pipeline.cuh — the shared-memory rings of the prefill GEMM (gemm_prefill.cuh) and
// the copies that fill them, through libcu++'s cuda::ptx wrappers (every one a compiler memory
// barrier, which the plain shared-memory loads of the weight fragments rely on).
//
// A ring has STAGES slots. Each slot has a "full" mbarrier (one arrival: the producer's, with the
// bytes it expects; the bulk-copy engine completes the transaction) and an "empty" mbarrier (one
// arrival per consumer warp once the slot's bytes are no longer needed). Both sides walk the
// slots in the same order, so a slot's barrier is never more than one phase ahead of a waiter.
#pragma once

#include <cuda.h>

#include <cstdint>

#include <cuda/ptx>

namespace mxmoe::cuda::sm90::detail {

// A slot of a ring and the parity of its current use.
template <int STAGES>
struct ring_pos {
  int slot = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++slot == STAGES) {
      slot = 0;
      phase ^= 1u;
    }
  }
};

__device__ __forceinline__ void barrier_init(uint64_t* bar, uint32_t arrivals) {
  ::cuda::ptx::mbarrier_init(bar, arrivals);
}

// Makes the initialised barriers visible to the bulk-copy engine; a __syncthreads must follow.
__device__ __forceinline__ void barrier_init_fence() {
  ::cuda::ptx::fence_mbarrier_init(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster);
}

// Consumers: until the current use of the slot is filled.
__device__ __forceinline__ void wait_full(uint64_t* bar, uint32_t phase) {
  while (!::cuda::ptx::mbarrier_try_wait_parity(bar, phase)) {
  }
}

// Producers: until the consumers released the slot's previous use (the first use passes at once:
// the phase before a barrier's first is complete by definition).
__device__ __forceinline__ void wait_empty(uint64_t* bar, uint32_t phase) { wait_full(bar, phase ^ 1u); }

__device__ __forceinline__ void arrive(uint64_t* bar) {
  ::cuda::ptx::mbarrier_arrive(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta, ::cuda::ptx::space_shared, bar);
}

// The producer's arrival on a full barrier, with the bytes its copies will deliver.
__device__ __forceinline__ void arrive_expect_bytes(uint64_t* bar, uint32_t bytes) {
  ::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta, ::cuda::ptx::space_shared,
                                         bar, bytes);
}

// One box of a 2-D / 3-D tensor map at the given coordinates (innermost first); elements outside
// the tensor arrive as zeros and count towards the transaction bytes.
__device__ __forceinline__ void tma_load_2d(void* smem, const CUtensorMap* map, int32_t c0, int32_t c1,
                                            uint64_t* bar) {
  const int32_t coords[2] = {c0, c1};
  ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_cluster, ::cuda::ptx::space_global, smem, map, coords, bar);
}
// With an L2 cache policy (`l2_policy`: a createpolicy encoding such as cute::TMA::CacheHintSm90's):
// which lines the L2 gives up first when it needs room.
__device__ __forceinline__ void tma_load_3d(void* smem, const CUtensorMap* map, int32_t c0, int32_t c1, int32_t c2,
                                            uint64_t* bar, uint64_t l2_policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4, %5}], [%2], %6;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(smem))),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))), "r"(c0), "r"(c1),
      "r"(c2), "l"(l2_policy)
      : "memory");
}

// Orders this thread's ordinary shared-memory reads of a slot before the copy engine's next
// writes into it (generic proxy, then async proxy); executed before the slot is released.
__device__ __forceinline__ void fence_reads_before_copies() {
  ::cuda::ptx::fence_proxy_async(::cuda::ptx::space_shared);
}

}  // namespace mxmoe::cuda::sm90::detail
