// moe/combine.cu — out[t, :] = sum over slots j (in slot order) of ybuf[t*k + j, :], the
// routing-weighted expert outputs GEMM2 wrote. A fixed order keeps the layer deterministic
// (no atomics on the output). Dropped slots (id -1) contribute nothing. Each thread owns 8
// consecutive hidden values: 16-byte loads and stores. A programmatic dependent of GEMM2
// (pdl.cuh).
#include <cuda_runtime.h>

#include "check.h"
#include "mxmoe/dtype.h"
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
  float acc[8] = {};
  for (int j = 0; j < top_k; ++j) {
    const int64_t p = t * top_k + j;
    if (ids[p] < 0) continue;
    const uint4 y = *reinterpret_cast<const uint4*>(ybuf + p * hidden + v * 8);
    const uint32_t w[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      acc[2 * q] += bf16_to_float(static_cast<uint16_t>(w[q] & 0xFFFFu));
      acc[2 * q + 1] += bf16_to_float(static_cast<uint16_t>(w[q] >> 16));
    }
  }
  uint32_t o[4];
#pragma unroll
  for (int q = 0; q < 4; ++q)
    o[q] = static_cast<uint32_t>(float_to_bf16(acc[2 * q])) | (static_cast<uint32_t>(float_to_bf16(acc[2 * q + 1])) << 16);
  *reinterpret_cast<uint4*>(out + t * hidden + v * 8) = make_uint4(o[0], o[1], o[2], o[3]);
}

}  // namespace

void launch_combine(int64_t tokens, int top_k, int64_t hidden, const moe_workspace& ws, uint16_t* out,
                    bool dependent, cudaStream_t stream) {
  const int64_t n = tokens * (hidden / 8);
  launch_pdl(combine_kernel, dim3(static_cast<unsigned>((n + 255) / 256)), dim3(256), 0, stream, dependent, tokens,
             top_k, hidden, static_cast<const int32_t*>(ws.ids), static_cast<const uint16_t*>(ws.ybuf), out);
}

}  // namespace mxmoe::cuda::sm90
