// moe/combine.cuh — the one definition of a combined output vector: 8 consecutive hidden values of
// token t, out[t, col .. col + 8) = the float sum, in slot order, of the routing-weighted expert
// outputs ybuf[t*k + j, col .. col + 8) of its valid slots j, rounded to bf16 once (combine.cu).
// A fixed order: deterministic (no atomics on the output).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "mxmoe/dtype.h"

namespace mxmoe::cuda::sm90::detail {

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
                                                int64_t col) {
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
      const uint4* src = reinterpret_cast<const uint4*>(ybuf + (pair0 + j) * hidden + col);
      y[u] = *src;
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

}  // namespace mxmoe::cuda::sm90::detail
