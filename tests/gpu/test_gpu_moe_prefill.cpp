// GPU tests of the prefill GEMMs (docs/moe_layer.md): the persistent warp-specialized GEMMs of
// src/cuda/moe/gemm_prefill.cuh, which moe_layer.cu's pick_config runs beyond the decode GEMM
// (more than 13 pairs per expert, 9 under grouped sigmoid routing, or more than 8,192 pairs): narrow (tiles of <= 64 pairs) up to 48
// pairs per expert on average, mid (<= 96) up to 72, wide (<= 176) above. Every test here builds its layers
// with MXMOE_MOE_PATH=default (scoped_moe_path: whatever the caller's environment says) and
// checks, from a captured forward, that the gather and both prefill GEMMs are what runs. Against
// the CPU reference, with the tolerances of docs/moe_layer.md; every case runs twice on
// 0xFF-filled buffers and must match bitwise (the workspace's work-item counters of the mid and
// wide tiles included: the routing kernels must zero them, and which CTA takes an item must not
// change the output).
//
// Shapes come from the kernel's tiles: blocks of 192 weight rows, three consumer warpgroups of 64
// (wide), or 256 rows and four warpgroups (narrow, mid). Wide: 2880 and 5760 = 15 and 30 whole
// blocks; 544 = 34 row tiles and 352 = 22: the last block has a warpgroup with two valid warps and
// one with none; 1088 = 68 and 448 = 28: last blocks of 8 and 4 row tiles, one and two idle
// warpgroups. Narrow and mid: 2880 = 180 row tiles and 5760 = 360: last blocks of 4 and 8 (three
// and two idle warpgroups); 544 and 352: last blocks of 2 and 6 (a warpgroup with two valid
// warps); 448 = 28: a last block of 12 (one idle). K-steps of 64 and weight stages of four (2880 = 45
// K-steps: the last stage has one; 544 = 8.5: the K tail is zero-filled), per-tile wgmma widths of 16..176 (counts that
// are no multiple of 16, experts with 1 pair next to experts with thousands), K long enough
// that both rings wrap inside one work item, and both routing paths (the one-CTA plan up to 8,192
// pairs, the four-step path beyond).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "moe_case.h"
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
#include "mxmoe/moe.h"

namespace mxmoe {
namespace {

using namespace test;  // tests/gpu/moe_case.h

constexpr const char* kPrefillGemm = "moe_gemm_prefill_kernel";
constexpr const char* kGather = "gather_sorted_rows_kernel";

// The kernels of one forward (`names`) are the gather and the two prefill GEMMs, no other GEMM
// (the narrow and the wide instantiation share the kernel's name); a layer of `m` under the
// switch launches them at each of `tokens`.
void expect_prefill_kernels(const std::vector<std::string>& names, const std::string& what) {
  EXPECT_EQ(count_containing(names, kGather), 1) << what;
  EXPECT_EQ(count_containing(names, kPrefillGemm), 2) << what;
  EXPECT_EQ(count_containing(names, "moe_gemm_kernel") + count_containing(names, "moe_gemm_decode_kernel"), 0) << what;
}
void expect_prefill_kernels(const host_moe& m, const std::vector<int64_t>& tokens, const std::string& what) {
  const cuda::moe_layer layer(m.weights(), m.cfg);
  for (const int64_t T : tokens) {
    std::vector<std::string> names;
    forward_kernel_names(layer, T, &names);
    expect_prefill_kernels(names, what + " T=" + std::to_string(T));
  }
}

// Kimi-K2's grouped routing: one group, scaling 2.827.
moe_config prefill_config_of(const shape_case& sc) {
  moe_config cfg = config_of(sc);
  if (sc.routing == routing_kind::sigmoid_grouped_topk) cfg.routing.routed_scaling_factor = 2.827f;
  return cfg;
}

class GpuMoePrefill : public testing::TestWithParam<shape_case> {};

TEST_P(GpuMoePrefill, SwitchRunsThePrefillKernels) {
  const scoped_moe_path path("default");
  const shape_case& sc = GetParam();
  std::mt19937 rng(2026);
  expect_prefill_kernels(make_moe(prefill_config_of(sc), sc.biases, rng), sc.tokens, sc.name);
}

TEST_P(GpuMoePrefill, MatchesReference) {
  const scoped_moe_path path("default");
  std::mt19937 rng(2027);
  expect_shape_matches(GetParam(), prefill_config_of(GetParam()), rng);
}

// "wide"/"mid"/"narrow": the instantiation the average pairs per expert selects (T * k / E).
INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuMoePrefill,
    testing::Values(
        // gpt-oss-120b's H = I = 2880 (8 / 16 of its 128 experts): 256 (176 + 80) and 32.5 pairs per
        // expert; 45 K-steps (the last weight stage has one).
        shape_case{"gpt_oss_2880_wide", 8, 2880, 2880, 4, routing_kind::topk_softmax,
                   activation_kind::swiglu_clamped, layout::gate_up_order::interleaved, true, {512}},
        shape_case{"gpt_oss_2880_narrow", 16, 2880, 2880, 1, routing_kind::topk_softmax,
                   activation_kind::swiglu_clamped, layout::gate_up_order::interleaved, true, {520}},
        // 64 pairs per expert: mid tiles of up to 96.
        shape_case{"gpt_oss_2880_mid", 16, 2880, 2880, 4, routing_kind::topk_softmax,
                   activation_kind::swiglu_clamped, layout::gate_up_order::interleaved, true, {256}},
        // Qwen3-30B-A3B's H = 2048, I = 768: 256 and 32 pairs per expert.
        shape_case{"qwen3_like_wide", 32, 2048, 768, 8, routing_kind::softmax_topk, activation_kind::silu_mul,
                   layout::gate_up_order::concatenated, false, {1024}},
        shape_case{"qwen3_like_narrow", 32, 2048, 768, 2, routing_kind::softmax_topk, activation_kind::silu_mul,
                   layout::gate_up_order::concatenated, false, {512}},
        // Kimi-K2's H = 7168, I = 2048 and grouped sigmoid routing (12 experts, top-1): 112 K-steps.
        shape_case{"kimi_like_narrow", 12, 7168, 2048, 1, routing_kind::sigmoid_grouped_topk,
                   activation_kind::silu_mul, layout::gate_up_order::concatenated, false, {512}},
        // 544 = 4.25 row blocks and 8.5 K-steps; 128, 1125 (176 * 6 + 69; 9,000 pairs: the
        // four-step routing) and 24 pairs per expert.
        shape_case{"odd_544_wide", 8, 544, 544, 2, routing_kind::softmax_topk, activation_kind::silu_mul,
                   layout::gate_up_order::concatenated, false, {512, 4500}},
        shape_case{"odd_544_narrow", 64, 544, 544, 2, routing_kind::softmax_topk, activation_kind::swiglu_clamped,
                   layout::gate_up_order::interleaved, true, {777}},
        shape_case{"odd_544_mid", 8, 544, 544, 2, routing_kind::softmax_topk, activation_kind::silu_mul,
                   layout::gate_up_order::concatenated, false, {261}},
        // H = 352 (10 row tiles in the last block), 2I = 448 (a last block of 4: two idle warpgroups).
        shape_case{"partial_row_blocks_narrow", 64, 352, 224, 4, routing_kind::topk_softmax,
                   activation_kind::swiglu_clamped, layout::gate_up_order::interleaved, true, {600}},
        // Few tokens, many pairs per expert (65: mid; 255: wide).
        shape_case{"few_experts_short_batch", 4, 352, 224, 2, routing_kind::softmax_topk, activation_kind::silu_mul,
                   layout::gate_up_order::concatenated, true, {130, 511}},
        // 8,800 pairs (the four-step routing) of 17 per expert: narrow tiles where the default runs
        // the mid tile (more pairs than the decode GEMM's plan takes).
        shape_case{"beyond_plan_narrow", 512, 256, 160, 8, routing_kind::softmax_topk, activation_kind::silu_mul,
                   layout::gate_up_order::concatenated, true, {1100}}),
    [](const testing::TestParamInfo<shape_case>& i) { return std::string(i.param.name); });

// Precomputed routing (slot p of the T * k slots on expert ids[p]), checked like the rest.
void expect_precomputed_matches(const moe_config& cfg, int64_t T, const std::vector<int32_t>& ids, const char* what,
                                unsigned seed) {
  const scoped_moe_path path("default");
  std::mt19937 rng(seed);
  const host_moe m = make_moe(cfg, true, rng);
  expect_prefill_kernels(m, {T}, what);
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

// Top-1 ids of T tokens: expert j < counts.size() gets counts[j] of them (in that order), the rest
// go one by one, round robin, to the experts after those.
std::vector<int32_t> uneven_top1_ids(int64_t T, const std::vector<int>& counts, int experts) {
  std::vector<int32_t> ids;
  for (size_t j = 0; j < counts.size(); ++j) ids.insert(ids.end(), static_cast<size_t>(counts[j]), static_cast<int32_t>(j));
  const int first = static_cast<int>(counts.size()), rest = experts - first;
  for (int64_t t = static_cast<int64_t>(ids.size()); t < T; ++t) ids.push_back(static_cast<int32_t>(first + t % rest));
  return ids;
}

// The same for the narrow tiles (64 pairs): experts with 1, 64, 65 and 200 pairs, the rest
// scattered one by one over the other 12 experts (600 pairs / 16 experts: narrow).
TEST(GpuMoePrefillRouting, UnevenExpertsNarrow) {
  expect_precomputed_matches(make_cfg(16, 320, 96, 1, routing_kind::softmax_topk, activation_kind::swiglu_clamped,
                                      layout::gate_up_order::concatenated),
                             600, uneven_top1_ids(600, {1, 64, 65, 200}, 16), "uneven experts, narrow", 37);
}

// The same for the mid tiles (96 pairs): experts with 1, 96, 97 and 250 pairs, the rest spread
// over the other 6 experts (700 pairs / 10 experts: mid).
TEST(GpuMoePrefillRouting, UnevenExpertsMid) {
  expect_precomputed_matches(make_cfg(10, 352, 160, 1, routing_kind::softmax_topk, activation_kind::silu_mul,
                                      layout::gate_up_order::concatenated),
                             700, uneven_top1_ids(700, {1, 96, 97, 250}, 10), "uneven experts, mid", 39);
}

// The tensor maps are encoded at capture and travel as kernel parameters: replays with new
// inputs in the captured buffers must still match. 150 pairs per expert (wide), 37.5 (narrow).
TEST(GpuMoePrefillGraph, CapturedForwardReplaysWithNewInputs) {
  const scoped_moe_path path("default");
  std::mt19937 rng(41);
  for (const int64_t E : {16, 64}) {
    const moe_config cfg = make_cfg(E, 352, 224, 4, routing_kind::topk_softmax, activation_kind::swiglu_clamped,
                                    layout::gate_up_order::interleaved);
    const host_moe m = make_moe(cfg, true, rng);
    const moe_weights w = m.weights();
    const cuda::moe_layer layer(w, cfg);
    std::vector<std::string> names;
    expect_graph_replays(layer, w, {600}, rng, &names);
    expect_prefill_kernels(names, "graph E=" + std::to_string(E));
  }
}

// Small cases for compute-sanitizer (memcheck, racecheck): H = 2368 is 37 K-steps, so GEMM1's
// weight ring (4 or 5 stages of four K-steps) and activation ring wrap inside one work item;
// I = 96 is 1.5 K-steps (a zero-filled K tail; one weight stage, half of it past K); 2I = 192 and H end in
// half-empty row blocks. Enough work items that CTAs run several.
void expect_small_case_matches(const moe_config& cfg, int64_t T, bool biases, const char* what, unsigned seed) {
  const scoped_moe_path path("default");
  std::mt19937 rng(seed);
  const host_moe m = make_moe(cfg, biases, rng);
  expect_prefill_kernels(m, {T}, what);
  const run_result r = run_case(m, T, routing_mode::logits_f32, rng);
  expect_close(r.out, r.ref, what);
}

TEST(GpuMoePrefillSanitize, Wide) {  // 130 pairs per expert
  expect_small_case_matches(make_cfg(8, 2368, 96, 2, routing_kind::softmax_topk, activation_kind::swiglu_clamped,
                                     layout::gate_up_order::interleaved),
                            520, true, "sanitize wide", 43);
}

TEST(GpuMoePrefillSanitize, Mid) {  // 64 pairs per expert
  expect_small_case_matches(make_cfg(8, 2368, 96, 2, routing_kind::softmax_topk, activation_kind::silu_mul,
                                     layout::gate_up_order::concatenated),
                            256, true, "sanitize mid", 45);
}

TEST(GpuMoePrefillSanitize, Narrow) {  // 32 pairs per expert
  expect_small_case_matches(make_cfg(32, 2368, 96, 2, routing_kind::softmax_topk, activation_kind::silu_mul,
                                     layout::gate_up_order::concatenated),
                            512, false, "sanitize narrow", 47);
}

// The switch itself: unset and "default" run the decode GEMM at 2 pairs per expert and the
// prefill GEMMs at 150; "tiles" runs gemm.cuh's wgmma tile at 150 (and the decode GEMM at 2);
// "prefill" runs the prefill GEMMs at both; other values are rejected when the layer is built,
// naming the variable.
TEST(GpuMoePrefillPath, DefaultRunsThePrefillKernelsAndTilesTheWgmmaTiles) {
  std::mt19937 rng(53);
  const moe_config cfg = make_cfg(8, 352, 224, 2, routing_kind::softmax_topk, activation_kind::silu_mul,
                                  layout::gate_up_order::concatenated);
  const host_moe m = make_moe(cfg, false, rng);
  for (const char* value : {static_cast<const char*>(nullptr), "", "default", "tiles", "prefill"}) {
    const scoped_moe_path path(value);
    const cuda::moe_layer layer(m.weights(), cfg);
    const std::string v = value ? value : "";
    const std::string what = std::string("MXMOE_MOE_PATH=") + (value ? value : "(unset)");
    std::vector<std::string> names;
    forward_kernel_names(layer, 8, &names);  // 2 pairs per expert
    if (v == "prefill") {
      expect_prefill_kernels(names, what + " T=8");
    } else {
      EXPECT_EQ(count_containing(names, kPrefillGemm) + count_containing(names, kGather), 0) << what << " T=8";
      EXPECT_EQ(count_containing(names, "moe_gemm_decode_kernel"), 2) << what << " T=8";
    }
    forward_kernel_names(layer, 600, &names);  // 150 pairs per expert
    if (v == "tiles") {
      EXPECT_EQ(count_containing(names, kPrefillGemm) + count_containing(names, kGather), 0) << what << " T=600";
      EXPECT_EQ(count_containing(names, "moe_gemm_kernel"), 2) << what << " T=600";
    } else {
      expect_prefill_kernels(names, what + " T=600");
    }
  }
  for (const char* rejected : {"prefil", "Prefill", "decode"}) {
    const scoped_moe_path path(rejected);
    try {
      const cuda::moe_layer layer(m.weights(), cfg);
      ADD_FAILURE() << "MXMOE_MOE_PATH=" << rejected << " accepted";
    } catch (const invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("MXMOE_MOE_PATH"), std::string::npos) << e.what();
    }
  }
}

// Where the default hands over (moe_layer.cu, decode_max_pairs_per_expert; measured in
// performance.md, 2026-12-06): the decode GEMM at 13 pairs per expert under softmax routing and
// at 9 under grouped sigmoid routing (uniform estimate T * k / E), the prefill GEMMs one step
// beyond; each against the reference.
TEST(GpuMoePrefillPath, DecodeUpToItsMostPairsPerExpertThenPrefill) {
  const scoped_moe_path path("default");
  struct handover_case {
    shape_case sc;
    int64_t last_decode_tokens;
  };
  std::mt19937 rng(57);
  for (const handover_case& hc :
       {handover_case{shape_case{"handover_softmax", 8, 352, 224, 2, routing_kind::softmax_topk,
                                 activation_kind::silu_mul, layout::gate_up_order::concatenated, false, {52, 56}},
                      52},
        handover_case{shape_case{"handover_grouped", 16, 544, 352, 8, routing_kind::sigmoid_grouped_topk,
                                 activation_kind::silu_mul, layout::gate_up_order::interleaved, true, {18, 20}},
                      18}}) {
    moe_config cfg = prefill_config_of(hc.sc);
    if (hc.sc.routing == routing_kind::sigmoid_grouped_topk) {
      cfg.routing.n_group = 4;
      cfg.routing.topk_group = 2;
    }
    const host_moe m = make_moe(cfg, hc.sc.biases, rng);
    const cuda::moe_layer layer(m.weights(), cfg);
    for (const int64_t T : hc.sc.tokens) {
      const std::string what = std::string(hc.sc.name) + " T=" + std::to_string(T);
      std::vector<std::string> names;
      forward_kernel_names(layer, T, &names);
      if (T <= hc.last_decode_tokens) {
        EXPECT_EQ(count_containing(names, "moe_gemm_decode_kernel"), 2) << what;
        EXPECT_EQ(count_containing(names, kPrefillGemm) + count_containing(names, kGather), 0) << what;
      } else {
        expect_prefill_kernels(names, what);
      }
      const run_result r = run_case(m, T, routing_mode::logits_f32, rng);
      expect_close(r.out, r.ref, what);
    }
  }
}

// "prefill" at decode sizes, where the default runs the decode GEMM: one token (every tile one
// pair wide, most experts empty), a few, and all tokens on one expert, against the reference.
TEST(GpuMoePrefillPath, PrefillAtDecodeSizesMatchesReference) {
  const scoped_moe_path path("prefill");
  std::mt19937 rng(55);
  for (const shape_case& sc :
       {shape_case{"prefill_path_t1", 16, 544, 352, 2, routing_kind::softmax_topk, activation_kind::silu_mul,
                   layout::gate_up_order::concatenated, false, {1, 3, 17}},
        shape_case{"prefill_path_one_expert", 1, 2880, 2880, 1, routing_kind::topk_softmax,
                   activation_kind::swiglu_clamped, layout::gate_up_order::interleaved, true, {1, 5}}}) {
    const host_moe m = make_moe(prefill_config_of(sc), sc.biases, rng);
    expect_prefill_kernels(m, sc.tokens, sc.name);
    expect_shape_matches(sc, prefill_config_of(sc), rng);
  }
}

// The wgmma tiles that "tiles" (and the legacy path) still run, against the reference: mid (32
// pairs per expert) and large (150), with residues of their 128-row and 64/128-token tiles.
TEST(GpuMoePrefillPath, TilesMatchReference) {
  const scoped_moe_path path("tiles");
  std::mt19937 rng(54);
  for (const shape_case& sc :
       {shape_case{"tiles_mid_odd", 16, 544, 352, 2, routing_kind::softmax_topk, activation_kind::swiglu_clamped,
                   layout::gate_up_order::interleaved, true, {256}},
        shape_case{"tiles_large", 8, 352, 224, 2, routing_kind::softmax_topk, activation_kind::silu_mul,
                   layout::gate_up_order::concatenated, false, {600}}})
    expect_shape_matches(sc, config_of(sc), rng);
}

}  // namespace
}  // namespace mxmoe
