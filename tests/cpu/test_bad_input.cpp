// Every public MoE / routing entry point rejects bad input with an mxmoe::invalid_argument that
// names the argument, and writes nothing: outputs are pre-filled with a sentinel and compared.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "moe_problem.h"
#include "mxmoe/error.h"
#include "mxmoe/moe.h"

namespace mxmoe {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

void expect_rejected(const std::function<void()>& call, const std::string& arg, const std::string& what) {
  try {
    call();
    ADD_FAILURE() << what << ": accepted; expected an error naming '" << arg << "'";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.arg(), arg) << what << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find("expected"), std::string::npos) << e.what();
  }
}

// ---- validate(moe_config) -----------------------------------------------------------------

moe_config good_config() {
  moe_config c;
  c.shape = {8, 64, 32};
  c.routing.kind = routing_kind::sigmoid_grouped_topk;
  c.routing.top_k = 2;
  c.routing.n_group = 4;
  c.routing.topk_group = 2;
  return c;
}

TEST(BadInput, ConfigFieldsAreNamed) {
  ASSERT_NO_THROW(validate(good_config()));
  struct bad_case {
    const char* arg;
    std::function<void(moe_config&)> edit;
  };
  const std::vector<bad_case> cases = {
      {"cfg.shape.experts", [](moe_config& c) { c.shape.experts = 0; }},
      {"cfg.shape.experts", [](moe_config& c) { c.shape.experts = 513; }},
      {"cfg.shape.hidden", [](moe_config& c) { c.shape.hidden = 48; }},
      {"cfg.shape.hidden", [](moe_config& c) { c.shape.hidden = -64; }},
      {"cfg.shape.intermediate", [](moe_config& c) { c.shape.intermediate = 40; }},
      {"cfg.shape.intermediate", [](moe_config& c) { c.shape.intermediate = 0; }},
      {"cfg.routing.top_k", [](moe_config& c) { c.routing.top_k = 0; }},
      {"cfg.routing.top_k", [](moe_config& c) { c.routing.top_k = 9; }},  // > E
      {"cfg.routing.top_k", [](moe_config& c) { c.shape.experts = 64; c.routing.n_group = 1; c.routing.topk_group = 1; c.routing.top_k = 17; }},
      {"cfg.routing.top_k", [](moe_config& c) { c.routing.topk_group = 1; c.routing.top_k = 3; }},  // > 1 * 8 / 4
      {"cfg.routing.n_group", [](moe_config& c) { c.routing.n_group = 3; }},
      {"cfg.routing.n_group", [](moe_config& c) { c.routing.n_group = 0; }},
      {"cfg.routing.topk_group", [](moe_config& c) { c.routing.topk_group = 0; }},
      {"cfg.routing.topk_group", [](moe_config& c) { c.routing.topk_group = 5; }},
      {"cfg.routing.routed_scaling_factor", [](moe_config& c) { c.routing.routed_scaling_factor = 0.0f; }},
      {"cfg.routing.routed_scaling_factor", [](moe_config& c) { c.routing.routed_scaling_factor = kNan; }},
      {"cfg.routing.kind", [](moe_config& c) { c.routing.kind = static_cast<routing_kind>(7); }},
      {"cfg.activation.kind", [](moe_config& c) { c.activation.kind = static_cast<activation_kind>(7); }},
      {"cfg.activation.alpha", [](moe_config& c) { c.activation.alpha = kNan; }},
      {"cfg.activation.alpha", [](moe_config& c) { c.activation.alpha = -1.0f; }},
      {"cfg.activation.limit", [](moe_config& c) { c.activation.limit = kInf; }},
      {"cfg.activation.limit", [](moe_config& c) { c.activation.limit = 0.0f; }},
      {"cfg.gate_up", [](moe_config& c) { c.gate_up = static_cast<layout::gate_up_order>(5); }},
  };
  for (const bad_case& bc : cases) {
    moe_config c = good_config();
    bc.edit(c);
    expect_rejected([&] { validate(c); }, bc.arg, bc.arg);
  }
}

// ---- validate(moe_weights, moe_config) and cpu::moe_forward ----------------------------------

class MoeBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    p = test::make_problem(8, 64, 32, 5, 2, activation_kind::swiglu_clamped, layout::gate_up_order::interleaved, true, 3);
    p.cfg.routing.kind = routing_kind::sigmoid_grouped_topk;
    p.cfg.routing.n_group = 4;
    p.cfg.routing.topk_group = 2;
    correction.assign(8, 0.0f);
    out.assign(static_cast<size_t>(p.tokens * p.h()), 0.0f);
    std::memset(out.data(), 0x5A, out.size() * sizeof(float));
    sentinel = out;
  }
  moe_weights weights() const {
    moe_weights w = p.weights();
    w.correction_bias = tensor_view(correction.data(), dtype::f32, {8});
    return w;
  }
  tensor_view out_view() { return tensor_view(out.data(), dtype::f32, {p.tokens, p.h()}); }
  void expect_out_unchanged(const std::string& what) {
    EXPECT_EQ(std::memcmp(out.data(), sentinel.data(), out.size() * sizeof(float)), 0) << what << " wrote to out";
  }
  // Both validate(weights, cfg) and moe_forward reject the edited weights.
  void expect_weights_rejected(const std::function<void(moe_weights&)>& edit, const std::string& arg) {
    moe_weights w = weights();
    edit(w);
    expect_rejected([&] { validate(w, p.cfg); }, arg, "validate: " + arg);
    expect_rejected([&] { cpu::moe_forward(p.x_view(), p.precomputed(), w, p.cfg, out_view()); }, arg,
                    "moe_forward: " + arg);
    expect_out_unchanged(arg);
  }
  void expect_call_rejected(const tensor_view& x, const routing_input& r, const tensor_view& o, const std::string& arg,
                            int threads = 0) {
    expect_rejected([&] { cpu::moe_forward(x, r, weights(), p.cfg, o, cpu::precision::f32, threads); }, arg, arg);
    expect_out_unchanged(arg);
  }

  test::moe_problem p;
  std::vector<float> correction, out, sentinel;
};

TEST_F(MoeBadInput, TheBaselineIsAccepted) {
  ASSERT_NO_THROW(validate(weights(), p.cfg));
  ASSERT_NO_THROW(cpu::moe_forward(p.x_view(), p.precomputed(), weights(), p.cfg, out_view()));
  EXPECT_NE(std::memcmp(out.data(), sentinel.data(), out.size() * sizeof(float)), 0);
}

TEST_F(MoeBadInput, WeightShapesDtypesAndPresence) {
  const int64_t e = 8, h = 64, i = 32;
  auto u8 = [&](const tensor_view& v, std::vector<int64_t> shape) { return tensor_view(v.data, dtype::u8, std::move(shape)); };
  expect_weights_rejected([&](moe_weights& w) { w.gate_up_blocks = u8(w.gate_up_blocks, {e, 2 * i, h / 32 + 1, 16}); }, "weights.gate_up_blocks");
  expect_weights_rejected([&](moe_weights& w) { w.gate_up_blocks = u8(w.gate_up_blocks, {e, i, h / 32, 16}); }, "weights.gate_up_blocks");
  expect_weights_rejected([&](moe_weights& w) { w.gate_up_blocks.type = dtype::i32; }, "weights.gate_up_blocks");
  expect_weights_rejected([&](moe_weights& w) { w.gate_up_blocks = tensor_view(); }, "weights.gate_up_blocks");
  expect_weights_rejected([&](moe_weights& w) { w.gate_up_blocks.data = nullptr; }, "weights.gate_up_blocks");
  expect_weights_rejected([&](moe_weights& w) { w.gate_up_scales = u8(w.gate_up_scales, {e, 2 * i, h / 16}); }, "weights.gate_up_scales");
  expect_weights_rejected([&](moe_weights& w) { w.gate_up_scales.strides = {2 * i * h / 32, 1, 1}; }, "weights.gate_up_scales");
  expect_weights_rejected([&](moe_weights& w) { w.down_blocks = u8(w.down_blocks, {e, h, i / 32, 8}); }, "weights.down_blocks");
  expect_weights_rejected([&](moe_weights& w) { w.down_scales = u8(w.down_scales, {e - 1, h, i / 32}); }, "weights.down_scales");
  expect_weights_rejected([&](moe_weights& w) { w.down_scales.device = device_kind::cuda; }, "weights.down_scales");
  expect_weights_rejected([&](moe_weights& w) { w.gate_up_bias.shape = {e, i}; }, "weights.gate_up_bias");
  expect_weights_rejected([&](moe_weights& w) { w.gate_up_bias.type = dtype::i32; }, "weights.gate_up_bias");
  expect_weights_rejected([&](moe_weights& w) { w.down_bias.shape = {e, h + 1}; }, "weights.down_bias");
  expect_weights_rejected([&](moe_weights& w) { w.down_bias.data = nullptr; }, "weights.down_bias");
  expect_weights_rejected([&](moe_weights& w) { w.router_weight = tensor_view(p.x.data(), dtype::f32, {e, h + 32}); },
                          "weights.router_weight");
  expect_weights_rejected([&](moe_weights& w) { w.router_bias = tensor_view(p.x.data(), dtype::f32, {e}); },
                          "weights.router_bias");  // without router_weight
  expect_weights_rejected([&](moe_weights& w) { w.correction_bias.shape = {e + 1}; }, "weights.correction_bias");
  expect_weights_rejected([&](moe_weights& w) { w.correction_bias.type = dtype::bf16; }, "weights.correction_bias");
  expect_weights_rejected([&](moe_weights& w) { w.gate_up = tensor_view(p.x.data(), dtype::bf16, {e, 2 * i, h}); },
                          "weights.gate_up");  // mxfp4 format with a dense tensor too
  expect_weights_rejected([&](moe_weights& w) { w.format = weight_format::bf16; }, "weights.gate_up");
  expect_weights_rejected([&](moe_weights& w) { w.format = static_cast<weight_format>(9); }, "weights.format");
}

TEST_F(MoeBadInput, CorrectionBiasValuesAndKind) {
  correction[3] = kNan;
  expect_weights_rejected([](moe_weights&) {}, "weights.correction_bias");
  correction[3] = 0.0f;
  p.cfg.routing.kind = routing_kind::softmax_topk;  // would silently ignore the bias
  p.cfg.routing.n_group = p.cfg.routing.topk_group = 1;
  expect_weights_rejected([](moe_weights&) {}, "weights.correction_bias");
}

TEST_F(MoeBadInput, Bf16FormatWithBlocksIsRejected) {
  std::vector<uint16_t> w13(static_cast<size_t>(8 * 64 * 64)), w2(static_cast<size_t>(8 * 64 * 32));
  expect_weights_rejected(
      [&](moe_weights& w) {
        w.format = weight_format::bf16;
        w.gate_up = tensor_view(w13.data(), dtype::bf16, {8, 64, 64});
        w.down = tensor_view(w2.data(), dtype::bf16, {8, 64, 32});
      },
      "weights.gate_up_blocks");
  expect_weights_rejected(
      [&](moe_weights& w) {
        w.format = weight_format::bf16;
        w.gate_up_blocks = w.gate_up_scales = w.down_blocks = w.down_scales = tensor_view();
        w.gate_up = tensor_view(w13.data(), dtype::u8, {8, 64, 64});
        w.down = tensor_view(w2.data(), dtype::bf16, {8, 64, 32});
      },
      "weights.gate_up");
}

TEST_F(MoeBadInput, ConfigErrorsReachMoeForward) {
  p.cfg.shape.hidden = 48;
  expect_call_rejected(p.x_view(), p.precomputed(), out_view(), "cfg.shape.hidden");
  p.cfg.shape.hidden = 64;
  p.cfg.routing.top_k = 17;
  expect_call_rejected(p.x_view(), p.precomputed(), out_view(), "cfg.routing.top_k");
}

TEST_F(MoeBadInput, ActivationsAndOutput) {
  const int64_t t = p.tokens, h = p.h();
  expect_call_rejected(tensor_view(p.x.data(), dtype::f32, {t, h + 32}), p.precomputed(), out_view(), "x");
  expect_call_rejected(tensor_view(p.x.data(), dtype::i32, {t, h}), p.precomputed(), out_view(), "x");
  expect_call_rejected(tensor_view(p.x.data(), dtype::f32, {t * h}), p.precomputed(), out_view(), "x");
  expect_call_rejected(tensor_view(nullptr, dtype::f32, {t, h}), p.precomputed(), out_view(), "x");
  tensor_view on_device = p.x_view();
  on_device.device = device_kind::cuda;
  expect_call_rejected(on_device, p.precomputed(), out_view(), "x");
  expect_call_rejected(p.x_view(), p.precomputed(), tensor_view(out.data(), dtype::f32, {t - 1, h}), "out");
  expect_call_rejected(p.x_view(), p.precomputed(), tensor_view(out.data(), dtype::f16, {t, h}), "out");
  expect_call_rejected(p.x_view(), p.precomputed(), tensor_view(nullptr, dtype::f32, {t, h}), "out");
  expect_call_rejected(p.x_view(), p.precomputed(), out_view(), "threads", -1);
}

TEST_F(MoeBadInput, RoutingInput) {
  const int64_t t = p.tokens, k = p.k();
  std::vector<int32_t> ids = p.ids;
  std::vector<float> wts = p.route_weights;
  auto pre = [&](dtype id_type = dtype::i32, std::vector<int64_t> id_shape = {}) {
    routing_input r;
    r.ids = tensor_view(ids.data(), id_type, id_shape.empty() ? std::vector<int64_t>{t, k} : id_shape);
    r.weights = tensor_view(wts.data(), dtype::f32, {t, k});
    return r;
  };
  ids[3] = -1;
  expect_call_rejected(p.x_view(), pre(), out_view(), "routing.ids");
  ids[3] = 8;  // == E
  expect_call_rejected(p.x_view(), pre(), out_view(), "routing.ids");
  ids[3] = p.ids[3];
  wts[1] = kNan;
  expect_call_rejected(p.x_view(), pre(), out_view(), "routing.weights");
  wts[1] = kInf;
  expect_call_rejected(p.x_view(), pre(), out_view(), "routing.weights");
  wts[1] = p.route_weights[1];
  expect_call_rejected(p.x_view(), pre(dtype::i64), out_view(), "routing.ids");
  expect_call_rejected(p.x_view(), pre(dtype::i32, {t, k + 1}), out_view(), "routing.ids");
  expect_call_rejected(p.x_view(), pre(dtype::i32, {t + 1, k}), out_view(), "routing.ids");

  routing_input only_ids = pre();
  only_ids.weights = tensor_view();
  expect_call_rejected(p.x_view(), only_ids, out_view(), "routing.weights");
  routing_input only_weights = pre();
  only_weights.ids = tensor_view();
  expect_call_rejected(p.x_view(), only_weights, out_view(), "routing.ids");
  routing_input weights_i32 = pre();
  weights_i32.weights.type = dtype::i32;
  expect_call_rejected(p.x_view(), weights_i32, out_view(), "routing.weights");

  routing_input both = pre();
  both.logits = p.by_logits().logits;
  expect_call_rejected(p.x_view(), both, out_view(), "routing");
  routing_input bad_logits;
  bad_logits.logits = tensor_view(p.logits.data(), dtype::f32, {t, 7});
  expect_call_rejected(p.x_view(), bad_logits, out_view(), "routing.logits");
  bad_logits.logits = tensor_view(p.logits.data(), dtype::i32, {t, 8});
  expect_call_rejected(p.x_view(), bad_logits, out_view(), "routing.logits");
  bad_logits.logits = tensor_view(nullptr, dtype::f32, {t, 8});
  expect_call_rejected(p.x_view(), bad_logits, out_view(), "routing.logits");
  // Nothing given and no router weights to compute logits from.
  expect_call_rejected(p.x_view(), routing_input{}, out_view(), "routing");
}

// ---- cpu::route and cpu::router_logits ---------------------------------------------------

class RouteBadInput : public ::testing::Test {
 protected:
  static constexpr int64_t kT = 3, kE = 8;
  void SetUp() override {
    logits.assign(kT * kE, 0.5f);
    bias.assign(kE, 0.0f);
    cfg.kind = routing_kind::sigmoid_grouped_topk;
    cfg.top_k = 2;
    cfg.n_group = 4;
    cfg.topk_group = 2;
    ids.assign(kT * 2, -77);
    wts.assign(kT * 2, -77.0f);
  }
  void expect_route_rejected(const tensor_view& l, const tensor_view& b, const routing_config& c, const tensor_view& io,
                             const tensor_view& wo, const std::string& arg) {
    expect_rejected([&] { cpu::route(l, b, c, io, wo); }, arg, arg);
    for (int32_t v : ids) EXPECT_EQ(v, -77) << arg;
    for (float v : wts) EXPECT_EQ(v, -77.0f) << arg;
  }
  tensor_view l() const { return tensor_view(logits.data(), dtype::f32, {kT, kE}); }
  tensor_view b() const { return tensor_view(bias.data(), dtype::f32, {kE}); }
  tensor_view io(std::vector<int64_t> shape = {kT, 2}) { return tensor_view(ids.data(), dtype::i32, std::move(shape)); }
  tensor_view wo(std::vector<int64_t> shape = {kT, 2}) { return tensor_view(wts.data(), dtype::f32, std::move(shape)); }

  std::vector<float> logits, bias, wts;
  std::vector<int32_t> ids;
  routing_config cfg;
};

TEST_F(RouteBadInput, TheBaselineIsAccepted) {
  ASSERT_NO_THROW(cpu::route(l(), b(), cfg, io(), wo()));
  EXPECT_NE(ids[0], -77);
}

TEST_F(RouteBadInput, Logits) {
  expect_route_rejected(tensor_view(logits.data(), dtype::f32, {kT * kE}), b(), cfg, io(), wo(), "logits");
  expect_route_rejected(tensor_view(logits.data(), dtype::i32, {kT, kE}), b(), cfg, io(), wo(), "logits");
  expect_route_rejected(tensor_view(nullptr, dtype::f32, {kT, kE}), b(), cfg, io(), wo(), "logits");
  expect_route_rejected(tensor_view(), b(), cfg, io(), wo(), "logits");
  std::vector<float> wide(static_cast<size_t>(513));
  expect_route_rejected(tensor_view(wide.data(), dtype::f32, {1, 513}), tensor_view(), cfg, io(), wo(), "logits");
  tensor_view device_logits = l();
  device_logits.device = device_kind::cuda;
  expect_route_rejected(device_logits, b(), cfg, io(), wo(), "logits");
}

TEST_F(RouteBadInput, Config) {
  routing_config c = cfg;
  c.top_k = 0;
  expect_route_rejected(l(), b(), c, io(), wo(), "cfg.top_k");
  c.top_k = 9;  // > E
  expect_route_rejected(l(), b(), c, io(), wo(), "cfg.top_k");
  c = cfg;
  c.n_group = 3;
  expect_route_rejected(l(), b(), c, io(), wo(), "cfg.n_group");
  c = cfg;
  c.topk_group = 1;
  c.top_k = 3;  // only 2 experts selectable
  expect_route_rejected(l(), b(), c, io(), wo(), "cfg.top_k");
  c = cfg;
  c.routed_scaling_factor = -2.0f;
  expect_route_rejected(l(), b(), c, io(), wo(), "cfg.routed_scaling_factor");
  c = cfg;
  c.kind = static_cast<routing_kind>(3);
  expect_route_rejected(l(), b(), c, io(), wo(), "cfg.kind");
}

TEST_F(RouteBadInput, CorrectionBias) {
  routing_config c = cfg;
  c.kind = routing_kind::softmax_topk;
  expect_route_rejected(l(), b(), c, io(), wo(), "correction_bias");
  expect_route_rejected(l(), tensor_view(bias.data(), dtype::f32, {kE - 1}), cfg, io(), wo(), "correction_bias");
  expect_route_rejected(l(), tensor_view(bias.data(), dtype::bf16, {kE}), cfg, io(), wo(), "correction_bias");
  bias[2] = kNan;
  expect_route_rejected(l(), b(), cfg, io(), wo(), "correction_bias");
}

TEST_F(RouteBadInput, Outputs) {
  expect_route_rejected(l(), b(), cfg, io({kT, 3}), wo(), "ids_out");
  expect_route_rejected(l(), b(), cfg, tensor_view(ids.data(), dtype::i64, {kT, 2}), wo(), "ids_out");
  expect_route_rejected(l(), b(), cfg, tensor_view(nullptr, dtype::i32, {kT, 2}), wo(), "ids_out");
  expect_route_rejected(l(), b(), cfg, io(), wo({kT + 1, 2}), "weights_out");
  expect_route_rejected(l(), b(), cfg, io(), tensor_view(wts.data(), dtype::bf16, {kT, 2}), "weights_out");
  tensor_view strided = wo();
  strided.strides = {1, kT};
  expect_route_rejected(l(), b(), cfg, io(), strided, "weights_out");
}

TEST(RouterLogitsBadInput, ShapesDtypesAndNulls) {
  const int64_t t = 3, h = 64, e = 4;
  std::vector<float> x(static_cast<size_t>(t * h), 1.0f), w(static_cast<size_t>(e * h), 1.0f), b(static_cast<size_t>(e), 0.0f),
      out(static_cast<size_t>(t * e), -3.0f);
  const tensor_view xv(x.data(), dtype::f32, {t, h}), wv(w.data(), dtype::f32, {e, h}), bv(b.data(), dtype::f32, {e}),
      ov(out.data(), dtype::f32, {t, e});
  ASSERT_NO_THROW(cpu::router_logits(xv, wv, bv, tensor_view(std::vector<float>(out.size()).data(), dtype::f32, {t, e})));
  struct bad_case {
    const char* arg;
    tensor_view x, w, b, o;
  };
  const std::vector<bad_case> cases = {
      {"x", tensor_view(x.data(), dtype::f32, {t, h, 1}), wv, bv, ov},
      {"x", tensor_view(x.data(), dtype::u8, {t, h}), wv, bv, ov},
      {"x", tensor_view(nullptr, dtype::f32, {t, h}), wv, bv, ov},
      {"router_weight", xv, tensor_view(w.data(), dtype::f32, {e / 2, 2 * h}), bv, ov},
      {"router_weight", xv, tensor_view(w.data(), dtype::i32, {e, h}), bv, ov},
      {"router_weight", xv, tensor_view(), bv, ov},
      {"router_bias", xv, wv, tensor_view(b.data(), dtype::f32, {e + 1}), ov},
      {"router_bias", xv, wv, tensor_view(b.data(), dtype::i32, {e}), ov},
      {"logits_out", xv, wv, bv, tensor_view(out.data(), dtype::f32, {t, e + 1})},
      {"logits_out", xv, wv, bv, tensor_view(out.data(), dtype::bf16, {t, e})},
      {"logits_out", xv, wv, bv, tensor_view(nullptr, dtype::f32, {t, e})},
  };
  for (const bad_case& bc : cases) {
    expect_rejected([&] { cpu::router_logits(bc.x, bc.w, bc.b, bc.o); }, bc.arg, bc.arg);
    for (float v : out) ASSERT_EQ(v, -3.0f) << bc.arg << " wrote to logits_out";
  }
}

}  // namespace
}  // namespace mxmoe
