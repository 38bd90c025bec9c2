// moe/dequant.cuh — MXFP4 fragments (layout::sm90_fragment) to the bf16 A operand of the tensor
// cores, in registers. One lane's four fragment words and 4 scale bytes become its four bf16x2 A
// registers for each of four k16 steps: the register layout of mma.sync.m16n8k16 and of each
// warp's part of a wgmma m64 A-from-registers operand. Per word: 9 integer ops
// (mx::fragment_bf16x2_pow2m126) and 4 bf16x2 multiplies; per tile 8 more for the scales.
// Bit-exact with mx::dequantize_value (tests/cpu check the word, the layout and the conversion
// against it; tests/gpu compare the layer with the CPU reference).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "mxmoe/mx.h"

namespace mxmoe::cuda::sm90::detail {

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// A lane's four bf16x2 A registers for each k16 step of one fragment tile, dequantized:
// a[j][r] = register r of k16 step j. Word j of `codes` is the fragment word of k16 step j
// (mx::fragment_bit); `scales` bytes: (g, kb0), (g+8, kb0), (g, kb1), (g+8, kb1).
// kScalesInRange: the caller knows that every scale byte is in [1, 128]
// (gemm_weights::scales_in_range), so the test below is left out.
template <bool kScalesInRange = false>
__device__ __forceinline__ void dequant_fragment(uint4 codes, uint32_t scales, uint32_t (&a)[4][4]) {
  const uint32_t w[4] = {codes.x, codes.y, codes.z, codes.w};
  // Common case: every scale byte in [1, 128], so 2^(s-1) is a normal bf16 and one multiply
  // by it applies both the 2^126 of the code conversion and the block scale. (A plain 32-bit
  // subtraction tests it: a zero byte borrows, and its own result byte 0xFF fails the test.)
  if (kScalesInRange || ((scales - 0x01010101u) & 0x80808080u) == 0) {
    uint32_t m[4];  // bf16x2 (2^(s_q - 1), 2^(s_q - 1)) = (s_q + 126) << 7 in both halves
#pragma unroll
    for (int q = 0; q < 4; ++q) m[q] = __byte_perm(scales, 0u, 0x4040u | q | (q << 8)) * 128u + 0x3F003F00u;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t lo = m[(j >> 1) * 2], hi = m[(j >> 1) * 2 + 1];
#pragma unroll
      for (int r = 0; r < 4; ++r) a[j][r] = bf16x2_mul(mx::fragment_bf16x2_pow2m126(w[j], r), (r & 1) ? hi : lo);
    }
  } else {
    const uint32_t c126 = static_cast<uint32_t>(mx::kBf16Pow2_126) * 0x00010001u;
    uint32_t m[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) m[q] = mx::e8m0_to_bf16_bits(static_cast<uint8_t>(scales >> (8 * q))) * 0x00010001u;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t lo = m[(j >> 1) * 2], hi = m[(j >> 1) * 2 + 1];
#pragma unroll
      for (int r = 0; r < 4; ++r)
        a[j][r] = bf16x2_mul(bf16x2_mul(mx::fragment_bf16x2_pow2m126(w[j], r), c126), (r & 1) ? hi : lo);
    }
  }
}

}  // namespace mxmoe::cuda::sm90::detail
