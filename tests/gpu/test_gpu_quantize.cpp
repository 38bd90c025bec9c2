// GPU tests of cuda::quantize / cuda::dequantize (src/cuda/quantize/): every byte and every
// statistic against the CPU reference (cpu::quantize / cpu::dequantize, which call mx:: per block),
// for every scale rule x scale layout x input dtype, on random data of several distributions,
// special values, odd shapes, batched and strided inputs (fast and reference kernels), with the
// outputs pre-filled with 0xFF (tiled padding included). Bad input must throw and write nothing;
// identical calls must give identical bytes; the asynchronous form's statistics must be right on
// concurrent streams and inside CUDA graphs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda_ok.h"
#include "stats_compare.h"
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
#include "mxmoe/layout.h"
#include "mxmoe/quantize.h"

namespace {

using mxmoe::device_kind;
using mxmoe::dtype;
using mxmoe::quant_stats;
using mxmoe::scale_layout;
using mxmoe::tensor_view;
using mxmoe::mx::scale_rule;
namespace mx = mxmoe::mx;
namespace cuda = mxmoe::cuda;

enum class dist { gaussian, laplace, log_uniform, outliers };
constexpr dist kDists[] = {dist::gaussian, dist::laplace, dist::log_uniform, dist::outliers};

float draw(dist d, std::mt19937_64& rng, dtype t) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  switch (d) {
    case dist::gaussian: return normal(rng);
    case dist::laplace: {
      const float u = unit(rng) - 0.5f;
      return (u < 0 ? 1.0f : -1.0f) * std::log(1.0f - 2.0f * std::fabs(u) + 1e-30f);
    }
    case dist::log_uniform: {
      // Many binades: f16 holds about 2^-24..2^15, the others far more.
      const float span = t == dtype::f16 ? 36.0f : 120.0f, lo = t == dtype::f16 ? -22.0f : -60.0f;
      const float v = std::exp2(lo + span * unit(rng));
      return unit(rng) < 0.5f ? -v : v;
    }
    case dist::outliers: return normal(rng) * (unit(rng) < 0.01f ? 1000.0f : 1.0f);
  }
  return 0.0f;
}

// A host tensor [batch, rows, K] of `t`, with element strides (batch_stride, row_stride, 1); the
// gaps between rows hold 0xFF bytes (NaN in every float type) that must never be read.
struct host_tensor {
  dtype type;
  std::vector<int64_t> shape, strides;
  std::vector<uint8_t> bytes;

  host_tensor(dtype t, int64_t batch, int64_t rows, int64_t k, int64_t row_stride, int64_t batch_stride)
      : type(t), shape{batch, rows, k}, strides{batch_stride, row_stride, 1} {
    const int64_t elems = batch == 0 || rows == 0 ? 0 : (batch - 1) * batch_stride + (rows - 1) * row_stride + k;
    bytes.assign(static_cast<size_t>(elems * mxmoe::dtype_size(t)), 0xFF);
  }
  int64_t offset(int64_t b, int64_t r, int64_t c) const { return b * strides[0] + r * strides[1] + c; }
  void set(int64_t off, float v) {
    uint8_t* p = bytes.data() + off * mxmoe::dtype_size(type);
    if (type == dtype::f32) {
      std::memcpy(p, &v, 4);
    } else {
      const uint16_t h = type == dtype::bf16 ? mxmoe::float_to_bf16(v) : mxmoe::float_to_f16(v);
      std::memcpy(p, &h, 2);
    }
  }
  template <class Fn>
  void fill(Fn value_at) {
    for (int64_t b = 0; b < shape[0]; ++b)
      for (int64_t r = 0; r < shape[1]; ++r)
        for (int64_t c = 0; c < shape[2]; ++c) set(offset(b, r, c), value_at(b, r, c));
  }
  tensor_view view(void* data, device_kind d) const {
    tensor_view v(data, type, shape, d);
    v.strides = strides;
    return v;
  }
};

host_tensor contiguous(dtype t, int64_t batch, int64_t rows, int64_t k) {
  return host_tensor(t, batch, rows, k, k, rows * k);
}

std::vector<int64_t> scale_shape(const std::vector<int64_t>& shape, scale_layout layout) {
  const int64_t rows = shape[1], cols = shape[2] / mx::kBlockSize;
  if (layout == scale_layout::linear) return {shape[0], rows, cols};
  return {shape[0], mxmoe::layout::scale_tiled_128x4{rows, cols}.size()};
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

struct quantized {
  std::vector<uint8_t> packed, scales;
  quant_stats stats;
};

std::string describe(dtype t, scale_rule r, scale_layout l, const std::vector<int64_t>& shape) {
  return std::string(mxmoe::to_string(t)) + " " + mx::to_string(r) + " " + mxmoe::to_string(l) + " " +
         mxmoe::shape_string(shape);
}

quantized quantize_on_cpu(const host_tensor& x, scale_rule rule, scale_layout layout) {
  quantized q;
  const std::vector<int64_t> pshape{x.shape[0], x.shape[1], x.shape[2] / 2}, sshape = scale_shape(x.shape, layout);
  q.packed.assign(static_cast<size_t>(numel(pshape)), 0xFF);
  q.scales.assign(static_cast<size_t>(numel(sshape)), 0xFF);
  q.stats = mxmoe::cpu::quantize(x.view(const_cast<uint8_t*>(x.bytes.data()), device_kind::cpu), rule, layout,
                                 tensor_view(q.packed.data(), dtype::u8, pshape),
                                 tensor_view(q.scales.data(), dtype::u8, sshape));
  return q;
}

// Index of the first differing byte, or -1.
int64_t first_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  return -1;
}

// Uploads x at `misalign` bytes past a 256-byte aligned allocation (0: the fast kernel; a
// non-multiple of 16: the reference kernel), quantizes on the GPU into 0xFF-filled outputs.
// `with_stats` false: quantize_async without a statistics pointer (the kernels that compute none);
// the returned stats are then default-constructed.
quantized quantize_on_gpu(const host_tensor& x, scale_rule rule, scale_layout layout, size_t misalign = 0,
                          bool with_stats = true) {
  const std::vector<int64_t> pshape{x.shape[0], x.shape[1], x.shape[2] / 2}, sshape = scale_shape(x.shape, layout);
  cuda::device_buffer dx(x.bytes.size() + misalign + 1), dp(static_cast<size_t>(numel(pshape))),
      ds(static_cast<size_t>(numel(sshape)));
  dx.fill(0xFF);
  if (!x.bytes.empty()) dx.upload(x.bytes.data(), x.bytes.size(), misalign);
  dp.fill(0xFF);
  ds.fill(0xFF);
  quantized q;
  const tensor_view xv = x.view(static_cast<uint8_t*>(dx.data()) + misalign, device_kind::cuda);
  if (with_stats) {
    q.stats = cuda::quantize(xv, rule, layout, dp.view(dtype::u8, pshape), ds.view(dtype::u8, sshape));
  } else {
    cuda::quantize_async(xv, rule, layout, dp.view(dtype::u8, pshape), ds.view(dtype::u8, sshape), nullptr);
    cuda::synchronize();
  }
  q.packed.resize(dp.size());
  q.scales.resize(ds.size());
  if (dp.size()) dp.download(q.packed.data(), dp.size());
  if (ds.size()) ds.download(q.scales.data(), ds.size());
  // quantize reads x and nothing else writes it: the device copy must still be the host's bytes
  // (a difference here means quantize wrote its input, or the device memory did not keep it).
  std::vector<uint8_t> x_after(x.bytes.size());
  if (!x_after.empty()) dx.download(x_after.data(), x_after.size(), misalign);
  const int64_t dx_diff = first_difference(x_after, x.bytes);
  EXPECT_EQ(dx_diff, -1) << "the device copy of x differs from the host's after quantize at byte " << dx_diff << ": "
                         << int{x_after[size_t(std::max<int64_t>(dx_diff, 0))]} << " instead of "
                         << int{x.bytes[size_t(std::max<int64_t>(dx_diff, 0))]};
  return q;
}

// The input bits of MX block `block` (blocks numbered in [batch, rows, K / 32] order), in hex.
std::string block_bits(const host_tensor& x, int64_t block) {
  const int64_t kb = x.shape[2] / mx::kBlockSize, rows = x.shape[1];
  const int64_t b = block / (rows * kb), r = block / kb % rows, c = block % kb * mx::kBlockSize;
  const int size = mxmoe::dtype_size(x.type);
  std::string s;
  char buf[12];
  for (int i = 0; i < mx::kBlockSize; ++i) {
    uint32_t v = 0;
    std::memcpy(&v, x.bytes.data() + (x.offset(b, r, c + i)) * size, static_cast<size_t>(size));
    std::snprintf(buf, sizeof buf, size == 2 ? "%04x " : "%08x ", v);
    s += buf;
  }
  return s;
}

// On a difference, the message names the first differing byte and the input block it encodes.
void expect_same_bytes(const quantized& gpu, const quantized& cpu, const host_tensor& x, const std::string& what) {
  const int64_t dp = first_difference(gpu.packed, cpu.packed), ds = first_difference(gpu.scales, cpu.scales);
  EXPECT_EQ(dp, -1) << what << ": packed byte " << dp << " gpu " << int{gpu.packed[size_t(std::max<int64_t>(dp, 0))]}
                    << " cpu " << int{cpu.packed[size_t(std::max<int64_t>(dp, 0))]} << ", input block "
                    << dp / mx::kPackedBlockBytes << ": " << block_bits(x, std::max<int64_t>(dp, 0) / mx::kPackedBlockBytes);
  EXPECT_EQ(ds, -1) << what << ": scale byte " << ds << " gpu " << int{gpu.scales[size_t(std::max<int64_t>(ds, 0))]}
                    << " cpu " << int{cpu.scales[size_t(std::max<int64_t>(ds, 0))]};
}

// Dequantizes `q` (of a [batch, rows, K] tensor) on both backends to bf16 and f32; bytes must match.
// `misaligned`: packed and out 4 bytes off 16-byte alignment (the reference kernel).
void expect_same_dequantize(const quantized& q, const std::vector<int64_t>& shape, scale_layout layout,
                            const std::string& what, bool misaligned = false) {
  const size_t misalign = misaligned ? 4 : 0;
  const std::vector<int64_t> pshape{shape[0], shape[1], shape[2] / 2}, sshape = scale_shape(shape, layout);
  for (dtype out_type : {dtype::bf16, dtype::f32}) {
    const size_t out_bytes = static_cast<size_t>(numel(shape) * mxmoe::dtype_size(out_type));
    std::vector<uint8_t> cpu_out(out_bytes, 0xFF), gpu_out(out_bytes, 0xFF);
    mxmoe::cpu::dequantize(tensor_view(q.packed.data(), dtype::u8, pshape), tensor_view(q.scales.data(), dtype::u8, sshape),
                           layout, tensor_view(cpu_out.data(), out_type, shape));
    cuda::device_buffer dp(q.packed.size() + misalign), ds(q.scales.size()), dout(out_bytes + misalign);
    if (!q.packed.empty()) dp.upload(q.packed.data(), q.packed.size(), misalign);
    if (!q.scales.empty()) ds.upload(q.scales.data(), q.scales.size());
    dout.fill(0xFF);
    cuda::dequantize(tensor_view(static_cast<uint8_t*>(dp.data()) + misalign, dtype::u8, pshape, device_kind::cuda),
                     ds.view(dtype::u8, sshape), layout,
                     tensor_view(static_cast<uint8_t*>(dout.data()) + misalign, out_type, shape, device_kind::cuda));
    if (out_bytes) dout.download(gpu_out.data(), out_bytes, misalign);
    const int64_t d = first_difference(gpu_out, cpu_out);
    EXPECT_EQ(d, -1) << what << " dequantize to " << mxmoe::to_string(out_type) << ": byte " << d;
  }
}

// `misaligned`: x one element off 16-byte alignment, so the reference kernels run.
void check_case(const host_tensor& x, scale_rule rule, scale_layout layout, bool misaligned = false) {
  const size_t misalign = misaligned ? static_cast<size_t>(mxmoe::dtype_size(x.type)) : 0;
  const std::string what = describe(x.type, rule, layout, x.shape) + (misalign ? " misaligned" : "");
  const quantized cpu = quantize_on_cpu(x, rule, layout);
  const quantized gpu = quantize_on_gpu(x, rule, layout, misalign);
  expect_same_bytes(gpu, cpu, x, what);
  expect_same_stats(gpu.stats, cpu.stats, what);
  expect_same_bytes(quantize_on_gpu(x, rule, layout, misalign, false), cpu, x, what + " without statistics");
  expect_same_dequantize(cpu, x.shape, layout, what, misaligned);
}

struct combo {
  dtype type;
  scale_rule rule;
  scale_layout layout;
};

std::vector<combo> all_combos() {
  std::vector<combo> v;
  for (dtype t : {dtype::bf16, dtype::f16, dtype::f32})
    for (scale_rule r : mx::kAllScaleRules)
      for (scale_layout l : {scale_layout::linear, scale_layout::tiled_128x4}) v.push_back({t, r, l});
  return v;
}

std::string combo_name(const testing::TestParamInfo<combo>& info) {
  return std::string(mxmoe::to_string(info.param.type)) + "_" + mx::to_string(info.param.rule) + "_" +
         mxmoe::to_string(info.param.layout);
}

class GpuQuantize : public testing::TestWithParam<combo> {};

// Rows and K chosen against the kernels' tiles (32 blocks per warp, 128-row scale tiles, 4 scale
// columns): residues everywhere, one row, K of one block, gpt-oss's 2880.
TEST_P(GpuQuantize, RandomDataMatchesCpuOnOddShapes) {
  const combo c = GetParam();
  const int64_t shapes[][2] = {{1, 32},    {1, 4128},  {3, 96},    {3, 2880}, {127, 32},
                               {127, 2880}, {129, 96}, {129, 4128}, {1000, 32}, {1000, 96}};
  uint64_t seed = 1234 + static_cast<uint64_t>(c.rule) * 7 + static_cast<uint64_t>(c.type) * 131;
  int i = 0;
  for (const auto& s : shapes) {
    const dist d = kDists[i++ % 4];
    std::mt19937_64 rng(seed++);
    host_tensor x = contiguous(c.type, 1, s[0], s[1]);
    x.fill([&](int64_t, int64_t, int64_t) { return draw(d, rng, c.type); });
    check_case(x, c.rule, c.layout);
  }
}

// [E, rows, K] with gaps between rows and between experts (the gaps hold NaN bytes), through the
// fast kernels, then through the reference kernels (data off 16-byte alignment).
TEST_P(GpuQuantize, BatchedStridedInputMatchesCpu) {
  const combo c = GetParam();
  std::mt19937_64 rng(99);
  host_tensor x(c.type, 3, 129, 96, 96 + 32, 129 * 128 + 64);
  x.fill([&](int64_t, int64_t, int64_t) { return draw(dist::laplace, rng, c.type); });
  check_case(x, c.rule, c.layout);
  check_case(x, c.rule, c.layout, true);
}

// Blocks built around the E2M1 ties and the E8M0 rounding boundaries of each rule, plus zeros,
// subnormals, NaN and Inf. Values are stored in the input dtype, so neighbours are one ulp of it.
TEST_P(GpuQuantize, SpecialValuesMatchCpu) {
  const combo c = GetParam();
  const int eb = c.type == dtype::f32 ? 23 : (c.type == dtype::bf16 ? 7 : 10);  // mantissa bits
  const float ulp = std::ldexp(1.0f, -eb);
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  // amax mantissas on the boundaries: floor/rceil switch above 1.0, even at 1.75, saturation at 1.5.
  const float amax_mantissas[] = {1.0f, 1.0f + ulp, 1.5f - ulp, 1.5f, 1.5f + ulp, 1.75f - ulp, 1.75f, 1.75f + ulp,
                                  2.0f - ulp};
  const int exps[] = {-3, 0, 4, c.type == dtype::f16 ? 10 : 40};
  std::vector<std::vector<float>> blocks;
  for (int e : exps) {
    for (float m : amax_mantissas) {
      // amax 4m * 2^e: floor and even pick scale 2^e, rceil 2^e or 2^(e+1). The other elements are
      // E2M1 ties times 2^(e-1), 2^e or 2^(e+1) (kept below amax) and one ulp around them.
      std::vector<float> b(32);
      const float amax = std::ldexp(4.0f * m, e);
      b[0] = amax;
      for (int j = 1; j < 32; ++j) {
        const float t = ties[j % 7] * (j % 3 == 0 ? 1.0f : (j % 3 == 1 ? 1.0f + ulp : 1.0f - ulp / 2));
        float v = std::ldexp(t, e + (j / 7) % 3 - 1);
        if (v > amax) v = std::ldexp(t, e - 1);
        b[static_cast<size_t>(j)] = j & 1 ? -v : v;
      }
      blocks.push_back(b);
    }
  }
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float min_sub = c.type == dtype::f32 ? std::ldexp(1.0f, -149)
                                             : (c.type == dtype::bf16 ? std::ldexp(1.0f, -133) : std::ldexp(1.0f, -24));
  std::vector<float> zeros(32, 0.0f), neg_zeros(32, -0.0f), subnormals(32), with_nan(32, 1.0f), with_inf(32, -2.0f),
      mixed(32);
  for (int j = 0; j < 32; ++j) {
    subnormals[static_cast<size_t>(j)] = min_sub * static_cast<float>(j + 1) * (j & 1 ? -1.0f : 1.0f);
    mixed[static_cast<size_t>(j)] = j % 4 == 0 ? 0.0f : (j % 4 == 1 ? -0.0f : (j % 4 == 2 ? min_sub : 3.0f));
  }
  with_nan[7] = nan;
  with_inf[30] = inf;
  blocks.insert(blocks.end(), {zeros, neg_zeros, subnormals, with_nan, with_inf, mixed});
  // Two blocks per row, odd row count: blocks land on every position of a warp tile and scale tile.
  const int64_t rows = static_cast<int64_t>(blocks.size() + 1) / 2;
  host_tensor x = contiguous(c.type, 1, rows, 64);
  x.fill([&](int64_t, int64_t r, int64_t k) {
    const size_t b = static_cast<size_t>(r * 2 + k / 32);
    return b < blocks.size() ? blocks[b][static_cast<size_t>(k % 32)] : 1.0f;
  });
  check_case(x, c.rule, c.layout);
}

// Blocks where the mse candidates come close: ref - 1 (the floor byte minus one) winning, tying
// (equal sums keep ref) or just losing, and ref + 1 tying with ref (every element on its coarser
// grid: equal sums pick the larger byte). The bf16 kernel evaluates ref - 1 only where a bound does
// not rule it out; these blocks are where the bound fails, so they check that path and the bound.
TEST_P(GpuQuantize, MseCloseCandidatesMatchCpu) {
  const combo c = GetParam();
  std::mt19937_64 rng(4242 + static_cast<uint64_t>(c.type));
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<std::vector<float>> blocks;
  for (int e : {-5, 0, 3}) {
    const float u = std::ldexp(1.0f, e);  // ref's unit: y = |x| / u, amax in [4u, 8u)
    // ref - 1 region: amax just above 4u, the rest where ref - 1's extra points 0.25u and 0.75u help.
    for (int n = 0; n < 24; ++n) {
      std::vector<float> b(32);
      b[static_cast<size_t>(n % 32)] = u * (4.0f + 0.5f * unit(rng) * unit(rng));
      for (int j = 0; j < 32; ++j) {
        if (j == n % 32) continue;
        const float r = unit(rng);
        const float y = (r < 0.45f ? 0.25f : (r < 0.9f ? 0.75f : 1.5f + 1.5f * unit(rng))) + 0.2f * (unit(rng) - 0.5f);
        b[static_cast<size_t>(j)] = (j & 1 ? -u : u) * y;
      }
      blocks.push_back(b);
    }
    // Exact ties with ref - 1: amax 4u and 16 elements at 0.25u (ref: error 1/16 each; ref - 1: 0,
    // but 1 on amax): equal sums, so ref stays.
    std::vector<float> tie(32, 0.0f);
    tie[0] = 4.0f * u;
    for (int j = 1; j <= 16; ++j) tie[static_cast<size_t>(j)] = 0.25f * u;
    blocks.push_back(tie);
    // ref + 1 ties: every element on its grid (0, 2u, 4u, 6u in units of ref), amax 6u.
    std::vector<float> hi_tie(32);
    for (int j = 0; j < 32; ++j) hi_tie[static_cast<size_t>(j)] = (j & 1 ? -u : u) * static_cast<float>(2 * (j % 4));
    blocks.push_back(hi_tie);
    // ref + 1 region: amax in (7u, 8u).
    for (int n = 0; n < 8; ++n) {
      std::vector<float> b(32);
      for (int j = 0; j < 32; ++j) b[static_cast<size_t>(j)] = (j & 1 ? -u : u) * 2.0f * unit(rng);
      b[static_cast<size_t>(3 * n)] = u * (7.0f + unit(rng));
      blocks.push_back(b);
    }
  }
  const int64_t rows = static_cast<int64_t>(blocks.size());
  host_tensor x = contiguous(c.type, 1, rows, 32);
  x.fill([&](int64_t, int64_t r, int64_t k) { return blocks[static_cast<size_t>(r)][static_cast<size_t>(k)]; });
  check_case(x, c.rule, c.layout);
  // The same blocks really contain ref - 1 winners (else this test would not cover that path).
  if (c.rule == scale_rule::mse && c.layout == scale_layout::linear) {
    const quantized cpu = quantize_on_cpu(x, c.rule, c.layout);
    int below_floor = 0;
    for (int64_t r = 0; r < rows; ++r) {
      float amax = 0.0f;
      for (float v : blocks[static_cast<size_t>(r)]) amax = std::max(amax, std::fabs(v));
      below_floor += cpu.scales[static_cast<size_t>(r)] < mx::scale_from_amax(amax, scale_rule::floor) ? 1 : 0;
    }
    EXPECT_GT(below_floor, 0) << "no block picked ref - 1";
  }
}

INSTANTIATE_TEST_SUITE_P(AllRulesLayoutsDtypes, GpuQuantize, testing::ValuesIn(all_combos()), combo_name);

// Every byte value as codes and as scales (0: the subnormal 2^-127, 0xFF: NaN) through dequantize.
TEST(GpuDequantize, ArbitraryBytesMatchCpu) {
  for (scale_layout layout : {scale_layout::linear, scale_layout::tiled_128x4}) {
    const std::vector<int64_t> shape{2, 131, 288};
    quantized q;
    std::mt19937_64 rng(7);
    q.packed.resize(static_cast<size_t>(numel(shape) / 2));
    for (auto& b : q.packed) b = static_cast<uint8_t>(rng());
    q.scales.resize(static_cast<size_t>(numel(scale_shape(shape, layout))));
    for (size_t i = 0; i < q.scales.size(); ++i) q.scales[i] = static_cast<uint8_t>(i % 256);
    expect_same_dequantize(q, shape, layout, std::string("arbitrary bytes ") + mxmoe::to_string(layout));
    expect_same_dequantize(q, shape, layout, std::string("arbitrary bytes misaligned ") + mxmoe::to_string(layout), true);
  }
}

TEST(GpuQuantize, IdenticalCallsGiveIdenticalBytes) {
  std::mt19937_64 rng(5);
  host_tensor x = contiguous(dtype::bf16, 2, 1000, 2880);
  x.fill([&](int64_t, int64_t, int64_t) { return draw(dist::gaussian, rng, dtype::bf16); });
  for (scale_rule rule : {scale_rule::rceil, scale_rule::mse}) {
    const quantized a = quantize_on_gpu(x, rule, scale_layout::tiled_128x4);
    const quantized b = quantize_on_gpu(x, rule, scale_layout::tiled_128x4);
    EXPECT_EQ(a.packed, b.packed);
    EXPECT_EQ(a.scales, b.scales);
    EXPECT_EQ(a.stats.signal_sq, b.stats.signal_sq);  // deterministic reduction: bitwise equal
    EXPECT_EQ(a.stats.error_sq, b.stats.error_sq);
    EXPECT_EQ(a.stats.saturated_blocks, b.stats.saturated_blocks);
  }
}

TEST(GpuQuantize, AsyncFormWritesTheSameStatistics) {
  std::mt19937_64 rng(11);
  host_tensor x = contiguous(dtype::f32, 1, 77, 2880);
  x.fill([&](int64_t, int64_t, int64_t) { return draw(dist::outliers, rng, dtype::f32); });
  const quantized cpu = quantize_on_cpu(x, scale_rule::floor, scale_layout::linear);
  cuda::device_buffer dx(x.bytes.size()), dp(cpu.packed.size()), ds(cpu.scales.size()), dstats(sizeof(quant_stats));
  dx.upload(x.bytes.data(), x.bytes.size());
  cuda::quantize_async(x.view(dx.data(), device_kind::cuda), scale_rule::floor, scale_layout::linear,
                       dp.view(dtype::u8, {1, 77, 1440}), ds.view(dtype::u8, {1, 77, 90}),
                       static_cast<quant_stats*>(dstats.data()));
  cuda::synchronize();
  quant_stats st;
  dstats.download(&st, sizeof st);
  expect_same_stats(st, cpu.stats, "quantize_async");
}

// The statistics take a per-call workspace (stream-ordered allocation) and a second kernel launched
// as a programmatic dependent of the quantize kernel. Several non-blocking streams quantizing at
// once, each three times in a row, into statistics pre-filled with 0xFF: every result must be the
// CPU's, and the three of a stream bitwise equal. The tensors are big enough for a full grid (every
// SM busy), so the streams' kernels really overlap.
TEST(GpuQuantize, AsyncStatisticsOnConcurrentStreams) {
  constexpr int kStreams = 4, kRepeats = 3;
  const std::vector<int64_t> shape{1, 1200, 2880};
  std::vector<host_tensor> xs;
  std::vector<quantized> cpu;
  std::vector<cuda::device_buffer> dx, dp, ds;
  cuda::device_buffer dstats(sizeof(quant_stats) * kStreams * kRepeats);
  dstats.fill(0xFF);
  std::vector<cudaStream_t> streams(kStreams);
  for (int i = 0; i < kStreams; ++i) {
    std::mt19937_64 rng(100 + i);
    xs.push_back(contiguous(dtype::bf16, shape[0], shape[1], shape[2]));
    xs.back().fill([&](int64_t, int64_t, int64_t) { return draw(kDists[i % 4], rng, dtype::bf16); });
    cpu.push_back(quantize_on_cpu(xs.back(), scale_rule::floor, scale_layout::linear));
    dx.emplace_back(xs.back().bytes.size());
    dx.back().upload(xs.back().bytes.data(), xs.back().bytes.size());
    dp.emplace_back(cpu.back().packed.size());
    ds.emplace_back(cpu.back().scales.size());
    CUDA_OK(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking));
  }
  cuda::synchronize();  // the fill is on the legacy stream, which non-blocking streams do not wait for
  auto* stats = static_cast<quant_stats*>(dstats.data());
  for (int r = 0; r < kRepeats; ++r)
    for (int i = 0; i < kStreams; ++i)
      cuda::quantize_async(xs[i].view(dx[i].data(), device_kind::cuda), scale_rule::floor, scale_layout::linear,
                           dp[i].view(dtype::u8, {1, 1200, 1440}), ds[i].view(dtype::u8, {1, 1200, 90}),
                           stats + r * kStreams + i, streams[i]);
  for (cudaStream_t s : streams) CUDA_OK(cudaStreamSynchronize(s));
  std::vector<quant_stats> got(kStreams * kRepeats);
  dstats.download(got.data(), dstats.size());
  for (int i = 0; i < kStreams; ++i) {
    for (int r = 0; r < kRepeats; ++r) {
      const quant_stats& g = got[r * kStreams + i];
      expect_same_stats(g, cpu[i].stats, "stream " + std::to_string(i) + " call " + std::to_string(r));
      EXPECT_EQ(g.signal_sq, got[i].signal_sq) << "stream " << i << " call " << r;  // bitwise
      EXPECT_EQ(g.error_sq, got[i].error_sq) << "stream " << i << " call " << r;
    }
    quantized q;
    q.packed.resize(dp[i].size());
    q.scales.resize(ds[i].size());
    dp[i].download(q.packed.data(), q.packed.size());
    ds[i].download(q.scales.data(), q.scales.size());
    expect_same_bytes(q, cpu[i], xs[i], "stream " + std::to_string(i));
  }
  for (cudaStream_t s : streams) CUDA_OK(cudaStreamDestroy(s));
}

// quantize_async captured into a CUDA graph (the workspace becomes a graph allocation, the dependent
// launch a programmatic edge), the graph launched twice on another stream, with direct calls on the
// capture stream next to it: all give the CPU's bytes and statistics.
TEST(GpuQuantize, AsyncStatisticsInCudaGraph) {
  std::mt19937_64 rng(21);
  host_tensor x = contiguous(dtype::bf16, 2, 700, 2880);
  x.fill([&](int64_t, int64_t, int64_t) { return draw(dist::laplace, rng, dtype::bf16); });
  const quantized cpu = quantize_on_cpu(x, scale_rule::mse, scale_layout::tiled_128x4);
  const std::vector<int64_t> sshape = scale_shape(x.shape, scale_layout::tiled_128x4);
  cuda::device_buffer dx(x.bytes.size()), dp(cpu.packed.size()), ds(cpu.scales.size()),
      dstats(2 * sizeof(quant_stats));
  dx.upload(x.bytes.data(), x.bytes.size());
  auto* stats = static_cast<quant_stats*>(dstats.data());
  cudaStream_t capture_stream, replay_stream;
  CUDA_OK(cudaStreamCreateWithFlags(&capture_stream, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&replay_stream, cudaStreamNonBlocking));
  auto run = [&](cudaStream_t s, quant_stats* out) {
    cuda::quantize_async(x.view(dx.data(), device_kind::cuda), scale_rule::mse, scale_layout::tiled_128x4,
                         dp.view(dtype::u8, {2, 700, 1440}), ds.view(dtype::u8, sshape), out, s);
  };
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(capture_stream, cudaStreamCaptureModeThreadLocal));
  run(capture_stream, stats);
  CUDA_OK(cudaStreamEndCapture(capture_stream, &graph));
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  auto check = [&](const std::string& what) {
    std::vector<quant_stats> got(2);
    dstats.download(got.data(), dstats.size());
    quantized q;
    q.packed.resize(dp.size());
    q.scales.resize(ds.size());
    dp.download(q.packed.data(), q.packed.size());
    ds.download(q.scales.data(), q.scales.size());
    expect_same_bytes(q, cpu, x, what);
    expect_same_stats(got[0], cpu.stats, what + ", graph");
    expect_same_stats(got[1], cpu.stats, what + ", direct");
  };
  for (int round = 0; round < 2; ++round) {
    dstats.fill(0xFF);
    dp.fill(0xFF);
    ds.fill(0xFF);
    cuda::synchronize();  // the fills are on the legacy stream, which non-blocking streams do not wait for
    CUDA_OK(cudaGraphLaunch(exec, replay_stream));
    run(capture_stream, stats + 1);
    CUDA_OK(cudaStreamSynchronize(replay_stream));
    CUDA_OK(cudaStreamSynchronize(capture_stream));
    check("round " + std::to_string(round));
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(capture_stream));
  CUDA_OK(cudaStreamDestroy(replay_stream));
}

// Bad input: an invalid_argument naming the argument, and the outputs keep their 0xFF bytes.
TEST(GpuQuantize, BadInputThrowsAndWritesNothing) {
  cuda::device_buffer dx(4 * 64 * 4), dp(4 * 64), ds(4 * 64 + 512);
  dx.fill(0);
  auto expect_untouched = [&](const char* what) {
    std::vector<uint8_t> p(dp.size()), s(ds.size());
    dp.download(p.data(), p.size());
    ds.download(s.data(), s.size());
    for (uint8_t b : p) ASSERT_EQ(b, 0xFF) << what;
    for (uint8_t b : s) ASSERT_EQ(b, 0xFF) << what;
  };
  auto expect_invalid = [&](const tensor_view& x, const tensor_view& packed, const tensor_view& scales,
                            scale_layout layout, const char* arg, const char* what) {
    dp.fill(0xFF);
    ds.fill(0xFF);
    try {
      cuda::quantize(x, scale_rule::even, layout, packed, scales);
      ADD_FAILURE() << what << ": no exception";
    } catch (const mxmoe::invalid_argument& e) {
      EXPECT_EQ(e.arg(), arg) << what << ": " << e.what();
    }
    expect_untouched(what);
  };
  const tensor_view good_x = dx.view(dtype::f32, {4, 64}), good_p = dp.view(dtype::u8, {4, 32}),
                    good_s = ds.view(dtype::u8, {4, 2});
  expect_invalid(dx.view(dtype::f32, {4, 48}), dp.view(dtype::u8, {4, 24}), ds.view(dtype::u8, {4, 1}),
                 scale_layout::linear, "x", "K % 32 != 0");
  std::vector<float> host_x(4 * 64, 1.0f);
  expect_invalid(tensor_view(host_x.data(), dtype::f32, {4, 64}, device_kind::cpu), good_p, good_s,
                 scale_layout::linear, "x", "x on the cpu");
  std::vector<uint8_t> host_p(4 * 32);
  expect_invalid(good_x, tensor_view(host_p.data(), dtype::u8, {4, 32}, device_kind::cpu), good_s,
                 scale_layout::linear, "packed", "packed on the cpu");
  expect_invalid(tensor_view(host_x.data(), dtype::f32, {4, 64}, device_kind::cuda), good_p, good_s,
                 scale_layout::linear, "x", "a host pointer labelled cuda");
  expect_invalid(dx.view(dtype::i32, {4, 64}), good_p, good_s, scale_layout::linear, "x", "x of dtype i32");
  expect_invalid(good_x, dp.view(dtype::f32, {4, 8}), good_s, scale_layout::linear, "packed", "packed of dtype f32");
  expect_invalid(good_x, good_p, ds.view(dtype::u8, {4, 2}), scale_layout::tiled_128x4, "scales",
                 "linear-sized scales for the tiled layout");

  // dequantize: out must be bf16 or f32 on the device.
  cuda::device_buffer dout(4 * 64 * 4);
  dout.fill(0xFF);
  EXPECT_THROW(cuda::dequantize(good_p, good_s, scale_layout::linear, dout.view(dtype::f16, {4, 64})),
               mxmoe::invalid_argument);
  std::vector<float> host_out(4 * 64);
  EXPECT_THROW(cuda::dequantize(good_p, good_s, scale_layout::linear,
                                tensor_view(host_out.data(), dtype::f32, {4, 64}, device_kind::cpu)),
               mxmoe::invalid_argument);
  std::vector<uint8_t> out(dout.size());
  dout.download(out.data(), out.size());
  for (uint8_t b : out) ASSERT_EQ(b, 0xFF);
}

TEST(GpuQuantize, EmptyTensorsAreFine) {
  cuda::device_buffer d(512);
  d.fill(0xFF);
  const quant_stats st = cuda::quantize(d.view(dtype::bf16, {0, 5, 64}), scale_rule::rceil, scale_layout::tiled_128x4,
                                        d.view(dtype::u8, {0, 5, 32}), d.view(dtype::u8, {0, 512}));
  EXPECT_EQ(st.elements, 0);
  EXPECT_EQ(st.blocks, 0);
  std::vector<uint8_t> bytes(512);
  d.download(bytes.data(), bytes.size());
  for (uint8_t b : bytes) ASSERT_EQ(b, 0xFF);
}

}  // namespace
