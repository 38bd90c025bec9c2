// mxmoe/mx.h — the one definition of the MXFP4 number formats and scale rules.
//
// Formats follow the OCP Microscaling Formats (MX) Specification v1.0:
//   * E2M1 (§5.3.3): 4 bits, sign bit 3, exponent bits 2..1 (bias 1), mantissa bit 0.
//     Codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6; codes 8..15 their negatives (8 is -0).
//     No Inf, no NaN.
//   * E8M0 (§5.4.1): 8-bit biased exponent, value 2^(byte-127) for bytes 0..254, 0xFF = NaN.
//     Byte 0 is 2^-127, a float32 *subnormal* (bits 0x00400000), not zero.
//   * MXFP4 block (§6): 32 E2M1 elements sharing one E8M0 scale; element i of a block decodes
//     to e2m1(code_i) * 2^(scale-127).
// Packing: two codes per byte, element 2j in the low nibble, 2j+1 in the high nibble (gpt-oss
// checkpoints, torchao pack_uint4, PTX cvt.rn.satfinite.e2m1x2.f32).
//
// Everything here is __host__ __device__ and bit-exact between the two: the CPU reference, the
// CUDA kernels, the tools and the tests all call these functions; nobody re-derives them.
//
// Policies (documented in docs/formats.md, tested in tests/cpu/test_mx.cpp):
//   * Encoding a value already divided by its scale: round to nearest, ties to the even code,
//     saturate to +-6, keep the sign of zero. NaN encodes as +0 (only reachable inside a block
//     whose scale is 0xFF, which decodes to NaN as a whole).
//   * A block containing NaN or +-Inf gets scale 0xFF and all codes 0: it decodes to NaN.
//   * An all-zero block gets scale byte 0 (every rule). A subnormal amax gets byte 0 (every rule).
//   * Scale bytes are clamped to [0, 254]; no rule ever produces 0xFF for a finite block.
#pragma once

#include <cstdint>
#include <cstring>

#include "mxmoe/hd.h"

namespace mxmoe::mx {

inline constexpr int kBlockSize = 32;        // elements per MX block
inline constexpr int kPackedBlockBytes = 16; // bytes of packed E2M1 codes per block
inline constexpr float kE2M1Max = 6.0f;
inline constexpr uint8_t kE8M0Nan = 0xFF;
inline constexpr int kE8M0Bias = 127;

// ---- bit casts ------------------------------------------------------------------------------

MXMOE_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

MXMOE_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// Round-to-nearest float ops that the device compiler may not contract into an FMA: the `mse`
// rule compares sums of squares, and CPU and GPU must pick the same byte.
MXMOE_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
MXMOE_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// x * 2^k, exact whenever the result is a normal float. Never multiplies by a subnormal power of
// two, so it stays right on a flush-to-zero build (2^(127-254) would be one).
MXMOE_HD float mul_pow2(float x, int k) {
  while (k > 127) {
    x *= bits_float(0x7F000000u);  // 2^127
    k -= 127;
  }
  while (k < -126) {
    x *= bits_float(0x00800000u);  // 2^-126
    k += 126;
  }
  return x * bits_float(static_cast<uint32_t>(k + 127) << 23);
}

// ---- E2M1 ---------------------------------------------------------------------------------

MXMOE_HD float e2m1_to_float(uint8_t code) {
  const uint32_t m = code & 7u;
  // codes 2..7 are normal: exponent (m >> 1) - 1, mantissa bit m & 1
  const float mag = m < 2 ? 0.5f * static_cast<float>(m)
                          : bits_float(((126u + (m >> 1)) << 23) | ((m & 1u) << 22));
  return bits_float(float_bits(mag) | (static_cast<uint32_t>(code & 8u) << 28));
}

// The magnitude code (0..7) of a magnitude a = |v| that is not NaN: round to nearest, ties to
// even code, saturate at 6. Tie points: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4.
// The code is the number of tie points below a (`<=` / `<` as the ties go): no branch on the
// data, which a random block's values would mispredict at almost every element, and no NaN test,
// so that a loop of it vectorizes (the CPU quantizer's fast path calls it on finite blocks).
MXMOE_HD uint32_t e2m1_magnitude(float a) {
  return static_cast<uint32_t>(a > 0.25f) + static_cast<uint32_t>(a >= 0.75f) + static_cast<uint32_t>(a > 1.25f) +
         static_cast<uint32_t>(a >= 1.75f) + static_cast<uint32_t>(a > 2.5f) + static_cast<uint32_t>(a >= 3.5f) +
         static_cast<uint32_t>(a > 5.0f);
}

// Round to nearest, ties to even code, saturate to +-6, sign of zero kept, NaN -> +0.
MXMOE_HD uint8_t float_to_e2m1(float v) {
  const uint32_t b = float_bits(v);
  const float a = bits_float(b & 0x7FFFFFFFu);
  if (!(a == a)) return 0;
  return static_cast<uint8_t>(((b >> 31) << 3) | e2m1_magnitude(a));
}

MXMOE_HD uint8_t pack_e2m1x2(uint8_t even, uint8_t odd) {
  return static_cast<uint8_t>((even & 0xFu) | ((odd & 0xFu) << 4));
}

// Code of element `i` (any index) of a packed row whose byte holds elements 2j (low) and 2j+1.
MXMOE_HD uint8_t unpack_e2m1(uint8_t byte, int64_t i) {
  return static_cast<uint8_t>((i & 1) ? (byte >> 4) : (byte & 0xFu));
}

// ---- E8M0 ---------------------------------------------------------------------------------

MXMOE_HD float e8m0_to_float(uint8_t byte) {
  if (byte == kE8M0Nan) return bits_float(0x7FC00000u);
  if (byte == 0) return bits_float(0x00400000u);  // 2^-127: subnormal, not 0
  return bits_float(static_cast<uint32_t>(byte) << 23);
}

// Round-up cast of |x| to E8M0: the smallest byte with 2^(byte-127) >= |x|. Zero -> 0; NaN, Inf
// and values above 2^127 -> 0xFF. The sign is ignored.
MXMOE_HD uint8_t float_to_e8m0_rceil(float x) {
  const uint32_t b = float_bits(x) & 0x7FFFFFFFu;
  if (b >= 0x7F800000u) return kE8M0Nan;
  const uint32_t e = b >> 23, m = b & 0x7FFFFFu;
  if (e == 0) return m <= 0x400000u ? 0 : 1;  // subnormal: 2^-127 is 0x00400000
  const uint32_t byte = e + (m != 0 ? 1u : 0u);
  return byte > 254u ? kE8M0Nan : static_cast<uint8_t>(byte);
}

// One element of a block: e2m1(code) * 2^(scale-127), NaN for scale 0xFF.
MXMOE_HD float dequantize_value(uint8_t code, uint8_t scale) {
  if (scale == kE8M0Nan) return bits_float(0x7FC00000u);
  return mul_pow2(e2m1_to_float(code), static_cast<int>(scale) - kE8M0Bias);
}

// ---- scale rules --------------------------------------------------------------------------

enum class scale_rule : uint8_t {
  floor,  // OCP MX v1.0 §6.3: floor(log2(amax)) - 2. Saturates blocks whose mantissa > 1.5.
  even,   // 0.75 round-up of amax's mantissa, then -2 (vLLM's fixed kernel, torchao EVEN).
  rceil,  // smallest byte with 6 * 2^(byte-127) >= amax, exact (never saturates).
  mse,    // per block: of floor-1, floor, floor+1, the one with least squared error;
          // ties go to the larger byte.
};

inline constexpr scale_rule kAllScaleRules[] = {scale_rule::floor, scale_rule::even,
                                                scale_rule::rceil, scale_rule::mse};

inline const char* to_string(scale_rule r) {
  switch (r) {
    case scale_rule::floor: return "floor";
    case scale_rule::even: return "even";
    case scale_rule::rceil: return "rceil";
    case scale_rule::mse: return "mse";
  }
  return "?";
}

// Scale byte from the block's amax for the closed-form rules (floor, even, rceil); for `mse` this
// returns the `floor` byte, the centre of its candidate set. NaN/Inf amax -> 0xFF; 0 -> 0.
MXMOE_HD uint8_t scale_from_amax(float amax, scale_rule rule) {
  const uint32_t b = float_bits(amax) & 0x7FFFFFFFu;
  if (b >= 0x7F800000u) return kE8M0Nan;
  if (b == 0) return 0;
  const int e = static_cast<int>(b >> 23);
  int byte;
  switch (rule) {
    case scale_rule::even: byte = static_cast<int>(((b + (1u << 21)) & 0xFF800000u) >> 23) - 2; break;
    case scale_rule::rceil: byte = e - 2 + ((b & 0x7FFFFFu) > 0x400000u ? 1 : 0); break;
    default: byte = e - 2; break;
  }
  return static_cast<uint8_t>(byte < 0 ? 0 : (byte > 254 ? 254 : byte));
}

// Squared error of a block quantized with `scale`, in units of 2^(ref-127) (ref: the block's
// floor byte), so that errors of neighbouring candidates compare without overflow.
MXMOE_HD float block_sq_error(const float* x, uint8_t scale, uint8_t ref) {
  const int d = static_cast<int>(scale) - static_cast<int>(ref);
  float err = 0.0f;
  for (int i = 0; i < kBlockSize; ++i) {
    const uint8_t code = float_to_e2m1(mul_pow2(x[i], kE8M0Bias - scale));
    const float y = mul_pow2(x[i], kE8M0Bias - ref);
    const float q = mul_pow2(e2m1_to_float(code), d);
    const float diff = add_rn(y, -q);
    err = add_rn(err, mul_rn(diff, diff));
  }
  return err;
}

// The scale byte `rule` gives a 32-element block. Blocks with NaN/Inf -> 0xFF.
MXMOE_HD uint8_t block_scale(const float* x, scale_rule rule) {
  uint32_t amax_bits = 0;
  for (int i = 0; i < kBlockSize; ++i) {
    const uint32_t b = float_bits(x[i]) & 0x7FFFFFFFu;
    amax_bits = b > amax_bits ? b : amax_bits;  // NaN bits sort above Inf
  }
  const float amax = bits_float(amax_bits);
  const uint8_t base = scale_from_amax(amax, rule);
  // Zero or subnormal amax: byte 0 for every rule (byte 1 can tie with it, and ties would pick 1).
  if (rule != scale_rule::mse || base == kE8M0Nan || amax_bits < 0x00800000u) return base;
  uint8_t best = base;
  float best_err = block_sq_error(x, base, base);
  const int lo = base > 0 ? base - 1 : 0, hi = base < 254 ? base + 1 : 254;
  for (int c = lo; c <= hi; ++c) {
    if (c == base) continue;
    const float err = block_sq_error(x, static_cast<uint8_t>(c), base);
    if (err < best_err || (err == best_err && c > best)) {
      best = static_cast<uint8_t>(c);
      best_err = err;
    }
  }
  return best;
}

// What quantizing one block did: elements clamped to +-6 (the block "saturated" if any),
// non-zero elements that became +-0, and whether the block held NaN/Inf.
struct block_stats {
  uint8_t clamped = 0;
  uint8_t flushed = 0;
  bool nonfinite = false;
};

// Quantize 32 floats: writes the scale byte and 16 packed bytes.
MXMOE_HD block_stats quantize_block(const float* x, scale_rule rule, uint8_t* scale_out,
                                    uint8_t* packed_out) {
  block_stats st;
  const uint8_t scale = block_scale(x, rule);
  *scale_out = scale;
  if (scale == kE8M0Nan) {
    st.nonfinite = true;
    for (int j = 0; j < kPackedBlockBytes; ++j) packed_out[j] = 0;
    return st;
  }
  const int k = kE8M0Bias - scale;
  for (int j = 0; j < kPackedBlockBytes; ++j) {
    uint8_t codes[2];
    for (int h = 0; h < 2; ++h) {
      const float xv = x[2 * j + h];
      const float v = mul_pow2(xv, k);
      codes[h] = float_to_e2m1(v);
      st.clamped += (bits_float(float_bits(v) & 0x7FFFFFFFu) > kE2M1Max) ? 1 : 0;
      st.flushed += ((codes[h] & 7u) == 0 && xv != 0.0f) ? 1 : 0;
    }
    packed_out[j] = pack_e2m1x2(codes[0], codes[1]);
  }
  return st;
}

MXMOE_HD void dequantize_block(const uint8_t* packed, uint8_t scale, float* out) {
  for (int i = 0; i < kBlockSize; ++i) out[i] = dequantize_value(unpack_e2m1(packed[i >> 1], i), scale);
}

// ---- the sm90 fragment word and its fast E2M1 -> BF16 conversion ---------------------------
// The kernels' weight layout (layout::sm90_fragment) stores one lane's mma.m16n8k16 A fragment of
// one k16 step as a u32 "fragment word" of 8 codes: slot s = r + 4h is element h (0: low, 1: high
// half of the bf16x2) of A register r (0..3). Placing a code's sign at bf16 bit 15 and its three
// magnitude bits (mantissa, exponent low, exponent high) at bits 6, 7, 8 gives exactly
// e2m1(code) * 2^-126 (code 1 lands on a bf16 subnormal, which is what 0.5 * 2^-126 is);
// multiplying by 2^126 and by the block scale (both exact in bf16) finishes the job.
//
// The bits of the 8 codes are placed in the word so that each register takes few integer ops to
// reach that bf16x2 form (mask M = 0x81C081C0, the sign and magnitude bits of both halves):
//   r0 = w & M                                  (1 op)
//   r1 = (w << 6) & M                           (2 ops; the shift can issue as IMAD.SHL)
//   r2 = rotl(w, 12) & M                        (2 ops)
//   r3 = ((w << 2) & M') | ((w >> 6) & M'')     (4 ops; the exponent high bit via >> 6)
// 9 ops for 4 bf16x2 instead of 3-4 each with plain nibbles. No single shift of one mask tiles
// the word four times over, so one register needs two shifts.
//
// fragment_bit(slot, b): the word bit holding code bit b (0 mantissa, 1..2 exponent, 3 sign) of
// `slot`; it is where register slot%4's recipe picks the bit up from its bf16 target position.
MXMOE_HD constexpr int fragment_bit(int slot, int b) {
  const int h = slot / 4, target = (b < 3 ? 6 + b : 15) + 16 * h;
  switch (slot % 4) {
    case 0: return target;
    case 1: return target - 6;
    case 2: return (target + 20) % 32;  // rotl by 12
    default: return b == 2 ? target + 6 : target - 2;
  }
}

// Packs 8 codes (slot order) into a fragment word, and reads one back.
MXMOE_HD uint32_t fragment_word_pack(const uint8_t (&codes)[8]) {
  uint32_t w = 0;
  for (int s = 0; s < 8; ++s)
    for (int b = 0; b < 4; ++b) w |= static_cast<uint32_t>((codes[s] >> b) & 1u) << fragment_bit(s, b);
  return w;
}
MXMOE_HD uint8_t fragment_word_code(uint32_t word, int slot) {
  uint32_t c = 0;
  for (int b = 0; b < 4; ++b) c |= ((word >> fragment_bit(slot, b)) & 1u) << b;
  return static_cast<uint8_t>(c);
}

// A register r of a fragment word as bf16x2 (slot r low, slot r + 4 high), each half
// e2m1(code) * 2^-126. `r` is a compile-time constant in the kernels.
MXMOE_HD uint32_t fragment_bf16x2_pow2m126(uint32_t w, int r) {
  constexpr uint32_t kMask = 0x81C081C0u;
  switch (r) {
    case 0: return w & kMask;
    case 1: return (w << 6) & kMask;
    case 2: {
#if defined(__CUDA_ARCH__)
      return __funnelshift_l(w, w, 12) & kMask;
#else
      return ((w << 12) | (w >> 20)) & kMask;
#endif
    }
    default: {
#if defined(__CUDA_ARCH__)
      // w >> 6 as the high word of a product: the multiply-add pipe takes it (it already takes
      // the left shift), one instruction fewer on the integer ALU, the dequantizing GEMMs' busiest.
      return ((w << 2) & 0x80C080C0u) | (__umulhi(w, 1u << 26) & 0x01000100u);
#else
      return ((w << 2) & 0x80C080C0u) | ((w >> 6) & 0x01000100u);
#endif
    }
  }
}

// bf16 bits of 2^(scale-127) (byte 0 is the bf16 subnormal 0x0040). 0xFF -> NaN.
MXMOE_HD uint16_t e8m0_to_bf16_bits(uint8_t scale) {
  if (scale == kE8M0Nan) return 0x7FC0u;
  if (scale == 0) return 0x0040u;
  return static_cast<uint16_t>(scale << 7);
}

inline constexpr uint16_t kBf16Pow2_126 = static_cast<uint16_t>((126 + 127) << 7);  // 2^126

// ---- what a scale rule implies about a quantized block (reading checkpoints back) ------------
// Each rule places a block's amax at a fixed window relative to its scale 2^(s-127): amax / 2^(s-127)
// lies in [4, 8) for floor, [3.5, 7) for even, (3, 6] for rceil and [2, 16) for mse (one of
// floor - 1, floor, floor + 1). So the largest |code| of a block the rule quantized is at least
// min_block_max_code(rule): 6 (value 4) for floor and even, 5 (value 3) for rceil, 4 (value 2)
// for mse. It holds for every block with an ordinary scale: not 0xFF (NaN), not clamped to byte
// 0 or 254, and not all zero. A block below the minimum was not quantized with that rule.
MXMOE_HD int min_block_max_code(scale_rule r) {
  switch (r) {
    case scale_rule::floor:
    case scale_rule::even: return 6;
    case scale_rule::rceil: return 5;
    case scale_rule::mse: return 4;
  }
  return 0;
}

}  // namespace mxmoe::mx
