// moe/gather_rows.cu — the activations of GEMM1 in expert-sorted order, for the prefill GEMMs'
// TMA loads: rows[s, :] = x[sorted[s] / top_k, :] for every valid sorted position s (dropped
// slots have none). One warp per row, 16-byte loads and stores. Costs T·k·H·2 bytes written and
// read back once; the rows live in the workspace's ybuf, which GEMM2 overwrites afterwards.
// A programmatic dependent launch (pdl.cuh): it waits for the routing before reading it.
#include <cuda_runtime.h>

#include "check.h"
#include "kernels.h"
#include "pdl.cuh"

namespace mxmoe::cuda::sm90 {
namespace {

constexpr int kGatherWarps = 8;

__global__ void gather_sorted_rows_kernel(const uint16_t* __restrict__ x, int top_k, int64_t hidden, int experts,
                                          moe_workspace ws, uint16_t* __restrict__ rows) {
  detail::wait_for_previous_grid();
  detail::allow_dependent_launch();
  const int64_t s = static_cast<int64_t>(blockIdx.x) * kGatherWarps + (threadIdx.x >> 5);
  if (s >= ws.offsets[experts]) return;
  const int64_t token = ws.sorted[s] / top_k;
  const uint4* src = reinterpret_cast<const uint4*>(x + token * hidden);
  uint4* dst = reinterpret_cast<uint4*>(rows + s * hidden);
  for (int64_t v = threadIdx.x & 31; v < hidden / 8; v += 32) dst[v] = src[v];
}

}  // namespace

void launch_gather_sorted_rows(const uint16_t* x, int64_t pairs, int top_k, int64_t hidden, int64_t experts,
                               const moe_workspace& ws, uint16_t* rows, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((pairs + kGatherWarps - 1) / kGatherWarps);
  launch_pdl(gather_sorted_rows_kernel, dim3(blocks), dim3(kGatherWarps * 32), 0, stream, true, x, top_k, hidden,
             static_cast<int>(experts), ws, rows);
}

}  // namespace mxmoe::cuda::sm90
