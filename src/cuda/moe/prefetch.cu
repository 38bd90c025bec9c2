// moe/prefetch.cu — an L2 prefetch of the first local experts' GEMM1 weights. While the route and
// plan kernels run, the DRAM is idle, and GEMM1's first tiles are the lowest experts touched: where
// most experts are touched (moe_layer.cu, gemm1_prefetch_bytes), 16 MB of them prefetched took
// Qwen3-30B-A3B T = 32-128 to 0.986-0.992 of the layer time (H100, docs/performance.md,
// thirty-third session). Launched on a stream of its own (moe_layer.cu forks and joins it), so
// that no kernel of the forward's chain waits for it: a kernel does not complete before its bulk
// prefetches, and inside the chain (extra CTAs of the route kernel) the route kernel took 12.1
// instead of 4.9 us and the layer 2-7 % longer. The lines keep the L2's normal priority: with
// evict-last (0.984-0.985 in the benchmark, which flushes the L2 before every forward) each
// layer of a model would leave 16 MB that every later normal line is evicted before.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "check.h"
#include "kernels.h"
#include "mxmoe/error.h"

namespace mxmoe::cuda::sm90 {
namespace {

constexpr int kPrefetchCtas = 8, kPrefetchThreads = 128;
constexpr int64_t kPrefetchChunk = 16 * 1024;  // bytes per cp.async.bulk.prefetch

// Thread i asks the L2 for chunks i, i + n, ... of the budget: the codes' share of it from the
// start of the codes, then the scales' share from the start of the scales.
__global__ void __launch_bounds__(kPrefetchThreads) weight_prefetch_kernel(weight_prefetch pf) {
  const int64_t total = pf.code_bytes + pf.scale_bytes;
  const int64_t code_budget =
      min(pf.code_bytes, static_cast<int64_t>(static_cast<double>(pf.budget) * pf.code_bytes / total)) / 16 * 16;
  const int64_t scale_budget = min(pf.scale_bytes, pf.budget - code_budget) / 16 * 16;
  const int64_t code_chunks = (code_budget + kPrefetchChunk - 1) / kPrefetchChunk;
  const int64_t chunks = code_chunks + (scale_budget + kPrefetchChunk - 1) / kPrefetchChunk;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const bool code = c < code_chunks;
    const int64_t off = (code ? c : c - code_chunks) * kPrefetchChunk;
    const int64_t end = code ? code_budget : scale_budget;
    const uint32_t bytes = static_cast<uint32_t>(end - off < kPrefetchChunk ? end - off : kPrefetchChunk);
    const uint8_t* p = (code ? pf.codes : pf.scales) + off;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
  }
}

}  // namespace

void launch_weight_prefetch(const weight_prefetch& pf, cudaStream_t stream) {
  MXMOE_CHECK_ARG(reinterpret_cast<uintptr_t>(pf.codes) % 16 == 0 && reinterpret_cast<uintptr_t>(pf.scales) % 16 == 0,
                  "weight_prefetch", "16-byte aligned codes and scales", "a misaligned pointer");
  if (pf.budget <= 0 || pf.code_bytes <= 0) return;
  weight_prefetch_kernel<<<kPrefetchCtas, kPrefetchThreads, 0, stream>>>(pf);
  MXMOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mxmoe::cuda::sm90
