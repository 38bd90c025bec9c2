// CPU MXFP4 quantize / dequantize along the last dimension (include/mxmoe/quantize.h).
//
// Every block goes through mx::quantize_block / mx::dequantize_value, or through a fast path that
// performs the same float operations on the blocks where they reduce to one multiply per element
// (quantize_block_fast, held equal to mx::quantize_block by tests), and every byte position
// through layout:: (checkpoint_mxfp4 for the packed codes and linear scales, scale_tiled_128x4
// for tiled scales): this file holds no format or layout of its own.
//
// Work is cut into chunks of whole rows whose size depends only on the shape, never on the thread
// count; statistics are summed per chunk and merged in chunk order, so the bytes and the
// statistics are identical for any number of threads.
#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "mxmoe/error.h"
#include "mxmoe/layout.h"
#include "mxmoe/quantize.h"

namespace mxmoe::cpu {
namespace {

constexpr int64_t kChunkElements = int64_t{1} << 16;

void check_on_cpu(const tensor_view& v, const char* name) {
  MXMOE_CHECK_ARG(v.device == device_kind::cpu, name, "a cpu tensor (mxmoe::cpu backend)", "a cuda tensor");
}

// Where block (b, n, kb) of a [..., rows, K] tensor lives: b is the flattened leading index.
class block_map {
 public:
  block_map(const tensor_view& values, scale_layout layout)
      : lead_shape_(values.shape.begin(), values.shape.end() - 2), layout_(layout) {
    rows_ = values.dim(-2);
    k_ = values.dim(-1);
    batch_ = 1;
    for (int64_t d : lead_shape_) batch_ *= d;
    for (int i = 0; i + 2 < values.rank(); ++i) lead_strides_.push_back(values.stride(i));
    row_stride_ = values.stride(-2);
    checkpoint_ = layout::checkpoint_mxfp4{batch_, rows_, k_};
    tiled_ = layout::scale_tiled_128x4{rows_, k_ / mx::kBlockSize};
  }

  int64_t batch() const { return batch_; }
  int64_t total_rows() const { return batch_ * rows_; }
  int64_t blocks_per_row() const { return k_ / mx::kBlockSize; }
  const layout::scale_tiled_128x4& tiled() const { return tiled_; }

  // Element offset of (b, n, 0) in the values tensor, honouring its strides.
  int64_t value_offset(int64_t b, int64_t n) const {
    int64_t off = n * row_stride_;
    for (size_t i = lead_shape_.size(); i-- > 0;) {
      off += (b % lead_shape_[i]) * lead_strides_[i];
      b /= lead_shape_[i];
    }
    return off;
  }
  int64_t packed_offset(int64_t b, int64_t n, int64_t kb) const {
    return checkpoint_.code_offset(b, n, kb * mx::kBlockSize).byte;
  }
  int64_t scale_offset(int64_t b, int64_t n, int64_t kb) const {
    if (layout_ == scale_layout::linear) return checkpoint_.scale_offset(b, n, kb);
    return b * tiled_.size() + tiled_.offset(n, kb);
  }
  int64_t rows_per_chunk() const { return quantize_chunk_rows(k_); }
  int64_t chunks() const { return layout::ceil_div(total_rows(), rows_per_chunk()); }

  // fn(element offset of the block, packed byte offset, scale byte offset) for every block of chunk c,
  // in row-major order.
  template <class Fn>
  void for_each_block(int64_t c, const Fn& fn) const {
    const int64_t end = std::min(total_rows(), (c + 1) * rows_per_chunk());
    for (int64_t r = c * rows_per_chunk(); r < end; ++r) {
      const int64_t b = r / rows_, n = r % rows_;
      const int64_t row = value_offset(b, n);
      for (int64_t kb = 0; kb < blocks_per_row(); ++kb)
        fn(row + kb * mx::kBlockSize, packed_offset(b, n, kb), scale_offset(b, n, kb));
    }
  }

 private:
  std::vector<int64_t> lead_shape_, lead_strides_;
  scale_layout layout_;
  int64_t rows_ = 0, k_ = 0, batch_ = 0, row_stride_ = 0;
  layout::checkpoint_mxfp4 checkpoint_;
  layout::scale_tiled_128x4 tiled_;
};

// Runs fn(chunk) for every chunk on up to `threads` threads (0: hardware concurrency).
template <class Fn>
void for_each_chunk(int64_t chunks, int threads, const Fn& fn) {
  int64_t n = threads > 0 ? threads : static_cast<int64_t>(std::thread::hardware_concurrency());
  n = std::clamp<int64_t>(n, 1, std::max<int64_t>(chunks, 1));
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t c = next++; c < chunks; c = next++) fn(c);
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < n; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
}

// The element type is decided once per block, not per element (load_float's switch would be).
void load_block(const tensor_view& x, int64_t offset, float* dst) {
  switch (x.type) {
    case dtype::bf16: {
      const uint16_t* p = static_cast<const uint16_t*>(x.data) + offset;
      for (int i = 0; i < mx::kBlockSize; ++i) dst[i] = bf16_to_float(p[i]);
      return;
    }
    case dtype::f32:
      std::copy_n(static_cast<const float*>(x.data) + offset, mx::kBlockSize, dst);
      return;
    default:
      for (int i = 0; i < mx::kBlockSize; ++i) dst[i] = load_float(x.data, x.type, offset + i);
  }
}

void store_block(const float* src, const tensor_view& out, int64_t offset) {
  if (out.type == dtype::bf16) {
    uint16_t* p = out.as<uint16_t>() + offset;
    for (int i = 0; i < mx::kBlockSize; ++i) p[i] = float_to_bf16(src[i]);
  } else {
    std::copy_n(src, mx::kBlockSize, out.as<float>() + offset);
  }
}

void add_block_stats(const float* x, const uint8_t* packed, uint8_t scale, const mx::block_stats& bs,
                     quant_stats& st) {
  st.elements += mx::kBlockSize;
  st.blocks += 1;
  if (bs.nonfinite) {
    st.nonfinite_blocks += 1;
    return;
  }
  st.saturated_blocks += bs.clamped > 0 ? 1 : 0;
  st.clamped_elements += bs.clamped;
  st.flushed_elements += bs.flushed;
  // The 16 values a code can take in this block, dequantized once instead of per element.
  double value_of[16];
  for (uint8_t c = 0; c < 16; ++c) value_of[c] = static_cast<double>(mx::dequantize_value(c, scale));
  for (int i = 0; i < mx::kBlockSize; ++i) {
    const double v = x[i];
    const double err = v - value_of[mx::unpack_e2m1(packed[i >> 1], i)];
    st.signal_sq += v * v;
    st.error_sq += err * err;
  }
}

// ---- the fast block path ----------------------------------------------------------------
// For a scale byte s <= 253, mx::mul_pow2(x, 127 - s) is the single multiply x * 2^(127 - s) (a
// normal float), so a block takes the same operations at every element and the loops below
// vectorize. Each loop keeps mx::'s float operations exactly (no contraction: the build has
// -ffp-contract=off); the statistics' double sums are added in element order, as the general
// path adds them.
constexpr int kFastMaxScale = 253;

float pow2_float(int k) { return mx::bits_float(static_cast<uint32_t>(k + 127) << 23); }  // k in [-126, 127]

// e2m1 magnitude of a magnitude code in half units (0, 1, 2, 3, 4, 6, 8, 12), without
// mx::e2m1_to_float's select, which keeps a loop of it scalar: the codes step by 0.5 up to 2, by 1
// up to 4, then to 6. tests/cpu/test_quantize_block.cpp holds the fast path's results equal to
// the general path's (mx::e2m1_to_float) for every code and every bf16 value.
inline uint32_t e2m1_halves(uint32_t m) {
  return m + (m > 4u ? m - 4u : 0u) + (m > 6u ? 2u : 0u);
}

// mx::block_sq_error for candidate bytes and a reference byte all <= kFastMaxScale.
float fast_sq_error(const float* x, int scale, int ref) {
  const float to_scale = pow2_float(mx::kE8M0Bias - scale), to_ref = pow2_float(mx::kE8M0Bias - ref);
  const float step = pow2_float(scale - ref);  // scale - ref is -1, 0 or 1
  float sq[mx::kBlockSize];
  for (int i = 0; i < mx::kBlockSize; ++i) {
    const uint32_t sign = mx::float_bits(x[i]) & 0x80000000u;
    const float a = mx::bits_float(mx::float_bits(x[i] * to_scale) & 0x7FFFFFFFu);
    const float mag = 0.5f * static_cast<float>(e2m1_halves(mx::e2m1_magnitude(a)));
    const float q = mx::bits_float(mx::float_bits(mag) | sign) * step;
    const float diff = x[i] * to_ref - q;
    sq[i] = diff * diff;
  }
  float err = 0.0f;
  for (int i = 0; i < mx::kBlockSize; ++i) err += sq[i];
  return err;
}

// mx::block_scale's mse choice among floor - 1, floor, floor + 1 (floor = base <= 252).
uint8_t fast_mse_scale(const float* x, int base) {
  int best = base;
  float best_err = fast_sq_error(x, base, base);
  const int lo = base > 0 ? base - 1 : 0, hi = base + 1;
  for (int c = lo; c <= hi; ++c) {
    if (c == base) continue;
    const float err = fast_sq_error(x, c, base);
    if (err < best_err || (err == best_err && c > best)) {
      best = c;
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best);
}

}  // namespace

int64_t quantize_chunk_rows(int64_t k) { return std::max<int64_t>(1, kChunkElements / std::max<int64_t>(k, 1)); }

namespace {

// quantize_block_fast's body, inlined into every caller (the chunk loop's clones among them).
inline __attribute__((always_inline)) bool fast_block(const float* x, mx::scale_rule rule, uint8_t* scale_out,
                                                     uint8_t* packed_out, quant_stats& st) {
  uint32_t amax_bits = 0;
  for (int i = 0; i < mx::kBlockSize; ++i) amax_bits = std::max(amax_bits, mx::float_bits(x[i]) & 0x7FFFFFFFu);
  if (amax_bits >= 0x7F800000u) return false;  // NaN / Inf
  int scale = mx::scale_from_amax(mx::bits_float(amax_bits), rule);
  // mse: mx::block_scale keeps the floor byte for a zero or subnormal amax, else compares three.
  if (rule == mx::scale_rule::mse && amax_bits >= 0x00800000u) {
    if (scale > kFastMaxScale - 1) return false;
    scale = fast_mse_scale(x, scale);
  }
  if (scale > kFastMaxScale) return false;

  const float to_unit = pow2_float(mx::kE8M0Bias - scale);
  uint32_t codes[mx::kBlockSize];
  uint32_t clamped = 0, flushed = 0;
  for (int i = 0; i < mx::kBlockSize; ++i) {
    const float a = mx::bits_float(mx::float_bits(x[i] * to_unit) & 0x7FFFFFFFu);
    const uint32_t m = mx::e2m1_magnitude(a);
    codes[i] = ((mx::float_bits(x[i]) >> 31) << 3) | m;
    clamped += a > mx::kE2M1Max ? 1u : 0u;
    flushed += (m == 0u && x[i] != 0.0f) ? 1u : 0u;
  }
  // The dequantized value of a code as the general path's table holds it: the float
  // mx::dequantize_value computes, e2m1 * 2^(scale - 127) rounded once to float (exact, also when
  // subnormal, except that the values 4 and 6 overflow to Inf at byte 253), then widened.
  const float unit = mx::e8m0_to_float(static_cast<uint8_t>(scale));
  double signal[mx::kBlockSize], error[mx::kBlockSize];
  for (int i = 0; i < mx::kBlockSize; ++i) {
    const double v = x[i];
    const float mag = 0.5f * static_cast<float>(e2m1_halves(codes[i] & 7u)) * unit;
    const double q = (codes[i] & 8u) ? -static_cast<double>(mag) : static_cast<double>(mag);
    const double err = v - q;
    signal[i] = v * v;
    error[i] = err * err;
  }
  *scale_out = static_cast<uint8_t>(scale);
  for (int j = 0; j < mx::kPackedBlockBytes; ++j) packed_out[j] = static_cast<uint8_t>(codes[2 * j] | (codes[2 * j + 1] << 4));
  st.elements += mx::kBlockSize;
  st.blocks += 1;
  st.saturated_blocks += clamped > 0 ? 1 : 0;
  st.clamped_elements += clamped;
  st.flushed_elements += flushed;
  for (int i = 0; i < mx::kBlockSize; ++i) {
    st.signal_sq += signal[i];
    st.error_sq += error[i];
  }
  return true;
}

}  // namespace

bool quantize_block_fast(const float* x, mx::scale_rule rule, uint8_t* scale_out, uint8_t* packed_out, quant_stats& st) {
  return fast_block(x, rule, scale_out, packed_out, st);
}

void quantize_block_general(const float* x, mx::scale_rule rule, uint8_t* scale, uint8_t* packed, quant_stats& st) {
  const mx::block_stats bs = mx::quantize_block(x, rule, scale, packed);
  add_block_stats(x, packed, *scale, bs, st);
}

void quantize_block_with_stats(const float* x, mx::scale_rule rule, uint8_t* scale, uint8_t* packed, quant_stats& st) {
  if (!fast_block(x, rule, scale, packed, st)) quantize_block_general(x, rule, scale, packed, st);
}

namespace {

// Tiled storage pads rows to 128 and scale columns to 4; those bytes are not data and get 0.
void zero_tiled_padding(const block_map& map, uint8_t* scales) {
  const layout::scale_tiled_128x4& t = map.tiled();
  for (int64_t b = 0; b < map.batch(); ++b) {
    uint8_t* base = scales + b * t.size();
    for (int64_t m = 0; m < t.padded_rows(); ++m)
      for (int64_t k = m < t.rows ? t.cols : 0; k < t.padded_cols(); ++k) base[t.offset(m, k)] = 0;
  }
}

// The blocks of chunk c, everything inlined into one function that is compiled twice, for AVX2
// and for the baseline, and picked when the program loads by the CPU's features: the fast path's
// loops then run at the machine's vector width. Both are the same IEEE operations in the same
// order (no contraction), so the bytes and statistics are the same bits on every machine; a test
// compares cpu::quantize with the general path block by block.
__attribute__((target_clones("avx2", "default"), flatten)) quant_stats quantize_chunk(
    const block_map& map, const tensor_view& x, mx::scale_rule rule, uint8_t* packed_base, uint8_t* scale_base, int64_t c) {
  quant_stats st;
  float block[mx::kBlockSize];
  map.for_each_block(c, [&](int64_t value, int64_t packed_at, int64_t scale_at) {
    load_block(x, value, block);
    if (!fast_block(block, rule, scale_base + scale_at, packed_base + packed_at, st))
      quantize_block_general(block, rule, scale_base + scale_at, packed_base + packed_at, st);
  });
  return st;
}

}  // namespace

quant_stats quantize(const tensor_view& x, mx::scale_rule rule, scale_layout layout, const tensor_view& packed,
                     const tensor_view& scales, int threads) {
  validate_mx_tensor(x, packed, scales, layout, mx_values::quantize_input);
  check_on_cpu(x, "x");
  check_on_cpu(packed, "packed");
  check_on_cpu(scales, "scales");

  const block_map map(x, layout);
  uint8_t* packed_base = packed.as<uint8_t>();
  uint8_t* scale_base = scales.as<uint8_t>();
  std::vector<quant_stats> chunk_stats(static_cast<size_t>(map.chunks()));

  for_each_chunk(map.chunks(), threads, [&](int64_t c) {
    chunk_stats[static_cast<size_t>(c)] = quantize_chunk(map, x, rule, packed_base, scale_base, c);
  });

  if (layout == scale_layout::tiled_128x4) zero_tiled_padding(map, scale_base);
  quant_stats total;
  for (const quant_stats& st : chunk_stats) total.merge(st);
  return total;
}

void dequantize(const tensor_view& packed, const tensor_view& scales, scale_layout layout, const tensor_view& out,
                int threads) {
  validate_mx_tensor(out, packed, scales, layout, mx_values::dequantize_output);
  check_on_cpu(packed, "packed");
  check_on_cpu(scales, "scales");
  check_on_cpu(out, "out");

  const block_map map(out, layout);
  const uint8_t* packed_base = packed.as<const uint8_t>();
  const uint8_t* scale_base = scales.as<const uint8_t>();
  for_each_chunk(map.chunks(), threads, [&](int64_t c) {
    float block[mx::kBlockSize];
    map.for_each_block(c, [&](int64_t value, int64_t packed_at, int64_t scale_at) {
      const uint8_t* codes = packed_base + packed_at;
      const uint8_t scale = scale_base[scale_at];
      for (int i = 0; i < mx::kBlockSize; ++i) block[i] = mx::dequantize_value(mx::unpack_e2m1(codes[i >> 1], i), scale);
      store_block(block, out, value);
    });
  });
}

}  // namespace mxmoe::cpu
