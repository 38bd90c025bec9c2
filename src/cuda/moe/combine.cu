// moe/combine.cu — out[t, :] = sum over slots j (in slot order) of ybuf[t*k + j, :], the
// routing-weighted expert outputs GEMM2 wrote (combine_vector; read with the L2 policy
// moe_workspace::ybuf_load_l2_policy). A fixed order keeps
// the layer deterministic (no atomics on the output). Dropped slots (id -1) contribute nothing.
// Each thread owns 8 consecutive hidden values: 16-byte loads and stores. A programmatic dependent
// of GEMM2 (pdl.cuh). (Folding it into GEMM2, the last CTA of a token summing, was measured
// slower: docs/performance.md, 2026-12-05.)
#include <cuda_runtime.h>

#include "check.h"
#include "mxmoe/dtype.h"
#include "kernels.h"
#include "l2_hint.cuh"
#include "pdl.cuh"

namespace mxmoe::cuda::sm90 {
namespace {

// Bit j of the result: slot j of token t is valid (ids[t*k + j] >= 0; a dropped slot's ybuf row is
// never written). k <= 16.
__device__ __forceinline__ uint32_t valid_slots(const int32_t* ids, int64_t t, int top_k) {
  uint32_t mask = 0;
  for (int j = 0; j < top_k; ++j) mask |= ids[t * top_k + j] >= 0 ? 1u << j : 0u;
  return mask;
}

// The bf16x8 vector of out[t, col ..) (col a multiple of 8; pair0 = t*k). The loads are issued
// kBatch slots at a time, the adds stay in slot order: one memory round trip for top-8 routing,
// where a load per slot after the previous one's add cost k round trips (4-6 us at T = 1 under
// ncu, docs/performance.md, 2026-12-05).
__device__ __forceinline__ uint4 combine_vector(const uint16_t* ybuf, int64_t pair0, uint32_t mask, int64_t hidden,
                                                int64_t col, uint64_t load_policy) {
  constexpr int kBatch = 8;
  float acc[8] = {};
  while (mask != 0) {
    uint4 y[kBatch];
    int n = 0;
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (mask == 0) break;
      const int j = __ffs(mask) - 1;
      mask &= mask - 1;
      y[u] = detail::load_16_l2_hint(ybuf + (pair0 + j) * hidden + col, load_policy);
      n = u + 1;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (u >= n) break;
      const uint32_t w[4] = {y[u].x, y[u].y, y[u].z, y[u].w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        acc[2 * q] += bf16_to_float(static_cast<uint16_t>(w[q] & 0xFFFFu));
        acc[2 * q + 1] += bf16_to_float(static_cast<uint16_t>(w[q] >> 16));
      }
    }
  }
  uint32_t o[4];
#pragma unroll
  for (int q = 0; q < 4; ++q)
    o[q] = static_cast<uint32_t>(float_to_bf16(acc[2 * q])) | (static_cast<uint32_t>(float_to_bf16(acc[2 * q + 1])) << 16);
  return make_uint4(o[0], o[1], o[2], o[3]);
}


__global__ void combine_kernel(int64_t tokens, int top_k, int64_t hidden, const int32_t* __restrict__ ids,
                               const uint16_t* __restrict__ ybuf, uint64_t load_policy, uint16_t* __restrict__ out) {
  detail::wait_for_previous_grid();
  detail::allow_dependent_launch();
  const int64_t vecs = hidden / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * vecs) return;
  const int64_t t = i / vecs, v = i % vecs;
  const uint32_t mask = valid_slots(ids, t, top_k);
  *reinterpret_cast<uint4*>(out + t * hidden + v * 8) = combine_vector(ybuf, t * top_k, mask, hidden, v * 8, load_policy);
}

}  // namespace

void launch_combine(int64_t tokens, int top_k, int64_t hidden, const moe_workspace& ws, uint16_t* out,
                    bool dependent, cudaStream_t stream) {
  const int64_t n = tokens * (hidden / 8);
  launch_pdl(combine_kernel, dim3(static_cast<unsigned>((n + 255) / 256)), dim3(256), 0, stream, dependent, tokens,
             top_k, hidden, static_cast<const int32_t*>(ws.ids), static_cast<const uint16_t*>(ws.ybuf),
             ws.ybuf_load_l2_policy, out);
}

}  // namespace mxmoe::cuda::sm90
