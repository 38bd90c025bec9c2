// Tests of tensor quantize / dequantize (include/mxmoe/quantize.h) on the CPU backend, directly
// (mxmoe::cpu::) and through the dispatch (mxmoe::): every dtype, 2-D and batched shapes, strided
// rows, both scale layouts (tiled padding pre-filled with 0xFF), statistics against a recount,
// thread-count independence, and bad input rejected by name without touching the outputs.
// Positions are computed with layout:: (never by hand); block results come from mx::quantize_block.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "mxmoe/dtype.h"
#include "mxmoe/error.h"
#include "mxmoe/layout.h"
#include "mxmoe/mx.h"
#include "mxmoe/quantize.h"

namespace {

using mxmoe::dtype;
using mxmoe::quant_stats;
using mxmoe::scale_layout;
using mxmoe::tensor_view;
namespace mx = mxmoe::mx;
namespace layout = mxmoe::layout;

constexpr uint8_t kSentinel = 0xA5;

// A [..., rows, K] tensor of one dtype whose dims other than the last may be padded (gaps filled
// with 0xFF bytes, a NaN in every float type, so reading a gap would show). `logical` holds the
// float value of every element in row-major logical order, after rounding to the dtype.
struct host_values {
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  std::vector<float> logical;
  tensor_view view;

  int64_t rows() const { return shape[shape.size() - 2]; }
  int64_t k() const { return shape.back(); }
  int64_t batch() const { return static_cast<int64_t>(logical.size()) / (rows() * k()); }
};

uint16_t to_storage16(dtype t, float v) { return t == dtype::bf16 ? mxmoe::float_to_bf16(v) : mxmoe::float_to_f16(v); }
float from_storage16(dtype t, uint16_t h) { return t == dtype::bf16 ? mxmoe::bf16_to_float(h) : mxmoe::f16_to_float(h); }

// Random values: Gaussian with a per-row magnitude 2^U(-6, 6), plus, when `specials`, a block of
// zeros, a block holding NaN, a block holding -Inf and a block of tiny values.
host_values make_values(dtype type, std::vector<int64_t> shape, uint64_t seed, int64_t pad = 0,
                        bool specials = true) {
  host_values h;
  h.shape = shape;
  const int rank = static_cast<int>(shape.size());
  std::vector<int64_t> strides(static_cast<size_t>(rank), 1);
  for (int i = rank - 2; i >= 0; --i)
    strides[static_cast<size_t>(i)] = strides[static_cast<size_t>(i + 1)] * shape[static_cast<size_t>(i + 1)] + pad;
  const int64_t elem = mxmoe::dtype_size(type);
  int64_t extent = 1;  // elements spanned, highest offset + 1
  for (int i = 0; i < rank; ++i) extent += (shape[static_cast<size_t>(i)] - 1) * strides[static_cast<size_t>(i)];
  h.bytes.assign(static_cast<size_t>(std::max<int64_t>(extent, 1) * elem), 0xFF);

  const int64_t k = shape.back(), rows_total = [&] {
    int64_t n = 1;
    for (int i = 0; i + 1 < rank; ++i) n *= shape[static_cast<size_t>(i)];
    return n;
  }();
  h.logical.resize(static_cast<size_t>(rows_total * k));
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> log_mag(-6.0f, 6.0f);
  for (int64_t r = 0; r < rows_total; ++r) {
    const float mag = std::exp2(log_mag(gen));
    // Element offset of logical row r: decompose over the leading dims.
    int64_t off = 0, rem = r;
    for (int i = rank - 2; i >= 0; --i) {
      off += (rem % shape[static_cast<size_t>(i)]) * strides[static_cast<size_t>(i)];
      rem /= shape[static_cast<size_t>(i)];
    }
    for (int64_t c = 0; c < k; ++c) {
      float v = normal(gen) * mag;
      const int64_t block = (r * k + c) / 32;
      if (specials && block == 1) v = 0.0f;
      if (specials && block == 3 && c % 32 == 5) v = std::numeric_limits<float>::quiet_NaN();
      if (specials && block == 6 && c % 32 == 30) v = -std::numeric_limits<float>::infinity();
      if (specials && block == 8) v *= 1e-6f;
      float stored = v;
      if (type == dtype::f32) {
        std::memcpy(&h.bytes[static_cast<size_t>((off + c) * elem)], &v, 4);
      } else {
        const uint16_t s = to_storage16(type, v);
        std::memcpy(&h.bytes[static_cast<size_t>((off + c) * elem)], &s, 2);
        stored = from_storage16(type, s);
      }
      h.logical[static_cast<size_t>(r * k + c)] = stored;
    }
  }
  h.view = tensor_view(h.bytes.data(), type, shape);
  if (pad) h.view.strides = strides;
  return h;
}

// Output buffers for a [..., rows, K] tensor, pre-filled with `fill`.
struct mx_buffers {
  std::vector<uint8_t> packed, scales;
  tensor_view packed_view, scales_view;
  layout::checkpoint_mxfp4 codes;  // packed positions (experts = flattened leading dims)
  layout::scale_tiled_128x4 tiled;
  scale_layout kind;

  int64_t scale_offset(int64_t b, int64_t n, int64_t kb) const {
    return kind == scale_layout::linear ? codes.scale_offset(b, n, kb) : b * tiled.size() + tiled.offset(n, kb);
  }
};

mx_buffers make_buffers(const std::vector<int64_t>& shape, scale_layout kind, uint8_t fill = kSentinel) {
  mx_buffers m;
  m.kind = kind;
  const std::vector<int64_t> lead(shape.begin(), shape.end() - 2);
  int64_t batch = 1;
  for (int64_t d : lead) batch *= d;
  const int64_t rows = shape[shape.size() - 2], k = shape.back();
  m.codes = layout::checkpoint_mxfp4{batch, rows, k};
  m.tiled = layout::scale_tiled_128x4{rows, k / 32};
  std::vector<int64_t> packed_shape = lead, scale_shape = lead;
  packed_shape.insert(packed_shape.end(), {rows, k / 2});
  if (kind == scale_layout::linear) scale_shape.insert(scale_shape.end(), {rows, k / 32});
  else scale_shape.push_back(m.tiled.size());
  m.packed.assign(static_cast<size_t>(m.codes.block_bytes()), fill);
  m.scales.assign(static_cast<size_t>(kind == scale_layout::linear ? m.codes.scale_bytes() : batch * m.tiled.size()),
                  fill);
  m.packed_view = tensor_view(m.packed.data(), dtype::u8, packed_shape);
  m.scales_view = tensor_view(m.scales.data(), dtype::u8, scale_shape);
  return m;
}

// Checks bytes against mx::quantize_block on each block and the statistics against a recount
// done here in double from the outputs.
void expect_matches_reference(const host_values& x, const mx_buffers& out, mx::scale_rule rule,
                              const quant_stats& st) {
  const int64_t k = x.k(), rows = x.rows(), cols = k / 32;
  quant_stats want;
  for (int64_t b = 0; b < x.batch(); ++b)
    for (int64_t n = 0; n < rows; ++n)
      for (int64_t kb = 0; kb < cols; ++kb) {
        const float* block = &x.logical[static_cast<size_t>(((b * rows + n) * k) + kb * 32)];
        uint8_t scale, packed[mx::kPackedBlockBytes];
        mx::quantize_block(block, rule, &scale, packed);
        const uint8_t got_scale = out.scales[static_cast<size_t>(out.scale_offset(b, n, kb))];
        ASSERT_EQ(got_scale, scale) << "block " << b << "," << n << "," << kb;
        for (int j = 0; j < mx::kPackedBlockBytes; ++j)
          ASSERT_EQ(out.packed[static_cast<size_t>(out.codes.code_offset(b, n, kb * 32 + 2 * j).byte)], packed[j])
              << "block " << b << "," << n << "," << kb << " byte " << j;
        want.elements += 32;
        want.blocks += 1;
        if (scale == mx::kE8M0Nan) {
          want.nonfinite_blocks += 1;
          continue;
        }
        int clamped = 0;
        for (int i = 0; i < 32; ++i) {
          const double v = block[i];
          const double scaled = std::ldexp(v, 127 - scale);
          const uint8_t code = mx::unpack_e2m1(packed[i >> 1], i);
          const double q = std::ldexp(static_cast<double>(mx::e2m1_to_float(code)), scale - 127);
          clamped += std::fabs(scaled) > 6.0 ? 1 : 0;
          want.flushed_elements += (v != 0.0 && q == 0.0) ? 1 : 0;
          want.signal_sq += v * v;
          want.error_sq += (v - q) * (v - q);
        }
        want.clamped_elements += clamped;
        want.saturated_blocks += clamped > 0 ? 1 : 0;
      }
  EXPECT_EQ(st.elements, want.elements);
  EXPECT_EQ(st.blocks, want.blocks);
  EXPECT_EQ(st.saturated_blocks, want.saturated_blocks);
  EXPECT_EQ(st.clamped_elements, want.clamped_elements);
  EXPECT_EQ(st.flushed_elements, want.flushed_elements);
  EXPECT_EQ(st.nonfinite_blocks, want.nonfinite_blocks);
  // Same terms, summed in a different order.
  EXPECT_NEAR(st.signal_sq, want.signal_sq, 1e-12 * want.signal_sq);
  EXPECT_NEAR(st.error_sq, want.error_sq, 1e-12 * want.error_sq);
}

bool same_stats(const quant_stats& a, const quant_stats& b) {
  return a.elements == b.elements && a.blocks == b.blocks && a.saturated_blocks == b.saturated_blocks &&
         a.clamped_elements == b.clamped_elements && a.flushed_elements == b.flushed_elements &&
         a.nonfinite_blocks == b.nonfinite_blocks && std::memcmp(&a.signal_sq, &b.signal_sq, sizeof(double)) == 0 &&
         std::memcmp(&a.error_sq, &b.error_sq, sizeof(double)) == 0;
}

const char* name_of(dtype t) { return mxmoe::to_string(t); }

// ---- correctness ------------------------------------------------------------------------------

TEST(Quantize, MatchesBlockReferenceForEveryDtypeShapeAndLayout) {
  const std::vector<std::vector<int64_t>> shapes = {{1, 32}, {37, 96}, {3, 5, 2880}, {2, 3, 129, 64}};
  for (dtype t : {dtype::bf16, dtype::f16, dtype::f32})
    for (const auto& shape : shapes)
      for (scale_layout kind : {scale_layout::linear, scale_layout::tiled_128x4})
        for (mx::scale_rule rule : mx::kAllScaleRules) {
          SCOPED_TRACE(testing::Message() << name_of(t) << " " << mxmoe::shape_string(shape) << " "
                                          << mxmoe::to_string(kind) << " " << mx::to_string(rule));
          const host_values x = make_values(t, shape, 100 + shape.size());
          mx_buffers direct = make_buffers(shape, kind), dispatched = make_buffers(shape, kind);
          const quant_stats st = mxmoe::cpu::quantize(x.view, rule, kind, direct.packed_view, direct.scales_view, 2);
          expect_matches_reference(x, direct, rule, st);
          const quant_stats st2 = mxmoe::quantize(x.view, rule, kind, dispatched.packed_view, dispatched.scales_view);
          EXPECT_EQ(direct.packed, dispatched.packed);
          EXPECT_EQ(direct.scales, dispatched.scales);
          EXPECT_TRUE(same_stats(st, st2));
        }
}

TEST(Quantize, StatisticsAndSqnrArePlausible) {
  // Unit Gaussian rows (no per-row magnitude): `even` lands near 19 dB (docs/formats.md), every
  // block is finite, no element is near the flush threshold in bulk.
  const std::vector<int64_t> shape = {64, 2880};
  host_values x = make_values(dtype::f32, shape, 9, 0, false);
  std::mt19937_64 gen(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x.logical) v = normal(gen);
  std::memcpy(x.bytes.data(), x.logical.data(), x.logical.size() * sizeof(float));
  mx_buffers out = make_buffers(shape, scale_layout::linear);
  const quant_stats st = mxmoe::cpu::quantize(x.view, mx::scale_rule::even, scale_layout::linear, out.packed_view,
                                              out.scales_view);
  expect_matches_reference(x, out, mx::scale_rule::even, st);
  EXPECT_EQ(st.blocks, 64 * 90);
  EXPECT_EQ(st.nonfinite_blocks, 0);
  EXPECT_GT(st.sqnr_db(), 18.0);
  EXPECT_LT(st.sqnr_db(), 20.0);
  EXPECT_DOUBLE_EQ(st.sqnr_db(), 10.0 * std::log10(st.signal_sq / st.error_sq));
  // floor saturates far more blocks than even on the same data (docs/formats.md: 41.5% vs 22%).
  mx_buffers out_floor = make_buffers(shape, scale_layout::linear);
  const quant_stats st_floor = mxmoe::cpu::quantize(x.view, mx::scale_rule::floor, scale_layout::linear,
                                                    out_floor.packed_view, out_floor.scales_view);
  EXPECT_GT(st_floor.saturated_blocks, st.saturated_blocks);
}

TEST(Quantize, StridedRowsGiveTheSameResultAsAContiguousCopy) {
  for (dtype t : {dtype::bf16, dtype::f16, dtype::f32})
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{45, 160}, std::vector<int64_t>{3, 7, 96}}) {
      SCOPED_TRACE(testing::Message() << name_of(t) << " " << mxmoe::shape_string(shape));
      const host_values strided = make_values(t, shape, 5, /*pad=*/40);
      const host_values contiguous = make_values(t, shape, 5, 0);
      ASSERT_FALSE(strided.view.contiguous());
      ASSERT_EQ(strided.logical.size(), contiguous.logical.size());
      ASSERT_EQ(std::memcmp(strided.logical.data(), contiguous.logical.data(), strided.logical.size() * 4), 0);
      for (scale_layout kind : {scale_layout::linear, scale_layout::tiled_128x4}) {
        mx_buffers a = make_buffers(shape, kind), b = make_buffers(shape, kind);
        const quant_stats sa = mxmoe::quantize(strided.view, mx::scale_rule::even, kind, a.packed_view, a.scales_view);
        const quant_stats sb =
            mxmoe::quantize(contiguous.view, mx::scale_rule::even, kind, b.packed_view, b.scales_view);
        EXPECT_EQ(a.packed, b.packed);
        EXPECT_EQ(a.scales, b.scales);
        EXPECT_TRUE(same_stats(sa, sb));
        expect_matches_reference(strided, a, mx::scale_rule::even, sa);
      }
    }
}

TEST(Quantize, LinearAndTiledScalesAgree) {
  const std::vector<int64_t> shape = {2, 200, 224};  // 7 scale columns, 2 row tiles
  const host_values x = make_values(dtype::bf16, shape, 77);
  mx_buffers lin = make_buffers(shape, scale_layout::linear), til = make_buffers(shape, scale_layout::tiled_128x4);
  mxmoe::quantize(x.view, mx::scale_rule::rceil, scale_layout::linear, lin.packed_view, lin.scales_view);
  mxmoe::quantize(x.view, mx::scale_rule::rceil, scale_layout::tiled_128x4, til.packed_view, til.scales_view);
  EXPECT_EQ(lin.packed, til.packed);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t n = 0; n < 200; ++n)
      for (int64_t kb = 0; kb < 7; ++kb)
        ASSERT_EQ(lin.scales[static_cast<size_t>(lin.scale_offset(b, n, kb))],
                  til.scales[static_cast<size_t>(til.scale_offset(b, n, kb))]);
}

TEST(Quantize, TiledPaddingIsWrittenAsZero) {
  const std::vector<int64_t> shape = {3, 129, 160};  // 5 scale columns: rows and columns padded
  const host_values x = make_values(dtype::f32, shape, 8);
  mx_buffers out = make_buffers(shape, scale_layout::tiled_128x4, 0xFF);
  mxmoe::cpu::quantize(x.view, mx::scale_rule::mse, scale_layout::tiled_128x4, out.packed_view, out.scales_view, 3);
  int64_t padding = 0;
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t off = 0; off < out.tiled.size(); ++off) {
      int64_t m, k;
      if (out.tiled.coord(off, &m, &k)) continue;
      ++padding;
      ASSERT_EQ(out.scales[static_cast<size_t>(b * out.tiled.size() + off)], 0) << b << " " << off;
    }
  EXPECT_EQ(padding, 3 * (out.tiled.size() - 129 * 5));
}

TEST(Dequantize, MatchesDequantizeValueAndIgnoresTiledPadding) {
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{37, 96}, std::vector<int64_t>{2, 131, 160}}) {
    SCOPED_TRACE(mxmoe::shape_string(shape));
    const host_values x = make_values(dtype::f32, shape, 21);
    mx_buffers lin = make_buffers(shape, scale_layout::linear);
    mx_buffers til = make_buffers(shape, scale_layout::tiled_128x4);
    mxmoe::quantize(x.view, mx::scale_rule::even, scale_layout::linear, lin.packed_view, lin.scales_view);
    mxmoe::quantize(x.view, mx::scale_rule::even, scale_layout::tiled_128x4, til.packed_view, til.scales_view);
    // Same tiled scales with the padding set to 0xFF (NaN if it were ever read as a scale).
    mx_buffers til_ff = til;
    til_ff.scales_view.data = til_ff.scales.data();
    til_ff.packed_view.data = til_ff.packed.data();
    const int64_t batch = static_cast<int64_t>(til.scales.size()) / til.tiled.size();
    int64_t padding = 0;
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t off = 0; off < til.tiled.size(); ++off) {
        int64_t m, k;
        if (!til.tiled.coord(off, &m, &k)) {
          til_ff.scales[static_cast<size_t>(b * til.tiled.size() + off)] = 0xFF;
          ++padding;
        }
      }
    ASSERT_GT(padding, 0);

    const size_t n = x.logical.size();
    for (dtype t : {dtype::f32, dtype::bf16}) {
      SCOPED_TRACE(name_of(t));
      const size_t bytes = n * static_cast<size_t>(mxmoe::dtype_size(t));
      std::vector<uint8_t> from_lin(bytes, kSentinel), from_til(bytes, kSentinel), from_til_ff(bytes, kSentinel);
      mxmoe::dequantize(lin.packed_view, lin.scales_view, scale_layout::linear, tensor_view(from_lin.data(), t, shape));
      mxmoe::cpu::dequantize(til.packed_view, til.scales_view, scale_layout::tiled_128x4,
                             tensor_view(from_til.data(), t, shape), 3);
      mxmoe::dequantize(til_ff.packed_view, til_ff.scales_view, scale_layout::tiled_128x4,
                        tensor_view(from_til_ff.data(), t, shape));
      EXPECT_EQ(from_lin, from_til);
      EXPECT_EQ(from_lin, from_til_ff);
      // Element by element against mx::dequantize_value at the layout's positions.
      const int64_t rows = shape[shape.size() - 2], k = shape.back();
      for (size_t i = 0; i < n; ++i) {
        const int64_t c = static_cast<int64_t>(i) % k, r = static_cast<int64_t>(i) / k;
        const int64_t b = r / rows, row = r % rows;
        const layout::nibble_pos p = lin.codes.code_offset(b, row, c);
        const uint8_t code = static_cast<uint8_t>((lin.packed[static_cast<size_t>(p.byte)] >> (4 * p.high)) & 0xF);
        const float want = mx::dequantize_value(code, lin.scales[static_cast<size_t>(lin.scale_offset(b, row, c / 32))]);
        float got;
        if (t == dtype::f32) {
          std::memcpy(&got, &from_lin[i * 4], 4);
          if (std::isnan(want)) ASSERT_TRUE(std::isnan(got)) << i;
          else ASSERT_EQ(got, want) << i;
        } else {
          uint16_t h;
          std::memcpy(&h, &from_lin[i * 2], 2);
          if (std::isnan(want)) ASSERT_TRUE(std::isnan(mxmoe::bf16_to_float(h))) << i;
          else ASSERT_EQ(h, mxmoe::float_to_bf16(want)) << i;
        }
      }
    }
  }
}

TEST(Quantize, ThreadCountDoesNotChangeBytesOrStatistics) {
  const std::vector<int64_t> shape = {3, 70, 2880};  // 22 rows per chunk: 10 chunks
  const host_values x = make_values(dtype::bf16, shape, 55);
  for (scale_layout kind : {scale_layout::linear, scale_layout::tiled_128x4}) {
    mx_buffers one = make_buffers(shape, kind);
    const quant_stats s1 = mxmoe::cpu::quantize(x.view, mx::scale_rule::mse, kind, one.packed_view, one.scales_view, 1);
    for (int threads : {4, 3, 0}) {
      mx_buffers many = make_buffers(shape, kind);
      const quant_stats sn =
          mxmoe::cpu::quantize(x.view, mx::scale_rule::mse, kind, many.packed_view, many.scales_view, threads);
      EXPECT_EQ(one.packed, many.packed) << threads;
      EXPECT_EQ(one.scales, many.scales) << threads;
      EXPECT_TRUE(same_stats(s1, sn)) << threads;
      std::vector<float> out1(x.logical.size(), 1.0f), outn(x.logical.size(), 2.0f);
      mxmoe::cpu::dequantize(one.packed_view, one.scales_view, kind, tensor_view(out1.data(), dtype::f32, shape), 1);
      mxmoe::cpu::dequantize(many.packed_view, many.scales_view, kind, tensor_view(outn.data(), dtype::f32, shape),
                             threads);
      EXPECT_EQ(std::memcmp(out1.data(), outn.data(), out1.size() * 4), 0) << threads;
    }
  }
}

TEST(Quantize, EmptyTensorsAreFine) {
  for (scale_layout kind : {scale_layout::linear, scale_layout::tiled_128x4}) {
    const std::vector<int64_t> shape = {0, 64};
    const tensor_view x(nullptr, dtype::f32, shape);
    const tensor_view packed(nullptr, dtype::u8, {0, 32});
    const tensor_view scales(nullptr, dtype::u8, kind == scale_layout::linear ? std::vector<int64_t>{0, 2}
                                                                               : std::vector<int64_t>{0});
    const quant_stats st = mxmoe::quantize(x, mx::scale_rule::even, kind, packed, scales);
    EXPECT_EQ(st.blocks, 0);
    EXPECT_NO_THROW(mxmoe::dequantize(packed, scales, kind, tensor_view(nullptr, dtype::bf16, shape)));
  }
}

// ---- bad input --------------------------------------------------------------------------------

// Runs `call`, expects mxmoe::invalid_argument naming `arg`, and checks the outputs kept their
// sentinel bytes.
template <class Call>
void expect_rejected(const std::string& arg, const std::vector<uint8_t>& out_a, const std::vector<uint8_t>& out_b,
                     Call call, const std::string& also_in_message = "") {
  try {
    call();
    ADD_FAILURE() << "no exception; expected one naming '" << arg << "'";
  } catch (const mxmoe::invalid_argument& e) {
    EXPECT_EQ(e.arg(), arg) << e.what();
    EXPECT_NE(std::string(e.what()).find("'" + arg + "'"), std::string::npos) << e.what();
    if (!also_in_message.empty()) {
      EXPECT_NE(std::string(e.what()).find(also_in_message), std::string::npos) << e.what();
    }
  }
  for (uint8_t b : out_a) ASSERT_EQ(b, kSentinel);
  for (uint8_t b : out_b) ASSERT_EQ(b, kSentinel);
}

struct quantize_case {
  std::string name;      // what is wrong
  std::string arg;       // the argument the error must name
  std::string message;   // a phrase the message must hold ("" = none)
  tensor_view x, packed, scales;
  scale_layout kind = scale_layout::linear;
};

TEST(BadInput, QuantizeRejectsByNameAndWritesNothing) {
  const int64_t rows = 5, k = 64;
  const host_values good = make_values(dtype::f32, {rows, k}, 1);
  std::vector<uint8_t> packed(4096, kSentinel), scales(4096, kSentinel);
  const tensor_view p(packed.data(), dtype::u8, {rows, k / 2});
  const tensor_view s(scales.data(), dtype::u8, {rows, k / 32});
  const tensor_view st(scales.data(), dtype::u8, {layout::scale_tiled_128x4{rows, k / 32}.size()});
  auto with = [](tensor_view v, auto change) {
    change(v);
    return v;
  };
  const tensor_view x = good.view;
  std::vector<float> batched_data(2 * rows * k, 1.0f);
  const tensor_view batched(batched_data.data(), dtype::f32, {2, rows, k});
  const std::vector<quantize_case> cases = {
      {"K not a multiple of 32", "x", "multiple of 32", with(x, [](tensor_view& v) { v.shape = {rows * 2, 32 + 16}; }),
       tensor_view(packed.data(), dtype::u8, {rows * 2, 24}), tensor_view(scales.data(), dtype::u8, {rows * 2, 1})},
      {"K = 0", "x", "multiple of 32", with(x, [](tensor_view& v) { v.shape = {rows, 0}; }),
       tensor_view(packed.data(), dtype::u8, {rows, 0}), tensor_view(scales.data(), dtype::u8, {rows, 0})},
      {"x dtype u8", "x", "bf16", with(x, [](tensor_view& v) { v.type = dtype::u8; }), p, s},
      {"x dtype i32", "x", "bf16", with(x, [](tensor_view& v) { v.type = dtype::i32; }), p, s},
      {"rank 1", "x", "rank", with(x, [](tensor_view& v) { v.shape = {rows * k}; }), p, s},
      {"null x", "x", "null", with(x, [](tensor_view& v) { v.data = nullptr; }), p, s},
      {"last dim strided", "x", "contiguous",
       with(x, [](tensor_view& v) { v.shape = {rows, 32}; v.strides = {64, 2}; }),
       tensor_view(packed.data(), dtype::u8, {rows, 16}), tensor_view(scales.data(), dtype::u8, {rows, 1})},
      {"stride count", "x", "stride", with(x, [](tensor_view& v) { v.strides = {64}; }), p, s},
      {"packed wrong shape", "packed", "[5, 32]", x, tensor_view(packed.data(), dtype::u8, {rows, k / 2 + 1}), s},
      {"packed wrong rows", "packed", "[5, 32]", x, tensor_view(packed.data(), dtype::u8, {rows + 1, k / 2}), s},
      {"packed dtype", "packed", "u8", x, tensor_view(packed.data(), dtype::bf16, {rows, k / 2}), s},
      {"packed strided", "packed", "contiguous", x,
       with(p, [](tensor_view& v) { v.strides = {64, 1}; }), s},
      {"packed null", "packed", "null", x, with(p, [](tensor_view& v) { v.data = nullptr; }), s},
      {"scales wrong shape", "scales", "[5, 2]", x, p, tensor_view(scales.data(), dtype::u8, {rows, 3})},
      {"scales dtype", "scales", "u8", x, p, with(s, [](tensor_view& v) { v.type = dtype::i32; })},
      {"scales null", "scales", "null", x, p, with(s, [](tensor_view& v) { v.data = nullptr; })},
      {"linear scales given for tiled", "scales", "tiled_128x4", x, p, s, scale_layout::tiled_128x4},
      {"tiled scales given for linear", "scales", "[5, 2]", x, p, st, scale_layout::linear},
      {"leading dims differ", "packed", "[2, 5, 32]", batched, tensor_view(packed.data(), dtype::u8, {3, rows, k / 2}),
       tensor_view(scales.data(), dtype::u8, {2, rows, 2})},
  };

  for (const quantize_case& c : cases) {
    SCOPED_TRACE(c.name);
    expect_rejected(c.arg, packed, scales, [&] { mxmoe::cpu::quantize(c.x, mx::scale_rule::even, c.kind, c.packed, c.scales); },
                    c.message);
    expect_rejected(c.arg, packed, scales, [&] { mxmoe::quantize(c.x, mx::scale_rule::even, c.kind, c.packed, c.scales); },
                    c.message);
  }
  // The valid call succeeds (so the cases above failed for the reason they name).
  EXPECT_NO_THROW(mxmoe::cpu::quantize(x, mx::scale_rule::even, scale_layout::linear, p, s));
}

TEST(BadInput, DequantizeRejectsByNameAndWritesNothing) {
  const int64_t rows = 5, k = 64;
  std::vector<uint8_t> packed(rows * k / 2, 0x21), scales(rows * k / 32, 127), out(4096, kSentinel);
  const tensor_view p(packed.data(), dtype::u8, {rows, k / 2});
  const tensor_view s(scales.data(), dtype::u8, {rows, k / 32});
  const tensor_view o(out.data(), dtype::f32, {rows, k});
  const std::vector<uint8_t> none;
  struct dq_case {
    std::string name, arg, message;
    tensor_view out;
    tensor_view packed;
  };
  const std::vector<dq_case> cases = {
      {"out f16", "out", "bf16 or f32", tensor_view(out.data(), dtype::f16, {rows, k}), p},
      {"out strided rows", "out", "contiguous", [&] {
         tensor_view v = o;
         v.strides = {k + 32, 1};
         return v;
       }(), p},
      {"out K 48", "out", "multiple of 32", tensor_view(out.data(), dtype::f32, {rows, 48}), p},
      {"out null", "out", "null", tensor_view(nullptr, dtype::f32, {rows, k}), p},
      {"packed shape", "packed", "[5, 32]", o, tensor_view(packed.data(), dtype::u8, {rows, k})},
  };
  for (const dq_case& c : cases) {
    SCOPED_TRACE(c.name);
    expect_rejected(c.arg, out, none, [&] { mxmoe::cpu::dequantize(c.packed, s, scale_layout::linear, c.out); },
                    c.message);
    expect_rejected(c.arg, out, none, [&] { mxmoe::dequantize(c.packed, s, scale_layout::linear, c.out); }, c.message);
  }
  EXPECT_NO_THROW(mxmoe::cpu::dequantize(p, s, scale_layout::linear, o));
}

TEST(BadInput, MixedDevicesAreRejected) {
  const int64_t rows = 3, k = 32;
  const host_values x = make_values(dtype::f32, {rows, k}, 2);
  std::vector<uint8_t> packed(rows * k / 2, kSentinel), scales(rows, kSentinel), out(rows * k * 4, kSentinel);
  tensor_view p(packed.data(), dtype::u8, {rows, k / 2}), s(scales.data(), dtype::u8, {rows, 1});
  tensor_view p_cuda = p, s_cuda = s, o_cuda(out.data(), dtype::f32, {rows, k});
  p_cuda.device = mxmoe::device_kind::cuda;
  s_cuda.device = mxmoe::device_kind::cuda;
  o_cuda.device = mxmoe::device_kind::cuda;
  expect_rejected("packed", packed, scales,
                  [&] { mxmoe::quantize(x.view, mx::scale_rule::even, scale_layout::linear, p_cuda, s); }, "cpu");
  expect_rejected("scales", packed, scales,
                  [&] { mxmoe::quantize(x.view, mx::scale_rule::even, scale_layout::linear, p, s_cuda); }, "cpu");
  expect_rejected("packed", packed, scales,
                  [&] { mxmoe::cpu::quantize(x.view, mx::scale_rule::even, scale_layout::linear, p_cuda, s); }, "cpu");
  const std::vector<uint8_t> none;
  std::vector<uint8_t> packed_in(rows * k / 2, 0x12), scales_in(rows, 127);
  const tensor_view pi(packed_in.data(), dtype::u8, {rows, k / 2}), si(scales_in.data(), dtype::u8, {rows, 1});
  expect_rejected("out", out, none, [&] { mxmoe::dequantize(pi, si, scale_layout::linear, o_cuda); }, "cpu");
  expect_rejected("out", out, none, [&] { mxmoe::cpu::dequantize(pi, si, scale_layout::linear, o_cuda); }, "cpu");
}

}  // namespace
