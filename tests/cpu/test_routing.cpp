// cpu::route and cpu::router_logits on small cases whose expected ids and weights were worked
// out by hand from the routing definitions in include/mxmoe/moe.h and docs/models.md (each
// formula is written next to its literal).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "mxmoe/moe.h"

namespace mxmoe {
namespace {

struct routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

routed route_rows(const std::vector<float>& logits, int64_t experts, const routing_config& cfg,
                  const std::vector<float>& correction_bias = {}) {
  const int64_t t = static_cast<int64_t>(logits.size()) / experts, k = cfg.top_k;
  routed r{std::vector<int32_t>(static_cast<size_t>(t * k), -1), std::vector<float>(static_cast<size_t>(t * k), -1.0f)};
  tensor_view bias;
  if (!correction_bias.empty()) bias = tensor_view(correction_bias.data(), dtype::f32, {experts});
  cpu::route(tensor_view(logits.data(), dtype::f32, {t, experts}), bias, cfg,
             tensor_view(r.ids.data(), dtype::i32, {t, k}), tensor_view(r.weights.data(), dtype::f32, {t, k}));
  return r;
}

routing_config make_cfg(routing_kind kind, int k, bool renormalize = true) {
  routing_config c;
  c.kind = kind;
  c.top_k = k;
  c.renormalize = renormalize;
  return c;
}

void expect_route(const routed& r, const std::vector<int32_t>& ids, const std::vector<double>& weights) {
  ASSERT_EQ(r.ids, ids);
  ASSERT_EQ(r.weights.size(), weights.size());
  for (size_t i = 0; i < weights.size(); ++i) EXPECT_NEAR(r.weights[i], weights[i], 2e-7 * std::fabs(weights[i]) + 1e-9) << i;
}

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(Routing, SoftmaxTopkWithoutRenormalize) {
  // p = exp(l) / S with S = e^1 + e^3 + e^2 + e^0; top-2: experts 1 (e^3/S), 2 (e^2/S).
  expect_route(route_rows({1, 3, 2, 0}, 4, make_cfg(routing_kind::softmax_topk, 2, false)), {1, 2},
               {0.6439142598879724, 0.23688281808991016});
}

TEST(Routing, SoftmaxTopkRenormalized) {
  // e^3 / (e^3 + e^2) = 1 / (1 + e^-1); e^2 / (e^3 + e^2) = 1 / (1 + e).
  expect_route(route_rows({1, 3, 2, 0}, 4, make_cfg(routing_kind::softmax_topk, 2, true)), {1, 2},
               {0.7310585786300049, 0.2689414213699951});
}

TEST(Routing, TopkSoftmaxIgnoresRenormalizeFlag) {
  // Softmax over the two largest logits (3, 2): the same numbers as the renormalized case.
  for (bool renorm : {false, true})
    expect_route(route_rows({1, 3, 2, 0}, 4, make_cfg(routing_kind::topk_softmax, 2, renorm)), {1, 2},
                 {0.7310585786300049, 0.2689414213699951});
}

TEST(Routing, TiesGoToTheLowerIndex) {
  const std::vector<float> logits = {2, 5, 5, 1, 5};
  for (routing_kind kind : {routing_kind::softmax_topk, routing_kind::topk_softmax}) {
    expect_route(route_rows(logits, 5, make_cfg(kind, 2)), {1, 2}, {0.5, 0.5});
    expect_route(route_rows(logits, 5, make_cfg(kind, 3)), {1, 2, 4}, {1.0 / 3, 1.0 / 3, 1.0 / 3});
  }
  routing_config sig = make_cfg(routing_kind::sigmoid_grouped_topk, 2);
  expect_route(route_rows(logits, 5, sig), {1, 2}, {0.5, 0.5});
}

TEST(Routing, AllNegativeLogits) {
  const std::vector<float> logits = {-3, -1, -2, -5};
  // softmax over (-1, -2): 1 / (1 + e^-1), 1 / (1 + e).
  expect_route(route_rows(logits, 4, make_cfg(routing_kind::topk_softmax, 2)), {1, 2},
               {0.7310585786300049, 0.2689414213699951});
  // S = e^-3 + e^-1 + e^-2 + e^-5; e^-1 / S, e^-2 / S.
  expect_route(route_rows(logits, 4, make_cfg(routing_kind::softmax_topk, 2, false)), {1, 2},
               {0.6572330228318555, 0.24178251715880078});
  // sigmoid(-1) / (sigmoid(-1) + sigmoid(-2)) etc.: sigmoid(-1) = 0.2689414213699951,
  // sigmoid(-2) = 0.11920292202211755.
  const double s1 = 0.2689414213699951, s2 = 0.11920292202211755;
  expect_route(route_rows(logits, 4, make_cfg(routing_kind::sigmoid_grouped_topk, 2)), {1, 2},
               {s1 / (s1 + s2), s2 / (s1 + s2)});
}

TEST(Routing, LargeNegativeLogitsDoNotUnderflowTheChoice) {
  // exp(-1000 - (-900)) underflows nothing that matters: expert 2 (-900) is the best.
  expect_route(route_rows({-1000, -2000, -900, -1500}, 4, make_cfg(routing_kind::softmax_topk, 1)), {2}, {1.0});
  expect_route(route_rows({-1000, -2000, -900, -1500}, 4, make_cfg(routing_kind::topk_softmax, 2)), {2, 0},
               {1.0, 0.0});
}

TEST(Routing, InfiniteLogits) {
  // One finite expert among -inf: it takes everything; the second slot is the lowest -inf index.
  expect_route(route_rows({-kInf, 0, -kInf, -kInf}, 4, make_cfg(routing_kind::softmax_topk, 2)), {1, 0}, {1.0, 0.0});
  // All -inf: the limit of equal logits, i.e. uniform (1/4 each before renormalizing).
  expect_route(route_rows({-kInf, -kInf, -kInf, -kInf}, 4, make_cfg(routing_kind::softmax_topk, 2, false)), {0, 1},
               {0.25, 0.25});
  expect_route(route_rows({-kInf, -kInf, -kInf, -kInf}, 4, make_cfg(routing_kind::topk_softmax, 2)), {0, 1},
               {0.5, 0.5});
  // Two +inf logits share the mass.
  expect_route(route_rows({1, kInf, 0, kInf}, 4, make_cfg(routing_kind::topk_softmax, 2)), {1, 3}, {0.5, 0.5});
  // sigmoid(-inf) = 0 for all: no division by zero, the weights stay 0.
  expect_route(route_rows({-kInf, -kInf, -kInf, -kInf}, 4, make_cfg(routing_kind::sigmoid_grouped_topk, 2)), {0, 1},
               {0.0, 0.0});
}

TEST(Routing, NanRanksBelowEverything) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  expect_route(route_rows({nan, 1, 0, 2}, 4, make_cfg(routing_kind::topk_softmax, 2)), {3, 1},
               {0.7310585786300049, 0.2689414213699951});
  // A token whose only choices are NaN gets NaN weights, never a silent pick of a finite value.
  const routed r = route_rows({nan, nan}, 2, make_cfg(routing_kind::softmax_topk, 1));
  EXPECT_EQ(r.ids[0], 0);
  EXPECT_TRUE(std::isnan(r.weights[0]));
}

TEST(Routing, GroupedTopkExcludesTheBestExpertsGroup) {
  // E = 8 in 4 groups of 2; s = sigmoid(l). Group scores (sum of both members):
  //   g0 = s(3) + s(-4) = 0.9706 (holds the single best expert 0), g1 = s(1) + s(1.2) = 1.4996,
  //   g2 = s(0.5) + s(0.8) = 1.3124, g3 = s(-1) + s(-2) = 0.3881. Keep g1, g2; top-2 inside:
  //   expert 3 (s(1.2) = 0.7685), expert 2 (s(1) = 0.7311). Renormalized, times 2.5:
  //   2.5 s(1.2) / (s(1.2) + s(1)) = 1.28123..., 2.5 s(1) / (...) = 1.21876...
  const std::vector<float> logits = {3, -4, 1, 1.2f, 0.5f, 0.8f, -1, -2};
  routing_config cfg = make_cfg(routing_kind::sigmoid_grouped_topk, 2, true);
  cfg.n_group = 4;
  cfg.topk_group = 2;
  cfg.routed_scaling_factor = 2.5f;
  const double s12 = 1.0 / (1.0 + std::exp(-static_cast<double>(1.2f))), s1 = 0.7310585786300049;
  expect_route(route_rows(logits, 8, cfg), {3, 2}, {2.5 * s12 / (s12 + s1), 2.5 * s1 / (s12 + s1)});
  // Without renormalization the weights are 2.5 s(l).
  cfg.renormalize = false;
  expect_route(route_rows(logits, 8, cfg), {3, 2}, {2.5 * s12, 2.5 * s1});
  // Without groups expert 0 wins.
  cfg.n_group = 1;
  cfg.topk_group = 1;
  const double s3 = 0.9525741268224334;  // sigmoid(3)
  expect_route(route_rows(logits, 8, cfg), {0, 3}, {2.5 * s3, 2.5 * s12});
}

TEST(Routing, GroupScoreIsTheSumOfTheTopTwo) {
  // Groups of 4: g0 = {2, 2, -9, -9} -> s(2) + s(2) = 1.7616; g1 = {2.5, 0, 0, 0} -> s(2.5) + s(0)
  // = 1.4241 (its single best expert would win a top-1 group score). Keep one group: g0.
  const std::vector<float> logits = {2, 2, -9, -9, 2.5f, 0, 0, 0};
  routing_config cfg = make_cfg(routing_kind::sigmoid_grouped_topk, 1);
  cfg.n_group = 2;
  cfg.topk_group = 1;
  expect_route(route_rows(logits, 8, cfg), {0}, {1.0});
}

TEST(Routing, SingleExpertGroupsUseTheirOneScore) {
  // n_group = E: each group is one expert; keep the 2 best groups (experts 1 and 3), top-2 of those.
  routing_config cfg = make_cfg(routing_kind::sigmoid_grouped_topk, 2, false);
  cfg.n_group = 4;
  cfg.topk_group = 2;
  const double s3 = 0.9525741268224334, s2 = 0.8807970779778823;  // sigmoid(3), sigmoid(2)
  expect_route(route_rows({0, 3, 1, 2}, 4, cfg), {1, 3}, {s3, s2});
}

TEST(Routing, CorrectionBiasChangesTheChoiceNotTheWeights) {
  // choice = s + bias = [s(2), s(1), s(0) + 0.5, s(-1)] = [0.881, 0.731, 1.0, 0.269]:
  // experts 2 and 0 are chosen; weights from s only: s(2) / (s(2) + s(0)), s(0) / (s(2) + s(0)),
  // sorted by weight (expert 0 first).
  routing_config cfg = make_cfg(routing_kind::sigmoid_grouped_topk, 2, true);
  expect_route(route_rows({2, 1, 0, -1}, 4, cfg, {0, 0, 0.5f, 0}), {0, 2}, {0.6378903113466692, 0.36210968865333093});
  // Without the bias: experts 0 and 1.
  const double s2 = 0.8807970779778823, s1 = 0.7310585786300049;
  expect_route(route_rows({2, 1, 0, -1}, 4, cfg), {0, 1}, {s2 / (s2 + s1), s1 / (s2 + s1)});
}

TEST(Routing, CorrectionBiasAlsoDrivesTheGroupChoice) {
  // Groups of 2: g0 = {1, 1}, g1 = {0, 0}. The bias lifts group 1 (choices 0.5 + 1) above group 0.
  routing_config cfg = make_cfg(routing_kind::sigmoid_grouped_topk, 1, false);
  cfg.n_group = 2;
  cfg.topk_group = 1;
  expect_route(route_rows({1, 1, 0, 0}, 4, cfg), {0}, {0.7310585786300049});
  expect_route(route_rows({1, 1, 0, 0}, 4, cfg, {0, 0, 1, 1}), {2}, {0.5});
}

TEST(Routing, Bf16LogitsRouteLikeTheirF32Values) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  const int64_t t = 9, e = 16;
  std::vector<uint16_t> bf(static_cast<size_t>(t * e));
  std::vector<float> f32(bf.size());
  for (size_t i = 0; i < bf.size(); ++i) {
    bf[i] = float_to_bf16(nd(rng));
    f32[i] = bf16_to_float(bf[i]);
  }
  for (routing_kind kind : {routing_kind::softmax_topk, routing_kind::topk_softmax, routing_kind::sigmoid_grouped_topk}) {
    routing_config cfg = make_cfg(kind, 4);
    if (kind == routing_kind::sigmoid_grouped_topk) {
      cfg.n_group = 4;
      cfg.topk_group = 2;
    }
    const routed want = route_rows(f32, e, cfg);
    routed got{std::vector<int32_t>(want.ids.size()), std::vector<float>(want.weights.size())};
    cpu::route(tensor_view(bf.data(), dtype::bf16, {t, e}), tensor_view(), cfg,
               tensor_view(got.ids.data(), dtype::i32, {t, 4}), tensor_view(got.weights.data(), dtype::f32, {t, 4}));
    EXPECT_EQ(got.ids, want.ids) << to_string(kind);
    EXPECT_EQ(got.weights, want.weights) << to_string(kind);
  }
}

TEST(Routing, RandomRowsAreSortedValidAndNormalized) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  const int64_t t = 33, e = 64;
  std::vector<float> logits(static_cast<size_t>(t * e));
  for (float& v : logits) v = nd(rng);
  routing_config cfg = make_cfg(routing_kind::sigmoid_grouped_topk, 6, true);
  cfg.n_group = 8;
  cfg.topk_group = 3;
  cfg.routed_scaling_factor = 2.0f;
  for (routing_kind kind : {routing_kind::softmax_topk, routing_kind::topk_softmax, routing_kind::sigmoid_grouped_topk}) {
    cfg.kind = kind;
    const routed r = route_rows(logits, e, cfg);
    const double want_sum = kind == routing_kind::sigmoid_grouped_topk ? 2.0 : 1.0;
    for (int64_t tok = 0; tok < t; ++tok) {
      double sum = 0.0;
      std::vector<bool> seen(static_cast<size_t>(e), false);
      for (int j = 0; j < 6; ++j) {
        const size_t n = static_cast<size_t>(tok * 6 + j);
        ASSERT_GE(r.ids[n], 0);
        ASSERT_LT(r.ids[n], e);
        EXPECT_FALSE(seen[static_cast<size_t>(r.ids[n])]) << "duplicate expert";
        seen[static_cast<size_t>(r.ids[n])] = true;
        if (j > 0) {
          EXPECT_GE(r.weights[n - 1], r.weights[n]);
        }
        sum += r.weights[n];
      }
      EXPECT_NEAR(sum, want_sum, 1e-5) << to_string(kind);
    }
  }
}

TEST(Routing, RouterLogitsAreXTimesWPlusBias) {
  const int64_t t = 5, h = 64, e = 6;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(t * h)), bias(static_cast<size_t>(e));
  std::vector<uint16_t> w(static_cast<size_t>(e * h));
  for (float& v : x) v = nd(rng);
  for (float& v : bias) v = nd(rng);
  for (uint16_t& v : w) v = float_to_bf16(nd(rng));
  std::vector<float> logits(static_cast<size_t>(t * e), -7.0f);
  cpu::router_logits(tensor_view(x.data(), dtype::f32, {t, h}), tensor_view(w.data(), dtype::bf16, {e, h}),
                     tensor_view(bias.data(), dtype::f32, {e}), tensor_view(logits.data(), dtype::f32, {t, e}));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < e; ++j) {
      double want = bias[static_cast<size_t>(j)];
      for (int64_t q = 0; q < h; ++q)
        want += static_cast<double>(x[static_cast<size_t>(i * h + q)]) * bf16_to_float(w[static_cast<size_t>(j * h + q)]);
      EXPECT_NEAR(logits[static_cast<size_t>(i * e + j)], want, 1e-6 * (1.0 + std::fabs(want)));
    }
  // Without a bias: the same minus the bias.
  std::vector<float> no_bias(logits.size());
  cpu::router_logits(tensor_view(x.data(), dtype::f32, {t, h}), tensor_view(w.data(), dtype::bf16, {e, h}),
                     tensor_view(), tensor_view(no_bias.data(), dtype::f32, {t, e}));
  for (size_t n = 0; n < logits.size(); ++n)
    EXPECT_NEAR(logits[n] - no_bias[n], bias[n % static_cast<size_t>(e)], 1e-5);
}

TEST(Routing, ZeroTokensWriteNothing) {
  std::vector<int32_t> ids(1, -5);
  std::vector<float> weights(1, -5.0f);
  const float dummy = 0.0f;
  cpu::route(tensor_view(&dummy, dtype::f32, {0, 8}), tensor_view(), make_cfg(routing_kind::softmax_topk, 2),
             tensor_view(ids.data(), dtype::i32, {0, 2}), tensor_view(weights.data(), dtype::f32, {0, 2}));
  EXPECT_EQ(ids[0], -5);
  EXPECT_EQ(weights[0], -5.0f);
}

}  // namespace
}  // namespace mxmoe
