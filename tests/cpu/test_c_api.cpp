// The C ABI (include/mxmoe/c_api.h, libmxmoe_c.so) as a C caller sees it: statuses and the
// thread-local last error for what the Python package never sends (NULL pointers, enum values
// out of range, ranks and sizes out of range), a quantize / MoE forward round trip, and the
// library's road through the ABI: synthetic layers and presets, a checkpoint opened, listed, read
// and prepared, verification, conversion with its report, progress and cancellation.
#include "mxmoe/c_api.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "mxmoe/checkpoint.h"
#include "mxmoe/forward.h"
#include "mxmoe/layout.h"
#include "mxmoe/presets.h"
#include "mxmoe/safetensors.h"
#include "mxmoe/shard.h"
#include "mxmoe/synthetic.h"

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

// Whether device 0 is a GPU the library can use; `why` says why not.
bool usable_gpu(std::string* why) {
  int32_t ok = 0;
  char text[256] = {};
  EXPECT_EQ(mxmoe_cuda_available(0, &ok, text, sizeof text), MXMOE_OK);
  *why = text;
  return ok != 0;
}

// Whether a stream captures: a null result pointer is named; a CPU-only build says it has no CUDA;
// with a usable GPU the legacy default stream is not capturing (the capture itself is checked on
// the GPU by python/tests/test_moe.py, under torch.cuda.graph).
TEST(CApi, StreamCapturing) {
  expect_invalid(mxmoe_stream_capturing(nullptr, nullptr), "capturing");
  int32_t capturing = -1;
  const mxmoe_status s = mxmoe_stream_capturing(nullptr, &capturing);
  if (!mxmoe_built_with_cuda()) {
    EXPECT_EQ(s, MXMOE_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(mxmoe_last_error()).find("no CUDA"), std::string::npos) << mxmoe_last_error();
    return;
  }
  std::string why;
  if (!usable_gpu(&why)) GTEST_SKIP() << "no usable GPU: " << why;
  ASSERT_EQ(s, MXMOE_OK) << mxmoe_last_error();
  EXPECT_EQ(capturing, 0);
}

// Device memory for a caller's scratch: bad arguments named; a CPU-only build says it has no CUDA;
// with a usable GPU a buffer comes and goes (free of NULL is a no-op everywhere).
TEST(CApi, DeviceMemory) {
  void* p = reinterpret_cast<void*>(1);
  expect_invalid(mxmoe_device_alloc(0, 64, nullptr), "ptr");
  expect_invalid(mxmoe_device_alloc(0, 0, &p), "bytes");
  mxmoe_device_free(0, nullptr);
  const mxmoe_status s = mxmoe_device_alloc(0, 64, &p);
  if (!mxmoe_built_with_cuda()) {
    EXPECT_EQ(s, MXMOE_ERR_UNSUPPORTED);
    EXPECT_EQ(p, nullptr);
    return;
  }
  std::string why;
  if (!usable_gpu(&why)) GTEST_SKIP() << "no usable GPU: " << why;
  ASSERT_EQ(s, MXMOE_OK) << mxmoe_last_error();
  EXPECT_NE(p, nullptr);
  mxmoe_device_free(0, p);
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
  double tol = 0, max_err = 0;
  ASSERT_EQ(mxmoe_forward_tolerance(MXMOE_DEVICE_CPU, &tol, &max_err), MXMOE_OK);
  EXPECT_EQ(tol, 1e-4);
  EXPECT_TRUE(std::isinf(max_err));
  mxmoe_moe_free(layer);
  mxmoe_moe_free(nullptr);
}

// ---- the library's road through the ABI --------------------------------------------------------

namespace fs = std::filesystem;

constexpr int64_t kE = 4, kH = 64, kI = 96;

mxmoe_moe_config gpt_oss_like() {
  return {kE, kH, kI, MXMOE_ROUTING_TOPK_SOFTMAX, 2, 0, 1, 1, 1.0f, MXMOE_ACT_SWIGLU_CLAMPED, 1.702f, 7.0f,
          MXMOE_GATE_UP_INTERLEAVED};
}

// The mxmoe_moe_weights of an MXFP4 layer with biases and `e` experts, viewing buffers the caller
// keeps, as a C caller builds them.
struct c_mxfp4_layer {
  mxmoe_tensor t[6];
  mxmoe_moe_weights w{};
  c_mxfp4_layer(void* gub, void* gus, void* dnb, void* dns, void* gu_bias, void* dn_bias, int64_t e) {
    t[0] = make(gub, MXMOE_U8, {e, 2 * kI, kH / 32, 16});
    t[1] = make(gus, MXMOE_U8, {e, 2 * kI, kH / 32});
    t[2] = make(dnb, MXMOE_U8, {e, kH, kI / 32, 16});
    t[3] = make(dns, MXMOE_U8, {e, kH, kI / 32});
    t[4] = make(gu_bias, MXMOE_BF16, {e, 2 * kI});
    t[5] = make(dn_bias, MXMOE_BF16, {e, kH});
    w.format = MXMOE_WEIGHTS_MXFP4;
    w.gate_up_blocks = &t[0];
    w.gate_up_scales = &t[1];
    w.down_blocks = &t[2];
    w.down_scales = &t[3];
    w.gate_up_bias = &t[4];
    w.down_bias = &t[5];
  }
  c_mxfp4_layer(const c_mxfp4_layer&) = delete;  // w points into t
  c_mxfp4_layer& operator=(const c_mxfp4_layer&) = delete;
};

struct layer_storage {
  std::vector<uint8_t> gub = std::vector<uint8_t>(kE * 2 * kI * kH / 2), gus = std::vector<uint8_t>(kE * 2 * kI * kH / 32),
                       dnb = std::vector<uint8_t>(kE * kH * kI / 2), dns = std::vector<uint8_t>(kE * kH * kI / 32);
  std::vector<uint16_t> gu_bias = std::vector<uint16_t>(kE * 2 * kI), dn_bias = std::vector<uint16_t>(kE * kH);
};

// Host buffers of one MXFP4 layer of kE experts (with biases) and the mxmoe_moe_weights viewing them
// (the storage base is constructed first).
struct layer_buffers : layer_storage, c_mxfp4_layer {
  layer_buffers()
      : c_mxfp4_layer(gub.data(), gus.data(), dnb.data(), dns.data(), gu_bias.data(), dn_bias.data(), kE) {}
};

class CApiRoad : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mxmoe-test-c-api-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(CApiRoad, SyntheticLayerIsTheLibrarysAndVerifies) {
  const mxmoe_moe_config cfg = gpt_oss_like();
  layer_buffers b;
  ASSERT_EQ(mxmoe_synthetic_layer(&cfg, 1, 0, 11, &b.w), MXMOE_OK) << mxmoe_last_error();
  mxmoe::moe_config c;
  c.shape = {kE, kH, kI};
  c.routing = {mxmoe::routing_kind::topk_softmax, 2, false, 1, 1, 1.0f};
  c.activation.kind = mxmoe::activation_kind::swiglu_clamped;
  c.gate_up = mxmoe::layout::gate_up_order::interleaved;
  const mxmoe::synthetic::mxfp4_layer want = mxmoe::synthetic::make_layer(c, {.biases = true}, 11);
  EXPECT_EQ(b.gub, want.gate_up_blocks);
  EXPECT_EQ(b.dns, want.down_scales);
  EXPECT_EQ(b.dn_bias, want.down_bias);

  std::vector<uint16_t> x(5 * kH);
  std::vector<float> logits(5 * kE), out(5 * kH, -1.0f);
  const mxmoe_tensor xt = make(x.data(), MXMOE_BF16, {5, kH}), lt = make(logits.data(), MXMOE_F32, {5, kE}),
                     ot = make(out.data(), MXMOE_F32, {5, kH});
  ASSERT_EQ(mxmoe_synthetic_inputs(&cfg, &b.w, 5, 3, &xt, &lt), MXMOE_OK) << mxmoe_last_error();
  mxmoe_moe* layer = nullptr;
  ASSERT_EQ(mxmoe_moe_prepare(&cfg, &b.w, MXMOE_DEVICE_CPU, 0, &layer), MXMOE_OK) << mxmoe_last_error();
  ASSERT_EQ(mxmoe_moe_forward(layer, &xt, &lt, nullptr, nullptr, &ot, nullptr, 0, nullptr), MXMOE_OK);
  double seconds = -1;
  ASSERT_EQ(mxmoe_moe_forward_timed(layer, &xt, &lt, nullptr, nullptr, &ot, nullptr, 0, nullptr, 3, &seconds),
            MXMOE_OK);
  EXPECT_GT(seconds, 0.0);
  expect_invalid(mxmoe_moe_forward_timed(layer, &xt, &lt, nullptr, nullptr, &ot, nullptr, 0, nullptr, 0, &seconds),
                 "iterations");
  mxmoe_moe_free(layer);

  mxmoe_verify_result r{};
  ASSERT_EQ(mxmoe_verify(&cfg, &b.w, &xt, &lt, nullptr, nullptr, &ot, MXMOE_DEVICE_CPU, MXMOE_REFERENCE_AUTO, &r),
            MXMOE_OK)
      << mxmoe_last_error();
  EXPECT_EQ(r.status, MXMOE_VERIFY_PASSED);
  EXPECT_EQ(r.reference, MXMOE_REFERENCE_F64);
  EXPECT_LT(r.rel_l2, 1e-6);
  EXPECT_EQ(r.tolerance_rel_l2, 1e-4);
  out[7] += 1.0f;  // one wrong element
  ASSERT_EQ(mxmoe_verify(&cfg, &b.w, &xt, &lt, nullptr, nullptr, &ot, MXMOE_DEVICE_CPU, MXMOE_REFERENCE_F64, &r),
            MXMOE_OK);
  EXPECT_EQ(r.status, MXMOE_VERIFY_FAILED);
  expect_invalid(mxmoe_verify(&cfg, &b.w, &xt, &lt, nullptr, nullptr, &ot, MXMOE_DEVICE_CPU, MXMOE_REFERENCE_F32, &r),
                 "reference");
  expect_invalid(mxmoe_verify(&cfg, &b.w, &xt, &lt, nullptr, nullptr, &ot, MXMOE_DEVICE_CPU, 7, &r), "reference");
  expect_invalid(mxmoe_verify(&cfg, nullptr, &xt, &lt, nullptr, nullptr, &ot, 0, 1, &r), "weights");
  expect_invalid(mxmoe_verify(&cfg, &b.w, &xt, &lt, nullptr, nullptr, &ot, 0, 1, nullptr), "result");
  std::vector<float> ref = out;
  const mxmoe_tensor rt = make(ref.data(), MXMOE_F32, {5, kH});
  out[3] = NAN;
  ASSERT_EQ(mxmoe_compare(&ot, &rt, MXMOE_DEVICE_CUDA, &r), MXMOE_OK);
  EXPECT_EQ(r.status, MXMOE_VERIFY_NONFINITE_OUTPUT);
  EXPECT_EQ(r.nonfinite_out, 1);
  ASSERT_EQ(mxmoe_compare(&rt, &ot, MXMOE_DEVICE_CUDA, &r), MXMOE_OK);
  EXPECT_EQ(r.status, MXMOE_VERIFY_FAILED);  // a non-finite reference never passes
  EXPECT_EQ(r.reference, MXMOE_REFERENCE_NONE);
  EXPECT_EQ(r.tolerance_max_err_rel, 1.5e-2);
  expect_invalid(mxmoe_compare(&ot, &lt, MXMOE_DEVICE_CPU, &r), "out");

  // Bad output tensors are named and nothing is written.
  std::vector<uint8_t> small(10, 0xAB);
  const mxmoe_tensor wrong = make(small.data(), MXMOE_U8, {10});
  layer_buffers c2;
  c2.w.gate_up_scales = &wrong;
  expect_invalid(mxmoe_synthetic_layer(&cfg, 1, 0, 11, &c2.w), "out.gate_up_scales");
  for (uint8_t v : c2.gub) EXPECT_EQ(v, 0);
  c2.w.gate_up_scales = &c2.t[1];
  expect_invalid(mxmoe_synthetic_layer(&cfg, 0, 0, 11, &c2.w), "out.gate_up_bias");  // no biases drawn
  expect_invalid(mxmoe_synthetic_layer(&cfg, 1, 1, 11, &c2.w), "correction_bias");
  c2.w.format = MXMOE_WEIGHTS_BF16;
  expect_invalid(mxmoe_synthetic_layer(&cfg, 1, 0, 11, &c2.w), "out.format");
  expect_invalid(mxmoe_synthetic_layer(&cfg, 1, 0, 11, nullptr), "out");
  expect_invalid(mxmoe_synthetic_inputs(&cfg, nullptr, 4, 3, &xt, &lt), "x");  // [5, H] for 4 tokens
  expect_invalid(mxmoe_synthetic_inputs(&cfg, nullptr, -1, 3, &xt, &lt), "tokens");
  mxmoe_moe_config bad = cfg;
  bad.top_k = 9;
  expect_invalid(mxmoe_moe_config_validate(&bad), "cfg.routing.top_k");
  EXPECT_EQ(mxmoe_moe_config_validate(&cfg), MXMOE_OK);
}

// Prepare options through the ABI are the C++ API's: an expert-mapped layer, a tensor-parallel
// shard and both at once give, bit for bit, what mxmoe::prepare with the same prepare_options
// gives; the layer reports its shard's configuration and its map; bad options are named.
TEST_F(CApiRoad, PrepareOptionsAreTheLibrarys) {
  const mxmoe_moe_config cfg = gpt_oss_like();
  const mxmoe::synthetic::mxfp4_layer full = mxmoe::synthetic::make_layer(
      [] {
        mxmoe::moe_config c;
        c.shape = {kE, kH, kI};
        c.routing = {mxmoe::routing_kind::topk_softmax, 2, false, 1, 1, 1.0f};
        c.activation.kind = mxmoe::activation_kind::swiglu_clamped;
        c.gate_up = mxmoe::layout::gate_up_order::interleaved;
        return c;
      }(),
      {.biases = true}, 5);
  const mxmoe::synthetic::layer_inputs in = mxmoe::synthetic::make_inputs(full.cfg, full.weights(), 6, 2);
  std::vector<int32_t> map(kE, 7);
  ASSERT_EQ(mxmoe_contiguous_expert_map(kE, 2, 1, map.data()), MXMOE_OK) << mxmoe_last_error();
  EXPECT_EQ(map, mxmoe::expert_map_of(mxmoe::contiguous_owners(kE, 2), 1));
  const mxmoe::owned_weights held = mxmoe::select_experts(full.weights(), full.cfg, map);
  const int64_t eh = 2;

  const auto views = [](const mxmoe::moe_weights& v, int64_t e) {
    return c_mxfp4_layer(v.gate_up_blocks.data, v.gate_up_scales.data, v.down_blocks.data, v.down_scales.data,
                         v.gate_up_bias.data, v.down_bias.data, e);
  };
  const c_mxfp4_layer whole = views(full.weights(), kE), mine = views(held.weights(), eh);
  const mxmoe_tensor xt = make(const_cast<uint16_t*>(in.x.data()), MXMOE_BF16, {6, kH}),
                     lt = make(const_cast<float*>(in.logits.data()), MXMOE_F32, {6, kE});
  struct option_case {
    const c_mxfp4_layer* w;
    const mxmoe::moe_weights cxx;
    std::vector<int32_t> map;
    int32_t rank, ranks;
  };
  for (const option_case& k : {option_case{&mine, held.weights(), map, 0, 0},
                               option_case{&whole, full.weights(), {}, 1, 3},
                               option_case{&mine, held.weights(), map, 2, 3}}) {
    const mxmoe_prepare_options o{k.map.empty() ? nullptr : k.map.data(), static_cast<int64_t>(k.map.size()), k.rank,
                                  k.ranks};
    mxmoe_moe* layer = nullptr;
    ASSERT_EQ(mxmoe_moe_prepare_with_options(&cfg, &k.w->w, &o, MXMOE_DEVICE_CPU, 0, &layer), MXMOE_OK)
        << mxmoe_last_error();
    const mxmoe::prepared_moe want =
        mxmoe::prepare(k.cxx, full.cfg, mxmoe::device_kind::cpu,
                       {k.map, k.ranks ? mxmoe::tp_shard{k.rank, k.ranks} : mxmoe::tp_shard{}});
    mxmoe_moe_config got{};
    ASSERT_EQ(mxmoe_moe_config_of(layer, &got), MXMOE_OK);
    EXPECT_EQ(got.intermediate, want.config().shape.intermediate);
    int64_t begin = -1, size = -1;
    if (k.ranks) {
      ASSERT_EQ(mxmoe_shard_intermediate(kI, k.rank, k.ranks, &begin, &size), MXMOE_OK);
      EXPECT_EQ(size, got.intermediate);
      EXPECT_EQ(begin, mxmoe::shard_begin(kI, {k.rank, k.ranks}));
    }
    std::vector<int32_t> got_map(kE, 9);
    ASSERT_EQ(mxmoe_moe_expert_map(layer, got_map.data(), kE, &size), MXMOE_OK);
    EXPECT_EQ(size, static_cast<int64_t>(k.map.size()));
    if (!k.map.empty()) {
      EXPECT_EQ(got_map, k.map);
    }
    std::vector<float> out(6 * kH, -1.0f), ref(6 * kH, -2.0f);
    const mxmoe_tensor ot = make(out.data(), MXMOE_F32, {6, kH});
    ASSERT_EQ(mxmoe_moe_forward(layer, &xt, &lt, nullptr, nullptr, &ot, nullptr, 0, nullptr), MXMOE_OK)
        << mxmoe_last_error();
    mxmoe::moe_forward_host(want, in.x_view(), in.routing(),
                            mxmoe::tensor_view(ref.data(), mxmoe::dtype::f32, {6, kH}));
    EXPECT_EQ(out, ref) << "rank " << k.rank << " of " << k.ranks << ", map of " << k.map.size();
    mxmoe_moe_free(layer);
  }

  mxmoe_moe* layer = nullptr;
  const std::vector<int32_t> short_map{0, 1, -1};
  mxmoe_prepare_options o{short_map.data(), 3, 0, 0};
  expect_invalid(mxmoe_moe_prepare_with_options(&cfg, &mine.w, &o, MXMOE_DEVICE_CPU, 0, &layer), "expert_map");
  EXPECT_EQ(layer, nullptr);
  o = {nullptr, 4, 0, 0};
  expect_invalid(mxmoe_moe_prepare_with_options(&cfg, &mine.w, &o, MXMOE_DEVICE_CPU, 0, &layer),
                 "options.expert_map");
  o = {nullptr, 0, 0, 4};  // I = 96 is 3 blocks: at most 3 ranks
  expect_invalid(mxmoe_moe_prepare_with_options(&cfg, &whole.w, &o, MXMOE_DEVICE_CPU, 0, &layer), "tp.ranks");
  o = {nullptr, 0, 3, 3};
  expect_invalid(mxmoe_moe_prepare_with_options(&cfg, &whole.w, &o, MXMOE_DEVICE_CPU, 0, &layer), "tp.rank");
  o = {nullptr, 0, 1, 0};
  expect_invalid(mxmoe_moe_prepare_with_options(&cfg, &whole.w, &o, MXMOE_DEVICE_CPU, 0, &layer), "tp.rank");
  int64_t begin = 0, size = 0;
  expect_invalid(mxmoe_shard_intermediate(100, 0, 1, &begin, &size), "intermediate");
  expect_invalid(mxmoe_contiguous_expert_map(kE, 5, 0, map.data()), "ranks");
  ASSERT_EQ(mxmoe_moe_prepare_with_options(&cfg, &whole.w, nullptr, MXMOE_DEVICE_CPU, 0, &layer), MXMOE_OK);
  ASSERT_EQ(mxmoe_moe_expert_map(layer, nullptr, 0, &size), MXMOE_OK);
  EXPECT_EQ(size, 0);
  mxmoe_moe_free(layer);
}

TEST(CApi, PresetsAreTheLibrarys) {
  int32_t n = 0;
  ASSERT_EQ(mxmoe_preset_count(&n), MXMOE_OK);
  ASSERT_EQ(static_cast<size_t>(n), mxmoe::model_presets().size());
  for (int32_t i = 0; i < n; ++i) {
    const char* name = nullptr;
    mxmoe_moe_config cfg{};
    int32_t biases = -1;
    ASSERT_EQ(mxmoe_preset(i, &name, &cfg, &biases), MXMOE_OK);
    const mxmoe::model_preset& p = mxmoe::model_presets()[static_cast<size_t>(i)];
    EXPECT_STREQ(name, p.name);
    EXPECT_EQ(cfg.experts, p.config.shape.experts);
    EXPECT_EQ(cfg.top_k, p.config.routing.top_k);
    EXPECT_EQ(cfg.routing_kind, static_cast<int32_t>(p.config.routing.kind));
    EXPECT_EQ(cfg.routed_scaling_factor, p.config.routing.routed_scaling_factor);
    EXPECT_EQ(biases, p.has_biases ? 1 : 0);
    EXPECT_EQ(mxmoe_moe_config_validate(&cfg), MXMOE_OK);
  }
  expect_invalid(mxmoe_preset(n, nullptr, nullptr, nullptr), "index");
  expect_invalid(mxmoe_preset_count(nullptr), "count");
}

int32_t count_steps(int64_t done, int64_t total, const char* note, void* data) {
  auto* steps = static_cast<std::vector<int64_t>*>(data);
  EXPECT_LE(done, total);
  EXPECT_NE(note, nullptr);
  steps->push_back(done);
  return 0;
}

int32_t stop_at_two(int64_t done, int64_t, const char*, void*) { return done == 2 ? 1 : 0; }

TEST_F(CApiRoad, CheckpointListReadPrepareConvert) {
  // An MXFP4 checkpoint of a synthetic layer at decoder layer 2, with its configuration.
  const mxmoe_moe_config cfg = gpt_oss_like();
  layer_buffers b;
  ASSERT_EQ(mxmoe_synthetic_layer(&cfg, 1, 0, 5, &b.w), MXMOE_OK);
  const std::string prefix = mxmoe::checkpoint::gpt_oss_prefix(2);
  const auto n = mxmoe::checkpoint::mxfp4_tensor_names(prefix);
  const auto view = [](const mxmoe_tensor& t) {
    std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
    return mxmoe::tensor_view(t.data, static_cast<mxmoe::dtype>(t.dtype), shape);
  };
  const std::string path = (dir_ / "mxfp4.safetensors").string();
  mxmoe::write_safetensors(path,
                           {{n.gate_up_blocks, view(b.t[0])},
                            {n.gate_up_scales, view(b.t[1])},
                            {n.down_blocks, view(b.t[2])},
                            {n.down_scales, view(b.t[3])},
                            {prefix + "experts.gate_up_proj_bias", view(b.t[4])},
                            {prefix + "experts.down_proj_bias", view(b.t[5])}});

  mxmoe_checkpoint* file = nullptr;
  ASSERT_EQ(mxmoe_checkpoint_open(path.c_str(), &file), MXMOE_OK) << mxmoe_last_error();
  int64_t count = 0;
  ASSERT_EQ(mxmoe_checkpoint_layer_count(file, &count), MXMOE_OK);
  ASSERT_EQ(count, 1);
  mxmoe_layer_info info{};
  ASSERT_EQ(mxmoe_checkpoint_layer_info(file, 0, &info), MXMOE_OK);
  EXPECT_EQ(info.layer, 2);
  EXPECT_EQ(info.layout, MXMOE_LAYOUT_MXFP4_GPT_OSS);
  EXPECT_EQ(info.format, MXMOE_WEIGHTS_MXFP4);
  EXPECT_EQ(info.weight_dtype, MXMOE_U8);
  EXPECT_EQ(info.gate_up_bias_dtype, MXMOE_BF16);
  EXPECT_EQ(info.router_weight_dtype, MXMOE_ABSENT);
  EXPECT_EQ(info.config.experts, kE);
  EXPECT_EQ(info.config.routing_kind, MXMOE_ROUTING_TOPK_SOFTMAX);  // the gpt-oss family's default
  EXPECT_EQ(info.config.gate_up_order, MXMOE_GATE_UP_INTERLEAVED);
  expect_invalid(mxmoe_checkpoint_layer_info(file, 1, &info), "index");

  layer_buffers read;
  ASSERT_EQ(mxmoe_checkpoint_read_layer(file, 2, &read.w), MXMOE_OK) << mxmoe_last_error();
  EXPECT_EQ(read.gub, b.gub);
  EXPECT_EQ(read.dns, b.dns);
  EXPECT_EQ(read.gu_bias, b.gu_bias);
  expect_invalid(mxmoe_checkpoint_read_layer(file, 0, &read.w), "layer");
  mxmoe_tensor router = make(read.gu_bias.data(), MXMOE_BF16, {kE, kH});
  read.w.router_weight = &router;
  expect_invalid(mxmoe_checkpoint_read_layer(file, 2, &read.w), "out.router_weight");  // the file has none
  read.w.router_weight = nullptr;
  read.w.gate_up_bias = nullptr;  // NULL skips a tensor
  EXPECT_EQ(mxmoe_checkpoint_read_layer(file, 2, &read.w), MXMOE_OK);

  mxmoe_moe* layer = nullptr;
  ASSERT_EQ(mxmoe_checkpoint_prepare_layer(file, 2, nullptr, MXMOE_DEVICE_CPU, 0, &layer), MXMOE_OK)
      << mxmoe_last_error();
  int64_t bytes = 0;
  ASSERT_EQ(mxmoe_moe_weight_bytes(layer, &bytes), MXMOE_OK);
  EXPECT_EQ(bytes, static_cast<int64_t>(b.gub.size() + b.gus.size() + b.dnb.size() + b.dns.size() +
                                        2 * (b.gu_bias.size() + b.dn_bias.size())));
  mxmoe_moe_free(layer);
  mxmoe_moe_config bad = cfg;
  bad.top_k = 0;
  expect_invalid(mxmoe_checkpoint_prepare_layer(file, 2, &bad, MXMOE_DEVICE_CPU, 0, &layer), "cfg.routing.top_k");
  EXPECT_EQ(layer, nullptr);
  expect_invalid(mxmoe_checkpoint_prepare_layer(file, 2, nullptr, 5, 0, &layer), "device_type");
  // With options: the held experts are taken out of the file (weights of those only); a map of the
  // wrong size is named as mxmoe_moe_prepare_with_options names it.
  std::vector<int32_t> held(static_cast<size_t>(kE), -1);
  held[1] = 0;
  mxmoe_prepare_options options{held.data(), kE, 0, 1};
  ASSERT_EQ(mxmoe_checkpoint_prepare_layer_with_options(file, 2, nullptr, &options, MXMOE_DEVICE_CPU, 0, &layer),
            MXMOE_OK)
      << mxmoe_last_error();
  ASSERT_EQ(mxmoe_moe_weight_bytes(layer, &bytes), MXMOE_OK);
  EXPECT_EQ(bytes * kE, static_cast<int64_t>(b.gub.size() + b.gus.size() + b.dnb.size() + b.dns.size() +
                                             2 * (b.gu_bias.size() + b.dn_bias.size())));
  mxmoe_moe_free(layer);
  options.expert_map_size = kE - 1;
  expect_invalid(
      mxmoe_checkpoint_prepare_layer_with_options(file, 2, nullptr, &options, MXMOE_DEVICE_CPU, 0, &layer),
      "expert_map");
  mxmoe_checkpoint_close(file);
  mxmoe_checkpoint_close(nullptr);

  // Conversion: MXFP4 -> BF16 -> MXFP4, with progress, a report and a cancelled run.
  const std::string bf16 = (dir_ / "bf16.safetensors").string(), again = (dir_ / "again.safetensors").string();
  std::vector<int64_t> steps;
  ASSERT_EQ(mxmoe_dequantize_checkpoint(path.c_str(), bf16.c_str(), 0, count_steps, &steps), MXMOE_OK)
      << mxmoe_last_error();
  EXPECT_FALSE(steps.empty());
  expect_invalid(mxmoe_dequantize_checkpoint(path.c_str(), bf16.c_str(), 0, nullptr, nullptr), "output");
  mxmoe_quantize_options o{MXMOE_RULE_EVEN, MXMOE_DEVICE_CPU, 0, 0, stop_at_two, nullptr, 0};
  mxmoe_quantize_report* report = reinterpret_cast<mxmoe_quantize_report*>(1);
  EXPECT_EQ(mxmoe_quantize_checkpoint(bf16.c_str(), again.c_str(), &o, &report), MXMOE_ERR_CANCELLED);
  EXPECT_EQ(report, nullptr);
  EXPECT_FALSE(fs::exists(again));
  o.progress = nullptr;
  o.rule = 9;
  expect_invalid(mxmoe_quantize_checkpoint(bf16.c_str(), again.c_str(), &o, &report), "rule");
  o.rule = MXMOE_RULE_EVEN;
  expect_invalid(mxmoe_quantize_checkpoint(path.c_str(), again.c_str(), &o, &report), "IN");  // MXFP4 already
  expect_invalid(mxmoe_quantize_checkpoint(nullptr, again.c_str(), &o, &report), "in_path");
  expect_invalid(mxmoe_quantize_checkpoint(bf16.c_str(), again.c_str(), nullptr, &report), "options");
  ASSERT_EQ(mxmoe_quantize_checkpoint(bf16.c_str(), again.c_str(), &o, &report), MXMOE_OK) << mxmoe_last_error();
  mxmoe_quantize_summary s{};
  ASSERT_EQ(mxmoe_quantize_report_summary(report, &s), MXMOE_OK);
  EXPECT_EQ(s.tensors, 2);
  EXPECT_EQ(s.total.elements, kE * 3 * kH * kI);
  EXPECT_EQ(s.copied_tensors, 2);  // the biases
  mxmoe_tensor_report t{};
  ASSERT_EQ(mxmoe_quantize_report_tensor(report, 0, &t), MXMOE_OK);
  EXPECT_STREQ(t.name, n.gate_up_blocks.c_str());
  ASSERT_EQ(t.ndim, 4);
  EXPECT_EQ(t.shape[1], 2 * kI);
  EXPECT_EQ(t.stats.elements, kE * 2 * kI * kH);
  expect_invalid(mxmoe_quantize_report_tensor(report, 2, &t), "index");
  mxmoe_quantize_report_free(report);
  mxmoe_quantize_report_free(nullptr);

  // Files that are not there, or not safetensors.
  mxmoe_checkpoint* none = reinterpret_cast<mxmoe_checkpoint*>(1);
  EXPECT_EQ(mxmoe_checkpoint_open((dir_ / "absent").c_str(), &none), MXMOE_ERR_IO);
  EXPECT_EQ(mxmoe_last_error_code(), ENOENT);
  EXPECT_EQ(none, nullptr);
  const std::string garbage = (dir_ / "garbage").string();
  { std::FILE* f = std::fopen(garbage.c_str(), "wb"); std::fputs("not a safetensors file at all", f); std::fclose(f); }
  EXPECT_EQ(mxmoe_checkpoint_open(garbage.c_str(), &none), MXMOE_ERR_FORMAT);
  EXPECT_EQ(mxmoe_last_error_code(), 0);
  expect_invalid(mxmoe_checkpoint_open("", &none), "path");
  expect_invalid(mxmoe_checkpoint_layer_count(nullptr, &count), "file");
}

}  // namespace
