// GPU tests of the sm_90a MoE layer (cuda::moe_layer) against the CPU reference
// (cpu::moe_forward) on the same MXFP4 weights, fresh random data per case.
//
// Tolerances: cuda::kForwardRelL2Tolerance and kForwardMaxErrTolerance (mxmoe/cuda.h, derived
// in docs/moe_layer.md): only the bf16 rounding of the activation, the weighted expert outputs
// and the output. A wrong layout, a wrong scale or a dropped tile gives errors of order 1.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_ok.h"
#include "moe_case.h"
#include "mxmoe/cuda.h"
#include "mxmoe/dtype.h"
#include "mxmoe/error.h"
#include "mxmoe/moe.h"

namespace mxmoe {
namespace {

using namespace test;  // tests/gpu/moe_case.h
using test::random_bf16;
using test::routing_mode;
using test::run_case;
using test::run_result;
using test::shape_case;
using test::to_device;

// ---- cases -----------------------------------------------------------------------------

class GpuMoe : public testing::TestWithParam<shape_case> {};

TEST_P(GpuMoe, MatchesReferenceAtEveryTileResidue) {
  const shape_case& sc = GetParam();
  std::mt19937 rng(1234);
  moe_config cfg = config_of(sc);
  if (sc.routing == routing_kind::sigmoid_grouped_topk) {
    cfg.routing.n_group = sc.E >= 16 ? 8 : 1;
    cfg.routing.topk_group = sc.E >= 16 ? 4 : 1;
    cfg.routing.routed_scaling_factor = 2.5f;
  }
  expect_shape_matches(sc, cfg, rng);
}

// K = H or I is 32 mod 64 in several cases (the last K-step half empty); 2I and H are not
// multiples of the 128-row CTA; T crosses each tile shape (16, 64, 128 tokens per expert).
INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuMoe,
    testing::Values(
        shape_case{"tiny_silu", 8, 64, 32, 2, routing_kind::softmax_topk, activation_kind::silu_mul,
                   layout::gate_up_order::concatenated, false, {1, 5, 33, 257}},
        shape_case{"odd_k_swiglu_bias", 16, 352, 224, 4, routing_kind::topk_softmax, activation_kind::swiglu_clamped,
                   layout::gate_up_order::interleaved, true, {1, 17, 100, 700}},
        shape_case{"gpt_oss_120b_e8", 8, 2880, 2880, 4, routing_kind::topk_softmax, activation_kind::swiglu_clamped,
                   layout::gate_up_order::interleaved, true, {1, 64, 300}},
        shape_case{"qwen3_30b_a3b_e16", 16, 2048, 768, 8, routing_kind::softmax_topk, activation_kind::silu_mul,
                   layout::gate_up_order::concatenated, false, {1, 64, 513}},
        shape_case{"deepseek_v3_e16", 16, 7168, 2048, 8, routing_kind::sigmoid_grouped_topk,
                   activation_kind::silu_mul, layout::gate_up_order::concatenated, false, {1, 9}},
        shape_case{"many_empty_experts", 64, 128, 64, 2, routing_kind::softmax_topk, activation_kind::silu_mul,
                   layout::gate_up_order::interleaved, true, {2}},
        shape_case{"max_tokens", 8, 64, 32, 2, routing_kind::softmax_topk, activation_kind::silu_mul,
                   layout::gate_up_order::concatenated, false, {65536}},
        shape_case{"max_experts_max_topk", 512, 64, 32, 16, routing_kind::softmax_topk, activation_kind::silu_mul,
                   layout::gate_up_order::concatenated, true, {1, 40, 3000}}),
    [](const testing::TestParamInfo<shape_case>& i) { return std::string(i.param.name); });

TEST(GpuMoeRouting, Bf16LogitsAndPrecomputedIds) {
  std::mt19937 rng(7);
  const moe_config cfg = make_cfg(16, 96, 64, 4, routing_kind::softmax_topk, activation_kind::silu_mul,
                                  layout::gate_up_order::concatenated);
  const host_moe m = make_moe(cfg, true, rng);
  for (int64_t T : {3, 150}) {
    run_result r = run_case(m, T, routing_mode::logits_bf16, rng);
    expect_close(r.out, r.ref, "bf16 logits T=" + std::to_string(T));
    r = run_case(m, T, routing_mode::precomputed, rng);
    expect_close(r.out, r.ref, "precomputed T=" + std::to_string(T));
  }
}

TEST(GpuMoeRouting, AllTokensOnOneExpert) {
  std::mt19937 rng(11);
  const moe_config cfg = make_cfg(8, 160, 96, 1, routing_kind::softmax_topk, activation_kind::silu_mul,
                                  layout::gate_up_order::interleaved);
  const host_moe m = make_moe(cfg, true, rng);
  for (int64_t T : {1, 700}) {
    const std::vector<int32_t> ids(static_cast<size_t>(T), 3);
    const run_result r = run_case(m, T, routing_mode::precomputed, rng, cpu::precision::f64, &ids);
    expect_close(r.out, r.ref, "one expert T=" + std::to_string(T));
  }
}

TEST(GpuMoeRouting, GroupedRoutingEveryActivation) {
  std::mt19937 rng(5);
  for (activation_kind act : {activation_kind::silu_mul, activation_kind::swiglu_clamped}) {
    moe_config cfg = make_cfg(32, 128, 96, 6, routing_kind::sigmoid_grouped_topk, act,
                              layout::gate_up_order::concatenated);
    cfg.routing.n_group = 4;
    cfg.routing.topk_group = 2;
    cfg.routing.routed_scaling_factor = 2.827f;
    cfg.activation.limit = 1.5f;  // low, so that the clamp is active on many elements
    const host_moe m = make_moe(cfg, true, rng);
    const run_result r = run_case(m, 40, routing_mode::logits_f32, rng);
    expect_close(r.out, r.ref, std::string("grouped ") + to_string(act));
  }
}

TEST(GpuMoeRouting, OutOfRangeIdsAreDroppedAndFlagged) {
  std::mt19937 rng(3);
  const moe_config cfg = make_cfg(8, 64, 32, 2, routing_kind::softmax_topk, activation_kind::silu_mul,
                                  layout::gate_up_order::concatenated);
  const host_moe m = make_moe(cfg, false, rng);
  const int64_t T = 4, H = 64;
  const std::vector<int32_t> ids = {0, 1, 2, 99, 3, -1, 4, 5};
  const std::vector<float> wts(8, 0.5f);
  const std::vector<uint16_t> x = random_bf16(static_cast<size_t>(T * H), 1.0f, rng);
  cuda::moe_layer layer(m.view(), cfg);
  cuda::device_buffer dx = to_device(x), dids = to_device(ids), dw = to_device(wts), dout(T * H * 2),
                      ws(layer.workspace_bytes(T));
  routing_input ri;
  ri.ids = dids.view(dtype::i32, {T, 2});
  ri.weights = dw.view(dtype::f32, {T, 2});
  layer.forward(dx.view(dtype::bf16, {T, H}), ri, dout.view(dtype::bf16, {T, H}), ws.data(), ws.size());
  EXPECT_EQ(layer.read_error_flags(ws.data(), ws.size()) & 1u, 1u);
  std::vector<uint16_t> out(static_cast<size_t>(T * H));
  dout.download(out.data(), out.size() * 2);
  // Reference: the dropped slots with weight 0 on a valid expert.
  std::vector<int32_t> ref_ids = ids;
  std::vector<float> ref_w = wts;
  for (size_t p = 0; p < ids.size(); ++p)
    if (ids[p] < 0 || ids[p] >= 8) ref_ids[p] = 0, ref_w[p] = 0.0f;
  routing_input hr;
  hr.ids = tensor_view(ref_ids.data(), dtype::i32, {T, 2});
  hr.weights = tensor_view(ref_w.data(), dtype::f32, {T, 2});
  std::vector<float> ref(static_cast<size_t>(T * H));
  const moe_weights w = m.view();
  cpu::moe_forward(tensor_view(x.data(), dtype::bf16, {T, H}), hr, w, cfg, tensor_view(ref.data(), dtype::f32, {T, H}),
                   cpu::precision::f64);
  expect_close(out, ref, "dropped slots");
}

TEST(GpuMoeGraph, CapturedForwardReplaysWithNewInputs) {
  std::mt19937 rng(99);
  const moe_config cfg = make_cfg(16, 352, 224, 4, routing_kind::topk_softmax, activation_kind::swiglu_clamped,
                                  layout::gate_up_order::interleaved);
  expect_graph_replays(make_moe(cfg, true, rng), 37, rng);
}

TEST(GpuMoeInput, BadInputIsRejectedAndNothingIsWritten) {
  std::mt19937 rng(1);
  const moe_config cfg = make_cfg(8, 64, 32, 2, routing_kind::softmax_topk, activation_kind::silu_mul,
                                  layout::gate_up_order::concatenated);
  const host_moe m = make_moe(cfg, false, rng);
  cuda::moe_layer layer(m.view(), cfg);
  const int64_t T = 4, H = 64, E = 8;
  cuda::device_buffer dx(T * H * 2), dlog(T * E * 4), dout(T * H * 2), ws(layer.workspace_bytes(T));
  dx.fill(0);
  dlog.fill(0);
  dout.fill(0xAB);
  routing_input ri;
  ri.logits = dlog.view(dtype::f32, {T, E});
  std::vector<uint16_t> host_x(static_cast<size_t>(T * H));
  auto expect_reject = [&](auto&& call, const char* arg) {
    try {
      call();
      ADD_FAILURE() << "accepted bad " << arg;
    } catch (const invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(arg), std::string::npos) << e.what();
    }
  };
  expect_reject([&] { layer.forward(tensor_view(host_x.data(), dtype::bf16, {T, H}), ri, dout.view(dtype::bf16, {T, H}), ws.data(), ws.size()); }, "x");
  expect_reject([&] { layer.forward(dx.view(dtype::f32, {T, H / 2}), ri, dout.view(dtype::bf16, {T, H}), ws.data(), ws.size()); }, "x");
  expect_reject([&] { layer.forward(dx.view(dtype::bf16, {T, H}), ri, dout.view(dtype::bf16, {T, H}), ws.data(), 64); }, "workspace");
  routing_input bad = ri;
  bad.logits = dlog.view(dtype::f32, {T, E - 1});
  expect_reject([&] { layer.forward(dx.view(dtype::bf16, {T, H}), bad, dout.view(dtype::bf16, {T, H}), ws.data(), ws.size()); }, "logits");
  expect_reject([&] { layer.forward(dx.view(dtype::bf16, {T, H}), ri, dout.view(dtype::bf16, {T - 1, H}), ws.data(), ws.size()); }, "out");
  std::vector<uint16_t> out(static_cast<size_t>(T * H));
  dout.download(out.data(), out.size() * 2);
  for (uint16_t v : out) ASSERT_EQ(v, 0xABABu) << "a rejected call wrote its output";
  moe_weights w = m.view();
  w.format = weight_format::bf16;
  EXPECT_THROW(cuda::moe_layer(w, cfg), invalid_argument);
  // T = 0 is valid and writes nothing.
  layer.forward(dx.view(dtype::bf16, {0, H}), routing_input{dlog.view(dtype::f32, {0, E}), {}, {}},
                dout.view(dtype::bf16, {0, H}), ws.data(), ws.size());
  dout.download(out.data(), out.size() * 2);
  for (uint16_t v : out) ASSERT_EQ(v, 0xABABu);
}

}  // namespace
}  // namespace mxmoe
