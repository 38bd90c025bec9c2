// Tests of the CPU quantizer's two block paths (include/mxmoe/quantize.h): the fast path
// (cpu::quantize_block_fast) must give the general path's (mx::quantize_block + the statistics
// element by element) scale byte, codes and statistics bit for bit wherever it applies, and must
// decline exactly the blocks it documents (NaN/Inf; scale byte 254 and an mse floor byte of 253 or
// 254, which no finite block reaches: a test says so).
// Inputs: every float exponent as the block's amax, each with mantissas at the rules' rounding
// edges, tie points of E2M1 placed on the block's own scale, zeros of both signs, subnormals,
// the largest finite magnitude, NaN and Inf, every bf16 value, and random blocks over the whole
// exponent range. Also: quantizing a matrix in bands of cpu::quantize_chunk_rows rows gives the
// bytes and statistics of one call on the whole matrix.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "mxmoe/dtype.h"
#include "mxmoe/mx.h"
#include "mxmoe/quantize.h"

namespace {

using mxmoe::quant_stats;
using mxmoe::tensor_view;
namespace mx = mxmoe::mx;
namespace cpu = mxmoe::cpu;

// Float bits as sign'exponent'mantissa.
constexpr uint32_t kInfBits = 0b0'11111111'00000000000000000000000u;
constexpr uint32_t kNanBits = 0b0'11111111'10000000000000000000000u;
constexpr uint32_t kMaxFiniteBits = 0b0'11111110'11111111111111111111111u;
constexpr uint32_t kMinNormalBits = 0b0'00000001'00000000000000000000000u;
constexpr uint32_t kMinSubnormalBits = 0b0'00000000'00000000000000000000001u;
constexpr uint32_t kMaxSubnormalBits = 0b0'00000000'11111111111111111111111u;
constexpr uint32_t kSignBit = 0b1'00000000'00000000000000000000000u;

// Mantissas of an amax at and around the rules' rounding edges: 1, just above 1, 1.25 (even's
// 0.75 round-up starts at 1.75: 0b11), 1.5 (rceil's edge), 1.75 and the largest.
constexpr uint32_t kEdgeMantissas[] = {
    0b00000000000000000000000u, 0b00000000000000000000001u, 0b01000000000000000000000u,
    0b01111111111111111111111u, 0b10000000000000000000000u, 0b10000000000000000000001u,
    0b10111111111111111111111u, 0b11000000000000000000000u, 0b11111111111111111111111u};

float from_bits(uint32_t b) { return mx::bits_float(b); }

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

::testing::AssertionResult same_stats(const quant_stats& a, const quant_stats& b) {
  if (a.elements == b.elements && a.blocks == b.blocks && a.saturated_blocks == b.saturated_blocks &&
      a.clamped_elements == b.clamped_elements && a.flushed_elements == b.flushed_elements &&
      a.nonfinite_blocks == b.nonfinite_blocks && same_bits(a.signal_sq, b.signal_sq) &&
      same_bits(a.error_sq, b.error_sq))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "statistics differ: clamped " << a.clamped_elements << "/" << b.clamped_elements
                                       << " flushed " << a.flushed_elements << "/" << b.flushed_elements << " signal "
                                       << a.signal_sq << "/" << b.signal_sq << " error " << a.error_sq << "/" << b.error_sq;
}

std::string block_string(const float* x) {
  std::string s;
  char buf[16];
  for (int i = 0; i < mx::kBlockSize; ++i) {
    std::snprintf(buf, sizeof buf, "%08x ", mx::float_bits(x[i]));
    s += buf;
  }
  return s;
}

// Whether the fast path is documented to take the block (computed here from the block alone).
bool fast_path_applies(const float* x, mx::scale_rule rule) {
  uint32_t amax = 0;
  for (int i = 0; i < mx::kBlockSize; ++i) amax = std::max(amax, mx::float_bits(x[i]) & ~kSignBit);
  if (amax >= kInfBits) return false;
  if (rule == mx::scale_rule::mse)
    return amax < kMinNormalBits || mx::scale_from_amax(from_bits(amax), mx::scale_rule::floor) <= 252;
  return mx::scale_from_amax(from_bits(amax), rule) <= 253;
}

// The largest scale byte `rule` gives a finite block (its largest finite amax's).
int top_scale_byte(mx::scale_rule rule) { return rule == mx::scale_rule::floor ? 252 : 253; }

// Counts of blocks each path took, so a test shows that it reached both.
struct path_counts {
  int64_t fast = 0, general = 0;
};

// Both paths on one block, starting from statistics that are already non-zero (as inside a
// chunk), compared bit for bit; the dispatching quantize_block_with_stats too.
void expect_paths_agree(const float* x, mx::scale_rule rule, path_counts& counts) {
  SCOPED_TRACE(testing::Message() << mx::to_string(rule) << " block " << block_string(x));
  quant_stats start;
  start.elements = 64;
  start.blocks = 2;
  start.signal_sq = 0.1;
  start.error_sq = 1.0 / 3.0;
  quant_stats general = start, fast = start, dispatched = start;
  uint8_t general_scale = 0x11, fast_scale = 0x11, dispatched_scale = 0x11;
  uint8_t general_codes[mx::kPackedBlockBytes], fast_codes[mx::kPackedBlockBytes], dispatched_codes[mx::kPackedBlockBytes];
  std::memset(fast_codes, 0x5A, sizeof fast_codes);
  cpu::quantize_block_general(x, rule, &general_scale, general_codes, general);
  // The general path is mx::quantize_block.
  uint8_t mx_scale, mx_codes[mx::kPackedBlockBytes];
  mx::quantize_block(x, rule, &mx_scale, mx_codes);
  ASSERT_EQ(general_scale, mx_scale);
  ASSERT_EQ(0, std::memcmp(general_codes, mx_codes, sizeof mx_codes));

  const bool took = cpu::quantize_block_fast(x, rule, &fast_scale, fast_codes, fast);
  ASSERT_EQ(took, fast_path_applies(x, rule)) << "general scale byte " << int{general_scale};
  if (took) {
    ++counts.fast;
    ASSERT_EQ(fast_scale, general_scale);
    for (int j = 0; j < mx::kPackedBlockBytes; ++j) ASSERT_EQ(fast_codes[j], general_codes[j]) << "byte " << j;
    ASSERT_TRUE(same_stats(fast, general));
  } else {
    ++counts.general;
    ASSERT_EQ(fast_scale, 0x11) << "declined, yet wrote the scale";
    for (int j = 0; j < mx::kPackedBlockBytes; ++j) ASSERT_EQ(fast_codes[j], 0x5A) << "declined, yet wrote byte " << j;
    ASSERT_TRUE(same_stats(fast, start)) << "declined, yet changed the statistics";
  }
  cpu::quantize_block_with_stats(x, rule, &dispatched_scale, dispatched_codes, dispatched);
  ASSERT_EQ(dispatched_scale, general_scale);
  ASSERT_EQ(0, std::memcmp(dispatched_codes, general_codes, sizeof general_codes));
  ASSERT_TRUE(same_stats(dispatched, general));
}

// A block with amax `amax_bits` (element 0, negative when `negative`), the other elements spread
// below it: fractions of amax, E2M1 tie points on the block's own scale (that of the general
// path), zeros of both signs and subnormals.
std::vector<float> edge_block(uint32_t amax_bits, mx::scale_rule rule, bool negative, std::mt19937& rng) {
  std::vector<float> x(mx::kBlockSize, 0.0f);
  const float amax = from_bits(amax_bits);
  x[0] = negative ? -amax : amax;
  std::uniform_real_distribution<float> frac(0.0f, 1.0f);
  for (int i = 1; i < 12; ++i) x[i] = amax * frac(rng) * (i % 2 ? -1.0f : 1.0f);
  x[12] = 0.0f;
  x[13] = -0.0f;
  x[14] = from_bits(kMinSubnormalBits);
  x[15] = -from_bits(kMaxSubnormalBits);
  if (amax_bits >= kMinNormalBits) x[16] = from_bits(kMinNormalBits);
  uint8_t scale, codes[mx::kPackedBlockBytes];
  mx::quantize_block(x.data(), rule, &scale, codes);
  if (scale == mx::kE8M0Nan) return x;
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f};
  int at = 17;
  for (float t : ties)
    for (const float side : {1.0f, -1.0f}) {
      const float v = mx::mul_pow2(t, static_cast<int>(scale) - mx::kE8M0Bias) * side;
      // Only values below amax keep the block's scale (and finite ones: 6 * 2^127 is not).
      if (std::isfinite(v) && std::fabs(v) <= amax && at < mx::kBlockSize) x[at++] = v;
    }
  return x;
}

TEST(QuantizeBlock, FastPathEqualsGeneralPathAtEveryExponentAndScaleEdge) {
  std::mt19937 rng(7);
  for (mx::scale_rule rule : mx::kAllScaleRules) {
    path_counts counts;
    std::vector<int> scales_seen(256, 0);
    for (uint32_t e = 0; e <= 254; ++e)
      for (uint32_t m : kEdgeMantissas)
        for (const bool negative : {false, true}) {
          const uint32_t amax_bits = (e << 23) | m;
          if (amax_bits == 0) continue;
          const std::vector<float> x = edge_block(amax_bits, rule, negative, rng);
          expect_paths_agree(x.data(), rule, counts);
          if (HasFatalFailure()) return;
          uint8_t scale, codes[mx::kPackedBlockBytes];
          mx::quantize_block(x.data(), rule, &scale, codes);
          scales_seen[scale] += 1;
        }
    // Every scale byte the rule gives a finite block was produced, the top ones included.
    for (int s = 0; s <= top_scale_byte(rule); ++s)
      EXPECT_GT(scales_seen[s], 0) << mx::to_string(rule) << " scale byte " << s;
    EXPECT_GT(counts.fast, 0);
  }
}

TEST(QuantizeBlock, TheTopScaleBytesOfFiniteBlocks) {
  // A finite amax has exponent field <= 254, so the floor byte is at most 252 and rounding up (even,
  // rceil, mse's floor + 1) reaches 253: byte 254 (2^127) is never a finite block's scale, and
  // the fast path, which stops at 253, takes every finite block. The blocks whose amax sits at
  // the top of the range, with each edge mantissa, by both paths:
  for (mx::scale_rule rule : mx::kAllScaleRules) {
    path_counts counts;
    std::vector<int> scales_seen(256, 0);
    for (uint32_t e = 250; e <= 254; ++e)
      for (uint32_t m : kEdgeMantissas)
        for (const float near : {1.0f, 0.99f, 0.9f, 0.75f, 0.6f, 0.5f}) {
          float x[mx::kBlockSize];
          const float amax = from_bits((e << 23) | m);
          for (int i = 0; i < mx::kBlockSize; ++i) x[i] = i == 0 ? amax : amax * (near * static_cast<float>(i) / 32.0f);
          expect_paths_agree(x, rule, counts);
          if (HasFatalFailure()) return;
          uint8_t scale, codes[mx::kPackedBlockBytes];
          mx::quantize_block(x, rule, &scale, codes);
          scales_seen[scale] += 1;
        }
    EXPECT_EQ(counts.general, 0) << mx::to_string(rule);
    EXPECT_EQ(scales_seen[254], 0) << mx::to_string(rule);
    EXPECT_GT(scales_seen[static_cast<size_t>(top_scale_byte(rule))], 0) << mx::to_string(rule);
    EXPECT_GT(scales_seen[static_cast<size_t>(top_scale_byte(rule) - 1)], 0) << mx::to_string(rule);
  }
}

TEST(QuantizeBlock, ZerosSubnormalsMaxMagnitudeNanAndInf) {
  const std::vector<std::vector<uint32_t>> patterns = {
      {0u},                                     // all +0
      {kSignBit},                               // all -0
      {kMinSubnormalBits},                      // the smallest subnormal
      {kMaxSubnormalBits, kSignBit | 0x1234u},  // subnormal amax, mixed signs
      {kMinNormalBits, kMaxSubnormalBits},      // amax at the first normal
      {kMaxFiniteBits},                         // the largest finite magnitude: scale byte 254
      {kMaxFiniteBits, 0x3F800000u, 0u},        // ... beside ordinary values
      {0x3F800000u, kNanBits},                  // NaN
      {0x3F800000u, kSignBit | kInfBits},       // -Inf
      {kInfBits},                               // all +Inf
      {kNanBits | 0x1u, 0x00000001u},           // a signalling-NaN pattern beside a subnormal
  };
  for (mx::scale_rule rule : mx::kAllScaleRules) {
    path_counts counts;
    for (const auto& p : patterns) {
      float x[mx::kBlockSize];
      for (int i = 0; i < mx::kBlockSize; ++i) x[i] = from_bits(p[static_cast<size_t>(i) % p.size()]);
      expect_paths_agree(x, rule, counts);
      if (HasFatalFailure()) return;
    }
    EXPECT_GT(counts.fast, 0);
    EXPECT_GT(counts.general, 0);
  }
}

TEST(QuantizeBlock, EveryBf16ValueInABlock) {
  // Each bf16 pattern h as element 0 of a block whose other elements are h scaled by fixed
  // fractions (and some of them negated), so every exponent, NaN and Inf meets every rule.
  for (mx::scale_rule rule : mx::kAllScaleRules) {
    path_counts counts;
    for (uint32_t h = 0; h <= 0xFFFFu; ++h) {
      float x[mx::kBlockSize];
      const float v = mxmoe::bf16_to_float(static_cast<uint16_t>(h));
      for (int i = 0; i < mx::kBlockSize; ++i)
        x[i] = v * (static_cast<float>(32 - i) / 32.0f) * ((i % 3) == 2 ? -1.0f : 1.0f);
      expect_paths_agree(x, rule, counts);
      if (HasFatalFailure()) return;
    }
    EXPECT_GT(counts.fast, 60000) << mx::to_string(rule);
    EXPECT_GT(counts.general, 0) << mx::to_string(rule);
  }
}

TEST(QuantizeBlock, RandomBlocksOverTheWholeExponentRange) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> exponent(0, 254), spread(0, 40), mantissa(0, 0x7FFFFF), coin(0, 1);
  for (mx::scale_rule rule : mx::kAllScaleRules) {
    path_counts counts;
    for (int b = 0; b < 40000; ++b) {
      const uint32_t top = exponent(rng);
      float x[mx::kBlockSize];
      for (int i = 0; i < mx::kBlockSize; ++i) {
        const uint32_t s = spread(rng), e = s > top ? 0 : top - s;
        x[i] = from_bits((coin(rng) << 31) | (e << 23) | mantissa(rng));
      }
      expect_paths_agree(x, rule, counts);
      if (HasFatalFailure()) return;
    }
    EXPECT_EQ(counts.fast, 40000) << "every block is finite";
  }
}

TEST(QuantizeBlock, CpuQuantizeEqualsTheGeneralPathBlockByBlock) {
  // cpu::quantize runs its own compilation of the chunk loop (for AVX2 where the CPU has it):
  // its bytes and statistics must be those of the general path applied block by block, summed per
  // chunk of quantize_chunk_rows rows and merged in order. Blocks over the whole exponent range,
  // with zeros, subnormals, NaN and Inf among them.
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> exponent(0, 254), spread(0, 30), mantissa(0, 0x7FFFFF), coin(0, 1), special(0, 99);
  const int64_t rows = 61, k = 2048 + 64;  // 31 rows a chunk: two full chunks and a short one
  std::vector<float> x(static_cast<size_t>(rows * k));
  for (int64_t b = 0; b < rows * k / 32; ++b) {
    const uint32_t top = exponent(rng);
    for (int i = 0; i < 32; ++i) {
      const uint32_t sp = spread(rng), e = sp > top ? 0 : top - sp;
      float v = from_bits((coin(rng) << 31) | (e << 23) | mantissa(rng));
      const uint32_t r = special(rng);
      if (r == 0) v = from_bits(kNanBits);
      else if (r == 1) v = from_bits(kSignBit | kInfBits);
      else if (r < 5) v = 0.0f;
      x[static_cast<size_t>(b * 32 + i)] = v;
    }
  }
  // The same values in bf16 (the converter's input), and as the floats those hold.
  std::vector<uint16_t> xb(x.size());
  std::vector<float> xr(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    xb[i] = mxmoe::float_to_bf16(x[i]);
    xr[i] = mxmoe::bf16_to_float(xb[i]);
  }
  for (const bool bf16 : {false, true})
  for (mx::scale_rule rule : mx::kAllScaleRules) {
    SCOPED_TRACE(testing::Message() << mx::to_string(rule) << (bf16 ? " bf16" : " f32"));
    std::vector<uint8_t> codes(x.size() / 2), scales(x.size() / 32);
    const quant_stats got = cpu::quantize(bf16 ? tensor_view(xb.data(), mxmoe::dtype::bf16, {rows, k})
                                               : tensor_view(x.data(), mxmoe::dtype::f32, {rows, k}), rule,
                                          mxmoe::scale_layout::linear,
                                          tensor_view(codes.data(), mxmoe::dtype::u8, {rows, k / 2}),
                                          tensor_view(scales.data(), mxmoe::dtype::u8, {rows, k / 32}), 2);
    std::vector<uint8_t> want_codes(codes.size()), want_scales(scales.size());
    quant_stats want;
    const int64_t chunk = cpu::quantize_chunk_rows(k);
    ASSERT_EQ(chunk, 31);
    for (int64_t n0 = 0; n0 < rows; n0 += chunk) {
      quant_stats st;
      for (int64_t b = n0 * k / 32; b < std::min(rows, n0 + chunk) * k / 32; ++b)
        cpu::quantize_block_general(&(bf16 ? xr : x)[static_cast<size_t>(b * 32)], rule, &want_scales[static_cast<size_t>(b)],
                                    &want_codes[static_cast<size_t>(b * 16)], st);
      want.merge(st);
    }
    EXPECT_EQ(codes, want_codes);
    EXPECT_EQ(scales, want_scales);
    EXPECT_TRUE(same_stats(got, want));
    EXPECT_GT(want.nonfinite_blocks, 0);
  }
}

TEST(QuantizeBlock, BandsOfChunkRowsGiveTheWholeMatrixResult) {
  // Odd shapes, K from one block to beyond a chunk of 65536 elements.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{7, 32}, {45, 2880}, {300, 288}, {3, 65536 + 32}};
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const auto& [rows, k] : shapes)
    for (mx::scale_rule rule : mx::kAllScaleRules) {
      SCOPED_TRACE(testing::Message() << rows << "x" << k << " " << mx::to_string(rule));
      std::vector<uint16_t> x(static_cast<size_t>(rows * k));
      for (auto& v : x) v = mxmoe::float_to_bf16(normal(rng) * 0.02f);
      std::vector<uint8_t> whole_codes(x.size() / 2), whole_scales(x.size() / 32);
      const quant_stats whole = cpu::quantize(tensor_view(x.data(), mxmoe::dtype::bf16, {rows, k}), rule,
                                              mxmoe::scale_layout::linear,
                                              tensor_view(whole_codes.data(), mxmoe::dtype::u8, {rows, k / 2}),
                                              tensor_view(whole_scales.data(), mxmoe::dtype::u8, {rows, k / 32}), 1);
      std::vector<uint8_t> band_codes(whole_codes.size()), band_scales(whole_scales.size());
      const int64_t band = cpu::quantize_chunk_rows(k);
      quant_stats banded;
      for (int64_t n0 = 0; n0 < rows; n0 += band) {
        const int64_t n = std::min(band, rows - n0);
        banded.merge(cpu::quantize(tensor_view(x.data() + n0 * k, mxmoe::dtype::bf16, {n, k}), rule,
                                   mxmoe::scale_layout::linear,
                                   tensor_view(band_codes.data() + n0 * k / 2, mxmoe::dtype::u8, {n, k / 2}),
                                   tensor_view(band_scales.data() + n0 * k / 32, mxmoe::dtype::u8, {n, k / 32}), 1));
      }
      EXPECT_EQ(band_codes, whole_codes);
      EXPECT_EQ(band_scales, whole_scales);
      EXPECT_TRUE(same_stats(banded, whole));
    }
}

}  // namespace
