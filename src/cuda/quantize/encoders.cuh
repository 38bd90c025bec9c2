// quantize/encoders.cuh — one MX block's 32 elements, held as raw little-endian words, to its
// amax, its E2M1 codes and its integer statistics: exact floating-point steps instead of
// mx::float_to_e2m1's compare chain, two elements per instruction for 16-bit inputs.
// Internal to src/cuda/quantize (included by launcher.cu only).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "addressing.cuh"
#include "mxmoe/dtype.h"
#include "mxmoe/mx.h"

namespace mxmoe::cuda::quant {

using mx::scale_rule;

// Element i of a block held as raw little-endian words.
template <dtype D>
__device__ __forceinline__ float element(const uint32_t* w, int i) {
  if constexpr (D == dtype::f32) {
    return __uint_as_float(w[i]);
  } else {
    const uint16_t h = static_cast<uint16_t>((i & 1) ? (w[i >> 1] >> 16) : (w[i >> 1] & 0xFFFFu));
    if constexpr (D == dtype::bf16) return bf16_to_float(h);
    // Exact conversion; only a NaN's payload could differ from f16_to_float, and a block holding
    // NaN is encoded as scale 0xFF, codes 0 whatever its payload.
    return __half2float(__ushort_as_half(h));
  }
}

// Bits of max |x| over the block, ordered as mx::block_scale orders them (NaN above Inf), and the
// input-format bits of min |x| (0: the block holds a +-0).
template <dtype D>
__device__ __forceinline__ uint32_t amax_bits(const uint32_t* w, uint32_t& min_abs) {
  if constexpr (D == dtype::f32) {
    uint32_t m = 0, z = 0x7FFFFFFFu;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      m = max(m, w[i] & 0x7FFFFFFFu);
      z = min(z, w[i] & 0x7FFFFFFFu);
    }
    min_abs = z;
    return m;
  } else {
    // 16-bit magnitudes order like the float values they convert to, NaN above Inf included.
    uint32_t m2 = 0, z2 = 0x7FFF7FFFu;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      m2 = __vmaxu2(m2, w[i] & 0x7FFF7FFFu);
      z2 = __vminu2(z2, w[i] & 0x7FFF7FFFu);
    }
    min_abs = min(z2 & 0xFFFFu, z2 >> 16);
    const uint16_t m = static_cast<uint16_t>(max(m2 & 0xFFFFu, m2 >> 16));
    if constexpr (D == dtype::bf16) return mx::float_bits(bf16_to_float(m));
    return mx::float_bits(__half2float(__ushort_as_half(m)));
  }
}

// |e2m1_to_float(float_to_e2m1(a))| for finite a >= 0 below 2^100: round to nearest on the E2M1
// grid, ties to the even code, saturate at 6. The grid step is 0.5 below 2 and half the power of
// two of a's binade above (1 in [2, 4), 2 in [4, 8)). Adding magic = E * 2^22, E = that power of
// two (1 below 2), leaves a sum in [magic, 2 magic) whose ulp is E/2 = the step, so the add rounds
// a to the grid with ties to even multiples of the step; the even multiples are exactly the even
// codes (0, 1, 2, 4 in the 0.5 grid; 2, 4 in the 1 grid; 4, 8 in the 2 grid), which reproduces
// mx::float_to_e2m1's tie points 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4; values
// that round to 8 or more saturate to 6 like codes 7. Subtracting magic is exact.
__device__ __forceinline__ float round_to_e2m1_grid(float a) {
  const uint32_t binade = mx::float_bits(fmaxf(a, 1.0f)) & 0x7F800000u;
  const float magic = mx::bits_float(binade + (22u << 23));
  return fminf(__fsub_rn(__fadd_rn(a, magic), magic), 6.0f);
}

// ---- per-element encoding -----------------------------------------------------------------------
//
// Every element goes through the same exact steps, in the scaled domain y = |x| * 2^k, k = 127 - scale
// (a power of two, so y is exact wherever it is a normal number; a y small enough to round is far
// below 0.25 and encodes as 0 either way):
//   1. yc = min(y, 6) where y can exceed 7 (floor, mse): values in [7, 8) would round to 8.
//   2. E = the power of two of max(yc, 1), by masking the exponent bits (1 below 2, else 2 or 4).
//   3. s = E * 2^(p-2) + yc, rounded once (p: the format's precision). The sum lies in
//      [E * 2^(p-2), E * 2^(p-1)) whose ulp is E/2, the E2M1 grid step around yc (0.5 below 2, 1 in
//      [2, 4), 2 in [4, 8)), so the add rounds yc to the grid, ties to the even multiple of the step;
//      the even multiples are the even codes, which are mx::float_to_e2m1's tie winners.
//   4. q = s * 2^emin - E * 2^(p-2+emin), one FMA, exact: q = r * 2^emin for the grid value r, which
//      in the format's bits is the 3-bit magnitude code at the exponent's lowest bit (code 1, 0.5,
//      is the subnormal 2^(emin-1)): bits 8..6 for bf16, 11..9 for f16, 24..22 for f32.
//   5. d = y - q * 2^-emin = y - r, exact (y and r share the step): the element's error in units
//      of the scale, for the statistics.
// The 16-bit formats run steps 1..5 on two elements per instruction (bf16x2 / f16x2 FMA, 16-bit
// SIMD min/max); f32 runs them per element. All of it is checked exhaustively on the host against
// mx::float_to_e2m1(mx::mul_pow2(x, k)) for every bf16 / f16 x and every k an encode can see.
//
// A packed word q (codes at bits c..c+2 and 16+c..18+c) and the sign bits of its two inputs (bits 15
// and 31) become one packed E2M1 byte, [sign1 code1 sign0 code0], in bits 31..24 of
//   q * (2^(24-c) + 2^(12-c)) + signs * (2^12 + 1)
// (the terms that land below bit 24 do not overlap, so nothing carries into the byte).

// bits of 2^n in a 16-bit format, in both halves
template <int kExpBits, int kBias>
constexpr uint32_t splat_pow2(int n) {
  return (static_cast<uint32_t>(n + kBias) << (15 - kExpBits)) * 0x10001u;
}

template <dtype D>
struct packed_format;

template <>
struct packed_format<dtype::bf16> {
  using vec = __nv_bfloat162;
  static constexpr int kPrecision = 8, kMinExp = -126, kCodeShift = 6;
  static constexpr uint32_t kExponent = 0x7F807F80u, kOne = 0x3F803F80u, kSix = 0x40C040C0u;
  static constexpr uint32_t pow2(int n) { return splat_pow2<8, 127>(n); }
  __device__ static float lo(uint32_t v) { return __uint_as_float(v << 16); }
  __device__ static float hi(uint32_t v) { return __uint_as_float(v & 0xFFFF0000u); }
};

template <>
struct packed_format<dtype::f16> {
  using vec = __half2;
  static constexpr int kPrecision = 11, kMinExp = -14, kCodeShift = 9;
  static constexpr uint32_t kExponent = 0x7C007C00u, kOne = 0x3C003C00u, kSix = 0x46004600u;
  static constexpr uint32_t pow2(int n) { return splat_pow2<5, 15>(n); }
  __device__ static float lo(uint32_t v) { return __half2float(__ushort_as_half(static_cast<unsigned short>(v))); }
  __device__ static float hi(uint32_t v) { return __half2float(__ushort_as_half(static_cast<unsigned short>(v >> 16))); }
};

template <class V>
__device__ __forceinline__ V as_vec(uint32_t u) {
  V v;
  memcpy(&v, &u, sizeof v);
  return v;
}
template <class V>
__device__ __forceinline__ uint32_t vec_bits(V v) {
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  return u;
}

// Bits 31..24: the packed E2M1 byte of a word's two elements (see above).
template <int kCodeShift>
__device__ __forceinline__ uint32_t gather_byte(uint32_t q, uint32_t x) {
  constexpr uint32_t kSpread = (1u << (24 - kCodeShift)) + (1u << (12 - kCodeShift));
  return q * kSpread + (x & 0x80008000u) * 0x1001u;
}

// Bytes 3 of four gathered words, in order.
__device__ __forceinline__ uint32_t pack_bytes3(const uint32_t (&g)[4]) {
  return __byte_perm(__byte_perm(g[0], g[1], 0x0073), __byte_perm(g[2], g[3], 0x0073), 0x5410);
}

// Number of the 8 codes of a packed word whose magnitude is not 0.
__device__ __forceinline__ int nonzero_codes(uint32_t packed) {
  return __popc(((packed & 0x77777777u) + 0x77777777u) & 0x88888888u);
}

// Number of set halves in n masks (0xFFFF per half where an element clamped) given their negated
// sum acc = -sum(masks) mod 2^32. With NL low and NH high halves set, sum(masks) = NH (2^32 - 2^16)
// + NL (2^16 - 1), so acc = (NH - NL) 2^16 + NL: bits 15..0 hold NL (NL <= 16) and bits 31..16 hold
// NH - NL as a 16-bit two's complement number.
__device__ __forceinline__ int clamped_count(uint32_t acc) {
  return 2 * static_cast<int>(acc & 0xFFFFu) + static_cast<int16_t>(acc >> 16);
}

// Per-block result of an encode: the 16 packed bytes and the integer statistics.
struct block_codes {
  uint4 packed;
  int nonzero;  // codes with a non-zero magnitude
  int clamped;  // elements with |x| * 2^k > 6
};

// kClamp: y may reach 7 (floor: y < 8; mse: y < 16). kCountClamped: y may exceed 6 (all but rceil,
// where amax * 2^k <= 6 by construction). kStats: the statistics are wanted (the nonzero and clamped
// counts, signal and error); without them the block costs ~30% fewer instructions. Signal and error
// sums are accumulated in units of the scale: y and d are at most 16, so the squares can neither
// overflow nor lose the small elements that matter (an element far below the block's amax adds far
// below float's precision anyway).
template <dtype D, bool kClamp, bool kCountClamped, bool kStats>
__device__ __forceinline__ block_codes encode_block_packed(const uint32_t* w, uint8_t scale, float& signal,
                                                           float& error) {
  using F = packed_format<D>;
  using V = typename F::vec;
  const int k = 127 - scale;  // scale <= 253 here: 2^k is a normal bf16
  V scale1, scale2;
  if constexpr (D == dtype::bf16) {
    scale1 = as_vec<V>(F::pow2(k));
  } else {
    // 2^k in two exact steps: for f16 input k <= 27 (amax >= 2^-24) unless the block is all zero.
    const int k1 = max(-15, min(k, 15)), k2 = max(0, min(k - k1, 15));
    scale1 = as_vec<V>(k1 == -15 ? 0x02000200u : F::pow2(k1));  // 2^-15 is an f16 subnormal
    scale2 = as_vec<V>(F::pow2(k2));
  }
  const V magic = as_vec<V>(F::pow2(F::kPrecision - 2));
  const V code_scale = as_vec<V>(F::pow2(F::kMinExp));
  const V neg_magic_code = as_vec<V>(F::pow2(F::kPrecision - 2 + F::kMinExp) | 0x80008000u);
  const V neg_code_unscale = as_vec<V>(F::pow2(-F::kMinExp) | 0x80008000u);
  const V six = as_vec<V>(F::kSix);
  uint32_t clamped_acc = 0;  // minus the sum of the clamp masks, see clamped_count
  float sig[2] = {0.0f, 0.0f}, err[2] = {0.0f, 0.0f};
  uint32_t out[4];
  int nonzero = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t g[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t x = w[4 * j + i];
      V yv = __hmul2(as_vec<V>(x & 0x7FFF7FFFu), scale1);  // the same |x| words as amax_bits
      if constexpr (D == dtype::f16) yv = __hmul2(yv, scale2);
      const uint32_t y = vec_bits(yv);
      const uint32_t yc = kClamp ? __vminu2(y, F::kSix) : y;  // bit order = value order for y >= 0
      const V e = as_vec<V>(__vmaxu2(yc, F::kOne) & F::kExponent);
      const V s = __hfma2(e, magic, as_vec<V>(yc));
      const uint32_t q = vec_bits(__hfma2(s, code_scale, __hmul2(e, neg_magic_code)));
      const uint32_t d = vec_bits(__hfma2(as_vec<V>(q), neg_code_unscale, yv));
      g[i] = gather_byte<F::kCodeShift>(q, x);
      if constexpr (kStats) {
        sig[0] = fmaf(F::lo(y), F::lo(y), sig[0]);
        sig[1] = fmaf(F::hi(y), F::hi(y), sig[1]);
        err[0] = fmaf(F::lo(d), F::lo(d), err[0]);
        err[1] = fmaf(F::hi(d), F::hi(d), err[1]);
        if constexpr (kCountClamped) clamped_acc -= __hgt2_mask(yv, six);  // exact compare, y > 6
      }
    }
    out[j] = pack_bytes3(g);
    if constexpr (kStats) nonzero += nonzero_codes(out[j]);
  }
  signal = sig[0] + sig[1];
  error = err[0] + err[1];
  return {make_uint4(out[0], out[1], out[2], out[3]), nonzero,
          kStats && kCountClamped ? clamped_count(clamped_acc) : 0};
}

// f32 input: the same steps per element; the upper halves of two elements' q and x form a bf16x2
// style word (code at bits 8..6 and 24..22, signs at 15 and 31) for gather_byte.
template <bool kClamp, bool kCountClamped, bool kStats>
__device__ __forceinline__ block_codes encode_block_f32(const uint32_t* w, uint8_t scale, float& signal, float& error) {
  const float f = mx::bits_float(static_cast<uint32_t>(254 - scale) << 23);  // 2^k, normal for scale <= 253
  float sig[2] = {0.0f, 0.0f}, err[2] = {0.0f, 0.0f};
  uint32_t out[4];
  int nonzero = 0, clamped = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t g[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t q[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float y = __fmul_rn(__uint_as_float(w[8 * j + 2 * i + h] & 0x7FFFFFFFu), f);
        const float yc = kClamp ? fminf(y, 6.0f) : y;
        const float e = __uint_as_float(__float_as_uint(fmaxf(yc, 1.0f)) & 0x7F800000u);
        const float s = __fmaf_rn(e, 0x1p22f, yc);
        const float qf = __fmaf_rn(s, 0x1p-126f, -__fmul_rn(e, 0x1p-104f));
        const float d = __fmaf_rn(qf, -0x1p126f, y);
        q[h] = __float_as_uint(qf);
        if constexpr (kStats) {
          sig[h] = __fmaf_rn(y, y, sig[h]);
          err[h] = __fmaf_rn(d, d, err[h]);
          if constexpr (kCountClamped) clamped += y > mx::kE2M1Max ? 1 : 0;
        }
      }
      g[i] = gather_byte<6>(__byte_perm(q[0], q[1], 0x7632),
                            __byte_perm(w[8 * j + 2 * i], w[8 * j + 2 * i + 1], 0x7632));
    }
    out[j] = pack_bytes3(g);
    if constexpr (kStats) nonzero += nonzero_codes(out[j]);
  }
  signal = sig[0] + sig[1];
  error = err[0] + err[1];
  return {make_uint4(out[0], out[1], out[2], out[3]), nonzero, clamped};
}

template <dtype D, scale_rule R, bool kStats>
__device__ __forceinline__ block_codes encode_block(const uint32_t* w, uint8_t scale, float& signal, float& error) {
  constexpr bool kClamp = R == scale_rule::floor || R == scale_rule::mse;
  constexpr bool kCountClamped = R != scale_rule::rceil;
  if constexpr (D == dtype::f32) return encode_block_f32<kClamp, kCountClamped, kStats>(w, scale, signal, error);
  else return encode_block_packed<D, kClamp, kCountClamped, kStats>(w, scale, signal, error);
}

// Number of +-0 elements of a block (called only for blocks that have one).
template <dtype D>
__device__ int count_zeros(const uint32_t* w) {
  int n = 0;
  if constexpr (D == dtype::f32) {
#pragma unroll
    for (int i = 0; i < 32; ++i) n += (w[i] & 0x7FFFFFFFu) == 0 ? 1 : 0;
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) n += ((w[i] & 0x7FFFu) == 0 ? 1 : 0) + ((w[i] & 0x7FFF0000u) == 0 ? 1 : 0);
  }
  return n;
}

}  // namespace mxmoe::cuda::quant
