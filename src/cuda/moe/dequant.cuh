// moe/dequant.cuh — MXFP4 fragments (layout::sm90_fragment) to the bf16 A operand of the tensor
// cores, in registers. One lane's 16 code bytes and 4 scale bytes become its four bf16x2 A
// registers for each of four k16 steps: the register layout of mma.sync.m16n8k16 and of each
// warp's part of a wgmma m64 A-from-registers operand. Bit-exact with mx::dequantize_value
// (tests/gpu compare the layer with the CPU reference; tests/cpu check the fragment layout).
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

// A lane's four bf16x2 A registers for each k16 step of one fragment tile, dequantized.
// word j of `codes` is k16 step j; `scales` bytes: (g, kb0), (g+8, kb0), (g, kb1), (g+8, kb1).
__device__ __forceinline__ void dequant_fragment(uint4 codes, uint32_t scales, uint32_t (&a)[4][4]) {
  const uint32_t w[4] = {codes.x, codes.y, codes.z, codes.w};
  // Common case: every scale byte in [1, 128], so 2^(s-1) is a normal bf16 and one multiply
  // by it applies both the 2^126 of the code conversion and the block scale.
  if (((__vsub4(scales, 0x01010101u)) & 0x80808080u) == 0) {
    uint32_t m[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) m[q] = (((scales >> (8 * q)) & 0xFFu) + 126u) * 0x00800080u;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t lo = m[(j >> 1) * 2], hi = m[(j >> 1) * 2 + 1];
      a[j][0] = bf16x2_mul(mx::e2m1x2_to_bf16x2_pow2m126(w[j], 0), lo);
      a[j][1] = bf16x2_mul(mx::e2m1x2_to_bf16x2_pow2m126(w[j], 4), hi);
      a[j][2] = bf16x2_mul(mx::e2m1x2_to_bf16x2_pow2m126(w[j], 8), lo);
      a[j][3] = bf16x2_mul(mx::e2m1x2_to_bf16x2_pow2m126(w[j], 12), hi);
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
        a[j][r] = bf16x2_mul(bf16x2_mul(mx::e2m1x2_to_bf16x2_pow2m126(w[j], 4 * r), c126), (r & 1) ? hi : lo);
    }
  }
}

}  // namespace mxmoe::cuda::sm90::detail
