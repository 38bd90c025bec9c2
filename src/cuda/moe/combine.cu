// moe/combine.cu — out[t, :] = sum over slots j (in slot order) of w_j * ybuf[row_j, :], the expert
// outputs GEMM2 wrote: row t*k + j with w_j = 1 where GEMM2 applied the routing weight (decode GEMM,
// wgmma tiles), the pair's sorted position with w_j its routing weight after the prefill GEMM
// (kernels.h, ybuf_rows). Read with the L2 policy moe_workspace::ybuf_load_l2_policy. A fixed order keeps
// the layer deterministic (no atomics on the output). Dropped slots (id -1) contribute nothing.
// Each thread owns 8 consecutive hidden values: 16-byte loads and stores. A programmatic dependent
// of GEMM2 (pdl.cuh). (Folding it into GEMM2, the last CTA of a token summing, was measured
// slower: docs/performance.md, 2026-12-05.)
#include <cuda_runtime.h>

#include <string>

#include "check.h"
#include "mxmoe/dtype.h"
#include "mxmoe/error.h"
#include "kernels.h"
#include "l2_hint.cuh"
#include "pdl.cuh"

namespace mxmoe::cuda::sm90 {
namespace {

constexpr int kMaxTopK = 16;  // moe_config's bound

// The ybuf row of pair p (-1: none), whether the sum takes it (*used) and its weight there: by_pair,
// row p = t*k + j with weight 1 (GEMM2 applied the routing weight), used unless the slot was dropped
// (id -1). The row is read even then, so that its load does not wait for the id's: one round trip
// per batch instead of two; a dropped slot's row holds whatever was there, and is never added.
// by_sorted_position: the pair's sorted position and routing weight from
// moe_workspace::combine_slots (one 8-byte load: found as offsets[e] + pos[p] here, with the
// weight, the metadata loads per thread quadrupled and the combine took 11-25 % longer:
// docs/performance.md, "2026-12-06 (twenty-seventh session)").
__device__ __forceinline__ int32_t slot_row(int64_t p, ybuf_rows rows, const moe_workspace& ws, float* weight,
                                            bool* used) {
  if (rows == ybuf_rows::by_pair) {
    *weight = 1.0f;
    *used = ws.ids[p] >= 0;
    return static_cast<int32_t>(p);
  }
  const combine_slot s = ws.combine_slots[p];
  *weight = s.weight;
  *used = s.row >= 0;
  return s.row;
}

// The bf16x8 vector of out[t, col ..) (col a multiple of 8). The loads are issued kBatch slots at
// a time, the adds stay in slot order: one memory round trip per batch for top-8 routing, where a
// load per slot after the previous one's add cost k round trips (4-6 us at T = 1 under ncu,
// docs/performance.md, 2026-12-05). acc + 1 * y is acc + y: the by_pair sums are those of an add.
__device__ __forceinline__ uint4 combine_vector(int64_t t, int top_k, ybuf_rows rows, const moe_workspace& ws,
                                                int64_t hidden, int64_t col) {
  constexpr int kBatch = 8;
  float acc[8] = {};
#pragma unroll
  for (int j0 = 0; j0 < kMaxTopK; j0 += kBatch) {
    if (j0 >= top_k) break;
    int32_t row[kBatch];
    float weight[kBatch];
    bool used[kBatch];
    uint4 y[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      used[u] = false;
      row[u] = j0 + u < top_k ? slot_row(t * top_k + j0 + u, rows, ws, &weight[u], &used[u]) : -1;
      if (row[u] >= 0) y[u] = detail::load_16_l2_hint(ws.ybuf + row[u] * hidden + col, ws.ybuf_load_l2_policy);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (!used[u]) continue;
      const uint32_t v[4] = {y[u].x, y[u].y, y[u].z, y[u].w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        acc[2 * q] = fmaf(weight[u], bf16_to_float(static_cast<uint16_t>(v[q] & 0xFFFFu)), acc[2 * q]);
        acc[2 * q + 1] = fmaf(weight[u], bf16_to_float(static_cast<uint16_t>(v[q] >> 16)), acc[2 * q + 1]);
      }
    }
  }
  uint32_t o[4];
#pragma unroll
  for (int q = 0; q < 4; ++q)
    o[q] = static_cast<uint32_t>(float_to_bf16(acc[2 * q])) | (static_cast<uint32_t>(float_to_bf16(acc[2 * q + 1])) << 16);
  return make_uint4(o[0], o[1], o[2], o[3]);
}

__global__ void combine_kernel(int64_t tokens, int top_k, int64_t hidden, moe_workspace ws, ybuf_rows rows,
                               uint16_t* __restrict__ out) {
  detail::wait_for_previous_grid();
  detail::allow_dependent_launch();
  const int64_t vecs = hidden / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * vecs) return;
  const int64_t t = i / vecs, v = i % vecs;
  *reinterpret_cast<uint4*>(out + t * hidden + v * 8) = combine_vector(t, top_k, rows, ws, hidden, v * 8);
}

}  // namespace

void launch_combine(int64_t tokens, int top_k, int64_t hidden, const moe_workspace& ws, ybuf_rows rows, uint16_t* out,
                    bool dependent, cudaStream_t stream) {
  MXMOE_CHECK_ARG(top_k >= 1 && top_k <= kMaxTopK, "top_k", "in [1, " + std::to_string(kMaxTopK) + "]",
                  std::to_string(top_k));
  const int64_t n = tokens * (hidden / 8);
  launch_pdl(combine_kernel, dim3(static_cast<unsigned>((n + 255) / 256)), dim3(256), 0, stream, dependent, tokens,
             top_k, hidden, ws, rows, out);
}

}  // namespace mxmoe::cuda::sm90
