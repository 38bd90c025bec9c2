// moe/gather_rows.cu — the activations of GEMM1 in expert-sorted order, for the prefill GEMMs'
// TMA loads: rows[s, :] = x[sorted[s] / top_k, :] for every valid sorted position s (dropped
// slots have none). Written token by token: one CTA reads x[t, :] once (16-byte loads) and writes
// it to the sorted positions of the token's k pairs, s = offsets[ids[p]] + pos[p] (the routing
// writes both: kernels.h). Costs T·H·2 bytes read and T·k·H·2 written; a gather by sorted position
// read each token's row k times, at random times, which at T = 16384 the L2 mostly missed (x is
// 67-235 MB on Qwen3-30B-A3B and Kimi-K2). The rows live in the workspace's ybuf, which GEMM2
// overwrites afterwards. Each pair's sorted position and routing weight also go to
// moe_workspace::combine_slots, for the combine after GEMM2. A programmatic dependent launch (pdl.cuh): it waits for the routing
// before reading it.
#include <cuda_runtime.h>

#include <string>

#include "check.h"
#include "kernels.h"
#include "mxmoe/error.h"
#include "pdl.cuh"

namespace mxmoe::cuda::sm90 {
namespace {

constexpr int kGatherThreads = 128;
constexpr int kGatherMaxTopK = 16;  // moe_config's bound

__global__ void __launch_bounds__(kGatherThreads)
    gather_sorted_rows_kernel(const uint16_t* __restrict__ x, int top_k, int64_t hidden, moe_workspace ws,
                              uint16_t* __restrict__ rows) {
  __shared__ int64_t dst_row[kGatherMaxTopK];  // sorted position of slot j, -1: dropped
  detail::wait_for_previous_grid();
  detail::allow_dependent_launch();
  const int64_t t = blockIdx.x;
  if (threadIdx.x < top_k) {
    const int64_t p = t * top_k + threadIdx.x;
    const int e = ws.ids[p];
    const int32_t s = e >= 0 ? ws.offsets[e] + ws.pos[p] : -1;
    dst_row[threadIdx.x] = s;
    ws.combine_slots[p] = combine_slot{s, ws.weights[p]};
  }
  __syncthreads();
  const int64_t vecs = hidden / 8;
  const uint4* src = reinterpret_cast<const uint4*>(x + t * hidden);
  uint4* dst = reinterpret_cast<uint4*>(rows);
#pragma unroll 4
  for (int64_t v = threadIdx.x; v < vecs; v += kGatherThreads) {
    const uint4 val = src[v];
    for (int j = 0; j < top_k; ++j)
      if (dst_row[j] >= 0) dst[dst_row[j] * vecs + v] = val;
  }
}

}  // namespace

void launch_gather_sorted_rows(const uint16_t* x, int64_t pairs, int top_k, int64_t hidden, const moe_workspace& ws,
                               uint16_t* rows, cudaStream_t stream) {
  MXMOE_CHECK_ARG(top_k >= 1 && top_k <= kGatherMaxTopK && pairs % top_k == 0, "top_k",
                  "in [1, " + std::to_string(kGatherMaxTopK) + "] and dividing the pairs", std::to_string(top_k));
  const int64_t tokens = pairs / top_k;
  if (tokens == 0) return;
  launch_pdl(gather_sorted_rows_kernel, dim3(static_cast<unsigned>(tokens)), dim3(kGatherThreads), 0, stream, true, x,
             top_k, hidden, ws, rows);
}

}  // namespace mxmoe::cuda::sm90
