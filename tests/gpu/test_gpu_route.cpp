// GPU tests of the routing kernel on its own (cuda::route, routing.cu's route_kernel) against the
// CPU reference cpu::route: the same experts for every token and weights within float rounding,
// for each register width of the kernel (E <= 128, <= 256, <= 384, <= 512) and each way grouped routing
// scores its groups: every group kept (topk_group == n_group: Kimi-K2's one group of 384),
// groups of whole warp registers (group size a multiple of 32: DeepSeek-V3's 8 groups of 32,
// 2 groups of 256) and groups scored lane by lane (group size 8, 48). The slot order may differ
// (the CPU orders slots by weight, the kernel by selection key), so slots are compared as sets.
// Logits are spread so that candidates are far apart compared with float rounding (the CPU decides
// in float64): a mismatch is a wrong selection, not a near tie.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "moe_case.h"
#include "mxmoe/cuda.h"
#include "mxmoe/moe.h"

namespace mxmoe {
namespace {

using namespace test;  // tests/gpu/moe_case.h

struct route_case {
  const char* name;
  int experts, top_k;
  routing_kind kind;
  int n_group, topk_group;
  bool renormalize;
};

// Distinct, well separated values: a random permutation of evenly spaced steps.
std::vector<float> spread(int n, float lo, float step, std::mt19937& rng) {
  std::vector<int> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<float> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = lo + step * static_cast<float>(perm[static_cast<size_t>(i)]);
  return v;
}

void expect_route_matches(const route_case& c, int64_t T, bool bf16_logits) {
  if (!cuda::available()) GTEST_SKIP() << "no usable sm_90 GPU";
  std::mt19937 rng(static_cast<unsigned>(c.experts * 131 + c.top_k * 7 + T));
  const int E = c.experts, k = c.top_k;
  moe_config cfg;
  cfg.shape = {E, 64, 32};
  cfg.routing.kind = c.kind;
  cfg.routing.top_k = k;
  cfg.routing.n_group = c.n_group;
  cfg.routing.topk_group = c.topk_group;
  cfg.routing.renormalize = c.renormalize;
  cfg.routing.routed_scaling_factor = c.kind == routing_kind::sigmoid_grouped_topk ? 2.5f : 1.0f;
  const bool grouped = c.kind == routing_kind::sigmoid_grouped_topk;

  // Logits on an evenly spaced grid (8/E apart, shifted by a random fraction of a step), in a
  // random order per token; grouped routing adds a correction bias within +-1e-3 of 0, so that
  // its selection keys sigmoid(logit) + bias stay apart too, except by chance.
  std::vector<float> logits(static_cast<size_t>(T * E)), bias;
  const float step = 8.0f / static_cast<float>(E);
  std::uniform_real_distribution<float> frac(0.1f, 0.9f), small(-1e-3f, 1e-3f);
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<float> row = spread(E, -4.0f + step * frac(rng), step, rng);
    std::copy(row.begin(), row.end(), logits.begin() + t * E);
  }
  if (bf16_logits)  // the CPU reads the values the kernel reads
    for (float& v : logits) v = bf16_to_float(float_to_bf16(v));
  if (grouped)
    for (int e = 0; e < E; ++e) bias.push_back(small(rng));

  std::vector<int32_t> ref_ids(static_cast<size_t>(T * k));
  std::vector<float> ref_w(ref_ids.size());
  cpu::route(tensor_view(logits.data(), dtype::f32, {T, E}),
             grouped ? tensor_view(bias.data(), dtype::f32, {E}) : tensor_view(), cfg.routing,
             tensor_view(ref_ids.data(), dtype::i32, {T, k}), tensor_view(ref_w.data(), dtype::f32, {T, k}));

  std::vector<uint16_t> logits16(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) logits16[i] = float_to_bf16(logits[i]);
  const cuda::device_buffer dlogits = bf16_logits ? to_device(logits16) : to_device(logits);
  const cuda::device_buffer dbias = to_device(bias);
  cuda::device_buffer dids(static_cast<size_t>(T * k * 4)), dw(static_cast<size_t>(T * k * 4));
  cuda::route(dlogits.view(bf16_logits ? dtype::bf16 : dtype::f32, {T, E}),
              grouped ? dbias.view(dtype::f32, {E}) : tensor_view(), cfg.routing, dids.view(dtype::i32, {T, k}),
              dw.view(dtype::f32, {T, k}), nullptr);
  std::vector<int32_t> ids(ref_ids.size());
  std::vector<float> w(ref_w.size());
  dids.download(ids.data(), ids.size() * 4);
  dw.download(w.data(), w.size() * 4);

  for (int64_t t = 0; t < T; ++t) {
    std::vector<std::pair<int32_t, float>> got, want;
    for (int j = 0; j < k; ++j) {
      const size_t p = static_cast<size_t>(t * k + j);
      got.emplace_back(ids[p], w[p]);
      want.emplace_back(ref_ids[p], ref_w[p]);
    }
    std::sort(got.begin(), got.end());
    std::sort(want.begin(), want.end());
    for (int j = 0; j < k; ++j) {
      ASSERT_EQ(got[static_cast<size_t>(j)].first, want[static_cast<size_t>(j)].first)
          << c.name << " token " << t << " slot " << j << (bf16_logits ? " (bf16 logits)" : "");
      EXPECT_NEAR(got[static_cast<size_t>(j)].second, want[static_cast<size_t>(j)].second,
                  2e-6 * std::max(1.0f, std::fabs(want[static_cast<size_t>(j)].second)))
          << c.name << " token " << t << " expert " << want[static_cast<size_t>(j)].first;
    }
  }
}

class GpuRoute : public testing::TestWithParam<route_case> {};

TEST_P(GpuRoute, MatchesTheCpuReference) {
  for (int64_t T : {1, 37})
    for (bool bf16 : {false, true}) expect_route_matches(GetParam(), T, bf16);
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, GpuRoute,
    testing::Values(route_case{"softmax_renorm_e128", 128, 8, routing_kind::softmax_topk, 1, 1, true},
                    route_case{"softmax_e96", 96, 4, routing_kind::softmax_topk, 1, 1, false},
                    route_case{"topk_softmax_e32", 32, 4, routing_kind::topk_softmax, 1, 1, true},
                    route_case{"topk_softmax_e256", 256, 4, routing_kind::topk_softmax, 1, 1, true},
                    route_case{"softmax_e512_k16", 512, 16, routing_kind::softmax_topk, 1, 1, true},
                    route_case{"grouped_every_group_kept_e384", 384, 8, routing_kind::sigmoid_grouped_topk, 1, 1, true},
                    route_case{"grouped_4_of_8_groups_of_32_e256", 256, 8, routing_kind::sigmoid_grouped_topk, 8, 4, true},
                    route_case{"grouped_1_of_2_groups_of_256_e512", 512, 8, routing_kind::sigmoid_grouped_topk, 2, 1, true},
                    route_case{"grouped_3_of_3_groups_of_128_e384", 384, 6, routing_kind::sigmoid_grouped_topk, 3, 3, false},
                    // 257..384 experts: twelve logits per lane (route_kernel<12>), scored groups of
                    // whole registers, of partial ones, and an E that ends inside a register.
                    route_case{"grouped_3_of_6_groups_of_64_e384", 384, 8, routing_kind::sigmoid_grouped_topk, 6, 3, true},
                    route_case{"grouped_2_of_4_groups_of_75_e300", 300, 6, routing_kind::sigmoid_grouped_topk, 4, 2, false},
                    route_case{"softmax_e300_k8", 300, 8, routing_kind::softmax_topk, 1, 1, true},
                    route_case{"grouped_4_of_8_groups_of_8_e64", 64, 6, routing_kind::sigmoid_grouped_topk, 8, 4, true},
                    route_case{"grouped_1_of_2_groups_of_48_e96", 96, 4, routing_kind::sigmoid_grouped_topk, 2, 1, true}),
    [](const testing::TestParamInfo<route_case>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace mxmoe
