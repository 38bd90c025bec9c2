// Tests of include/mxmoe/mx.h and the bf16/f16 conversions of include/mxmoe/dtype.h: E2M1
// encode/decode (exhaustive over bf16 against a brute-force nearest-value oracle), packing,
// E8M0 decode and the round-up cast, the four scale rules at their boundaries and on random
// blocks (saturation rates, SQNR, mse optimality), the kernels' fast E2M1->bf16 conversion.
// Expected values are literals from the OCP MX spec and the published test vectors collected in
// docs/formats.md, or plain brute-force oracles written here (nearest grid value, smallest byte by
// exhaustive search, double-precision math).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "mxmoe/dtype.h"
#include "mxmoe/mx.h"

namespace mx = mxmoe::mx;
using mx::scale_rule;

namespace {

constexpr float kE2M1Grid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

uint32_t bits(float f) { return mx::float_bits(f); }
float from_bits(uint32_t b) { return mx::bits_float(b); }
float make_float(uint32_t exponent, uint32_t mantissa) { return from_bits((exponent << 23) | mantissa); }

// Oracle: nearest E2M1 grid value by distance, ties to the even code, |v| clamped to 6 first
// (saturation), the sign bit copied (also for zero), NaN -> +0.
uint8_t e2m1_oracle(float v) {
  if (std::isnan(v)) return 0;
  const double a = std::min(std::fabs(static_cast<double>(v)), 6.0);
  int best = 0;
  for (int c = 1; c < 8; ++c) {
    const double d = std::fabs(a - kE2M1Grid[c]), bd = std::fabs(a - kE2M1Grid[best]);
    if (d < bd || (d == bd && c % 2 == 0)) best = c;
  }
  return static_cast<uint8_t>((std::signbit(v) ? 8 : 0) | best);
}

// Oracle for the rceil rule: the smallest byte b in [0, 254] with 6 * 2^(b-127) >= amax, by
// exhaustive search in double (every 6 * 2^n with n in [-127, 127] is exact in double).
int rceil_oracle(float amax) {
  for (int b = 0; b <= 254; ++b)
    if (std::ldexp(6.0, b - 127) >= static_cast<double>(amax)) return b;
  return -1;
}

// Squared error of a block quantized with `rule`, in double, from the dequantized values.
double block_error(const float* x, scale_rule rule, uint8_t* scale_out = nullptr) {
  uint8_t scale, packed[mx::kPackedBlockBytes];
  mx::quantize_block(x, rule, &scale, packed);
  if (scale_out) *scale_out = scale;
  double err = 0.0;
  for (int i = 0; i < mx::kBlockSize; ++i) {
    const double d = static_cast<double>(x[i]) - mx::dequantize_value(mx::unpack_e2m1(packed[i >> 1], i), scale);
    err += d * d;
  }
  return err;
}

// ---- E2M1 ---------------------------------------------------------------------------------

TEST(E2M1, EveryCodeDecodes) {
  EXPECT_EQ(mx::e2m1_to_float(0b0000), 0.0f);
  EXPECT_FALSE(std::signbit(mx::e2m1_to_float(0b0000)));
  EXPECT_EQ(mx::e2m1_to_float(0b0001), 0.5f);
  EXPECT_EQ(mx::e2m1_to_float(0b0010), 1.0f);
  EXPECT_EQ(mx::e2m1_to_float(0b0011), 1.5f);
  EXPECT_EQ(mx::e2m1_to_float(0b0100), 2.0f);
  EXPECT_EQ(mx::e2m1_to_float(0b0101), 3.0f);
  EXPECT_EQ(mx::e2m1_to_float(0b0110), 4.0f);
  EXPECT_EQ(mx::e2m1_to_float(0b0111), 6.0f);
  EXPECT_EQ(bits(mx::e2m1_to_float(0b1000)), 0x80000000u);  // -0
  EXPECT_EQ(mx::e2m1_to_float(0b1001), -0.5f);
  EXPECT_EQ(mx::e2m1_to_float(0b1010), -1.0f);
  EXPECT_EQ(mx::e2m1_to_float(0b1011), -1.5f);
  EXPECT_EQ(mx::e2m1_to_float(0b1100), -2.0f);
  EXPECT_EQ(mx::e2m1_to_float(0b1101), -3.0f);
  EXPECT_EQ(mx::e2m1_to_float(0b1110), -4.0f);
  EXPECT_EQ(mx::e2m1_to_float(0b1111), -6.0f);
  for (int c = 0; c < 16; ++c) EXPECT_EQ(mx::float_to_e2m1(mx::e2m1_to_float(c)), c) << c;
}

TEST(E2M1, TiesGoToTheEvenCode) {
  EXPECT_EQ(mx::float_to_e2m1(0.25f), 0b0000);  // 0 | 0.5   -> 0
  EXPECT_EQ(mx::float_to_e2m1(0.75f), 0b0010);  // 0.5 | 1   -> 1
  EXPECT_EQ(mx::float_to_e2m1(1.25f), 0b0010);  // 1 | 1.5   -> 1
  EXPECT_EQ(mx::float_to_e2m1(1.75f), 0b0100);  // 1.5 | 2   -> 2
  EXPECT_EQ(mx::float_to_e2m1(2.5f), 0b0100);   // 2 | 3     -> 2
  EXPECT_EQ(mx::float_to_e2m1(3.5f), 0b0110);   // 3 | 4     -> 4
  EXPECT_EQ(mx::float_to_e2m1(5.0f), 0b0110);   // 4 | 6     -> 4
  EXPECT_EQ(mx::float_to_e2m1(-2.5f), 0b1100);
  EXPECT_EQ(mx::float_to_e2m1(-5.0f), 0b1110);
  // One ulp off a tie decides it.
  EXPECT_EQ(mx::float_to_e2m1(std::nextafter(0.25f, 1.0f)), 0b0001);
  EXPECT_EQ(mx::float_to_e2m1(std::nextafter(0.75f, 0.0f)), 0b0001);
  EXPECT_EQ(mx::float_to_e2m1(std::nextafter(5.0f, 6.0f)), 0b0111);
}

TEST(E2M1, PublishedVector) {
  // auto-round's published vector (docs/formats.md, Test vectors).
  const float in[] = {0.0f, 0.25f, 0.4f, 0.75f, 1.25f, 1.4f, 1.75f, 2.5f, 2.9f, 3.5f, 5.0f, 5.1f};
  const float want[] = {0.0f, 0.0f, 0.5f, 1.0f, 1.0f, 1.5f, 2.0f, 2.0f, 3.0f, 4.0f, 4.0f, 6.0f};
  for (size_t i = 0; i < std::size(in); ++i)
    EXPECT_EQ(mx::e2m1_to_float(mx::float_to_e2m1(in[i])), want[i]) << in[i];
}

TEST(E2M1, SignOfZeroSaturationAndNan) {
  EXPECT_EQ(mx::float_to_e2m1(-0.0f), 8);
  EXPECT_EQ(mx::float_to_e2m1(0.0f), 0);
  EXPECT_EQ(mx::float_to_e2m1(-0.1f), 8);
  EXPECT_EQ(mx::float_to_e2m1(-0.25f), 8);
  EXPECT_EQ(mx::float_to_e2m1(-1e-30f), 8);
  EXPECT_EQ(mx::float_to_e2m1(6.5f), 7);
  EXPECT_EQ(mx::float_to_e2m1(1e30f), 7);
  EXPECT_EQ(mx::float_to_e2m1(-1e30f), 15);
  EXPECT_EQ(mx::float_to_e2m1(std::numeric_limits<float>::infinity()), 7);
  EXPECT_EQ(mx::float_to_e2m1(-std::numeric_limits<float>::infinity()), 15);
  EXPECT_EQ(mx::float_to_e2m1(std::numeric_limits<float>::quiet_NaN()), 0);
  EXPECT_EQ(mx::float_to_e2m1(-std::numeric_limits<float>::quiet_NaN()), 0);
  EXPECT_EQ(mx::float_to_e2m1(from_bits(0x7F800001u)), 0);  // signalling NaN
}

TEST(E2M1, ExhaustiveOverBf16AgainstOracle) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float v = mxmoe::bf16_to_float(static_cast<uint16_t>(h));
    ASSERT_EQ(mx::float_to_e2m1(v), e2m1_oracle(v)) << "bf16 bits 0x" << std::hex << h;
  }
}

TEST(E2M1, RandomFloatsAgainstOracle) {
  std::mt19937 gen(7);
  std::uniform_int_distribution<uint32_t> exponent(100, 140), mantissa(0, 0x7FFFFF), sign(0, 1);
  for (int i = 0; i < 200000; ++i) {
    const float v = from_bits((sign(gen) << 31) | (exponent(gen) << 23) | mantissa(gen));
    ASSERT_EQ(mx::float_to_e2m1(v), e2m1_oracle(v)) << v;
  }
}

TEST(E2M1, PackingPutsTheEvenElementInTheLowNibble) {
  EXPECT_EQ(mx::pack_e2m1x2(0x3, 0xA), 0xA3);
  EXPECT_EQ(mx::unpack_e2m1(0xA3, 0), 0x3);
  EXPECT_EQ(mx::unpack_e2m1(0xA3, 1), 0xA);
  EXPECT_EQ(mx::unpack_e2m1(0xA3, 30), 0x3);
  EXPECT_EQ(mx::unpack_e2m1(0xA3, 2881), 0xA);
  for (int even = 0; even < 16; ++even)
    for (int odd = 0; odd < 16; ++odd) {
      const uint8_t byte = mx::pack_e2m1x2(static_cast<uint8_t>(even), static_cast<uint8_t>(odd));
      EXPECT_EQ(byte, odd * 16 + even);
      EXPECT_EQ(mx::unpack_e2m1(byte, 2 * 5), even);
      EXPECT_EQ(mx::unpack_e2m1(byte, 2 * 5 + 1), odd);
    }
}

// ---- E8M0 ---------------------------------------------------------------------------------

TEST(E8M0, DecodesEveryByte) {
  EXPECT_EQ(bits(mx::e8m0_to_float(0)), 0x00400000u);  // 2^-127, a float subnormal, not 0
  EXPECT_EQ(mx::e8m0_to_float(127), 1.0f);
  EXPECT_EQ(mx::e8m0_to_float(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(mx::e8m0_to_float(0xFF)));
  for (int b = 0; b <= 254; ++b)
    EXPECT_EQ(bits(mx::e8m0_to_float(static_cast<uint8_t>(b))), bits(std::ldexp(1.0f, b - 127))) << b;
}

TEST(E8M0, RoundUpCastTable) {
  // torchao RCEIL cases (docs/formats.md, Test vectors): input bits -> byte.
  const std::pair<uint32_t, int> table[] = {
      {0x0u, 0},          {0x1u, 0},          {0x00400000u, 0},   {0x00400001u, 1},   {0x007FFFFFu, 1},
      {0x00800000u, 1},   {0x1F800000u, 63},  {0x1F800001u, 64},  {0x3F7FFFFFu, 127}, {0x3F800000u, 127},
      {0x3F800001u, 128}, {0x7F000000u, 254}, {0x7F000001u, 255}, {0x7F800000u, 255}, {0x7FC00000u, 255}};
  for (const auto& [in, byte] : table) {
    EXPECT_EQ(mx::float_to_e8m0_rceil(from_bits(in)), byte) << std::hex << in;
    EXPECT_EQ(mx::float_to_e8m0_rceil(from_bits(in | 0x80000000u)), byte) << "sign ignored " << std::hex << in;
  }
}

TEST(E8M0, RoundUpCastIsTheSmallestCoveringPowerOfTwo) {
  std::mt19937 gen(11);
  std::uniform_int_distribution<uint32_t> any_finite(0, 0x7F7FFFFFu);
  for (int i = 0; i < 20000; ++i) {
    const float x = from_bits(any_finite(gen));
    int want = 255;
    for (int b = 0; b <= 254; ++b)
      if (std::ldexp(1.0, b - 127) >= static_cast<double>(x)) {
        want = b;
        break;
      }
    ASSERT_EQ(mx::float_to_e8m0_rceil(x), want) << std::hex << bits(x);
  }
}

TEST(E8M0, DequantizeValue) {
  EXPECT_EQ(mx::dequantize_value(0b0111, 127), 6.0f);
  EXPECT_EQ(mx::dequantize_value(0b1011, 126), -0.75f);
  EXPECT_EQ(bits(mx::dequantize_value(0b0001, 0)), 0x00200000u);  // 0.5 * 2^-127 = 2^-128
  EXPECT_TRUE(std::isnan(mx::dequantize_value(0, 0xFF)));
  for (int s = 0; s <= 254; ++s)
    for (int c = 0; c < 16; ++c) {
      const double want = std::ldexp(static_cast<double>(mx::e2m1_to_float(c)), s - 127);
      const float got = mx::dequantize_value(static_cast<uint8_t>(c), static_cast<uint8_t>(s));
      if (std::fabs(want) >= std::ldexp(1.0, 128)) EXPECT_TRUE(std::isinf(got)) << c << " " << s;
      else EXPECT_EQ(static_cast<double>(got), want) << c << " " << s;
    }
}

// ---- scale rules: the worked block of docs/formats.md ---------------------------------------

struct worked_case {
  scale_rule rule;
  uint8_t scale;
  uint8_t byte0, byte1;
  float decoded[4];
  double sq_error;
};

TEST(ScaleRules, WorkedBlock) {
  float x[mx::kBlockSize] = {3.9f, -1.3f, 0.2f, 0.74f};
  ASSERT_EQ(bits(3.9f), 0x4079999Au);
  const worked_case cases[] = {
      {scale_rule::floor, 0x7E, 0xD7, 0x31, {3.0f, -1.5f, 0.25f, 0.75f}, 0.853},
      {scale_rule::even, 0x7F, 0xB6, 0x10, {4.0f, -1.5f, 0.0f, 0.5f}, 0.148},
      {scale_rule::rceil, 0x7F, 0xB6, 0x10, {4.0f, -1.5f, 0.0f, 0.5f}, 0.148},
      {scale_rule::mse, 0x7F, 0xB6, 0x10, {4.0f, -1.5f, 0.0f, 0.5f}, 0.148},
  };
  for (const worked_case& c : cases) {
    SCOPED_TRACE(mx::to_string(c.rule));
    uint8_t scale = 0xAA, packed[mx::kPackedBlockBytes];
    std::fill(std::begin(packed), std::end(packed), 0xAA);
    const mx::block_stats st = mx::quantize_block(x, c.rule, &scale, packed);
    EXPECT_EQ(scale, c.scale);
    EXPECT_EQ(packed[0], c.byte0);
    EXPECT_EQ(packed[1], c.byte1);
    for (int j = 2; j < mx::kPackedBlockBytes; ++j) EXPECT_EQ(packed[j], 0);
    float out[mx::kBlockSize];
    mx::dequantize_block(packed, scale, out);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], c.decoded[i]) << i;
    EXPECT_NEAR(block_error(x, c.rule), c.sq_error, 5e-4);
    EXPECT_EQ(st.clamped, c.rule == scale_rule::floor ? 1 : 0);  // floor: 3.9 / 0.5 = 7.8 > 6
  }
}

// ---- scale rules: boundaries --------------------------------------------------------------

// Expected bytes from the rule definitions (docs/formats.md, Scale rules), clamped to [0, 254].
int floor_expected(uint32_t e, uint32_t) { return std::clamp(static_cast<int>(e) - 2, 0, 254); }
int even_expected(uint32_t e, uint32_t m) {
  // mantissa >= 1.75 rounds the exponent up (0.75 round-up of the mantissa fraction)
  return std::clamp(static_cast<int>(e) - 2 + (m >= 0x600000u ? 1 : 0), 0, 254);
}

TEST(ScaleRules, BoundariesAroundOnePointFiveAndOnePointSevenFive) {
  const uint32_t exponents[] = {1, 2, 3, 4, 20, 126, 127, 128, 200, 253, 254};
  const uint32_t mantissas[] = {0x000000, 0x000001, 0x3FFFFF, 0x400000, 0x400001,
                                0x5FFFFF, 0x600000, 0x600001, 0x7FFFFE, 0x7FFFFF};
  for (uint32_t e : exponents)
    for (uint32_t m : mantissas) {
      const float amax = make_float(e, m);
      SCOPED_TRACE(testing::Message() << "amax bits 0x" << std::hex << bits(amax));
      EXPECT_EQ(mx::scale_from_amax(amax, scale_rule::floor), floor_expected(e, m));
      EXPECT_EQ(mx::scale_from_amax(amax, scale_rule::even), even_expected(e, m));
      EXPECT_EQ(mx::scale_from_amax(amax, scale_rule::rceil), rceil_oracle(amax));
      EXPECT_EQ(mx::scale_from_amax(-amax, scale_rule::rceil), rceil_oracle(amax));
      // The same through a whole block whose other elements are smaller.
      float block[mx::kBlockSize];
      for (int i = 0; i < mx::kBlockSize; ++i) block[i] = amax * (static_cast<float>(i % 7) / 8.0f);
      block[13] = -amax;
      EXPECT_EQ(mx::block_scale(block, scale_rule::floor), floor_expected(e, m));
      EXPECT_EQ(mx::block_scale(block, scale_rule::even), even_expected(e, m));
      EXPECT_EQ(mx::block_scale(block, scale_rule::rceil), rceil_oracle(amax));
    }
}

TEST(ScaleRules, ClampsAtZeroAndNeverExceeds253ForFiniteInput) {
  // Small normals: E - 2 < 0 clamps to byte 0.
  EXPECT_EQ(mx::scale_from_amax(make_float(1, 0), scale_rule::floor), 0);
  EXPECT_EQ(mx::scale_from_amax(make_float(2, 0x7FFFFF), scale_rule::floor), 0);
  EXPECT_EQ(mx::scale_from_amax(make_float(1, 0x7FFFFF), scale_rule::even), 0);  // E-1 = 0
  EXPECT_EQ(mx::scale_from_amax(make_float(2, 0x600000), scale_rule::even), 1);
  // The largest float: floor E-2 = 252, even/rceil E-1 = 253; 254 is unreachable from a finite
  // amax, so the upper clamp is a guard only.
  const float fmax = std::numeric_limits<float>::max();
  EXPECT_EQ(mx::scale_from_amax(fmax, scale_rule::floor), 252);
  EXPECT_EQ(mx::scale_from_amax(fmax, scale_rule::even), 253);
  EXPECT_EQ(mx::scale_from_amax(fmax, scale_rule::rceil), 253);
  float block[mx::kBlockSize] = {fmax, -fmax, 1.0f};
  for (scale_rule r : mx::kAllScaleRules) EXPECT_LE(mx::block_scale(block, r), 253) << mx::to_string(r);
}

TEST(ScaleRules, RceilNeverSaturatesAndIsTheSmallestSuchByte) {
  std::mt19937 gen(5);
  std::uniform_int_distribution<uint32_t> any_finite(1, 0x7F7FFFFFu);
  std::uniform_real_distribution<float> frac(-1.0f, 1.0f);
  for (int i = 0; i < 20000; ++i) {
    float block[mx::kBlockSize];
    const float amax = from_bits(any_finite(gen));
    for (float& v : block) v = amax * frac(gen);
    block[i % mx::kBlockSize] = (i & 1) ? amax : -amax;
    const int want = rceil_oracle(amax);
    uint8_t scale, packed[mx::kPackedBlockBytes];
    const mx::block_stats st = mx::quantize_block(block, scale_rule::rceil, &scale, packed);
    ASSERT_EQ(scale, want) << std::hex << bits(amax);
    ASSERT_EQ(st.clamped, 0) << std::hex << bits(amax);
  }
}

TEST(ScaleRules, AllZeroBlockGetsByteZero) {
  float zeros[mx::kBlockSize] = {};
  float signed_zeros[mx::kBlockSize];
  std::fill(std::begin(signed_zeros), std::end(signed_zeros), -0.0f);
  for (scale_rule r : mx::kAllScaleRules) {
    uint8_t scale = 0xAA, packed[mx::kPackedBlockBytes];
    mx::quantize_block(zeros, r, &scale, packed);
    EXPECT_EQ(scale, 0) << mx::to_string(r);
    for (uint8_t b : packed) EXPECT_EQ(b, 0);
    mx::quantize_block(signed_zeros, r, &scale, packed);
    EXPECT_EQ(scale, 0) << mx::to_string(r);
    for (uint8_t b : packed) EXPECT_EQ(b, 0x88);  // -0 keeps its sign
  }
}

TEST(ScaleRules, SubnormalAmaxGetsByteZero) {
  const uint32_t amaxes[] = {0x00000001u, 0x00200000u, 0x00400000u, 0x00400001u, 0x007FFFFFu};
  for (uint32_t a : amaxes) {
    float block[mx::kBlockSize] = {};
    block[3] = from_bits(a);
    block[7] = -from_bits(a >> 1);
    for (scale_rule r : mx::kAllScaleRules) {
      uint8_t scale = 0xAA, packed[mx::kPackedBlockBytes];
      mx::quantize_block(block, r, &scale, packed);
      EXPECT_EQ(scale, 0) << mx::to_string(r) << " amax bits 0x" << std::hex << a;
      // Element 3 is a / 2^-127 (exact in double) rounded to E2M1 by the oracle, times 2^-127.
      const double scaled = std::ldexp(static_cast<double>(from_bits(a)), 127);
      const double want = std::ldexp(static_cast<double>(kE2M1Grid[e2m1_oracle(static_cast<float>(scaled)) & 7]), -127);
      float out[mx::kBlockSize];
      mx::dequantize_block(packed, scale, out);
      EXPECT_EQ(static_cast<double>(out[3]), want);
    }
  }
}

TEST(ScaleRules, NanOrInfAnywhereMakesTheBlockNan) {
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            from_bits(0x7F800001u)};
  for (float s : specials)
    for (int pos : {0, 17, 31}) {
      float block[mx::kBlockSize];
      for (int i = 0; i < mx::kBlockSize; ++i) block[i] = 0.1f * static_cast<float>(i - 9);
      block[pos] = s;
      for (scale_rule r : mx::kAllScaleRules) {
        uint8_t scale = 0, packed[mx::kPackedBlockBytes];
        std::fill(std::begin(packed), std::end(packed), 0x5A);
        const mx::block_stats st = mx::quantize_block(block, r, &scale, packed);
        EXPECT_EQ(scale, 0xFF) << mx::to_string(r);
        EXPECT_TRUE(st.nonfinite);
        for (uint8_t b : packed) EXPECT_EQ(b, 0);
        float out[mx::kBlockSize];
        mx::dequantize_block(packed, scale, out);
        for (float v : out) EXPECT_TRUE(std::isnan(v));
      }
    }
}

// ---- scale rules: statistics on random blocks ---------------------------------------------

// Blocks of log-uniform elements sign * 2^U(-20, 20) plus a per-block offset 2^U(-20, 20). The
// theoretical fractions of docs/formats.md assume log2(amax) mod 1 is uniform; the offset, uniform over
// a whole number of binades and independent of the elements, makes that exact (the max of 32
// log-uniform elements alone is not uniform mod 1 and saturates floor ~51% of the time).
// Saturation depends on the amax mantissa m only: floor saturates iff m > 1.5 (p = 1 - log2 1.5),
// even iff 1.5 < m < 1.75 (p = log2(1.75 / 1.5)), rceil never.
TEST(ScaleRules, SaturatedFractionOnLogUniformBlocksMatchesTheory) {
  const int n = 100000;
  std::mt19937_64 gen(3);
  std::uniform_real_distribution<double> log_mag(-20.0, 20.0);
  std::bernoulli_distribution negative(0.5);
  const std::pair<scale_rule, double> expected[] = {{scale_rule::floor, 1.0 - std::log2(1.5)},
                                                    {scale_rule::even, std::log2(1.75 / 1.5)},
                                                    {scale_rule::rceil, 0.0}};
  int saturated[3] = {};
  for (int b = 0; b < n; ++b) {
    float block[mx::kBlockSize];
    const double offset = log_mag(gen);
    for (float& v : block) v = static_cast<float>((negative(gen) ? -1.0 : 1.0) * std::exp2(offset + log_mag(gen)));
    for (int r = 0; r < 3; ++r) {
      uint8_t scale, packed[mx::kPackedBlockBytes];
      saturated[r] += mx::quantize_block(block, expected[r].first, &scale, packed).clamped > 0 ? 1 : 0;
    }
  }
  for (int r = 0; r < 3; ++r) {
    const double p = expected[r].second, frac = static_cast<double>(saturated[r]) / n;
    const double sigma = std::sqrt(p * (1.0 - p) / n);
    EXPECT_NEAR(frac, p, 4.0 * sigma + 1e-12) << mx::to_string(expected[r].first);
  }
  EXPECT_NEAR(expected[0].second, 0.415, 0.001);
  EXPECT_NEAR(expected[1].second, 0.222, 0.001);
}

enum class dist { gaussian, laplace, uniform, outliers };

void fill_block(dist d, std::mt19937_64& gen, float* x) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::exponential_distribution<float> expo(1.0f);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::bernoulli_distribution negative(0.5);
  for (int i = 0; i < mx::kBlockSize; ++i) {
    switch (d) {
      case dist::gaussian: x[i] = normal(gen); break;
      case dist::laplace: x[i] = negative(gen) ? -expo(gen) : expo(gen); break;
      case dist::uniform: x[i] = uni(gen); break;
      case dist::outliers: x[i] = normal(gen) * (uni(gen) > 0.9f ? 30.0f : 1.0f); break;
    }
  }
}

// Aggregate SQNR (sum x^2 / sum err^2) over blocks with a per-block scale 2^U(0, 1), i.e. a
// log-uniform block magnitude over one binade, so the result does not depend on where a fixed
// sigma happens to fall within a binade. docs/formats.md's reference figures come from a separate Python
// simulation quoted to 0.01 dB; with 100k blocks our own sampling sd is ~0.005 dB, and
// 0.05 dB covers both.
TEST(ScaleRules, SqnrOnGaussianAndLaplaceBlocksMatchesIndependentSimulation) {
  const int n = 100000;
  struct expectation {
    dist d;
    scale_rule rule;
    double db;
  };
  const expectation expected[] = {
      {dist::gaussian, scale_rule::floor, 18.69}, {dist::gaussian, scale_rule::even, 18.96},
      {dist::gaussian, scale_rule::rceil, 18.64}, {dist::gaussian, scale_rule::mse, 19.00},
      {dist::laplace, scale_rule::floor, 17.98},  {dist::laplace, scale_rule::even, 18.14},
      {dist::laplace, scale_rule::rceil, 17.54},  {dist::laplace, scale_rule::mse, 18.23},
  };
  for (const expectation& e : expected) {
    std::mt19937_64 gen(17);
    std::uniform_real_distribution<double> binade(0.0, 1.0);
    double signal = 0.0, error = 0.0;
    for (int b = 0; b < n; ++b) {
      float x[mx::kBlockSize];
      fill_block(e.d, gen, x);
      const float s = static_cast<float>(std::exp2(binade(gen)));
      for (float& v : x) v *= s;
      for (float v : x) signal += static_cast<double>(v) * v;
      error += block_error(x, e.rule);
    }
    EXPECT_NEAR(10.0 * std::log10(signal / error), e.db, 0.05)
        << (e.d == dist::gaussian ? "gaussian " : "laplace ") << mx::to_string(e.rule);
  }
}

// mse searches floor-1..floor+1 and every other rule picks floor or floor+1, so mse's error is
// never larger, up to rounding: mse compares float sums of 32 squared differences (each
// difference and square rounded once, 31 additions), a relative error of at most 33 * 2^-24 per
// sum, so two sums can be misordered by at most 66 * 2^-24 ~ 3.9e-6 relative.
TEST(ScaleRules, MseIsNeverWorseThanAnyOtherRule) {
  const double slack = 66.0 * std::ldexp(1.0, -24);
  const scale_rule others[] = {scale_rule::floor, scale_rule::even, scale_rule::rceil};
  std::mt19937_64 gen(23);
  std::uniform_real_distribution<double> log_scale(-140.0, 120.0);
  int beats[3] = {};
  for (dist d : {dist::gaussian, dist::laplace, dist::uniform, dist::outliers}) {
    for (int b = 0; b < 20000; ++b) {
      float x[mx::kBlockSize];
      fill_block(d, gen, x);
      // Mostly moderate magnitudes; every fourth block anywhere from subnormal to near overflow.
      const float s = static_cast<float>(std::exp2(b % 4 == 0 ? log_scale(gen) : log_scale(gen) / 8.0));
      for (float& v : x) v *= s;
      const double mse_err = block_error(x, scale_rule::mse);
      for (int r = 0; r < 3; ++r) {
        const double other = block_error(x, others[r]);
        ASSERT_LE(mse_err, other * (1.0 + slack)) << mx::to_string(others[r]) << " block " << b;
        beats[r] += mse_err < other ? 1 : 0;
      }
    }
  }
  // The search does pick a different, better byte than each fixed rule on some blocks.
  for (int r = 0; r < 3; ++r) EXPECT_GT(beats[r], 1000) << mx::to_string(others[r]);
}

// Every block a rule quantizes (ordinary scale: not NaN, not clamped to 0 or 254, not all zero)
// has a largest |code| of at least min_block_max_code(rule), and blocks reaching exactly that
// minimum exist: amax / scale = 4.0 for floor and even, 3.25 for rceil (rounds to 3), and an
// all-equal power-of-two block for mse (floor and floor + 1 both exact; the tie goes to the larger
// byte, leaving the amax at code 4 = 2.0).
TEST(ScaleRules, LargestCodeWindowOfEachRule) {
  std::mt19937_64 gen(41);
  std::uniform_real_distribution<double> log_scale(-100.0, 100.0);
  const auto largest_code = [](const float* x, scale_rule rule, uint8_t* scale) {
    uint8_t packed[mx::kPackedBlockBytes];
    mx::quantize_block(x, rule, scale, packed);
    int m = 0;
    for (int i = 0; i < mx::kBlockSize; ++i) m = std::max(m, mx::unpack_e2m1(packed[i / 2], i) & 7);
    return m;
  };
  for (scale_rule rule : mx::kAllScaleRules) {
    SCOPED_TRACE(mx::to_string(rule));
    const int minimum = mx::min_block_max_code(rule);
    int reached = 8;
    for (dist d : {dist::gaussian, dist::laplace, dist::uniform, dist::outliers})
      for (int b = 0; b < 5000; ++b) {
        float x[mx::kBlockSize];
        fill_block(d, gen, x);
        const float s = static_cast<float>(std::exp2(log_scale(gen)));
        for (float& v : x) v *= s;
        uint8_t scale;
        const int m = largest_code(x, rule, &scale);
        if (scale == 0 || scale >= 254 || m == 0) continue;
        ASSERT_GE(m, minimum) << "block " << b;
        reached = std::min(reached, m);
      }
    const float edge = rule == scale_rule::rceil ? 3.25f : (rule == scale_rule::mse ? 1.0f : 4.0f);
    float x[mx::kBlockSize];
    std::fill(x, x + mx::kBlockSize, edge);
    uint8_t scale;
    reached = std::min(reached, largest_code(x, rule, &scale));
    EXPECT_EQ(reached, minimum);
  }
}

// ---- the sm90 fragment word and the kernels' fast E2M1 -> bf16 conversion -------------------

// A fragment word with `code` in `slot` and random codes elsewhere.
uint32_t word_with(uint8_t code, int slot, std::mt19937& gen) {
  uint8_t codes[8];
  for (auto& c : codes) c = static_cast<uint8_t>(gen() & 0xF);
  codes[slot] = code;
  return mx::fragment_word_pack(codes);
}

// The bf16 the conversion must give a code: sign at bit 15, magnitude bits at 8..6.
uint16_t bf16_pow2m126_of(uint8_t code) {
  return static_cast<uint16_t>(((code & 8u) << 12) | ((code & 7u) << 6));
}

TEST(FragmentWord, BitPlacementIsAPermutationOfTheWord) {
  uint64_t seen = 0;
  for (int slot = 0; slot < 8; ++slot)
    for (int b = 0; b < 4; ++b) {
      const int bit = mx::fragment_bit(slot, b);
      ASSERT_TRUE(bit >= 0 && bit < 32) << slot << " " << b;
      ASSERT_FALSE((seen >> bit) & 1u) << "bit " << bit << " used twice";
      seen |= uint64_t{1} << bit;
    }
  EXPECT_EQ(seen, 0xFFFFFFFFull);
}

// Every pair of slots with every pair of codes (the other slots random): packing then reading
// back gives the codes; and every word read then packed gives the word back.
TEST(FragmentWord, PackAndReadBackRoundTrip) {
  std::mt19937 gen(17);
  for (int s1 = 0; s1 < 8; ++s1)
    for (int s2 = s1 + 1; s2 < 8; ++s2)
      for (int c1 = 0; c1 < 16; ++c1)
        for (int c2 = 0; c2 < 16; ++c2) {
          uint8_t codes[8];
          for (auto& c : codes) c = static_cast<uint8_t>(gen() & 0xF);
          codes[s1] = static_cast<uint8_t>(c1);
          codes[s2] = static_cast<uint8_t>(c2);
          const uint32_t w = mx::fragment_word_pack(codes);
          for (int s = 0; s < 8; ++s) ASSERT_EQ(mx::fragment_word_code(w, s), codes[s]) << s1 << s2 << " slot " << s;
        }
  for (int i = 0; i < 200000; ++i) {
    const uint32_t w = i < 32 ? 1u << i : static_cast<uint32_t>(gen());
    uint8_t codes[8];
    for (int s = 0; s < 8; ++s) codes[s] = mx::fragment_word_code(w, s);
    ASSERT_EQ(mx::fragment_word_pack(codes), w) << std::hex << w;
  }
}

// fragment_bf16x2_pow2m126(w, r) holds slot r's code (low half) and slot r+4's (high half) in the
// bf16 form above. The conversion only shifts and masks, so each output bit is one input bit or
// 0: checking the zero word and the 32 one-bit words covers all 2^32 words; random words on top.
TEST(FragmentWord, FastConversionReadsEverySlot) {
  std::mt19937 gen(23);
  for (int i = -1; i < 300000; ++i) {
    const uint32_t w = i < 0 ? 0u : i < 32 ? 1u << i : static_cast<uint32_t>(gen());
    for (int r = 0; r < 4; ++r) {
      const uint32_t want = bf16_pow2m126_of(mx::fragment_word_code(w, r)) |
                            (static_cast<uint32_t>(bf16_pow2m126_of(mx::fragment_word_code(w, r + 4))) << 16);
      ASSERT_EQ(mx::fragment_bf16x2_pow2m126(w, r), want) << std::hex << "word " << w << " register " << r;
    }
  }
}

// For every code, slot and scale byte 0..255: bf16(conv) * 2^126 * bf16(scale), in float, equals
// mx::dequantize_value bit for bit. The two products are exact except when the value exceeds the
// float (and bf16) range — e2m1 >= 2 at scale 254, >= 4 at 253 — where both sides are Inf; every
// finite result is also exactly representable in bf16 (2 significant bits, exponent >= -128 >
// bf16's subnormal floor).
TEST(FastConversion, MatchesDequantizeValue) {
  std::mt19937 gen(31);
  const float pow2_126 = mxmoe::bf16_to_float(mx::kBf16Pow2_126);
  ASSERT_EQ(pow2_126, std::ldexp(1.0f, 126));
  for (int s = 0; s <= 255; ++s) {
    const float scale = mxmoe::bf16_to_float(mx::e8m0_to_bf16_bits(static_cast<uint8_t>(s)));
    for (int code = 0; code < 16; ++code)
      for (int slot = 0; slot < 8; ++slot) {
        const uint32_t word = word_with(static_cast<uint8_t>(code), slot, gen);
        const uint32_t pair = mx::fragment_bf16x2_pow2m126(word, slot % 4);
        const uint16_t half = static_cast<uint16_t>(slot < 4 ? pair & 0xFFFFu : pair >> 16);
        const float got = mxmoe::bf16_to_float(half) * pow2_126 * scale;
        const float want = mx::dequantize_value(static_cast<uint8_t>(code), static_cast<uint8_t>(s));
        if (s == 0xFF) {
          ASSERT_TRUE(std::isnan(got) && std::isnan(want));
          continue;
        }
        ASSERT_EQ(bits(got), bits(want)) << "code " << code << " slot " << slot << " scale " << s;
        const double exact = std::ldexp(static_cast<double>(mx::e2m1_to_float(code)), s - 127);
        if (std::fabs(exact) >= std::ldexp(1.0, 128)) {
          ASSERT_TRUE(std::isinf(got));
        } else {
          ASSERT_EQ(static_cast<double>(got), exact);
          ASSERT_EQ(mxmoe::bf16_to_float(mxmoe::float_to_bf16(got)), got);
        }
      }
  }
}

// ---- dtype.h conversions -------------------------------------------------------------------

// Oracle: of the two bf16 values around f (truncation and the next one up), the nearer, ties to
// the even one.
uint16_t bf16_oracle(float f) {
  const uint32_t u = bits(f);
  const uint16_t lo = static_cast<uint16_t>(u >> 16), hi = static_cast<uint16_t>(lo + 1);
  const double dl = std::fabs(static_cast<double>(f) - mxmoe::bf16_to_float(lo));
  const double dh = std::fabs(static_cast<double>(mxmoe::bf16_to_float(hi)) - f);
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(Dtype, FloatToBf16RoundsToNearestEven) {
  EXPECT_EQ(mxmoe::float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(mxmoe::float_to_bf16(from_bits(0x3F808000u)), 0x3F80);  // tie, even stays
  EXPECT_EQ(mxmoe::float_to_bf16(from_bits(0x3F818000u)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(mxmoe::float_to_bf16(from_bits(0x3F808001u)), 0x3F81);  // just above the tie
  EXPECT_EQ(mxmoe::float_to_bf16(from_bits(0x3F807FFFu)), 0x3F80);
  EXPECT_EQ(mxmoe::float_to_bf16(from_bits(0xBF818000u)), 0xBF82);
  EXPECT_EQ(mxmoe::float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds to Inf
  EXPECT_EQ(mxmoe::float_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(mxmoe::float_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(mxmoe::float_to_bf16(from_bits(0x00008000u)), 0x0000);  // subnormal tie -> even 0
  EXPECT_EQ(mxmoe::float_to_bf16(from_bits(0x00018000u)), 0x0002);
  for (uint32_t nan : {0x7FC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu, 0x7F80FFFFu}) {
    const uint16_t h = mxmoe::float_to_bf16(from_bits(nan));
    EXPECT_TRUE(std::isnan(mxmoe::bf16_to_float(h))) << std::hex << nan;
    EXPECT_EQ(h & 0x8000, (nan >> 16) & 0x8000);
  }
  std::mt19937 gen(41);
  std::uniform_int_distribution<uint32_t> finite(0, 0x7F7FFFFFu), sign(0, 1);
  for (int i = 0; i < 500000; ++i) {
    const float f = from_bits(finite(gen) | (sign(gen) << 31));
    if (std::fabs(f) >= from_bits(0x7F7F8000u)) continue;  // rounds to Inf: checked above
    ASSERT_EQ(mxmoe::float_to_bf16(f), bf16_oracle(f)) << std::hex << bits(f);
  }
}

// The host half of float2_to_bf16x2 (the device half: tests/gpu/test_gpu_dtype.cu): float_to_bf16
// of each, the first argument in bits 0..15.
TEST(Dtype, Float2ToBf16x2PutsTheFirstInTheLowHalf) {
  EXPECT_EQ(mxmoe::float2_to_bf16x2(1.0f, -2.0f), 0b1100'0000'0000'0000'0011'1111'1000'0000u);
  EXPECT_EQ(mxmoe::float2_to_bf16x2(from_bits(0x3F818000u), 0.0f), 0x00003F82u);  // tie, odd rounds up
  EXPECT_EQ(mxmoe::float2_to_bf16x2(0.0f, std::numeric_limits<float>::infinity()), 0x7F800000u);
}

// Oracle: f16 value of the bits, from the IEEE binary16 definition in double.
double f16_value(uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const double mag = e == 0 ? std::ldexp(static_cast<double>(m), -24) : std::ldexp(1024.0 + m, e - 25);
  return (h & 0x8000) ? -mag : mag;
}

TEST(Dtype, F16ExhaustiveRoundTrip) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = mxmoe::f16_to_float(static_cast<uint16_t>(h));
    const int e = (h >> 10) & 0x1F;
    if (e == 0x1F && (h & 0x3FF)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      const uint16_t back = mxmoe::float_to_f16(f);
      ASSERT_EQ(back & 0x7C00, 0x7C00);
      ASSERT_NE(back & 0x3FF, 0) << "NaN must stay NaN";
      continue;
    }
    if (e == 0x1F) ASSERT_TRUE(std::isinf(f));
    else ASSERT_EQ(static_cast<double>(f), f16_value(static_cast<uint16_t>(h))) << std::hex << h;
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0);
    ASSERT_EQ(mxmoe::float_to_f16(f), h) << std::hex << h;
  }
}

// Oracle: nearest finite f16 by binary search over the (monotone) positive f16 codes, ties to the
// even code; at or above 65520 (65504 + half an ulp) the result is Inf.
uint16_t f16_oracle(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7C00;
  uint16_t lo = 0, hi = 0x7BFF;  // largest code with value <= a
  while (lo < hi) {
    const uint16_t mid = static_cast<uint16_t>((lo + hi + 1) / 2);
    if (f16_value(mid) <= a) lo = mid;
    else hi = static_cast<uint16_t>(mid - 1);
  }
  if (lo == 0x7BFF) return sign | lo;
  const double dl = a - f16_value(lo), dh = f16_value(static_cast<uint16_t>(lo + 1)) - a;
  const uint16_t pick = dl < dh ? lo : dh < dl ? static_cast<uint16_t>(lo + 1) : ((lo & 1) ? lo + 1 : lo);
  return sign | pick;
}

TEST(Dtype, FloatToF16TiesSubnormalsOverflow) {
  EXPECT_EQ(mxmoe::float_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(mxmoe::float_to_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(mxmoe::float_to_f16(65520.0f), 0x7C00);  // tie with 65536: even -> Inf
  EXPECT_EQ(mxmoe::float_to_f16(-1e9f), 0xFC00);
  EXPECT_EQ(mxmoe::float_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(mxmoe::float_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie 0 | 1 -> 0
  EXPECT_EQ(mxmoe::float_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(mxmoe::float_to_f16(std::ldexp(3.0f, -25)), 0x0002);  // tie 1 | 2 -> 2
  EXPECT_EQ(mxmoe::float_to_f16(-std::ldexp(1.0f, -26)), 0x8000);
  EXPECT_EQ(mxmoe::float_to_f16(std::ldexp(1023.5f, -24)), 0x0400);  // rounds up to the smallest normal
  EXPECT_EQ(mxmoe::float_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  EXPECT_EQ(mxmoe::float_to_f16(1.0f + std::ldexp(3.0f, -11)), 0x3C02);
  std::mt19937 gen(43);
  std::uniform_int_distribution<uint32_t> exponent(90, 145), mantissa(0, 0x7FFFFF), sign(0, 1);
  for (int i = 0; i < 300000; ++i) {
    const float f = from_bits((sign(gen) << 31) | (exponent(gen) << 23) | mantissa(gen));
    ASSERT_EQ(mxmoe::float_to_f16(f), f16_oracle(f)) << std::hex << bits(f);
  }
}

}  // namespace
