// GPU test of mxmoe/dtype.h's device conversions: float2_to_bf16x2 (one cvt.rn.bf16x2.f32 on the
// device) against float_to_bf16 (the integer rounding the CPU reference uses) for every one of
// the 2^32 float bit patterns, in both halves of the word. Equal bits everywhere except NaN, where
// the device gives a NaN (not the input's sign and payload, as dtype.h says).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <ios>

#include "cuda_ok.h"
#include "mxmoe/dtype.h"

namespace mxmoe {
namespace {

struct mismatch_log {
  unsigned long long count;
  uint32_t first_input, first_got, first_want;
};

__device__ bool is_bf16_nan(uint16_t h) { return (h & 0x7F80u) == 0x7F80u && (h & 0x007Fu) != 0; }

// Each thread checks the patterns u = i, i + stride, ... as `lo` (paired with the pattern's bitwise
// complement as `hi`, so both halves see every pattern once).
__global__ void compare_bf16x2_with_integer_rounding(mismatch_log* log) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < (uint64_t{1} << 32);
       i += stride) {
    const uint32_t u = static_cast<uint32_t>(i);
    const float lo = __uint_as_float(u), hi = __uint_as_float(~u);
    const uint32_t got = float2_to_bf16x2(lo, hi);
    const uint16_t want_lo = float_to_bf16(lo), want_hi = float_to_bf16(hi);
    const uint16_t got_lo = static_cast<uint16_t>(got & 0xFFFFu), got_hi = static_cast<uint16_t>(got >> 16);
    const bool lo_ok = is_bf16_nan(want_lo) ? is_bf16_nan(got_lo) : got_lo == want_lo;
    const bool hi_ok = is_bf16_nan(want_hi) ? is_bf16_nan(got_hi) : got_hi == want_hi;
    if (!(lo_ok && hi_ok) && atomicAdd(&log->count, 1ull) == 0) {
      log->first_input = u;
      log->first_got = got;
      log->first_want = static_cast<uint32_t>(want_lo) | (static_cast<uint32_t>(want_hi) << 16);
    }
  }
}

TEST(GpuDtype, Float2ToBf16x2MatchesIntegerRoundingOnEveryFloat) {
  mismatch_log* log = nullptr;
  CUDA_OK(cudaMalloc(&log, sizeof(mismatch_log)));
  CUDA_OK(cudaMemset(log, 0, sizeof(mismatch_log)));
  compare_bf16x2_with_integer_rounding<<<1024, 256>>>(log);
  CUDA_OK(cudaGetLastError());
  mismatch_log h{};
  CUDA_OK(cudaMemcpy(&h, log, sizeof(h), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaFree(log));
  EXPECT_EQ(h.count, 0ull) << std::hex << "first: input 0x" << h.first_input << " got 0x" << h.first_got
                           << " want 0x" << h.first_want;
}

}  // namespace
}  // namespace mxmoe
