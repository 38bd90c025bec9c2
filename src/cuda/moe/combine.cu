// moe/combine.cu — out[t, :] = sum over slots j (in slot order) of ybuf[t*k + j, :], the
// routing-weighted expert outputs GEMM2 wrote (combine.cuh's combine_vector). A fixed order keeps
// the layer deterministic (no atomics on the output). Dropped slots (id -1) contribute nothing.
// Each thread owns 8 consecutive hidden values: 16-byte loads and stores. A programmatic dependent
// of GEMM2 (pdl.cuh). (Folding it into GEMM2, the last CTA of a token summing, was measured
// slower: docs/performance.md, 2026-12-05.)
#include <cuda_runtime.h>

#include "check.h"
#include "combine.cuh"
#include "kernels.h"
#include "pdl.cuh"

namespace mxmoe::cuda::sm90 {
namespace {

__global__ void combine_kernel(int64_t tokens, int top_k, int64_t hidden, const int32_t* __restrict__ ids,
                               const uint16_t* __restrict__ ybuf, uint16_t* __restrict__ out) {
  detail::wait_for_previous_grid();
  detail::allow_dependent_launch();
  const int64_t vecs = hidden / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * vecs) return;
  const int64_t t = i / vecs, v = i % vecs;
  const uint32_t mask = detail::valid_slots(ids, t, top_k);
  *reinterpret_cast<uint4*>(out + t * hidden + v * 8) = detail::combine_vector(ybuf, t * top_k, mask, hidden, v * 8);
}

}  // namespace

void launch_combine(int64_t tokens, int top_k, int64_t hidden, const moe_workspace& ws, uint16_t* out,
                    bool dependent, cudaStream_t stream) {
  const int64_t n = tokens * (hidden / 8);
  launch_pdl(combine_kernel, dim3(static_cast<unsigned>((n + 255) / 256)), dim3(256), 0, stream, dependent, tokens,
             top_k, hidden, static_cast<const int32_t*>(ws.ids), static_cast<const uint16_t*>(ws.ybuf), out);
}

}  // namespace mxmoe::cuda::sm90
