// quantize/mse.cuh — the `mse` scale rule on the device: the exact replica of mx::block_scale's
// search (any input type) and, for bf16 input, the search fused with the encode in packed
// arithmetic with bit-identical sums.
// Internal to src/cuda/quantize (included by launcher.cu only).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "encoders.cuh"
#include "mxmoe/mx.h"

namespace mxmoe::cuda::quant {

using mx::scale_rule;

// mx::block_scale(x, scale_rule::mse) with the same float operations in the same order, so the
// same byte: per candidate c, err_c = sum_i (y_i - q_i)^2 accumulated with add_rn(err, mul_rn(d, d))
// from i = 0, where y_i = x_i * 2^(127-ref) and q_i = e2m1(code_i) * 2^(c-ref). Both y and q carry
// x_i's sign, so |y| - |q| is the same difference up to sign (round to nearest is symmetric) and
// its square is the same float. Every power-of-two factor here is a normal float (ref <= 252), so
// x * factor is what mx::mul_pow2 computes.
template <dtype D>
__device__ uint8_t mse_scale(const uint32_t* w, uint32_t amax) {
  const uint8_t base = mx::scale_from_amax(mx::bits_float(amax), scale_rule::mse);
  if (base == mx::kE8M0Nan || amax < 0x00800000u) return base;
  const bool has_lo = base > 0, has_hi = base < 254;
  const float f_ref = mx::e8m0_to_float(static_cast<uint8_t>(254 - base));  // 2^(127 - base)
  const float f_lo = has_lo ? mx::e8m0_to_float(static_cast<uint8_t>(255 - base)) : 0.0f;
  const float f_hi = has_hi ? mx::e8m0_to_float(static_cast<uint8_t>(253 - base)) : 0.0f;
  float err_lo = 0.0f, err_ref = 0.0f, err_hi = 0.0f;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const float ax = fabsf(element<D>(w, i));
    const float y = __fmul_rn(ax, f_ref);
    const float d_ref = __fsub_rn(y, round_to_e2m1_grid(y));
    err_ref = __fadd_rn(err_ref, __fmul_rn(d_ref, d_ref));
    const float d_lo = __fsub_rn(y, __fmul_rn(round_to_e2m1_grid(__fmul_rn(ax, f_lo)), 0.5f));
    err_lo = __fadd_rn(err_lo, __fmul_rn(d_lo, d_lo));
    const float d_hi = __fsub_rn(y, __fmul_rn(round_to_e2m1_grid(__fmul_rn(ax, f_hi)), 2.0f));
    err_hi = __fadd_rn(err_hi, __fmul_rn(d_hi, d_hi));
  }
  // mx::block_scale visits base - 1, then base + 1; ties go to the larger byte.
  uint8_t best = base;
  float best_err = err_ref;
  if (has_lo && err_lo < best_err) {
    best = static_cast<uint8_t>(base - 1);
    best_err = err_lo;
  }
  if (has_hi && err_hi <= best_err) best = static_cast<uint8_t>(base + 1);
  return best;
}

// ---- mse for bf16 input: search and encode in one pass ------------------------------------------
//
// mx::block_scale's mse search compares err_c = sum_i (y_i - r_i)^2 over the candidates c = ref - 1,
// ref, ref + 1 (ref: the floor byte), accumulated from i = 0 as add_rn(err, mul_rn(d, d)), where
// y_i = |x_i| * 2^(127-ref) and r_i is |x_i| encoded with scale c, in units of ref. Here every
// candidate is rounded in those units, on two elements per bf16x2 instruction, without rescaling:
// candidate c's grid is the E2M1 grid times 2^(ref-c) (c = ref - 1: steps 0.25 / 0.5 / 1 up to 3;
// ref: 0.5 / 1 / 2 up to 6; c = ref + 1: 1 / 2 / 4 up to 12). With E_c the power of two that sets
// the step (step = E_c / 2) and y clamped to the grid's top (3 and 6; y < 8 never reaches 12):
//   s_c = E_c * 2^6 + yc                 rounds yc to the grid, ties to even codes (as encode_block)
//   q_c = s_c * 2^m - E_c * 2^(6+m)      = r_c * 2^m, m = -126 - (c - ref): the code's bf16 bits
//                                         (code << 6), exact
//   d_c = y - q_c * 2^-m                 = y - r_c, exact
// E_c comes from one mask of max(y, 0.5): E_full in {0.5, 1, 2, 4} (y < 8), E_lo = min(E_full, 2),
// E_ref = max(E_full, 1), E_hi = max(E_full, 2). d_c is exact in bf16: y and r_c are multiples of
// ulp(y) (the grid steps are at least 0.25 > ulp(y) for y < 8) and |d_c| <= y (0 is on every grid,
// and clamping only lowers r_c), so d_c has at most 8 significant bits. Then d_c^2 has at most 16
// and is an exact float whenever d_c is a multiple of 2^-74, which holds when every non-zero y is at
// least 2^-67 (y is a bf16 normal there, ulp(y) >= 2^-74; zeros give d = 0); so mul_rn(d, d) is d^2
// and add_rn(err, d^2) = fma(d, d, err): the sums below are bit-identical to mx::block_sq_error's.
// Blocks with a smaller non-zero element (rare: a dynamic range beyond 2^70) and blocks without a
// search (zero or subnormal amax, NaN, Inf) return false and take the scalar path (mse_scale +
// encode_block). Checked exhaustively on the host for every bf16 y in [2^-67, 8) and 0 against
// mx::float_to_e2m1 / mx::block_sq_error's steps (throwaway program, see docs/quantize_kernels.md).
//
// ref and ref + 1 are always evaluated. ref - 1 almost never wins (its grid stops at 3 while
// y_max >= 4), so it is evaluated only for the blocks where a bound cannot rule it out (see
// mse_lo_cannot_win_b and _a; ~0.005% of the benchmark's blocks, ~0.6% of Gaussian ones).

// Candidate ref + C (C in -1, 0, 1) for one bf16x2 word of y (y >= 0, e_full as above): its code word
// q (code << 6 per half) and its exact error d = y - r.
template <int C>
__device__ __forceinline__ void mse_round_pair(uint32_t y, uint32_t e_full, uint32_t& q, uint32_t& d) {
  using F = packed_format<dtype::bf16>;
  using V = F::vec;
  constexpr uint32_t kTwo = 0x40004000u, kThree = 0x40404040u, kNeg = 0x80008000u;
  const uint32_t e = C < 0 ? __vminu2(e_full, kTwo) : __vmaxu2(e_full, C == 0 ? F::kOne : kTwo);
  const uint32_t yc = C < 0 ? __vminu2(y, kThree) : (C == 0 ? __vminu2(y, F::kSix) : y);
  const V ev = as_vec<V>(e);
  const V s = __hfma2(ev, as_vec<V>(F::pow2(6)), as_vec<V>(yc));
  // 2^m with m = -126 - C; 2^-127 (C = 1) is the bf16 subnormal 0x0040.
  const V code_unit = as_vec<V>(C > 0 ? 0x00400040u : F::pow2(-126 - C));
  q = vec_bits(__hfma2(s, code_unit, __hmul2(ev, as_vec<V>(F::pow2(-120 - C) | kNeg))));
  d = vec_bits(__hfma2(as_vec<V>(q), as_vec<V>(F::pow2(126 + C) | kNeg), as_vec<V>(y)));
}

// Sound tests that candidate ref - 1 loses (CPU: it wins only if err_lo < err_ref, as floats), from the
// block's largest y (y_max in [4, 8)), err_ref and ref's packed codes. In exact arithmetic, per element,
// e_lo^2 - e_ref^2 is >= 0 for y > 3 (ref - 1 clamps at 3), 0 for y in [0.875, 3] (same grid there)
// and at least -1/16 below 0.875, only for codes 0, 1, 2 of ref (the points 0.25 and 0.75 that ref - 1
// adds gain at most 0.5 (1/4 - 1/8)). So E_lo - E_ref >= (y_max - 3)^2 - e_ref(y_max)^2 - n_small / 16
// (A), and E_lo >= (y_max - 3)^2 alone (B). The float sums are within 31 half-ulps of the exact ones:
// err_lo <= 800 and err_ref <= 128 give |err - E| < 2^-10 + 2^-13, below the margin 2^-8 used here
// (the bounds are computed exactly or with errors far below it: every value has few bits).
// B is checked first and alone where it holds (A costs ~25 instructions per block).
__device__ __forceinline__ bool mse_lo_cannot_win_b(float y_max, float err_ref) {
  const float t = y_max - 3.0f;
  return __fmaf_rn(t, t, -err_ref) > 0x1p-8f;  // err_lo >= (y_max - 3)^2 - 2^-10
}
__device__ __forceinline__ bool mse_lo_cannot_win_a(float y_max, const uint32_t (&out_ref)[4]) {
  const float t = y_max - 3.0f;
  const float e_amax = y_max <= 5.0f ? y_max - 4.0f : fabsf(y_max - 6.0f);  // ref: 4 up to 5, then 6
  int n_small = 0;  // codes with magnitude <= 2: not bit 2 and not (bits 1 and 0)
#pragma unroll
  for (int j = 0; j < 4; ++j)
    n_small += __popc(~((out_ref[j] >> 2) | ((out_ref[j] >> 1) & out_ref[j])) & 0x11111111u);
  return t * t - e_amax * e_amax - 0.0625f * static_cast<float>(n_small) > 0x1p-8f;  // A
}

// kStats: also the counts and the signal (the error sums are the search itself).
template <bool kStats>
__device__ __forceinline__ bool mse_encode_bf16(const uint32_t* w, uint32_t amax, uint32_t min_abs, uint8_t& scale,
                                                block_codes& codes, float& signal, float& error) {
  using F = packed_format<dtype::bf16>;
  using V = F::vec;
  if (amax < 0x00800000u || amax >= 0x7F800000u) return false;
  const uint8_t ref = mx::scale_from_amax(mx::bits_float(amax), scale_rule::mse);  // <= 252
  uint32_t min_nonzero = min_abs;
  if (min_abs == 0) {
    // (|x| | 0x8000) - 1 per half, no borrow between halves: 0x7FFF for a zero, else 0x7FFF + |x|,
    // which as a signed 16-bit number is negative and ordered by |x|.
    uint32_t m2 = 0x7FFF7FFFu;
#pragma unroll
    for (int i = 0; i < 16; ++i) m2 = __vmins2(m2, (w[i] | 0x80008000u) - 0x00010001u);
    const int m = min(static_cast<int>(static_cast<int16_t>(m2 & 0xFFFFu)), static_cast<int>(static_cast<int16_t>(m2 >> 16)));
    min_nonzero = static_cast<uint32_t>(m + 0x8001);  // amax > 0: some element is not zero
  }
  const float unscale = mx::bits_float(static_cast<uint32_t>(254 - ref) << 23);  // 2^(127 - ref), a normal float
  if (__fmul_rn(bf16_to_float(static_cast<uint16_t>(min_nonzero)), unscale) < 0x1p-67f) return false;

  constexpr uint32_t kHalf = 0x3F003F00u, kNeg = 0x80008000u;
  constexpr uint32_t kSpread = (1u << (24 - F::kCodeShift)) + (1u << (12 - F::kCodeShift));
  const V y_scale = as_vec<V>(F::pow2(127 - ref));
  auto y_of = [&](uint32_t x) { return vec_bits(__hmul2(as_vec<V>(x & 0x7FFF7FFFu), y_scale)); };
  auto e_full_of = [](uint32_t y) { return __vmaxu2(y, kHalf) & F::kExponent; };  // bit order = value order, y >= 0
  auto signs_of = [](uint32_t x) { return (x & kNeg) * 0x1001u; };                // see gather_byte
  float err_ref = 0.0f, err_hi = 0.0f, sig = 0.0f;
  uint32_t out_ref[4], out_hi[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t g_ref[4], g_hi[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t x = w[4 * j + i], y = y_of(x), e_full = e_full_of(y);
      uint32_t q_ref, d_ref, q_hi, d_hi;
      mse_round_pair<0>(y, e_full, q_ref, d_ref);
      mse_round_pair<1>(y, e_full, q_hi, d_hi);
      g_ref[i] = q_ref * kSpread + signs_of(x);
      g_hi[i] = q_hi * kSpread + signs_of(x);
      // Element 4j + i's pair in mx::block_sq_error's order: low half (element 2(4j + i)) first.
      err_ref = __fmaf_rn(F::lo(d_ref), F::lo(d_ref), err_ref);
      err_ref = __fmaf_rn(F::hi(d_ref), F::hi(d_ref), err_ref);
      err_hi = __fmaf_rn(F::lo(d_hi), F::lo(d_hi), err_hi);
      err_hi = __fmaf_rn(F::hi(d_hi), F::hi(d_hi), err_hi);
      if constexpr (kStats) {
        sig = fmaf(F::lo(y), F::lo(y), sig);
        sig = fmaf(F::hi(y), F::hi(y), sig);
      }
    }
    out_ref[j] = pack_bytes3(g_ref);
    out_hi[j] = pack_bytes3(g_hi);
  }
  // mx::block_scale: start from ref, visit ref - 1 then ref + 1; ties go to the larger byte.
  int pick = 0;
  float best = err_ref;
  uint32_t out_lo[4] = {0, 0, 0, 0};
  const float y_max = __fmul_rn(mx::bits_float(amax), unscale);
  if (ref > 0 && !mse_lo_cannot_win_b(y_max, err_ref) && !mse_lo_cannot_win_a(y_max, out_ref)) {
    float err_lo = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t g_lo[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t x = w[4 * j + i], y = y_of(x);
        uint32_t q_lo, d_lo;
        mse_round_pair<-1>(y, e_full_of(y), q_lo, d_lo);
        g_lo[i] = q_lo * kSpread + signs_of(x);
        err_lo = __fmaf_rn(F::lo(d_lo), F::lo(d_lo), err_lo);
        err_lo = __fmaf_rn(F::hi(d_lo), F::hi(d_lo), err_lo);
      }
      out_lo[j] = pack_bytes3(g_lo);
    }
    if (err_lo < best) {
      pick = -1;
      best = err_lo;
    }
  }
  if (err_hi <= best) {  // ref <= 252: ref + 1 is always a candidate
    pick = 1;
    best = err_hi;
  }
  scale = static_cast<uint8_t>(ref + pick);
  uint32_t out[4];
  int nonzero = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    out[j] = pick < 0 ? out_lo[j] : (pick > 0 ? out_hi[j] : out_ref[j]);
    if constexpr (kStats) nonzero += nonzero_codes(out[j]);
  }
  // Clamped elements: |x| * 2^(127 - scale) > 6, i.e. |x| > 3 * 2^(ref-127) for ref - 1 and
  // |x| > 6 * 2^(ref-127) for ref (both bf16 normals); never for ref + 1 (y < 8).
  int clamped = 0;
  const uint32_t clamp_at = ((static_cast<uint32_t>(ref) + (pick < 0 ? 1u : 2u)) << 7) | 0x40u;
  if (kStats && pick <= 0 && (amax >> 16) > clamp_at) {
    uint32_t clamped_acc = 0;
#pragma unroll
    for (int i = 0; i < 16; ++i)
      clamped_acc -= __hgt2_mask(as_vec<V>(w[i] & 0x7FFF7FFFu), as_vec<V>(clamp_at * 0x10001u));
    clamped = clamped_count(clamped_acc);
  }
  codes = {make_uint4(out[0], out[1], out[2], out[3]), nonzero, clamped};
  const float to_scale_units = pick < 0 ? 4.0f : (pick > 0 ? 0.25f : 1.0f);
  signal = sig * to_scale_units;
  error = best * to_scale_units;
  return true;
}

}  // namespace mxmoe::cuda::quant
