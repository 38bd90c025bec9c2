// The C ABI (include/mxmoe/c_api.h, libmxmoe_c.so) as a C caller sees it: statuses and the
// thread-local last error for what the Python package never sends (NULL pointers, enum values
// out of range, ranks and sizes out of range), and a quantize / MoE forward round trip.
#include "mxmoe/c_api.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "mxmoe/layout.h"

namespace {

mxmoe_tensor make(void* data, int32_t dtype, std::vector<int64_t> shape) {
  mxmoe_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.device_type = MXMOE_DEVICE_CPU;
  t.ndim = static_cast<int32_t>(shape.size());
  int64_t stride = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    t.shape[i] = shape[static_cast<size_t>(i)];
    t.strides[i] = stride;
    stride *= shape[static_cast<size_t>(i)];
  }
  return t;
}

void expect_invalid(mxmoe_status s, const char* argument) {
  EXPECT_EQ(s, MXMOE_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(mxmoe_last_error_argument(), argument);
  EXPECT_NE(std::string(mxmoe_last_error()).find(std::string("argument '") + argument + "'"), std::string::npos)
      << mxmoe_last_error();
}

TEST(CApi, VersionAndBuild) {
  EXPECT_EQ(mxmoe_abi_version(), MXMOE_C_ABI_VERSION);
  EXPECT_STRNE(mxmoe_version(), "");
  int32_t ok = -1;
  char why[256];
  ASSERT_EQ(mxmoe_cuda_available(0, &ok, why, sizeof why), MXMOE_OK);
  if (!ok) {
    EXPECT_GT(std::strlen(why), 0u);
  }
}

TEST(CApi, QuantizeRoundTrip) {
  std::vector<float> x(4 * 64), y(4 * 64, -1.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) - 3.0f;  // exact in E2M1
  std::vector<uint8_t> packed(4 * 32), scales(4 * 2);
  const mxmoe_tensor xt = make(x.data(), MXMOE_F32, {4, 64}), pt = make(packed.data(), MXMOE_U8, {4, 32}),
                     st = make(scales.data(), MXMOE_U8, {4, 2}), yt = make(y.data(), MXMOE_F32, {4, 64});
  mxmoe_quant_stats stats{};
  ASSERT_EQ(mxmoe_quantize(&xt, MXMOE_RULE_EVEN, MXMOE_SCALES_LINEAR, &pt, &st, &stats, nullptr, nullptr), MXMOE_OK)
      << mxmoe_last_error();
  EXPECT_EQ(stats.elements, 256);
  EXPECT_EQ(stats.error_sq, 0.0);
  ASSERT_EQ(mxmoe_dequantize(&pt, &st, MXMOE_SCALES_LINEAR, &yt, nullptr), MXMOE_OK);
  EXPECT_EQ(x, y);
}

TEST(CApi, BadArgumentsAreNamedAndWriteNothing) {
  std::vector<float> x(64);
  std::vector<uint8_t> packed(32, 0xAB), scales(2, 0xAB);
  mxmoe_tensor xt = make(x.data(), MXMOE_F32, {1, 64});
  const mxmoe_tensor pt = make(packed.data(), MXMOE_U8, {1, 32}), st = make(scales.data(), MXMOE_U8, {1, 2});
  expect_invalid(mxmoe_quantize(nullptr, 0, 0, &pt, &st, nullptr, nullptr, nullptr), "x");
  expect_invalid(mxmoe_quantize(&xt, 9, 0, &pt, &st, nullptr, nullptr, nullptr), "rule");
  expect_invalid(mxmoe_quantize(&xt, 0, -1, &pt, &st, nullptr, nullptr, nullptr), "layout");
  mxmoe_quant_stats stats{};
  expect_invalid(mxmoe_quantize(&xt, 0, 0, &pt, &st, &stats, &stats, nullptr), "device_stats");
  xt.dtype = 42;
  expect_invalid(mxmoe_quantize(&xt, 0, 0, &pt, &st, nullptr, nullptr, nullptr), "x.dtype");
  xt = make(x.data(), MXMOE_F32, {1, 64});
  xt.ndim = MXMOE_MAX_RANK + 1;
  expect_invalid(mxmoe_quantize(&xt, 0, 0, &pt, &st, nullptr, nullptr, nullptr), "x.ndim");
  xt = make(x.data(), MXMOE_F32, {1, 64});
  xt.shape[0] = -1;
  expect_invalid(mxmoe_quantize(&xt, 0, 0, &pt, &st, nullptr, nullptr, nullptr), "x");
  xt = make(x.data(), MXMOE_F32, {1, 64});
  xt.device_type = 7;
  expect_invalid(mxmoe_quantize(&xt, 0, 0, &pt, &st, nullptr, nullptr, nullptr), "x.device_type");
  xt = make(x.data(), MXMOE_F32, {1, 64});
  mxmoe_tensor on_gpu = pt;
  on_gpu.device_type = MXMOE_DEVICE_CUDA;
  expect_invalid(mxmoe_quantize(&xt, 0, 0, &on_gpu, &st, nullptr, nullptr, nullptr), "packed");
  for (uint8_t b : packed) EXPECT_EQ(b, 0xAB);
  for (uint8_t b : scales) EXPECT_EQ(b, 0xAB);
  int64_t bytes = 0;
  expect_invalid(mxmoe_scale_bytes(130, 48, MXMOE_SCALES_TILED_128X4, &bytes), "k");
  ASSERT_EQ(mxmoe_scale_bytes(130, 160, MXMOE_SCALES_TILED_128X4, &bytes), MXMOE_OK);
  EXPECT_EQ(bytes, (mxmoe::layout::scale_tiled_128x4{130, 5}.size()));
}

TEST(CApi, LastErrorIsPerThread) {
  expect_invalid(mxmoe_quantize(nullptr, 0, 0, nullptr, nullptr, nullptr, nullptr, nullptr), "x");
  std::thread([] {
    EXPECT_STREQ(mxmoe_last_error(), "");
    expect_invalid(mxmoe_dequantize(nullptr, nullptr, 0, nullptr, nullptr), "packed");
  }).join();
  EXPECT_STREQ(mxmoe_last_error_argument(), "x");
}

TEST(CApi, MoeLayerLifecycle) {
  const int64_t e = 2, h = 32, i = 32;
  std::vector<uint8_t> gu_blocks(e * 2 * i * 16, 0x22), gu_scales(e * 2 * i, 127), dn_blocks(e * h * 16, 0x22),
      dn_scales(e * h, 127);
  const mxmoe_tensor gub = make(gu_blocks.data(), MXMOE_U8, {e, 2 * i, 1, 16}),
                     gus = make(gu_scales.data(), MXMOE_U8, {e, 2 * i, 1}),
                     dnb = make(dn_blocks.data(), MXMOE_U8, {e, h, 1, 16}),
                     dns = make(dn_scales.data(), MXMOE_U8, {e, h, 1});
  mxmoe_moe_weights w{};
  w.format = MXMOE_WEIGHTS_MXFP4;
  w.gate_up_blocks = &gub;
  w.gate_up_scales = &gus;
  w.down_blocks = &dnb;
  w.down_scales = &dns;
  mxmoe_moe_config cfg{e, h, i, MXMOE_ROUTING_SOFTMAX_TOPK, 1, 1, 1, 1, 1.0f, MXMOE_ACT_SILU_MUL, 1.702f, 7.0f,
                       MXMOE_GATE_UP_CONCATENATED};
  mxmoe_moe* layer = reinterpret_cast<mxmoe_moe*>(1);
  cfg.top_k = 3;
  expect_invalid(mxmoe_moe_prepare(&cfg, &w, MXMOE_DEVICE_CPU, 0, &layer), "cfg.routing.top_k");
  EXPECT_EQ(layer, nullptr);
  cfg.top_k = 1;
  cfg.activation_kind = 5;
  expect_invalid(mxmoe_moe_prepare(&cfg, &w, MXMOE_DEVICE_CPU, 0, &layer), "cfg.activation.kind");
  cfg.activation_kind = MXMOE_ACT_SILU_MUL;
  ASSERT_EQ(mxmoe_moe_prepare(&cfg, &w, MXMOE_DEVICE_CPU, 0, &layer), MXMOE_OK) << mxmoe_last_error();
  std::fill(gu_blocks.begin(), gu_blocks.end(), 0);  // the layer keeps its own copy

  std::vector<float> x(3 * h, 1.0f), logits(3 * e, 0.0f), out(3 * h, -1.0f);
  logits[1] = 1.0f;  // token 0 -> expert 1, the others -> expert 0
  const mxmoe_tensor xt = make(x.data(), MXMOE_F32, {3, h}), lt = make(logits.data(), MXMOE_F32, {3, e}),
                     ot = make(out.data(), MXMOE_F32, {3, h});
  ASSERT_EQ(mxmoe_moe_forward(layer, &xt, &lt, nullptr, nullptr, &ot, nullptr, 0, nullptr), MXMOE_OK)
      << mxmoe_last_error();
  // Every code is 0x2 = 1.0, scale 2^0: h = 32 per row, silu(32) * 32, then I of those per output.
  const float act = 32.0f / (1.0f + std::exp(-32.0f)) * 32.0f;
  for (float v : out) EXPECT_NEAR(v, act * 32.0f, act * 32.0f * 1e-6f);
  expect_invalid(mxmoe_moe_forward(layer, &xt, &lt, nullptr, nullptr, nullptr, nullptr, 0, nullptr), "out");
  expect_invalid(mxmoe_moe_forward(nullptr, &xt, &lt, nullptr, nullptr, &ot, nullptr, 0, nullptr), "layer");
  int64_t bytes = -1;
  ASSERT_EQ(mxmoe_moe_workspace_bytes(layer, 100, &bytes), MXMOE_OK);
  EXPECT_EQ(bytes, 0);
  ASSERT_EQ(mxmoe_moe_weight_bytes(layer, &bytes), MXMOE_OK);
  EXPECT_EQ(bytes, static_cast<int64_t>(gu_blocks.size() + gu_scales.size() + dn_blocks.size() + dn_scales.size()));
  double tol = 0;
  ASSERT_EQ(mxmoe_forward_rel_l2_tolerance(MXMOE_DEVICE_CPU, &tol), MXMOE_OK);
  EXPECT_EQ(tol, 1e-4);
  mxmoe_moe_free(layer);
  mxmoe_moe_free(nullptr);
}

}  // namespace
