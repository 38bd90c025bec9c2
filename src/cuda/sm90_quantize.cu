// sm90_quantize.cu — MXFP4 quantize / dequantize of device tensors (include/mxmoe/cuda.h), bit-exact
// with the CPU reference (src/cpu/quantize.cpp). Design and napkin math: docs/quantize_kernels.md.
//
// Two kernels per direction:
//   * fast: one thread per 32-element MX block, one warp per 32 consecutive blocks. The warp's
//     input is staged through shared memory with 16-byte cp.async (each instruction of the warp
//     reads 512 contiguous bytes), double-buffered so the next tile's loads are in flight while
//     the current one is encoded; each thread writes its 16 packed bytes with one 16-byte store.
//     Dequantize is the mirror image (16-byte loads of codes, output staged through shared memory).
//     Needs 16-byte aligned rows and outputs.
//   * reference: one thread per block, element loads, mx::quantize_block / mx::dequantize_value
//     as written. Used when an address is not 16-byte aligned (and exercised by the tests so).
// Scale bytes always come from mx::scale_from_amax (floor/even/rceil) or an exact replica of
// mx::block_scale's `mse` search (same float operations in the same order, see mse_scale; for bf16
// input fused with the encode in packed arithmetic, bit-identical sums, see mse_encode_bf16). The
// fast kernel encodes elements with exact floating-point steps instead of mx::float_to_e2m1's
// compare chain (see "per-element encoding"): two elements per instruction in bf16x2 / f16x2
// arithmetic for 16-bit inputs, so a bf16 element costs ~15-17 SASS instructions in the hot loop
// (loads, amax, scale, encode, packing, statistics), against a budget of ~23 per element at 85 % of
// the H200's copy bandwidth (docs/quantize_kernels.md has the napkin math).
// Statistics: integer counts exact (clamped elements by a packed compare, flushed ones as zero
// codes minus zero inputs); signal and error sums per block in float in units of the scale, per
// thread in double, one partial per CTA, reduced in a fixed order by a one-CTA kernel launched as a
// programmatic dependent of the quantize kernel. They cost ~30% of the hot loop's instructions:
// without a statistics pointer, quantize_async runs kernels that compute none (same bytes).
// Every kernel here is launched as a programmatic dependent of the work before it (its CTAs become
// resident while that work drains) and waits for it before touching memory.
// Limits: at most 2^31 - 1 blocks per call; at most 4 leading dimensions that cannot be merged.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>
#include <cutlass/fast_math.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "check.h"
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
#include "mxmoe/layout.h"
#include "mxmoe/mx.h"

namespace mxmoe::cuda {
namespace {

using mx::scale_rule;

constexpr int kThreads = 256;
constexpr int kWarpsPerCta = kThreads / 32;
constexpr int kMaxLeadingDims = 4;
constexpr uint32_t kFullMask = 0xFFFFFFFFu;

// ---- where things live ------------------------------------------------------------------------

// Row r of a [..., rows, K] tensor (r flattened over all dimensions but the last) starts at element
// offset sum_d index_d(r) * stride_d. Dimensions are stored innermost first, with size-1 dimensions
// dropped and mergeable neighbours merged on the host: a contiguous tensor has one dimension.
struct row_map {
  int ndims = 1;
  cutlass::FastDivmod size[kMaxLeadingDims];
  int64_t stride[kMaxLeadingDims] = {};

  __device__ int64_t offset(int row) const {
    int64_t off = 0;
#pragma unroll
    for (int d = 0; d < kMaxLeadingDims - 1; ++d) {
      if (d + 1 >= ndims) break;
      int q, i;
      size[d](q, i, row);
      off += static_cast<int64_t>(i) * stride[d];
      row = q;
    }
    return off + static_cast<int64_t>(row) * stride[ndims - 1];
  }
};

// Byte offset of block g's scale (g = row * K/32 + kb over all rows).
struct scale_index {
  bool tiled = false;
  cutlass::FastDivmod blocks_per_row;  // K / 32
  cutlass::FastDivmod rows;            // rows per matrix (dim -2)
  layout::scale_tiled_128x4 tile;      // {rows, K/32}
  int64_t matrix_bytes = 0;            // tile.size()

  __device__ int64_t offset(int g) const {
    if (!tiled) return g;
    int row, kb, b, m;
    blocks_per_row(row, kb, g);
    rows(b, m, row);
    // m and kb are non-negative (g is): passed zero-extended so the compiler knows it and turns the
    // layout's signed divisions by 128, 32 and 4 into plain shifts and masks.
    return b * matrix_bytes + tile.offset(static_cast<uint32_t>(m), static_cast<uint32_t>(kb));
  }
};

struct stats_partial {
  unsigned long long saturated, clamped, flushed, nonfinite;
  double signal, error;
};

struct quant_params {
  const uint8_t* x;
  uint8_t* packed;
  uint8_t* scales;
  int total_blocks;
  cutlass::FastDivmod blocks_per_row;
  row_map rows;
  scale_index scale;
  int64_t pad_entries;  // tiled padding bytes over all matrices (0 for linear)
  bool dense;           // block g starts at element g * 32 (rows back to back): no row arithmetic
  scale_rule rule;      // for the reference kernel (the fast ones are one per rule)
  stats_partial* partials;  // one per CTA; nullptr: no statistics wanted
};

struct dequant_params {
  const uint8_t* packed;
  const uint8_t* scales;
  uint8_t* out;
  int total_blocks;
  scale_index scale;
};

// ---- statistics -------------------------------------------------------------------------------

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

// Programmatic dependent launch: the next kernel in the stream may be scheduled from here on (it
// still waits for this grid to complete before touching memory, see wait_for_previous_grid).
__device__ __forceinline__ void allow_dependent_launch() { asm volatile("griddepcontrol.launch_dependents;"); }

// The quantize kernels are launched as programmatic dependents of whatever precedes them in the
// stream, so that their CTAs are resident when it ends: before any memory access they wait for that
// grid to complete and its writes to be visible (immediately when it was not a programmatic launch).
__device__ __forceinline__ void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// One CTA: thread t sums partials t, t + kThreads, ... in that order, then cta_sum combines the
// threads: the order of every double addition depends only on `count`, so identical calls give
// identical statistics. Launched as a programmatic dependent of the quantize kernel (see
// launch_finalize): it may start while the quantize kernel drains, and waits for it to complete
// before reading the partials.
__global__ void __launch_bounds__(kThreads) finalize_stats(const stats_partial* partials, int count, int64_t blocks,
                                                           quant_stats* out) {
  wait_for_previous_grid();
  allow_dependent_launch();
  stats_partial mine{0, 0, 0, 0, 0.0, 0.0};
  for (int i = threadIdx.x; i < count; i += kThreads) add_partial(mine, partials[i]);
  const stats_partial t = cta_sum(mine);
  if (threadIdx.x != 0) return;
  out->elements = blocks * mx::kBlockSize;
  out->blocks = blocks;
  out->saturated_blocks = static_cast<int64_t>(t.saturated);
  out->clamped_elements = static_cast<int64_t>(t.clamped);
  out->flushed_elements = static_cast<int64_t>(t.flushed);
  out->nonfinite_blocks = static_cast<int64_t>(t.nonfinite);
  out->signal_sq = t.signal;
  out->error_sq = t.error;
}

// Tiled scale storage pads rows to 128 and columns to 4: those bytes get 0, like the CPU writes.
// Padding entries of one matrix are enumerated as the padded rows (all columns), then the padded
// columns of the real rows.
__device__ void zero_tiled_padding(const quant_params& p) {
  if (p.pad_entries == 0) return;
  const layout::scale_tiled_128x4& t = p.scale.tile;
  const int64_t pr = t.padded_rows(), pc = t.padded_cols();
  const int64_t per_matrix = pr * pc - t.rows * t.cols, row_pad = (pr - t.rows) * pc;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < p.pad_entries;
       i += int64_t{gridDim.x} * kThreads) {
    const int64_t b = i / per_matrix, j = i % per_matrix;
    int64_t m, k;
    if (j < row_pad) {
      m = t.rows + j / pc;
      k = j % pc;
    } else {
      m = (j - row_pad) / (pc - t.cols);
      k = t.cols + (j - row_pad) % (pc - t.cols);
    }
    p.scales[b * p.scale.matrix_bytes + t.offset(m, k)] = 0;
  }
}

// ---- the fast quantize kernel -----------------------------------------------------------------

template <dtype D>
constexpr int elem_bytes() {
  return D == dtype::f32 ? 4 : 2;
}

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

// 16-byte chunk c of a warp tile sits at c ^ ((c >> 3) & (chunks per block - 1)) in shared memory:
// conflict-free both for the tile-order copies and for each thread reading its own block.
template <int kChunksPerBlock>
__device__ __forceinline__ int swizzle(int c) {
  return c ^ ((c >> 3) & (kChunksPerBlock - 1));
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

template <dtype D>
__device__ __forceinline__ void issue_tile_loads(const quant_params& p, int tile, uint4* stage) {
  constexpr int kChunksPerBlock = 32 * elem_bytes<D>() / 16;
  const int lane = threadIdx.x & 31;
  if (p.dense) {
    // The tile is one contiguous range: chunk c is at byte c * 16 of it.
    const uint8_t* base = p.x + int64_t{tile} * (32 * mx::kBlockSize * elem_bytes<D>());
    if (tile < (p.total_blocks >> 5)) {
      // A whole tile (every tile but a partial last one): no bounds checks, and copy i's addresses
      // are this lane's plus constants. Its chunk c = 32 i + lane goes to swizzle(c) = 32 i + (lane ^ t)
      // with t = (4 i + lane / 8) & (chunks per block - 1) = ((4 i) & (chunks - 1)) ^ ((lane / 8) & (chunks - 1))
      // (lane / 8 < 4 shares no bit with 4 i).
      const uint8_t* src = base + lane * 16;
      const int lane_sw = lane ^ ((lane >> 3) & (kChunksPerBlock - 1));
#pragma unroll
      for (int i = 0; i < kChunksPerBlock; ++i)
        __pipeline_memcpy_async(stage + 32 * i + (lane_sw ^ ((4 * i) & (kChunksPerBlock - 1))), src + i * 512, 16);
      return;
    }
#pragma unroll
    for (int i = 0; i < kChunksPerBlock; ++i) {
      const int c = i * 32 + lane;
      const bool valid = tile * 32 + c / kChunksPerBlock < p.total_blocks;
      __pipeline_memcpy_async(stage + swizzle<kChunksPerBlock>(c), valid ? base + c * 16 : p.x, 16, valid ? 0 : 16);
    }
    return;
  }
  const int g = tile * 32 + lane;
  int64_t src = -1;  // byte offset of this lane's block, -1 past the end
  if (g < p.total_blocks) {
    int row, kb;
    p.blocks_per_row(row, kb, g);
    src = (p.rows.offset(row) + int64_t{kb} * mx::kBlockSize) * elem_bytes<D>();
  }
#pragma unroll
  for (int i = 0; i < kChunksPerBlock; ++i) {
    const int c = i * 32 + lane;
    const int64_t s = __shfl_sync(kFullMask, src, c / kChunksPerBlock);
    const uint8_t* gp = s >= 0 ? p.x + s + (c % kChunksPerBlock) * 16 : p.x;
    __pipeline_memcpy_async(stage + swizzle<kChunksPerBlock>(c), gp, 16, s >= 0 ? 0 : 16);
  }
}

// CTAs per SM (occupancy as measured): 3 for 16-bit input (at most 80 registers), 2 for f32 and for
// the bf16 mse kernel (at most 128 registers: it carries three candidates' codes and sums through the
// block; compute-bound, so 16 warps per SM still cover the load latency many times over).
template <dtype D, scale_rule R>
constexpr int min_ctas_per_sm() {
  return D == dtype::f32 || (D == dtype::bf16 && R == scale_rule::mse) ? 2 : 3;
}

// kStats: the statistics are wanted (quantize_async with a quant_stats pointer); without them the
// counts and sums are not computed and no partials are written.
template <dtype D, scale_rule R, bool kStats>
__global__ void __launch_bounds__(kThreads, min_ctas_per_sm<D, R>()) quantize_fast(const quant_params p) {
  constexpr int kChunksPerBlock = 32 * elem_bytes<D>() / 16;
  constexpr int kTileChunks = 32 * kChunksPerBlock;
  extern __shared__ __align__(128) uint4 smem[];  // 128-byte aligned: the swizzle assumes it
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint4* stage0 = smem + (2 * warp) * kTileChunks;
  uint4* stage1 = stage0 + kTileChunks;

  wait_for_previous_grid();
  allow_dependent_launch();
  zero_tiled_padding(p);

  stats_acc acc;
  const int tiles = (p.total_blocks + 31) / 32;
  const int stride = gridDim.x * kWarpsPerCta;
  int tile = blockIdx.x * kWarpsPerCta + warp;
  // This lane's block: its chunk q sits at swizzle(lane * chunks + q) = block_chunk0 ^ q, because
  // lane * chunks has no bits below the chunk count and (lane * chunks + q) / 8 = lane * chunks / 8.
  const int block_chunk0 = lane * kChunksPerBlock + (((lane * kChunksPerBlock) >> 3) & (kChunksPerBlock - 1));
  if (tile < tiles) issue_tile_loads<D>(p, tile, stage0);
  __pipeline_commit();
  for (int it = 0; tile < tiles; tile += stride, ++it) {
    uint4* cur = (it & 1) ? stage1 : stage0;
    if (tile + stride < tiles) issue_tile_loads<D>(p, tile + stride, (it & 1) ? stage0 : stage1);
    __pipeline_commit();
    __pipeline_wait_prior(1);
    __syncwarp();

    const int g = tile * 32 + lane;
    if (g < p.total_blocks) {
      uint32_t w[kChunksPerBlock * 4];
#pragma unroll
      for (int q = 0; q < kChunksPerBlock; ++q) {
        const uint4 v = cur[block_chunk0 ^ q];
        w[4 * q] = v.x;
        w[4 * q + 1] = v.y;
        w[4 * q + 2] = v.z;
        w[4 * q + 3] = v.w;
      }
      uint32_t min_abs;
      const uint32_t amax = amax_bits<D>(w, min_abs);
      const bool has_zero = min_abs == 0;
      uint8_t scale;
      block_codes c{};
      float signal = 0.0f, error = 0.0f;  // in units of the scale
      bool encoded = false;
      if constexpr (R == scale_rule::mse && D == dtype::bf16)
        encoded = mse_encode_bf16<kStats>(w, amax, min_abs, scale, c, signal, error);
      if (!encoded) {
        if constexpr (R == scale_rule::mse) scale = mse_scale<D>(w, amax);
        else scale = mx::scale_from_amax(mx::bits_float(amax), R);
        if (scale != mx::kE8M0Nan) c = encode_block<D, R, kStats>(w, scale, signal, error);
      }
      uint4 out = make_uint4(0, 0, 0, 0);
      if (scale == mx::kE8M0Nan) {
        acc.nonfinite += 1;
      } else {
        out = c.packed;
        if constexpr (kStats) {
          acc.clamped += c.clamped;
          acc.saturated += c.clamped != 0 ? 1u : 0u;
          acc.flushed += mx::kBlockSize - c.nonzero - (has_zero ? count_zeros<D>(w) : 0);
          // unit^2 = 2^(2 (scale - 127)), a normal double for every byte <= 254, built from its exponent
          // bits. Multiplying by it is exact, so the fma rounds once, like the product-then-add it replaces.
          const double unit_sq = __hiloint2double((2 * static_cast<int>(scale) + 769) << 20, 0);
          acc.signal = fma(static_cast<double>(signal), unit_sq, acc.signal);
          acc.error = fma(static_cast<double>(error), unit_sq, acc.error);
        }
      }
      __stcs(reinterpret_cast<uint4*>(p.packed) + g, out);
      p.scales[p.scale.offset(g)] = scale;
    }
    __syncwarp();  // every lane has read `cur` before the next iteration refills it
  }
  if constexpr (kStats) store_cta_stats(acc, p.partials);
}

// ---- the reference quantize kernel ------------------------------------------------------------

template <dtype D>
__global__ void __launch_bounds__(kThreads) quantize_reference(const quant_params p) {
  wait_for_previous_grid();
  allow_dependent_launch();
  zero_tiled_padding(p);
  stats_acc acc;
  for (int g = blockIdx.x * kThreads + threadIdx.x; g < p.total_blocks; g += gridDim.x * kThreads) {
    int row, kb;
    p.blocks_per_row(row, kb, g);
    const uint8_t* src = p.x + (p.rows.offset(row) + int64_t{kb} * mx::kBlockSize) * elem_bytes<D>();
    float x[mx::kBlockSize];
    for (int i = 0; i < mx::kBlockSize; ++i) {
      if constexpr (D == dtype::f32) x[i] = reinterpret_cast<const float*>(src)[i];
      else if constexpr (D == dtype::bf16) x[i] = bf16_to_float(reinterpret_cast<const uint16_t*>(src)[i]);
      else x[i] = f16_to_float(reinterpret_cast<const uint16_t*>(src)[i]);
    }
    uint8_t scale, codes[mx::kPackedBlockBytes];
    const mx::block_stats st = mx::quantize_block(x, p.rule, &scale, codes);
    for (int j = 0; j < mx::kPackedBlockBytes; ++j) p.packed[int64_t{g} * mx::kPackedBlockBytes + j] = codes[j];
    p.scales[p.scale.offset(g)] = scale;
    if (st.nonfinite) {
      acc.nonfinite += 1;
      continue;
    }
    acc.clamped += st.clamped;
    acc.flushed += st.flushed;
    acc.saturated += st.clamped > 0 ? 1u : 0u;
    for (int i = 0; i < mx::kBlockSize; ++i) {
      const double v = x[i];
      const double e = v - static_cast<double>(mx::dequantize_value(mx::unpack_e2m1(codes[i >> 1], i), scale));
      acc.signal += v * v;
      acc.error += e * e;
    }
  }
  if (p.partials != nullptr) store_cta_stats(acc, p.partials);
}

// ---- dequantize ---------------------------------------------------------------------------------

// Element values of one block: e2m1(code) * 2^(scale-127) is exact for every code and scale byte
// (the smallest, 0.5 * 2^-127, is a float subnormal), so it equals mx::dequantize_value, which
// gets there in two steps for byte 0. Such a value has at most two significant bits, so its bf16
// is its float's upper half (what float_to_bf16 returns for it). Scale 0xFF: every element is the
// canonical NaN dequantize_value returns (bf16 0x7FC0, as float_to_bf16 converts it).
template <dtype D>
__device__ __forceinline__ void dequantize_words(uint4 codes, uint8_t scale, uint32_t* out) {
  constexpr int kWords = D == dtype::f32 ? 32 : 16;
  if (scale == mx::kE8M0Nan) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) out[i] = D == dtype::f32 ? 0x7FC00000u : 0x7FC07FC0u;
    return;
  }
  const uint32_t cw[4] = {codes.x, codes.y, codes.z, codes.w};
  const float s = mx::e8m0_to_float(scale);
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const uint8_t code = static_cast<uint8_t>((cw[i >> 3] >> (4 * (i & 7))) & 0xFu);
    const uint32_t v = mx::float_bits(mx::e2m1_to_float(code) * s);
    if constexpr (D == dtype::f32) out[i] = v;
    else out[i >> 1] = (i & 1) ? (out[i >> 1] | (v & 0xFFFF0000u)) : (v >> 16);
  }
}

template <dtype D>
__global__ void __launch_bounds__(kThreads) dequantize_fast(const dequant_params p) {
  constexpr int kChunksPerBlock = 32 * elem_bytes<D>() / 16;
  constexpr int kTileChunks = 32 * kChunksPerBlock;
  __shared__ __align__(128) uint4 smem[kWarpsPerCta * kTileChunks];  // 128-byte aligned: the swizzle assumes it
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint4* stage = smem + warp * kTileChunks;
  const int tiles = (p.total_blocks + 31) / 32;
  const int stride = gridDim.x * kWarpsPerCta;
  const uint4* packed = reinterpret_cast<const uint4*>(p.packed);
  uint4* out = reinterpret_cast<uint4*>(p.out);

  int tile = blockIdx.x * kWarpsPerCta + warp;
  uint4 codes = make_uint4(0, 0, 0, 0);
  uint8_t scale = 0;
  auto load = [&](int t, uint4& c, uint8_t& s) {
    const int g = t * 32 + lane;
    if (t < tiles && g < p.total_blocks) {
      c = __ldcs(packed + g);
      s = p.scales[p.scale.offset(g)];
    }
  };
  load(tile, codes, scale);
  for (; tile < tiles; tile += stride) {
    uint4 next_codes = make_uint4(0, 0, 0, 0);
    uint8_t next_scale = 0;
    load(tile + stride, next_codes, next_scale);

    uint32_t w[kChunksPerBlock * 4];
    dequantize_words<D>(codes, scale, w);
#pragma unroll
    for (int q = 0; q < kChunksPerBlock; ++q)
      stage[swizzle<kChunksPerBlock>(lane * kChunksPerBlock + q)] =
          make_uint4(w[4 * q], w[4 * q + 1], w[4 * q + 2], w[4 * q + 3]);
    __syncwarp();
#pragma unroll
    for (int i = 0; i < kChunksPerBlock; ++i) {
      const int c = i * 32 + lane;
      if (tile * 32 + c / kChunksPerBlock < p.total_blocks)
        __stcs(out + int64_t{tile} * kTileChunks + c, stage[swizzle<kChunksPerBlock>(c)]);
    }
    __syncwarp();  // the stage is rewritten next iteration
    codes = next_codes;
    scale = next_scale;
  }
}

template <dtype D>
__global__ void __launch_bounds__(kThreads) dequantize_reference(const dequant_params p) {
  for (int g = blockIdx.x * kThreads + threadIdx.x; g < p.total_blocks; g += gridDim.x * kThreads) {
    const uint8_t scale = p.scales[p.scale.offset(g)];
    const uint8_t* codes = p.packed + int64_t{g} * mx::kPackedBlockBytes;
    for (int i = 0; i < mx::kBlockSize; ++i) {
      const float v = mx::dequantize_value(mx::unpack_e2m1(codes[i >> 1], i), scale);
      const int64_t e = int64_t{g} * mx::kBlockSize + i;
      if constexpr (D == dtype::f32) reinterpret_cast<float*>(p.out)[e] = v;
      else reinterpret_cast<uint16_t*>(p.out)[e] = float_to_bf16(v);
    }
  }
}

// ---- host side ----------------------------------------------------------------------------------

std::string str(int64_t v) { return std::to_string(v); }

void check_device_view(const tensor_view& v, const char* name, int device) {
  MXMOE_CHECK_ARG(v.device == device_kind::cuda, name, "a cuda tensor (mxmoe::cuda backend)", "a cpu tensor");
  if (v.numel() == 0) return;
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, v.data);
  cudaGetLastError();
  MXMOE_CHECK_ARG(err == cudaSuccess && (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged),
                  name, "a pointer to device memory", "a host or unknown pointer");
  MXMOE_CHECK_ARG(attr.device == device, name, "memory on the current device " + str(device),
                  "memory on device " + str(attr.device));
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int64_t total_blocks_of(const tensor_view& v) {
  return v.numel() / mx::kBlockSize;
}

// Merges the leading dimensions of x (all but the last) into row_map form, innermost first.
row_map make_row_map(const tensor_view& x, bool* rows_aligned16) {
  int64_t sizes[16], strides[16];
  int n = 0;
  for (int d = x.rank() - 2; d >= 0; --d) {
    const int64_t size = x.dim(d), stride = x.stride(d);
    if (size == 1) continue;
    if (n > 0 && stride == sizes[n - 1] * strides[n - 1]) {
      sizes[n - 1] *= size;
      continue;
    }
    MXMOE_CHECK_ARG(n < kMaxLeadingDims, "x",
                    "at most " + str(kMaxLeadingDims) + " leading dimensions that are not contiguous with each other",
                    "shape " + shape_string(x.shape) + " strides " + shape_string(x.strides));
    sizes[n] = size;
    strides[n] = stride;
    ++n;
  }
  row_map m;
  if (n == 0) {  // a single row
    sizes[0] = 1;
    strides[0] = 0;
    n = 1;
  }
  m.ndims = n;
  *rows_aligned16 = true;
  for (int d = 0; d < n; ++d) {
    m.size[d] = cutlass::FastDivmod(static_cast<int>(sizes[d]));
    m.stride[d] = strides[d];
    *rows_aligned16 &= (strides[d] * dtype_size(x.type)) % 16 == 0;
  }
  return m;
}

scale_index make_scale_index(const tensor_view& values, scale_layout layout) {
  const int64_t rows = values.dim(-2), cols = values.dim(-1) / mx::kBlockSize;
  scale_index s;
  s.tiled = layout == scale_layout::tiled_128x4;
  s.blocks_per_row = cutlass::FastDivmod(static_cast<int>(cols));
  s.rows = cutlass::FastDivmod(static_cast<int>(std::max<int64_t>(rows, 1)));
  s.tile = layout::scale_tiled_128x4{rows, cols};
  s.matrix_bytes = s.tile.size();
  return s;
}

void check_block_count(const tensor_view& values, const char* name) {
  MXMOE_CHECK_ARG(total_blocks_of(values) <= INT_MAX, name,
                  "at most " + str(INT_MAX) + " MX blocks (2^31 - 1) per call", str(total_blocks_of(values)) + " blocks");
}

int current_device() {
  int dev = 0;
  MXMOE_CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

// CTAs for a grid-stride kernel: enough to fill the GPU, no more than the work needs.
template <class Kernel>
int grid_size(Kernel kernel, int smem_bytes, int64_t ctas_needed) {
  int dev = current_device(), sms = 0, per_sm = 0;
  MXMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  MXMOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem_bytes));
  return static_cast<int>(std::clamp<int64_t>(ctas_needed, 1, int64_t{std::max(per_sm, 1)} * sms));
}

// Launches `kernel` as a programmatic dependent of the work before it in `stream`: its CTAs may be
// scheduled while that work drains (each kernel here calls wait_for_previous_grid before touching
// memory). Capturable in CUDA graphs (a programmatic edge).
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), int grid, int smem_bytes, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
  config.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
  MXMOE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// The kernel quantize_async launches for given parameters, with its dynamic shared memory and grid.
struct quantize_launch {
  void (*kernel)(quant_params);
  int smem_bytes;
  int grid;
};

template <dtype D, scale_rule R, bool kStats>
quantize_launch plan_fast(const quant_params& p) {
  constexpr int kSmem = kWarpsPerCta * 2 * 32 * (32 * elem_bytes<D>() / 16) * 16;
  auto kernel = quantize_fast<D, R, kStats>;
  MXMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const int64_t tiles = layout::ceil_div(p.total_blocks, 32);
  return {kernel, kSmem,
          grid_size(kernel, kSmem,
                    std::max(layout::ceil_div(tiles, kWarpsPerCta), layout::ceil_div(p.pad_entries, kThreads)))};
}

template <dtype D, scale_rule R>
quantize_launch plan_fast(const quant_params& p, bool stats) {
  return stats ? plan_fast<D, R, true>(p) : plan_fast<D, R, false>(p);
}

template <dtype D>
quantize_launch plan_quantize(const quant_params& p, bool fast, bool stats) {
  if (!fast) {
    auto kernel = quantize_reference<D>;
    return {kernel, 0,
            grid_size(kernel, 0,
                      std::max(layout::ceil_div(p.total_blocks, kThreads), layout::ceil_div(p.pad_entries, kThreads)))};
  }
  switch (p.rule) {
    case scale_rule::floor: return plan_fast<D, scale_rule::floor>(p, stats);
    case scale_rule::even: return plan_fast<D, scale_rule::even>(p, stats);
    case scale_rule::rceil: return plan_fast<D, scale_rule::rceil>(p, stats);
    case scale_rule::mse: return plan_fast<D, scale_rule::mse>(p, stats);
  }
  throw std::logic_error("plan_quantize: unknown scale rule");
}

quantize_launch plan_quantize(const quant_params& p, dtype t, bool fast, bool stats) {
  switch (t) {
    case dtype::bf16: return plan_quantize<dtype::bf16>(p, fast, stats);
    case dtype::f16: return plan_quantize<dtype::f16>(p, fast, stats);
    default: return plan_quantize<dtype::f32>(p, fast, stats);
  }
}

// finalize_stats after the quantize kernel just enqueued: its launch overlaps that kernel's last
// CTAs instead of following its completion.
void launch_finalize(const stats_partial* partials, int count, int64_t blocks, quant_stats* out, cudaStream_t stream) {
  launch_dependent(finalize_stats, 1, 0, stream, partials, count, blocks, out);
}

// Frees a stream-ordered allocation when the enqueueing code is left, also by an exception.
struct stream_allocation {
  void* ptr = nullptr;
  cudaStream_t stream = nullptr;
  stream_allocation(size_t bytes, cudaStream_t s) : stream(s) { MXMOE_CUDA_CHECK(cudaMallocAsync(&ptr, bytes, s)); }
  ~stream_allocation() {
    if (ptr) cudaFreeAsync(ptr, stream);
  }
  stream_allocation(const stream_allocation&) = delete;
  stream_allocation& operator=(const stream_allocation&) = delete;
};

}  // namespace

void quantize_async(const tensor_view& x, mx::scale_rule rule, scale_layout layout, const tensor_view& packed,
                    const tensor_view& scales, quant_stats* device_stats, void* stream_ptr) {
  validate_mx_tensor(x, packed, scales, layout, "x");
  const int dev = current_device();
  check_device_view(x, "x", dev);
  check_device_view(packed, "packed", dev);
  check_device_view(scales, "scales", dev);
  check_block_count(x, "x");
  MXMOE_CHECK_ARG(static_cast<int>(rule) <= static_cast<int>(scale_rule::mse), "rule", "floor, even, rceil or mse",
                  "value " + str(static_cast<int>(rule)));

  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  bool rows_aligned = true;
  quant_params p{};
  p.x = static_cast<const uint8_t*>(x.data);
  p.packed = packed.as<uint8_t>();
  p.scales = scales.as<uint8_t>();
  p.total_blocks = static_cast<int>(total_blocks_of(x));
  p.blocks_per_row = cutlass::FastDivmod(static_cast<int>(x.dim(-1) / mx::kBlockSize));
  p.rows = x.numel() > 0 ? make_row_map(x, &rows_aligned) : row_map{};
  p.dense = p.rows.ndims == 1 && (p.rows.stride[0] == x.dim(-1) || x.numel() == x.dim(-1));
  p.scale = make_scale_index(x, layout);
  const int64_t lead_rows = x.dim(-2) > 0 ? x.numel() / x.dim(-1) / x.dim(-2) : 0;
  p.pad_entries = layout == scale_layout::tiled_128x4
                      ? lead_rows * (p.scale.matrix_bytes - x.dim(-2) * (x.dim(-1) / mx::kBlockSize))
                      : 0;
  p.rule = rule;
  const bool fast = rows_aligned && aligned16(x.data) && aligned16(packed.data);

  // Without a statistics pointer the kernel computes none (a cheaper kernel) and nothing follows it.
  const bool stats = device_stats != nullptr;
  const quantize_launch launch = plan_quantize(p, x.type, fast, stats);
  if (!stats) return launch_dependent(launch.kernel, launch.grid, launch.smem_bytes, stream, p);
  stream_allocation partials(sizeof(stats_partial) * static_cast<size_t>(launch.grid), stream);
  p.partials = static_cast<stats_partial*>(partials.ptr);
  launch_dependent(launch.kernel, launch.grid, launch.smem_bytes, stream, p);
  launch_finalize(p.partials, launch.grid, p.total_blocks, device_stats, stream);
}

quant_stats quantize(const tensor_view& x, mx::scale_rule rule, scale_layout layout, const tensor_view& packed,
                     const tensor_view& scales, void* stream_ptr) {
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  quant_stats result;
  {
    // Validation happens in quantize_async before this allocation is used for anything.
    stream_allocation stats(sizeof(quant_stats), stream);
    quantize_async(x, rule, layout, packed, scales, static_cast<quant_stats*>(stats.ptr), stream);
    MXMOE_CUDA_CHECK(cudaMemcpyAsync(&result, stats.ptr, sizeof result, cudaMemcpyDeviceToHost, stream));
  }
  MXMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return result;
}

void dequantize(const tensor_view& packed, const tensor_view& scales, scale_layout layout, const tensor_view& out,
                void* stream_ptr) {
  validate_mx_tensor(out, packed, scales, layout, "out");
  const int dev = current_device();
  check_device_view(packed, "packed", dev);
  check_device_view(scales, "scales", dev);
  check_device_view(out, "out", dev);
  check_block_count(out, "out");

  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  dequant_params p{};
  p.packed = static_cast<const uint8_t*>(packed.data);
  p.scales = static_cast<const uint8_t*>(scales.data);
  p.out = out.as<uint8_t>();
  p.total_blocks = static_cast<int>(total_blocks_of(out));
  p.scale = make_scale_index(out, layout);
  if (p.total_blocks == 0) return;
  const bool fast = aligned16(packed.data) && aligned16(out.data);
  const bool is_f32 = out.type == dtype::f32;
  if (fast) {
    auto kernel = is_f32 ? dequantize_fast<dtype::f32> : dequantize_fast<dtype::bf16>;
    const int grid = grid_size(kernel, 0, layout::ceil_div(layout::ceil_div(p.total_blocks, 32), kWarpsPerCta));
    kernel<<<grid, kThreads, 0, stream>>>(p);
  } else {
    auto kernel = is_f32 ? dequantize_reference<dtype::f32> : dequantize_reference<dtype::bf16>;
    const int grid = grid_size(kernel, 0, layout::ceil_div(p.total_blocks, kThreads));
    kernel<<<grid, kThreads, 0, stream>>>(p);
  }
  MXMOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mxmoe::cuda
