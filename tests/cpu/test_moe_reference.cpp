// cpu::moe_forward against a plain float64 loop over the dequantized weights (a re-statement of
// the math of include/mxmoe/moe.h and docs/models.md, not of any layout), and its invariances: MXFP4 == BF16 on the same
// values, gate/up order, routing sources, thread count, precision.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "moe_problem.h"
#include "mxmoe/moe.h"

namespace mxmoe {
namespace {

using test::make_problem;
using test::moe_problem;

double activation_formula(double gate, double up, const activation_config& a) {
  if (a.kind == activation_kind::silu_mul) return gate / (1.0 + std::exp(-gate)) * up;
  const double limit = a.limit, alpha = a.alpha;
  const double g = std::min(gate, limit);
  const double u = std::max(-limit, std::min(up, limit));
  return g / (1.0 + std::exp(-alpha * g)) * (u + 1.0);
}

// out[t] = Σ_s w[t,s] (W2_e · act(W13_e · x_t + b13_e) + b2_e), e = ids[t,s], in float64.
std::vector<double> plain_moe(const moe_problem& p, const std::vector<int32_t>& ids, const std::vector<float>& wts) {
  const std::vector<float> w13 = p.w13_values(), w2 = p.w2_values();
  const int64_t h = p.h(), in = p.i(), k = p.k();
  const layout::gate_up_rows rows{in, p.cfg.gate_up};
  std::vector<double> out(static_cast<size_t>(p.tokens * h), 0.0), h13(static_cast<size_t>(2 * in)),
      act(static_cast<size_t>(in));
  for (int64_t t = 0; t < p.tokens; ++t)
    for (int64_t s = 0; s < k; ++s) {
      const int64_t e = ids[static_cast<size_t>(t * k + s)];
      for (int64_t r = 0; r < 2 * in; ++r) {
        double acc = p.gate_up_bias.empty() ? 0.0 : p.gate_up_bias[static_cast<size_t>(e * 2 * in + r)];
        for (int64_t c = 0; c < h; ++c)
          acc += static_cast<double>(p.x[static_cast<size_t>(t * h + c)]) * w13[static_cast<size_t>((e * 2 * in + r) * h + c)];
        h13[static_cast<size_t>(r)] = acc;
      }
      for (int64_t j = 0; j < in; ++j)
        act[static_cast<size_t>(j)] = activation_formula(h13[static_cast<size_t>(rows.checkpoint_row(j, 0))],
                                                         h13[static_cast<size_t>(rows.checkpoint_row(j, 1))], p.cfg.activation);
      for (int64_t n = 0; n < h; ++n) {
        double y = p.down_bias.empty() ? 0.0 : p.down_bias[static_cast<size_t>(e * h + n)];
        for (int64_t j = 0; j < in; ++j) y += act[static_cast<size_t>(j)] * w2[static_cast<size_t>((e * h + n) * in + j)];
        out[static_cast<size_t>(t * h + n)] += static_cast<double>(wts[static_cast<size_t>(t * k + s)]) * y;
      }
    }
  return out;
}

std::vector<float> run(const moe_problem& p, const routing_input& r, const moe_weights& w, const moe_config& cfg,
                       cpu::precision prec, int threads = 2) {
  std::vector<float> out(static_cast<size_t>(p.tokens * p.h()), -12345.0f);
  cpu::moe_forward(p.x_view(), r, w, cfg, tensor_view(out.data(), dtype::f32, {p.tokens, p.h()}), prec, threads);
  return out;
}
std::vector<float> run(const moe_problem& p, cpu::precision prec, int threads = 2) {
  return run(p, p.precomputed(), p.weights(), p.cfg, prec, threads);
}

double rel_l2(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0.0, den = 0.0;
  for (size_t n = 0; n < want.size(); ++n) {
    num += (got[n] - want[n]) * (got[n] - want[n]);
    den += want[n] * want[n];
  }
  return std::sqrt(num / den);
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct shape_case {
  int64_t e, h, i, t;
  int k;
  activation_kind act;
  layout::gate_up_order order;
  bool biases;
};

class MoeAgainstPlainLoop : public ::testing::TestWithParam<shape_case> {};

TEST_P(MoeAgainstPlainLoop, F64MatchesAndF32IsClose) {
  const shape_case c = GetParam();
  const moe_problem p = make_problem(c.e, c.h, c.i, c.t, c.k, c.act, c.order, c.biases, 100u + static_cast<uint32_t>(c.t));
  const std::vector<double> want = plain_moe(p, p.ids, p.route_weights);
  double scale = 0.0;
  for (double v : want) scale = std::max(scale, std::fabs(v));
  ASSERT_GT(scale, 0.0);

  const std::vector<float> f64 = run(p, cpu::precision::f64);
  for (size_t n = 0; n < want.size(); ++n)  // float64 math, one rounding to the f32 output
    ASSERT_NEAR(f64[n], want[n], 1.2e-7 * std::fabs(want[n]) + 1e-12 * scale) << "element " << n;

  const std::vector<float> f32 = run(p, cpu::precision::f32);
  EXPECT_LT(rel_l2(f32, want), 1e-5);
  EXPECT_GT(rel_l2(f32, want), 0.0) << "f32 mode should not be float64 in disguise";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MoeAgainstPlainLoop,
    ::testing::Values(
        shape_case{4, 64, 32, 1, 1, activation_kind::silu_mul, layout::gate_up_order::concatenated, false},
        shape_case{8, 96, 64, 17, 3, activation_kind::swiglu_clamped, layout::gate_up_order::interleaved, true},
        shape_case{5, 64, 96, 7, 2, activation_kind::silu_mul, layout::gate_up_order::interleaved, true},
        shape_case{6, 96, 32, 13, 4, activation_kind::swiglu_clamped, layout::gate_up_order::concatenated, false},
        shape_case{8, 64, 64, 9, 8, activation_kind::swiglu_clamped, layout::gate_up_order::interleaved, true}));

TEST(MoeReference, Mxfp4EqualsBf16OnTheDequantizedWeights) {
  const moe_problem p = make_problem(6, 96, 64, 11, 3, activation_kind::swiglu_clamped,
                                     layout::gate_up_order::interleaved, true, 5);
  const std::vector<float> w13 = p.w13_values(), w2 = p.w2_values();
  std::vector<uint16_t> w13_bf(w13.size()), w2_bf(w2.size());
  for (size_t n = 0; n < w13.size(); ++n) w13_bf[n] = float_to_bf16(w13[n]);
  for (size_t n = 0; n < w2.size(); ++n) w2_bf[n] = float_to_bf16(w2[n]);
  for (size_t n = 0; n < w13.size(); ++n) ASSERT_EQ(bf16_to_float(w13_bf[n]), w13[n]) << "E2M1 x 2^k fits bf16";

  moe_weights bf = p.weights();
  bf.format = weight_format::bf16;
  bf.gate_up_blocks = bf.gate_up_scales = bf.down_blocks = bf.down_scales = tensor_view();
  bf.gate_up = tensor_view(w13_bf.data(), dtype::bf16, {p.e(), 2 * p.i(), p.h()});
  bf.down = tensor_view(w2_bf.data(), dtype::bf16, {p.e(), p.h(), p.i()});
  for (cpu::precision prec : {cpu::precision::f64, cpu::precision::f32})
    EXPECT_TRUE(bitwise_equal(run(p, p.precomputed(), bf, p.cfg, prec), run(p, prec)));
}

TEST(MoeReference, GateUpOrderIsARowPermutation) {
  moe_problem cat = make_problem(5, 64, 64, 9, 2, activation_kind::swiglu_clamped,
                                 layout::gate_up_order::concatenated, true, 9);
  moe_problem inter = cat;
  inter.cfg.gate_up = layout::gate_up_order::interleaved;
  const layout::gate_up_rows from{cat.i(), layout::gate_up_order::concatenated},
      to{cat.i(), layout::gate_up_order::interleaved};
  const layout::checkpoint_mxfp4 g = cat.w13_layout();
  for (int64_t e = 0; e < cat.e(); ++e)
    for (int64_t r = 0; r < 2 * cat.i(); ++r) {
      int64_t j;
      int is_up;
      to.split_checkpoint_row(r, &j, &is_up);
      const int64_t src = from.checkpoint_row(j, is_up);
      std::copy_n(&cat.gate_up_blocks[static_cast<size_t>(g.code_offset(e, src, 0).byte)], g.row_bytes(),
                  &inter.gate_up_blocks[static_cast<size_t>(g.code_offset(e, r, 0).byte)]);
      std::copy_n(&cat.gate_up_scales[static_cast<size_t>(g.scale_offset(e, src, 0))], g.scale_cols(),
                  &inter.gate_up_scales[static_cast<size_t>(g.scale_offset(e, r, 0))]);
      inter.gate_up_bias[static_cast<size_t>(e * 2 * cat.i() + r)] = cat.gate_up_bias[static_cast<size_t>(e * 2 * cat.i() + src)];
    }
  ASSERT_NE(inter.gate_up_blocks, cat.gate_up_blocks);
  for (cpu::precision prec : {cpu::precision::f64, cpu::precision::f32})
    EXPECT_TRUE(bitwise_equal(run(inter, prec), run(cat, prec)));
  // The order matters: reading the permuted weights as concatenated gives something else.
  moe_problem wrong = inter;
  wrong.cfg.gate_up = layout::gate_up_order::concatenated;
  EXPECT_FALSE(bitwise_equal(run(wrong, cpu::precision::f32), run(cat, cpu::precision::f32)));
}

TEST(MoeReference, BiasesAreAddedOnBothGemms) {
  moe_problem p = make_problem(4, 64, 32, 5, 2, activation_kind::silu_mul, layout::gate_up_order::concatenated, true, 21);
  const std::vector<float> with = run(p, cpu::precision::f64);
  for (auto* bias : {&p.gate_up_bias, &p.down_bias}) {
    moe_problem q = p;
    bias == &p.gate_up_bias ? q.gate_up_bias.clear() : q.down_bias.clear();
    const std::vector<double> want = plain_moe(q, q.ids, q.route_weights);
    EXPECT_LT(rel_l2(run(q, cpu::precision::f64), want), 1e-7);
    EXPECT_GT(rel_l2(with, want), 1e-3) << "the bias changed nothing";
  }
}

TEST(MoeReference, Gemm2BiasIsScaledByTheRoutingWeight) {
  // Zero x and no GEMM1 bias: h = 0, act = 0, so out = Σ_s w_s b2[e_s].
  moe_problem p = make_problem(4, 64, 32, 3, 2, activation_kind::silu_mul, layout::gate_up_order::concatenated, true, 4);
  std::fill(p.x.begin(), p.x.end(), 0.0f);
  std::fill(p.gate_up_bias.begin(), p.gate_up_bias.end(), 0.0f);
  const std::vector<float> out = run(p, cpu::precision::f64);
  for (int64_t t = 0; t < p.tokens; ++t)
    for (int64_t n = 0; n < p.h(); ++n) {
      double want = 0.0;
      for (int64_t s = 0; s < p.k(); ++s)
        want += static_cast<double>(p.route_weights[static_cast<size_t>(t * p.k() + s)]) *
                p.down_bias[static_cast<size_t>(p.ids[static_cast<size_t>(t * p.k() + s)] * p.h() + n)];
      EXPECT_NEAR(out[static_cast<size_t>(t * p.h() + n)], want, 1e-6 * (1.0 + std::fabs(want)));
    }
}

TEST(MoeReference, RoutingSourcesAgree) {
  moe_problem p = make_problem(8, 64, 32, 13, 3, activation_kind::swiglu_clamped, layout::gate_up_order::interleaved, true, 31);
  for (routing_kind kind : {routing_kind::softmax_topk, routing_kind::topk_softmax, routing_kind::sigmoid_grouped_topk}) {
    p.cfg.routing.kind = kind;
    moe_weights w = p.weights();
    std::vector<float> correction(static_cast<size_t>(p.e()));
    if (kind == routing_kind::sigmoid_grouped_topk) {
      p.cfg.routing.n_group = 4;
      p.cfg.routing.topk_group = 2;
      for (size_t e = 0; e < correction.size(); ++e) correction[e] = 0.1f * static_cast<float>(e % 3);
      w.correction_bias = tensor_view(correction.data(), dtype::f32, {p.e()});
    }
    // logits -> cpu::route -> precomputed ids and weights: the same bits as routing by logits.
    std::vector<int32_t> ids(p.ids.size());
    std::vector<float> wts(p.route_weights.size());
    cpu::route(p.by_logits().logits, w.correction_bias, p.cfg.routing, tensor_view(ids.data(), dtype::i32, {p.tokens, p.k()}),
               tensor_view(wts.data(), dtype::f32, {p.tokens, p.k()}));
    routing_input pre;
    pre.ids = tensor_view(ids.data(), dtype::i32, {p.tokens, p.k()});
    pre.weights = tensor_view(wts.data(), dtype::f32, {p.tokens, p.k()});
    const std::vector<float> by_logits = run(p, p.by_logits(), w, p.cfg, cpu::precision::f32);
    EXPECT_TRUE(bitwise_equal(by_logits, run(p, pre, w, p.cfg, cpu::precision::f32))) << to_string(kind);
    EXPECT_LT(rel_l2(run(p, p.by_logits(), w, p.cfg, cpu::precision::f64), plain_moe(p, ids, wts)), 1e-7);

    // No routing given: logits = x·Wrᵀ + br from the router weights.
    std::vector<float> router(static_cast<size_t>(p.e() * p.h())), router_bias(static_cast<size_t>(p.e()));
    for (size_t n = 0; n < router.size(); ++n) router[n] = 0.05f * static_cast<float>(static_cast<int>(n * 7919 % 41) - 20);
    for (size_t n = 0; n < router_bias.size(); ++n) router_bias[n] = 0.25f * static_cast<float>(n % 5);
    w.router_weight = tensor_view(router.data(), dtype::f32, {p.e(), p.h()});
    w.router_bias = tensor_view(router_bias.data(), dtype::f32, {p.e()});
    std::vector<float> logits(static_cast<size_t>(p.tokens * p.e()));
    cpu::router_logits(p.x_view(), w.router_weight, w.router_bias, tensor_view(logits.data(), dtype::f32, {p.tokens, p.e()}));
    routing_input from_logits;
    from_logits.logits = tensor_view(logits.data(), dtype::f32, {p.tokens, p.e()});
    EXPECT_TRUE(bitwise_equal(run(p, routing_input{}, w, p.cfg, cpu::precision::f32),
                              run(p, from_logits, w, p.cfg, cpu::precision::f32)))
        << to_string(kind);
  }
}

TEST(MoeReference, EmptyExpertsAndAllTokensOnOneExpert) {
  moe_problem p = make_problem(8, 64, 64, 17, 1, activation_kind::swiglu_clamped, layout::gate_up_order::interleaved, true, 41);
  std::fill(p.ids.begin(), p.ids.end(), 6);  // experts 0..5 and 7 get nothing
  EXPECT_LT(rel_l2(run(p, cpu::precision::f64), plain_moe(p, p.ids, p.route_weights)), 1e-7);

  moe_problem q = make_problem(8, 64, 32, 17, 2, activation_kind::silu_mul, layout::gate_up_order::concatenated, false, 42);
  for (int64_t t = 0; t < q.tokens; ++t) {  // slot 0 always expert 7, slot 1 always expert 0
    q.ids[static_cast<size_t>(2 * t)] = 7;
    q.ids[static_cast<size_t>(2 * t + 1)] = 0;
  }
  EXPECT_LT(rel_l2(run(q, cpu::precision::f64), plain_moe(q, q.ids, q.route_weights)), 1e-7);
  EXPECT_LT(rel_l2(run(q, cpu::precision::f32), plain_moe(q, q.ids, q.route_weights)), 1e-5);
}

// One expert, x = e_0, W13[:, 0] = the (gate, up) pairs to test, W2 = identity, weight 1:
// out[j] = act(gate_j, up_j) exactly as the layer computes it.
std::vector<float> activation_through_layer(const std::vector<float>& gate, const std::vector<float>& up,
                                            const activation_config& act) {
  const int64_t n = static_cast<int64_t>(gate.size());  // H = I = the number of pairs
  moe_config cfg;
  cfg.shape = {1, n, n};
  cfg.routing.top_k = 1;
  cfg.activation = act;
  std::vector<uint16_t> w13(static_cast<size_t>(2 * n * n), 0), w2(static_cast<size_t>(n * n), 0);
  const layout::gate_up_rows rows{n, cfg.gate_up};
  for (int64_t j = 0; j < n; ++j) {
    w13[static_cast<size_t>(rows.checkpoint_row(j, 0) * n)] = float_to_bf16(gate[static_cast<size_t>(j)]);
    w13[static_cast<size_t>(rows.checkpoint_row(j, 1) * n)] = float_to_bf16(up[static_cast<size_t>(j)]);
    w2[static_cast<size_t>(j * n + j)] = float_to_bf16(1.0f);
  }
  moe_weights w;
  w.format = weight_format::bf16;
  w.gate_up = tensor_view(w13.data(), dtype::bf16, {1, 2 * n, n});
  w.down = tensor_view(w2.data(), dtype::bf16, {1, n, n});
  std::vector<float> x(static_cast<size_t>(n), 0.0f), out(static_cast<size_t>(n), -1.0f);
  x[0] = 1.0f;
  const int32_t id = 0;
  const float weight = 1.0f;
  routing_input r;
  r.ids = tensor_view(&id, dtype::i32, {1, 1});
  r.weights = tensor_view(&weight, dtype::f32, {1, 1});
  cpu::moe_forward(tensor_view(x.data(), dtype::f32, {1, n}), r, w, cfg, tensor_view(out.data(), dtype::f32, {1, n}),
                   cpu::precision::f64);
  return out;
}

TEST(MoeReference, ActivationsMatchTheirFormulas) {
  // Gate and up at, below and beyond the limit (7), on both sides; all exact in bf16.
  const std::vector<float> gate_values = {-8, -1, 3, 7, 7.5f, 20}, up_values = {-9, -7, -2.5f, 0, 7, 9.5f};
  std::vector<float> gate, up;
  for (float g : gate_values)
    for (float u : up_values) {
      gate.push_back(g);
      up.push_back(u);
    }
  gate.resize(64, 0.5f);  // H = I = 64
  up.resize(64, 0.25f);
  activation_config cfgs[4];
  cfgs[0].kind = activation_kind::silu_mul;
  cfgs[1].kind = activation_kind::swiglu_clamped;  // gpt-oss: alpha 1.702, limit 7
  cfgs[2].kind = activation_kind::swiglu_clamped;
  cfgs[2].alpha = 1.0f;
  cfgs[2].limit = 3.0f;
  cfgs[3].kind = activation_kind::swiglu_clamped;
  cfgs[3].alpha = 0.5f;
  cfgs[3].limit = 8.0f;
  for (const activation_config& a : cfgs) {
    const std::vector<float> out = activation_through_layer(gate, up, a);
    for (size_t j = 0; j < gate.size(); ++j) {
      const double want = activation_formula(gate[j], up[j], a);
      EXPECT_NEAR(out[j], want, 1e-6 * std::fabs(want) + 1e-30) << "gate " << gate[j] << " up " << up[j] << " "
                                                                  << to_string(a.kind) << " limit " << a.limit;
    }
  }
  // Spot values, written out: gate 20, up 9.5 clamp to 7 and 7: 7 * sigmoid(1.702 * 7) * 8.
  const std::vector<float> out = activation_through_layer(gate, up, cfgs[1]);
  const size_t at = 5 * 6 + 5;  // gate 20, up 9.5
  EXPECT_NEAR(out[at], 7.0 / (1.0 + std::exp(-1.702 * 7.0)) * 8.0, 1e-5);
  // gate -8 stays -8 (only clamped from above); up -9 clamps to -7: -8 sigmoid(-13.616) (-6).
  EXPECT_NEAR(out[0], -8.0 / (1.0 + std::exp(1.702 * 8.0)) * -6.0, 1e-9);
  // silu_mul clamps nothing: 20 * sigmoid(20) * 9.5.
  EXPECT_NEAR(activation_through_layer(gate, up, cfgs[0])[at], 20.0 / (1.0 + std::exp(-20.0)) * 9.5, 1e-4);
}

TEST(MoeReference, AlphaAndLimitAreUsed) {
  moe_problem p = make_problem(4, 64, 64, 9, 2, activation_kind::swiglu_clamped, layout::gate_up_order::interleaved, true, 51);
  const std::vector<float> base = run(p, cpu::precision::f32);
  moe_config other_alpha = p.cfg, other_limit = p.cfg;
  other_alpha.activation.alpha = 1.0f;
  other_limit.activation.limit = 2.0f;
  EXPECT_GT(rel_l2(run(p, p.precomputed(), p.weights(), other_alpha, cpu::precision::f32),
                   std::vector<double>(base.begin(), base.end())),
            1e-3);
  EXPECT_GT(rel_l2(run(p, p.precomputed(), p.weights(), other_limit, cpu::precision::f32),
                   std::vector<double>(base.begin(), base.end())),
            1e-3);
}

TEST(MoeReference, ThreadCountDoesNotChangeABit) {
  const moe_problem p = make_problem(8, 96, 64, 17, 3, activation_kind::swiglu_clamped,
                                     layout::gate_up_order::interleaved, true, 61);
  for (cpu::precision prec : {cpu::precision::f32, cpu::precision::f64}) {
    const std::vector<float> one = run(p, prec, 1);
    EXPECT_TRUE(bitwise_equal(one, run(p, prec, 4)));
    EXPECT_TRUE(bitwise_equal(one, run(p, prec, 3)));
    EXPECT_TRUE(bitwise_equal(one, run(p, prec, 1))) << "two identical calls differ";
  }
}

TEST(MoeReference, Bf16InputsAndOutputs) {
  moe_problem p = make_problem(5, 64, 32, 7, 2, activation_kind::silu_mul, layout::gate_up_order::concatenated, true, 71);
  std::vector<uint16_t> x_bf(p.x.size());
  for (size_t n = 0; n < p.x.size(); ++n) {
    x_bf[n] = float_to_bf16(p.x[n]);
    p.x[n] = bf16_to_float(x_bf[n]);
  }
  const std::vector<float> want = run(p, cpu::precision::f32);
  std::vector<float> got(want.size());
  std::vector<uint16_t> got_bf(want.size());
  const tensor_view x_view(x_bf.data(), dtype::bf16, {p.tokens, p.h()});
  cpu::moe_forward(x_view, p.precomputed(), p.weights(), p.cfg, tensor_view(got.data(), dtype::f32, {p.tokens, p.h()}));
  EXPECT_TRUE(bitwise_equal(got, want));
  cpu::moe_forward(x_view, p.precomputed(), p.weights(), p.cfg, tensor_view(got_bf.data(), dtype::bf16, {p.tokens, p.h()}));
  for (size_t n = 0; n < want.size(); ++n) ASSERT_EQ(got_bf[n], float_to_bf16(want[n])) << n;
}

TEST(MoeReference, ZeroTokensIsANoOp) {
  const moe_problem p = make_problem(4, 64, 32, 0, 2, activation_kind::silu_mul, layout::gate_up_order::concatenated, false, 81);
  float sentinel = 42.0f;
  const float x = 0.0f;
  cpu::moe_forward(tensor_view(&x, dtype::f32, {0, p.h()}), p.by_logits(), p.weights(), p.cfg,
                   tensor_view(&sentinel, dtype::f32, {0, p.h()}));
  EXPECT_EQ(sentinel, 42.0f);
}

}  // namespace
}  // namespace mxmoe
