// quantize/statistics.cuh — the quantize statistics on the device: per-thread accumulators, the
// CTA's partial (one per CTA, summed in a fixed order) that finalize_stats (kernels.cuh) reduces.
// Internal to src/cuda/quantize (included by launcher.cu only).
#pragma once

#include <cstdint>

#include "addressing.cuh"

namespace mxmoe::cuda::quant {

using mx::scale_rule;

struct stats_partial {
  unsigned long long saturated, clamped, flushed, nonfinite;
  double signal, error;
};

struct stats_acc {
  uint32_t saturated = 0, clamped = 0, flushed = 0, nonfinite = 0;
  double signal = 0.0, error = 0.0;
};

__device__ __forceinline__ void add_partial(stats_partial& t, const stats_partial& o) {
  t.saturated += o.saturated;
  t.clamped += o.clamped;
  t.flushed += o.flushed;
  t.nonfinite += o.nonfinite;
  t.signal += o.signal;
  t.error += o.error;
}

// The CTA's sum of one stats_partial per thread in a fixed order — butterfly shuffles inside each
// warp, then the warp sums in warp order — so identical calls give identical bits. Valid in
// thread 0 only.
__device__ stats_partial cta_sum(const stats_partial& mine) {
  __shared__ stats_partial warp_sums[kWarpsPerCta];
  unsigned long long c[4] = {mine.saturated, mine.clamped, mine.flushed, mine.nonfinite};
  double s[2] = {mine.signal, mine.error};
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
    for (int j = 0; j < 4; ++j) c[j] += __shfl_xor_sync(kFullMask, c[j], off);
#pragma unroll
    for (int j = 0; j < 2; ++j) s[j] += __shfl_xor_sync(kFullMask, s[j], off);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = {c[0], c[1], c[2], c[3], s[0], s[1]};
  __syncthreads();
  stats_partial t = warp_sums[0];
  if (threadIdx.x == 0)
    for (int w = 1; w < kWarpsPerCta; ++w) add_partial(t, warp_sums[w]);
  return t;
}

// Writes the CTA's statistics as partial blockIdx.x.
__device__ void store_cta_stats(const stats_acc& acc, stats_partial* partials) {
  const stats_partial t = cta_sum({acc.saturated, acc.clamped, acc.flushed, acc.nonfinite, acc.signal, acc.error});
  if (threadIdx.x == 0) partials[blockIdx.x] = t;
}

}  // namespace mxmoe::cuda::quant
