// GPU tests of the MoE layer at prefill sizes, shaped by the tiles of the persistent
// warp-specialized GEMMs of src/cuda/moe/gemm_prefill.cuh, which moe_layer.cu's pick_prefill runs
// (when kSelectPrefillKernels is set) from 512 tokens with more than 8 pairs per expert (narrow: up
// to 48 pairs per expert on average, tiles of <= 64; wide above, tiles of <= 176) and wherever
// experts average more than 64 pairs; otherwise these sizes run the decode/mid/large tiles.
// Against the CPU reference, with the tolerances of docs/moe_layer.md; every case runs twice on
// 0xFF-filled buffers and must match bitwise.
//
// Shapes come from the kernel's tiles: blocks of 128 weight rows (2880 = 22.5 blocks, 544 =
// 4.25, 352 = 22 row tiles: the last block has a warpgroup with two valid warps, 448 = 28: a
// warpgroup with none), K-steps of 64 and weight stages of two (2880 = 45 K-steps: the last stage
// has one; 544 = 8.5: the K tail is zero-filled), per-tile wgmma widths of 16..176 (counts that
// are no multiple of 16, experts with 1 pair next to experts with thousands), and K long enough
// that both rings wrap inside one work item.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "moe_case.h"
#include "mxmoe/moe.h"

namespace mxmoe {
namespace {

using namespace test;  // tests/gpu/moe_case.h

// Kimi-K2's grouped routing: one group, scaling 2.827.
moe_config prefill_config_of(const shape_case& sc) {
  moe_config cfg = config_of(sc);
  if (sc.routing == routing_kind::sigmoid_grouped_topk) cfg.routing.routed_scaling_factor = 2.827f;
  return cfg;
}

class GpuMoePrefill : public testing::TestWithParam<shape_case> {};

TEST_P(GpuMoePrefill, MatchesReference) {
  std::mt19937 rng(2027);
  expect_shape_matches(GetParam(), prefill_config_of(GetParam()), rng);
}

// "wide"/"narrow": the instantiation the average pairs per expert selects (T * k / E).
INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuMoePrefill,
    testing::Values(
        // gpt-oss-120b's H = I = 2880 (8 / 16 of its 128 experts): 256 (176 + 80) and 32.5 pairs per
        // expert; 45 K-steps (the last weight stage has one).
        shape_case{"gpt_oss_2880_wide", 8, 2880, 2880, 4, routing_kind::topk_softmax,
                   activation_kind::swiglu_clamped, layout::gate_up_order::interleaved, true, {512}},
        shape_case{"gpt_oss_2880_narrow", 16, 2880, 2880, 1, routing_kind::topk_softmax,
                   activation_kind::swiglu_clamped, layout::gate_up_order::interleaved, true, {520}},
        // Qwen3-30B-A3B's H = 2048, I = 768: 256 and 32 pairs per expert.
        shape_case{"qwen3_like_wide", 32, 2048, 768, 8, routing_kind::softmax_topk, activation_kind::silu_mul,
                   layout::gate_up_order::concatenated, false, {1024}},
        shape_case{"qwen3_like_narrow", 32, 2048, 768, 2, routing_kind::softmax_topk, activation_kind::silu_mul,
                   layout::gate_up_order::concatenated, false, {512}},
        // Kimi-K2's H = 7168, I = 2048 and grouped sigmoid routing (12 experts, top-1): 112 K-steps.
        shape_case{"kimi_like_narrow", 12, 7168, 2048, 1, routing_kind::sigmoid_grouped_topk,
                   activation_kind::silu_mul, layout::gate_up_order::concatenated, false, {512}},
        // 544 = 4.25 row blocks and 8.5 K-steps; 128, 750 (176 * 4 + 46) and 24 pairs per expert.
        shape_case{"odd_544_wide", 8, 544, 544, 2, routing_kind::softmax_topk, activation_kind::silu_mul,
                   layout::gate_up_order::concatenated, false, {512, 3001}},
        shape_case{"odd_544_narrow", 64, 544, 544, 2, routing_kind::softmax_topk, activation_kind::swiglu_clamped,
                   layout::gate_up_order::interleaved, true, {777}},
        // H = 352 (6 row tiles in the last block), 2I = 448 (a last block of 4: one idle warpgroup).
        shape_case{"partial_row_blocks_narrow", 64, 352, 224, 4, routing_kind::topk_softmax,
                   activation_kind::swiglu_clamped, layout::gate_up_order::interleaved, true, {600}},
        // Below 512 tokens but more than 64 pairs per expert (where the large tile used to run).
        shape_case{"few_experts_short_batch", 4, 352, 224, 2, routing_kind::softmax_topk, activation_kind::silu_mul,
                   layout::gate_up_order::concatenated, true, {130, 511}}),
    [](const testing::TestParamInfo<shape_case>& i) { return std::string(i.param.name); });

// Precomputed routing (slot p of the T * k slots on expert ids[p]), checked like the rest.
void expect_precomputed_matches(const moe_config& cfg, int64_t T, const std::vector<int32_t>& ids, const char* what,
                                unsigned seed) {
  std::mt19937 rng(seed);
  const host_moe m = make_moe(cfg, true, rng);
  const run_result r = run_case(m, T, routing_mode::precomputed, rng, cpu::precision::f64, &ids);
  expect_close(r.out, r.ref, what);
}

// Very uneven experts, wide tiles (176 pairs): slot 0 of every token on expert 0 (thousands of
// pairs: full tiles and a remainder), slot 1 on experts with 1, 17, 177 (a full tile + 1) and 0
// pairs, the rest spread.
TEST(GpuMoePrefillRouting, UnevenExpertsWide) {
  const int64_t T = 3000;
  std::vector<int32_t> ids(static_cast<size_t>(T * 2));
  for (int64_t t = 0; t < T; ++t) {
    ids[2 * t] = 0;
    ids[2 * t + 1] = t < 1 ? 1 : t < 18 ? 2 : t < 195 ? 3 : static_cast<int32_t>(5 + t % 3);  // expert 4: none
  }
  expect_precomputed_matches(make_cfg(8, 256, 160, 2, routing_kind::softmax_topk, activation_kind::silu_mul,
                                      layout::gate_up_order::interleaved),
                             T, ids, "uneven experts, wide", 31);
}

// The same for the narrow tiles (64 pairs): experts with 1, 64, 65 and 200 pairs, the rest
// scattered one by one over the other experts (600 pairs / 64 experts: narrow).
TEST(GpuMoePrefillRouting, UnevenExpertsNarrow) {
  const int64_t T = 600;
  std::vector<int32_t> ids(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t)
    ids[t] = t < 1 ? 0 : t < 65 ? 1 : t < 130 ? 2 : t < 330 ? 3 : static_cast<int32_t>(4 + t % 60);
  expect_precomputed_matches(make_cfg(64, 320, 96, 1, routing_kind::softmax_topk, activation_kind::swiglu_clamped,
                                      layout::gate_up_order::concatenated),
                             T, ids, "uneven experts, narrow", 37);
}

TEST(GpuMoePrefillGraph, CapturedForwardReplaysWithNewInputs) {
  std::mt19937 rng(41);
  const moe_config wide = make_cfg(16, 352, 224, 4, routing_kind::topk_softmax, activation_kind::swiglu_clamped,
                                   layout::gate_up_order::interleaved);
  expect_graph_replays(make_moe(wide, true, rng), 600, rng);  // 150 pairs per expert
  const moe_config narrow = make_cfg(64, 352, 224, 4, routing_kind::topk_softmax, activation_kind::swiglu_clamped,
                                     layout::gate_up_order::interleaved);
  expect_graph_replays(make_moe(narrow, true, rng), 600, rng);  // 37.5 pairs per expert
}

// Small cases for compute-sanitizer (memcheck, racecheck): H = 2368 is 37 K-steps, so GEMM1's
// weight ring (6 or 9 stages of four K-steps) and activation ring wrap inside one work item;
// I = 96 is 1.5 K-steps (a zero-filled K tail, a one-step weight stage); 2I = 192 and H end in
// half-empty row blocks. Enough work items that CTAs run several.
void expect_small_case_matches(const moe_config& cfg, int64_t T, bool biases, const char* what, unsigned seed) {
  std::mt19937 rng(seed);
  const host_moe m = make_moe(cfg, biases, rng);
  const run_result r = run_case(m, T, routing_mode::logits_f32, rng);
  expect_close(r.out, r.ref, what);
}

TEST(GpuMoePrefillSanitize, Wide) {  // 130 pairs per expert
  expect_small_case_matches(make_cfg(8, 2368, 96, 2, routing_kind::softmax_topk, activation_kind::swiglu_clamped,
                                     layout::gate_up_order::interleaved),
                            520, true, "sanitize wide", 43);
}

TEST(GpuMoePrefillSanitize, Narrow) {  // 16 pairs per expert
  expect_small_case_matches(make_cfg(64, 2368, 96, 2, routing_kind::softmax_topk, activation_kind::silu_mul,
                                     layout::gate_up_order::concatenated),
                            512, false, "sanitize narrow", 47);
}

}  // namespace
}  // namespace mxmoe
