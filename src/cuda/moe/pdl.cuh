// moe/pdl.cuh — programmatic dependent launch for the MoE layer's kernels.
//
// Every kernel of one forward is launched as a programmatic dependent of the one before it
// (launch_pdl), so that its CTAs are scheduled while that one drains instead of after it ends.
// The contract each kernel keeps:
//   * wait_for_previous_grid() before touching memory the previous kernel writes or reads (it
//     returns once that grid has completed and its writes are visible; immediately when the
//     kernel was not launched as a dependent). Read-only data written by earlier kernels of the
//     same forward (the tile list, before GEMM2) and the weights may be read before it: the
//     previous kernel only lets its dependents in after its own wait (see below), so the kernel
//     before it has completed by then.
//   * allow_dependent_launch() only after its own wait: from there on the next kernel may be
//     scheduled.
// Inside a CUDA graph the launches become programmatic edges.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "check.h"

namespace mxmoe::cuda::sm90 {
namespace detail {

__device__ __forceinline__ void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void allow_dependent_launch() { asm volatile("griddepcontrol.launch_dependents;"); }

}  // namespace detail

// Launches kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent of the
// preceding work in the stream when `dependent` is set.
template <class... Params, class... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                bool dependent, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attr;
  config.numAttrs = dependent ? 1 : 0;
  MXMOE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace mxmoe::cuda::sm90
