// GPU tests of the combine (combine.cu): out[t] = the slot-ordered sum of the
// routing-weighted expert outputs of token t's valid slots. Against the CPU reference
// (cpu::moe_forward, the documented tolerances), output and workspace filled with 0xFF, every call
// made twice and compared bitwise. The cases: tokens none of whose slots any tile holds (an expert
// map, out-of-range ids; T = 1 with no tile at all) get zero rows, two layers of different k
// sharing one workspace back to back and in a replayed graph, and workspace_bytes growing with T.
// (They were written for a combine folded into GEMM2, measured slower and reverted, 2026-12-05;
// what they check holds for every combine.)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_ok.h"
#include "moe_case.h"
#include "mxmoe/cuda.h"
#include "mxmoe/dtype.h"
#include "mxmoe/moe.h"
#include "mxmoe/shard.h"
#include "mxmoe/synthetic.h"

namespace mxmoe {
namespace {

using namespace test;  // tests/gpu/moe_case.h

// One call's inputs with caller-provided routing, on the host and on the device.
struct precomputed_call {
  int64_t T = 0;
  std::vector<uint16_t> x;
  std::vector<int32_t> ids;
  std::vector<float> wts;
  cuda::device_buffer x_d, ids_d, wts_d;
  precomputed_call(const moe_config& cfg, std::vector<int32_t> ids_in, std::mt19937& rng)
      : T(static_cast<int64_t>(ids_in.size()) / cfg.routing.top_k), ids(std::move(ids_in)) {
    x = random_bf16(static_cast<size_t>(T * cfg.shape.hidden), 1.0f, rng);
    std::uniform_real_distribution<float> u(0.1f, 1.0f);
    wts.resize(ids.size());
    for (auto& w : wts) w = u(rng);
    x_d = to_device(x);
    ids_d = to_device(ids);
    wts_d = to_device(wts);
  }
  routing_input device_routing(int k) const {
    routing_input r;
    r.ids = ids_d.view(dtype::i32, {T, k});
    r.weights = wts_d.view(dtype::f32, {T, k});
    return r;
  }
};

// The layer's output for `c`, made twice on a 0xFF-filled output and workspace (bitwise-equal
// results required); *flags: the workspace's error flags.
std::vector<uint16_t> run_twice(const cuda::moe_layer& layer, const precomputed_call& c, uint32_t* flags) {
  const moe_config& cfg = layer.config();
  const int64_t H = cfg.shape.hidden, T = c.T;
  cuda::device_buffer out(static_cast<size_t>(T * H) * 2), ws(layer.workspace_bytes(T));
  std::vector<uint16_t> first(static_cast<size_t>(T * H)), second(first.size());
  for (int rep = 0; rep < 2; ++rep) {
    out.fill(0xFF);
    ws.fill(0xFF);
    layer.forward(c.x_d.view(dtype::bf16, {T, H}), c.device_routing(cfg.routing.top_k), out.view(dtype::bf16, {T, H}),
                  ws.data(), ws.size());
    cuda::synchronize();
    out.download((rep == 0 ? first : second).data(), first.size() * 2);
  }
  EXPECT_EQ(std::memcmp(first.data(), second.data(), first.size() * 2), 0) << "two identical calls differ, T " << T;
  *flags = layer.read_error_flags(ws.data(), ws.size());
  return first;
}

// Every element of token t's output row is +0 (bits 0): what combine.cu writes for no valid slot.
void expect_zero_row(const std::vector<uint16_t>& out, int64_t H, int64_t t, const std::string& what) {
  for (int64_t n = 0; n < H; ++n)
    ASSERT_EQ(out[static_cast<size_t>(t * H + n)], 0u) << what << ": token " << t << " element " << n;
}

// A layer holding 6 of 16 experts (the others map to -1): tokens t % 3 == 0 have every slot held
// elsewhere, the others a mix. T = 1: no tile at all (every GEMM2 CTA only writes zero rows);
// 6: 8-token decode tiles; 37: 16-token tiles, route rows of 3 row blocks (the last one partial);
// 200: the narrow prefill GEMM and the separate combine kernel (both must agree on the zero rows).
TEST(GpuMoeCombine, ExpertMapDropsSlotsAndEmptyTokensGetZeroRows) {
  std::mt19937 rng(71);
  const moe_config cfg = make_cfg(16, 352, 224, 4, routing_kind::softmax_topk, activation_kind::swiglu_clamped,
                                  layout::gate_up_order::interleaved);
  const int64_t H = cfg.shape.hidden;
  const synthetic::mxfp4_layer full = make_moe(cfg, true, rng);
  std::vector<int32_t> map(16, -1);
  for (int e = 0; e < 6; ++e) map[static_cast<size_t>(e)] = e;
  const owned_weights mine = select_experts(full.weights(), cfg, map);
  const cuda::moe_layer layer(mine.weights(), cfg, map);
  for (const int64_t T : {1, 6, 37, 200}) {
    std::vector<int32_t> ids;
    for (int64_t t = 0; t < T; ++t)
      for (int j = 0; j < 4; ++j)  // four distinct experts per token
        ids.push_back(static_cast<int32_t>(t % 3 == 0 ? 6 + (t + 2 * j) % 10 : (t + 5 * j) % 16));
    const precomputed_call c(cfg, ids, rng);
    uint32_t flags = 1234;
    const std::vector<uint16_t> out = run_twice(layer, c, &flags);
    EXPECT_EQ(flags, 0u) << "a slot held elsewhere is not an error";
    const std::string what = "expert map T=" + std::to_string(T);
    for (int64_t t = 0; t < T; t += 3) expect_zero_row(out, H, t, what);
    if (T == 1) continue;  // the reference is all zeros: nothing more to compare
    routing_input hr;
    hr.ids = tensor_view(c.ids.data(), dtype::i32, {T, 4});
    hr.weights = tensor_view(c.wts.data(), dtype::f32, {T, 4});
    std::vector<float> ref(out.size());
    cpu::moe_forward(tensor_view(c.x.data(), dtype::bf16, {T, H}), hr, mine.weights(), cfg,
                     tensor_view(ref.data(), dtype::f32, {T, H}), cpu::precision::f64, 0, map);
    expect_close(out, ref, what);
  }
}

// Out-of-range ids drop their slots (and flag them); a token whose slots are all out of range gets
// a zero row. GEMM2 here splits K over 4 warp groups (I = 2080, few tiles): 32-row CTAs, 2 row
// blocks of H = 64. T = 1 has no tile at all.
TEST(GpuMoeCombine, OutOfRangeIdsDropWholeTokens) {
  std::mt19937 rng(73);
  const moe_config cfg = make_cfg(8, 64, 2080, 2, routing_kind::softmax_topk, activation_kind::silu_mul,
                                  layout::gate_up_order::concatenated);
  const int64_t H = cfg.shape.hidden;
  const host_moe m = make_moe(cfg, true, rng);
  const moe_weights w = m.weights();
  const cuda::moe_layer layer(w, cfg);
  for (const std::vector<int32_t>& ids :
       {std::vector<int32_t>{8, -2}, std::vector<int32_t>{1, 2, 99, -5, 3, 8, -1, -1, 4, 5}}) {
    const precomputed_call c(cfg, ids, rng);
    const int64_t T = c.T;
    uint32_t flags = 0;
    const std::vector<uint16_t> out = run_twice(layer, c, &flags);
    EXPECT_EQ(flags & 1u, 1u);
    const std::string what = "out-of-range ids T=" + std::to_string(T);
    for (int64_t t = 0; t < T; ++t)
      if (ids[static_cast<size_t>(2 * t)] < 0 || ids[static_cast<size_t>(2 * t)] >= 8)
        if (ids[static_cast<size_t>(2 * t + 1)] < 0 || ids[static_cast<size_t>(2 * t + 1)] >= 8)
          expect_zero_row(out, H, t, what);
    if (T == 1) continue;
    // Reference: a dropped slot is expert 0 with weight 0.
    std::vector<int32_t> ref_ids = ids;
    std::vector<float> ref_w = c.wts;
    for (size_t p = 0; p < ids.size(); ++p)
      if (ids[p] < 0 || ids[p] >= 8) ref_ids[p] = 0, ref_w[p] = 0.0f;
    routing_input hr;
    hr.ids = tensor_view(ref_ids.data(), dtype::i32, {T, 2});
    hr.weights = tensor_view(ref_w.data(), dtype::f32, {T, 2});
    std::vector<float> ref(out.size());
    cpu::moe_forward(tensor_view(c.x.data(), dtype::bf16, {T, H}), hr, w, cfg, tensor_view(ref.data(), dtype::f32, {T, H}),
                     cpu::precision::f64);
    expect_close(out, ref, what);
  }
}

// Two layers of different k and row blocks (A: k = 4, H = 352: three 128-row blocks; B: k = 1,
// H = 64, GEMM2 over 4 K groups: two 32-row blocks) alternate on one workspace, first enqueued
// back to back on one stream, then captured together in one CUDA graph replayed with new inputs:
// each forward must find nothing of the other layer's (or 0xFF) in what it reads.
TEST(GpuMoeCombine, TwoLayersShareOneWorkspace) {
  std::mt19937 rng(79);
  const moe_config ca = make_cfg(16, 352, 224, 4, routing_kind::softmax_topk, activation_kind::silu_mul,
                                 layout::gate_up_order::concatenated);
  const moe_config cb = make_cfg(8, 64, 2080, 1, routing_kind::softmax_topk, activation_kind::silu_mul,
                                 layout::gate_up_order::concatenated);
  const host_moe ma = make_moe(ca, true, rng), mb = make_moe(cb, false, rng);
  const moe_weights wa = ma.weights(), wb = mb.weights();
  const cuda::moe_layer la(wa, ca), lb(wb, cb);
  struct call {
    const cuda::moe_layer* layer;
    const moe_weights* w;
    int64_t T;
    std::vector<uint16_t> x;
    std::vector<float> logits;
    cuda::device_buffer x_d, logits_d, out;
  };
  const std::vector<std::pair<bool, int64_t>> plan = {{true, 12}, {false, 5}, {true, 3}, {false, 33}, {true, 40}, {false, 1}};
  size_t ws_bytes = 0;
  for (const auto& [a, T] : plan) ws_bytes = std::max(ws_bytes, (a ? la : lb).workspace_bytes(T));
  cuda::device_buffer ws(ws_bytes);
  std::vector<call> calls;
  for (const auto& [a, T] : plan) {
    call c{a ? &la : &lb, a ? &wa : &wb, T, {}, {}, {}, {}, {}};
    const int64_t H = c.layer->config().shape.hidden, E = c.layer->config().shape.experts;
    c.x_d = cuda::device_buffer(static_cast<size_t>(T * H) * 2);
    c.logits_d = cuda::device_buffer(static_cast<size_t>(T * E) * 4);
    c.out = cuda::device_buffer(static_cast<size_t>(T * H) * 2);
    calls.push_back(std::move(c));
  }
  auto new_inputs = [&] {
    std::normal_distribution<float> nd(0.0f, 2.0f);
    for (call& c : calls) {
      const int64_t H = c.layer->config().shape.hidden, E = c.layer->config().shape.experts;
      c.x = random_bf16(static_cast<size_t>(c.T * H), 1.0f, rng);
      c.logits.resize(static_cast<size_t>(c.T * E));
      for (auto& l : c.logits) l = nd(rng);
      c.x_d.upload(c.x.data(), c.x.size() * 2);
      c.logits_d.upload(c.logits.data(), c.logits.size() * 4);
      c.out.fill(0xFF);
    }
  };
  auto enqueue = [&](cudaStream_t s) {
    for (call& c : calls) {
      const moe_config& cfg = c.layer->config();
      routing_input ri;
      ri.logits = c.logits_d.view(dtype::f32, {c.T, cfg.shape.experts});
      c.layer->forward(c.x_d.view(dtype::bf16, {c.T, cfg.shape.hidden}), ri,
                       c.out.view(dtype::bf16, {c.T, cfg.shape.hidden}), ws.data(), ws.size(), s);
    }
  };
  auto check = [&](const std::string& how) {
    for (size_t i = 0; i < calls.size(); ++i) {
      const call& c = calls[i];
      const moe_config& cfg = c.layer->config();
      std::vector<uint16_t> out(static_cast<size_t>(c.T * cfg.shape.hidden));
      c.out.download(out.data(), out.size() * 2);
      expect_close(out, reference_by_logits(c.x, c.logits, *c.w, cfg, c.T),
                   how + " call " + std::to_string(i) + " T=" + std::to_string(c.T));
    }
  };
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  ws.fill(0xFF);
  new_inputs();
  enqueue(stream);
  CUDA_OK(cudaStreamSynchronize(stream));
  check("stream");
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  enqueue(stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 2; ++rep) {
    new_inputs();
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    check("graph replay " + std::to_string(rep));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// workspace_bytes(max_tokens) covers every smaller T: the total never shrinks as T grows.
TEST(GpuMoeCombine, WorkspaceBytesNeverShrinkWithTokens) {
  std::mt19937 rng(89);
  for (const int k : {1, 8, 16}) {
    const moe_config cfg = make_cfg(512, 64, 32, k, routing_kind::softmax_topk, activation_kind::silu_mul,
                                    layout::gate_up_order::concatenated);
    const host_moe m = make_moe(cfg, false, rng);
    const cuda::moe_layer layer(m.weights(), cfg);
    size_t last = layer.workspace_bytes(0);
    for (int64_t T = 1; T <= 9000; ++T) {
      const size_t b = layer.workspace_bytes(T);
      ASSERT_GE(b, last) << "k " << k << " T " << T;
      last = b;
    }
  }
}

}  // namespace
}  // namespace mxmoe
