// GPU tests of expert and tensor parallelism that one GPU can run (include/mxmoe/parallel.h,
// shard.h, prepare_options in forward.h):
//   GpuParallelMap    layers holding a subset of the experts (the expert map applied by the
//                     routing kernels: the one-CTA plan routing itself, route + plan, the
//                     four-step path; logits and precomputed ids), summed, against the whole layer
//   GpuParallelTp     tensor-parallel shards (uneven 32-blocks) on one GPU, summed
//   GpuParallelLocal  ep_layer / tp_layer over P = 2 ranks of an in-process group on one GPU
//                     (threads, device-to-device copies): the device dispatch, pack and combine
//   GpuParallelNccl   ep_layer / tp_layer over NCCL with one rank (ncclCommInitRank, nranks 1):
//                     the NCCL communicator end to end, eagerly and captured in a CUDA graph;
//                     skipped with the reason when libnccl.so.2 cannot be loaded
//
// Tolerances. A sum over ranks rounds each rank's output to bf16 where the whole layer rounds
// once: for the expert map, whose ranks compute the whole layer's bf16 expert outputs (same T,
// same tiles), |sum - whole| <= 2^-9 (sum |partial| + |whole|) per element (checked with 2^-8).
// Against the float64 reference every parallel result is held to the layer's own documented
// tolerance (cuda::kForwardRelL2Tolerance, kForwardMaxErrTolerance); against the one-GPU layer,
// where tiles or roundings differ (EP receives P*T rows, TP rounds each shard's expert outputs),
// to twice it (both are within it of the reference).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_ok.h"
#include "moe_case.h"
#include "mxmoe/cuda.h"
#include "mxmoe/dtype.h"
#include "mxmoe/forward.h"
#include "mxmoe/moe.h"
#include "mxmoe/parallel.h"
#include "mxmoe/shard.h"
#include "mxmoe/synthetic.h"
#include "mxmoe/verify.h"

namespace mxmoe {
namespace {

using test::to_device;

// Softmax top-k routing (renormalized): the parallel layers do not depend on the routing kind.
moe_config make_cfg(int64_t E, int64_t H, int64_t I, int k, activation_kind act, layout::gate_up_order order) {
  return test::make_cfg(E, H, I, k, routing_kind::softmax_topk, act, order);
}

std::vector<uint16_t> download_bf16(const cuda::device_buffer& b, int64_t n) {
  std::vector<uint16_t> v(static_cast<size_t>(n));
  if (n) b.download(v.data(), v.size() * 2);
  return v;
}

// One call's inputs on the host and the device; routing by logits or by precomputed ids.
struct call_inputs {
  synthetic::layer_inputs in;
  std::vector<int32_t> ids;
  std::vector<float> weights;
  cuda::device_buffer x, logits, ids_d, weights_d;
  bool precomputed = false;

  call_inputs(const moe_config& cfg, const moe_weights& w, int64_t T, uint64_t seed, bool pre) : precomputed(pre) {
    in = synthetic::make_inputs(cfg, w, T, seed);
    const int64_t k = cfg.routing.top_k, E = cfg.shape.experts;
    ids.resize(static_cast<size_t>(T * k));
    weights.resize(ids.size());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) {  // distinct experts per token, every expert reached
        ids[static_cast<size_t>(t * k + j)] = static_cast<int32_t>((t * 5 + j * 3) % E);
        weights[static_cast<size_t>(t * k + j)] = 0.2f + 0.1f * static_cast<float>(j);
      }
    x = to_device(in.x);
    logits = to_device(in.logits);
    ids_d = to_device(ids);
    weights_d = to_device(weights);
  }
  int64_t tokens() const { return in.tokens; }
  tensor_view x_view(int64_t H) const { return x.view(dtype::bf16, {in.tokens, H}); }
  routing_input device_routing(const moe_config& cfg) const {
    routing_input r;
    if (precomputed) {
      r.ids = ids_d.view(dtype::i32, {in.tokens, cfg.routing.top_k});
      r.weights = weights_d.view(dtype::f32, {in.tokens, cfg.routing.top_k});
    } else {
      r.logits = logits.view(dtype::f32, {in.tokens, cfg.shape.experts});
    }
    return r;
  }
  routing_input host_routing(const moe_config& cfg) const {
    routing_input r;
    if (precomputed) {
      r.ids = tensor_view(ids.data(), dtype::i32, {in.tokens, cfg.routing.top_k});
      r.weights = tensor_view(weights.data(), dtype::f32, {in.tokens, cfg.routing.top_k});
    } else {
      r.logits = tensor_view(in.logits.data(), dtype::f32, {in.tokens, cfg.shape.experts});
    }
    return r;
  }
};

// A prepared cuda layer run twice on the same inputs: its bf16 output (both runs bitwise equal).
std::vector<uint16_t> run_layer(const prepared_moe& layer, const call_inputs& c, uint32_t* flags = nullptr) {
  const moe_config& cfg = layer.config();
  const int64_t T = c.tokens(), H = cfg.shape.hidden;
  cuda::device_buffer out(static_cast<size_t>(std::max<int64_t>(1, T * H)) * 2), ws(layer.workspace_bytes(T) + 16);
  std::vector<uint16_t> first;
  for (int rep = 0; rep < 2; ++rep) {
    out.fill(0xFF);
    ws.fill(0xFF);
    moe_forward(layer, c.x_view(H), c.device_routing(cfg), out.view(dtype::bf16, {T, H}), ws.data(), ws.size());
    cuda::synchronize();
    std::vector<uint16_t> got = download_bf16(out, T * H);
    if (rep == 0) {
      first = std::move(got);
    } else {
      EXPECT_EQ(got, first) << "two identical calls differ";
    }
  }
  if (flags) *flags = layer.read_error_flags(ws.data(), ws.size());
  return first;
}

std::vector<float> reference(const moe_weights& w, const moe_config& cfg, const call_inputs& c) {
  std::vector<float> ref(static_cast<size_t>(c.tokens() * cfg.shape.hidden));
  cpu::moe_forward(c.in.x_view(), c.host_routing(cfg), w, cfg,
                   tensor_view(ref.data(), dtype::f32, {c.tokens(), cfg.shape.hidden}), cpu::precision::f64);
  return ref;
}

std::vector<float> to_float(const std::vector<uint16_t>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = bf16_to_float(v[i]);
  return f;
}

// Within the layer's documented tolerance of the float64 reference.
void expect_near_reference(const std::vector<float>& got, const std::vector<float>& ref, const std::string& what) {
  const comparison e = compare(tensor_view(got.data(), dtype::f32, {static_cast<int64_t>(got.size())}),
                               tensor_view(ref.data(), dtype::f32, {static_cast<int64_t>(ref.size())}));
  EXPECT_EQ(e.nonfinite_out, 0) << what;
  EXPECT_LE(e.rel_l2, cuda::kForwardRelL2Tolerance) << what;
  EXPECT_LE(e.max_abs, cuda::kForwardMaxErrTolerance * e.max_ref) << what;
  EXPECT_GT(e.max_ref, 0.0) << what << ": an all-zero reference proves nothing";
  std::printf("  %-44s rel_l2 %.2e  max_err/max_ref %.2e\n", what.c_str(), e.rel_l2,
              e.max_ref > 0 ? e.max_abs / e.max_ref : 0.0);
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  return compare(tensor_view(a.data(), dtype::f32, {static_cast<int64_t>(a.size())}),
                 tensor_view(b.data(), dtype::f32, {static_cast<int64_t>(b.size())}))
      .rel_l2;
}

// ---- expert maps ----------------------------------------------------------------------------

struct map_case {
  const char* name;
  int64_t tokens;
  bool precomputed;
};

// Each routing path: T = 5 the few-token plan (20 pairs), T = 12 the one-CTA plan routes itself,
// T = 40 route + plan, T = 3000 (k = 4: 12000 pairs) the four-step path; precomputed ids through
// the plan and the import kernel.
TEST(GpuParallelMap, SubsetsSumToTheWholeLayer) {
  const moe_config cfg = make_cfg(16, 256, 96, 4, activation_kind::swiglu_clamped, layout::gate_up_order::interleaved);
  const synthetic::mxfp4_layer full = synthetic::make_layer(cfg, {.biases = true}, 41);
  const prepared_moe whole = prepare(full.weights(), cfg, device_kind::cuda);
  const std::vector<int32_t> owners{0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 2, 2, 1, 0};  // three ranks, scattered
  std::vector<prepared_moe> ranks;
  std::vector<owned_weights> held;
  for (int q = 0; q < 3; ++q) {
    held.push_back(select_experts(full.weights(), cfg, expert_map_of(owners, q)));
    ranks.push_back(prepare(held.back().weights(), cfg, device_kind::cuda, {expert_map_of(owners, q), {}}));
  }
  for (const map_case& mc : {map_case{"few-token plan", 5, false}, map_case{"plan routes", 12, false},
                             map_case{"route + plan", 40, false},
                             map_case{"four-step route", 3000, false}, map_case{"plan precomputed", 5, true},
                             map_case{"four-step import", 3000, true}}) {
    const call_inputs c(cfg, full.weights(), mc.tokens, 42, mc.precomputed);
    const std::vector<uint16_t> want = run_layer(whole, c);
    std::vector<std::vector<uint16_t>> parts;
    for (int q = 0; q < 3; ++q) {
      uint32_t flags = 1234;
      parts.push_back(run_layer(ranks[static_cast<size_t>(q)], c, &flags));
      EXPECT_EQ(flags, 0u) << mc.name << ": a slot held elsewhere is not an error";
    }
    // Slack for the float32 sums behind the roundings: 2^-20 of the largest output.
    float max_want = 0.0f;
    for (uint16_t v : want) max_want = std::max(max_want, std::fabs(bf16_to_float(v)));
    std::vector<float> sum(want.size(), 0.0f);
    int64_t over = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      double mag = std::fabs(bf16_to_float(want[i]));
      for (const auto& p : parts) {
        sum[i] += bf16_to_float(p[i]);
        mag += std::fabs(bf16_to_float(p[i]));
      }
      over += std::fabs(sum[i] - bf16_to_float(want[i])) > std::ldexp(mag, -8) + std::ldexp(max_want, -20) ? 1 : 0;
    }
    EXPECT_EQ(over, 0) << mc.name << ": elements beyond the rounding of the partial sums";
    expect_near_reference(sum, reference(full.weights(), cfg, c), std::string("map sum, ") + mc.name);
  }
}

// A rank none of whose experts a token picked gives that token exactly 0; an id outside [0, E)
// is still dropped and flagged, one held elsewhere is not flagged.
TEST(GpuParallelMap, RemoteSlotsGiveZeroAndBadIdsAreStillFlagged) {
  constexpr int64_t H = 256;
  const moe_config cfg = make_cfg(8, H, 64, 2, activation_kind::silu_mul, layout::gate_up_order::concatenated);
  const synthetic::mxfp4_layer full = synthetic::make_layer(cfg, {.biases = true}, 43);
  const std::vector<int32_t> map{0, 1, -1, -1, -1, -1, -1, -1};
  const owned_weights mine = select_experts(full.weights(), cfg, map);
  const prepared_moe layer = prepare(mine.weights(), cfg, device_kind::cuda, {map, {}});
  for (int64_t T : {4, 5000}) {  // the one-CTA plan; the import kernel (10000 pairs)
    call_inputs c(cfg, full.weights(), T, 44, true);
    for (int64_t t = 0; t < T; ++t) {  // odd tokens on experts 5, 6 (held elsewhere); even on 0 and 7
      c.ids[static_cast<size_t>(2 * t)] = t % 2 ? 5 : 0;
      c.ids[static_cast<size_t>(2 * t + 1)] = t % 2 ? 6 : 7;
    }
    c.ids_d = to_device(c.ids);
    uint32_t flags = 1234;
    const std::vector<uint16_t> out = run_layer(layer, c, &flags);
    EXPECT_EQ(flags, 0u);
    for (int64_t t = 1; t < T; t += 2)
      for (int64_t n = 0; n < H; ++n) ASSERT_EQ(out[static_cast<size_t>(t * H + n)], 0) << "T " << T << " token " << t;
    std::vector<float> ref(out.size());
    cpu::moe_forward(c.in.x_view(), c.host_routing(cfg), mine.weights(), cfg, tensor_view(ref.data(), dtype::f32, {T, H}),
                     cpu::precision::f64, 0, map);
    expect_near_reference(to_float(out), ref, "map of two experts, T " + std::to_string(T));
    c.ids[1] = 8;  // out of range
    c.ids_d = to_device(c.ids);
    run_layer(layer, c, &flags);
    EXPECT_EQ(flags, 1u) << "T " << T;
  }
}

// ---- tensor-parallel shards on one GPU ---------------------------------------------------------

TEST(GpuParallelTp, ShardsSumToTheWholeLayer) {
  for (const auto& [inter, P, act, order] :
       {std::tuple{int64_t{2880}, 8, activation_kind::swiglu_clamped, layout::gate_up_order::interleaved},
        std::tuple{int64_t{544}, 3, activation_kind::silu_mul, layout::gate_up_order::concatenated}}) {
    const moe_config cfg = make_cfg(4, 256, inter, 2, act, order);
    const synthetic::mxfp4_layer full = synthetic::make_layer(cfg, {.biases = true}, 45);
    const prepared_moe whole = prepare(full.weights(), cfg, device_kind::cuda);
    for (int64_t T : {3, 70}) {
      const call_inputs c(cfg, full.weights(), T, 46, false);
      const std::vector<float> want = to_float(run_layer(whole, c));
      std::vector<float> sum(want.size(), 0.0f);
      for (int r = 0; r < P; ++r) {
        const prepared_moe shard = prepare(full.weights(), cfg, device_kind::cuda, {{}, {r, P}});
        ASSERT_EQ(shard.config().shape.intermediate, shard_intermediate(inter, {r, P}));
        const std::vector<uint16_t> part = run_layer(shard, c);
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += bf16_to_float(part[i]);
      }
      const std::string what = "I " + std::to_string(inter) + " over " + std::to_string(P) + ", T " + std::to_string(T);
      expect_near_reference(sum, reference(full.weights(), cfg, c), "tp sum, " + what);
      EXPECT_LE(rel_l2(sum, want), 2 * cuda::kForwardRelL2Tolerance) << what << ": against the one-GPU layer";
    }
  }
}

// ---- the parallel layers over an in-process group on one GPU ---------------------------------

// Rank r's tokens: seed 50 + r. Returns each rank's output of two forwards (bitwise equal).
std::vector<std::vector<uint16_t>> run_ep_local(const synthetic::mxfp4_layer& full, const std::vector<call_inputs>& c,
                                               int64_t capacity, std::vector<uint32_t>* flags) {
  const moe_config& cfg = full.cfg;
  const int P = static_cast<int>(c.size());
  const int64_t T = c[0].tokens(), H = cfg.shape.hidden;
  const std::vector<int32_t> owners = contiguous_owners(cfg.shape.experts, P);
  auto group = parallel::make_local_group(P, device_kind::cuda);
  std::vector<std::vector<uint16_t>> out(static_cast<size_t>(P));
  flags->assign(static_cast<size_t>(P), 0);
  parallel::run_ranks(P, [&](int r) {
    const owned_weights mine = select_experts(full.weights(), cfg, expert_map_of(owners, r));
    parallel::ep_layer ep(mine.weights(), cfg, *group[static_cast<size_t>(r)],
                          {.owners = owners, .max_tokens = T, .capacity = capacity});
    cuda::device_buffer dout(static_cast<size_t>(T * H) * 2);
    for (int rep = 0; rep < 2; ++rep) {
      dout.fill(0xFF);
      ep.forward(c[static_cast<size_t>(r)].x_view(H), c[static_cast<size_t>(r)].device_routing(cfg),
                 dout.view(dtype::bf16, {T, H}));
      cuda::synchronize();
      std::vector<uint16_t> got = download_bf16(dout, T * H);
      if (rep == 0) {
        out[static_cast<size_t>(r)] = std::move(got);
      } else {
        EXPECT_EQ(got, out[static_cast<size_t>(r)]) << "rank " << r << ": two identical calls differ";
      }
    }
    (*flags)[static_cast<size_t>(r)] = ep.read_error_flags();
  });
  return out;
}

TEST(GpuParallelLocal, ExpertParallelTwoRanksMatchTheLayer) {
  const moe_config cfg = make_cfg(16, 256, 96, 4, activation_kind::swiglu_clamped, layout::gate_up_order::interleaved);
  const synthetic::mxfp4_layer full = synthetic::make_layer(cfg, {.biases = true}, 51);
  const prepared_moe whole = prepare(full.weights(), cfg, device_kind::cuda);
  for (const auto& [T, pre] : {std::pair{int64_t{6}, false}, std::pair{int64_t{6}, true}, std::pair{int64_t{300}, false}}) {
    std::vector<call_inputs> c;
    for (int r = 0; r < 2; ++r) c.emplace_back(cfg, full.weights(), T, 50 + static_cast<uint64_t>(r), pre);
    std::vector<uint32_t> flags;
    const auto out = run_ep_local(full, c, 0, &flags);
    for (int r = 0; r < 2; ++r) {
      const std::string what = "ep rank " + std::to_string(r) + " T " + std::to_string(T) + (pre ? " ids" : " logits");
      EXPECT_EQ(flags[static_cast<size_t>(r)], 0u) << what;
      const std::vector<float> got = to_float(out[static_cast<size_t>(r)]);
      expect_near_reference(got, reference(full.weights(), cfg, c[static_cast<size_t>(r)]), what);
      EXPECT_LE(rel_l2(got, to_float(run_layer(whole, c[static_cast<size_t>(r)]))), 2 * cuda::kForwardRelL2Tolerance)
          << what << ": against the one-GPU layer";
    }
  }
}

// Every token on rank 1's experts with a capacity of 3: the first three tokens of each rank are
// served, the others get exactly 0, and bit 1 is set; rank 0 receives only unused rows.
TEST(GpuParallelLocal, CapacityOverflowIsFlaggedAndDropsOnlyLateTokens) {
  constexpr int64_t T = 6, H = 256, served = 3 * H;
  const moe_config cfg = make_cfg(8, H, 64, 2, activation_kind::silu_mul, layout::gate_up_order::concatenated);
  const synthetic::mxfp4_layer full = synthetic::make_layer(cfg, {.biases = false}, 52);
  std::vector<call_inputs> c;
  for (int r = 0; r < 2; ++r) {
    c.emplace_back(cfg, full.weights(), T, 53 + static_cast<uint64_t>(r), true);
    for (size_t p = 0; p < c.back().ids.size(); ++p) c.back().ids[p] = 4 + static_cast<int32_t>(p % 2);  // experts 4, 5
    c.back().ids_d = to_device(c.back().ids);
  }
  std::vector<uint32_t> flags;
  const auto out = run_ep_local(full, c, 3, &flags);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(flags[static_cast<size_t>(r)], parallel::kOverflowFlag) << "rank " << r;
    std::vector<float> ref(static_cast<size_t>(T * H));
    cpu::moe_forward(c[static_cast<size_t>(r)].in.x_view(), c[static_cast<size_t>(r)].host_routing(cfg), full.weights(),
                     cfg, tensor_view(ref.data(), dtype::f32, {T, H}), cpu::precision::f64);
    const std::vector<float> got = to_float(out[static_cast<size_t>(r)]);
    expect_near_reference(std::vector<float>(got.begin(), got.begin() + served),
                          std::vector<float>(ref.begin(), ref.begin() + served), "served tokens, rank " + std::to_string(r));
    for (size_t i = served; i < got.size(); ++i) ASSERT_EQ(got[i], 0.0f) << "rank " << r << " element " << i;
  }
}

TEST(GpuParallelLocal, TensorParallelTwoRanksAgreeAndMatchTheLayer) {
  const moe_config cfg = make_cfg(6, 256, 352, 2, activation_kind::swiglu_clamped, layout::gate_up_order::interleaved);
  const synthetic::mxfp4_layer full = synthetic::make_layer(cfg, {.biases = true}, 54);
  const call_inputs c(cfg, full.weights(), 9, 55, false);
  const int64_t T = 9, H = 256;
  std::vector<std::vector<uint16_t>> out(2);
  auto group = parallel::make_local_group(2, device_kind::cuda);
  parallel::run_ranks(2, [&](int r) {
    parallel::tp_layer tp(full.weights(), cfg, *group[static_cast<size_t>(r)], {.max_tokens = T});
    cuda::device_buffer dout(static_cast<size_t>(T * H) * 2);
    tp.forward(c.x_view(H), c.device_routing(cfg), dout.view(dtype::bf16, {T, H}));
    cuda::synchronize();
    out[static_cast<size_t>(r)] = download_bf16(dout, T * H);
    EXPECT_EQ(tp.read_error_flags(), 0u);
  });
  EXPECT_EQ(out[0], out[1]) << "the ranks of a TP group end with different bits";
  expect_near_reference(to_float(out[0]), reference(full.weights(), cfg, c), "tp 2 ranks, I 352 (6 + 5 blocks)");
}

// ---- NCCL with one rank --------------------------------------------------------------------

std::unique_ptr<parallel::communicator> single_rank_nccl() {
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  return parallel::nccl_communicator(parallel::nccl_new_unique_id(), 0, 1);
}

#define SKIP_WITHOUT_NCCL()                                         \
  do {                                                              \
    std::string why;                                                \
    if (!parallel::nccl_available(&why)) GTEST_SKIP() << "NCCL: " << why; \
  } while (0)

// One rank holds every expert: the dispatch sends every token to itself through NCCL and the
// output is the one-GPU layer's, bit for bit (same rows, same tiles, one partial).
TEST(GpuParallelNccl, SingleRankExpertParallelIsTheLayer) {
  SKIP_WITHOUT_NCCL();
  auto comm = single_rank_nccl();
  std::printf("  communicator: %s\n", comm->name().c_str());
  const moe_config cfg = make_cfg(16, 128, 96, 4, activation_kind::swiglu_clamped, layout::gate_up_order::interleaved);
  const synthetic::mxfp4_layer full = synthetic::make_layer(cfg, {.biases = true}, 61);
  const prepared_moe whole = prepare(full.weights(), cfg, device_kind::cuda);
  parallel::ep_layer ep(full.weights(), cfg, *comm, {.owners = {}, .max_tokens = 64});
  for (bool pre : {true, false}) {
    const call_inputs c(cfg, full.weights(), 37, 62, pre);
    cuda::device_buffer dout(37 * 128 * 2);
    ep.forward(c.x_view(128), c.device_routing(cfg), dout.view(dtype::bf16, {37, 128}));
    cuda::synchronize();
    const std::vector<uint16_t> got = download_bf16(dout, 37 * 128);
    EXPECT_EQ(ep.read_error_flags(), 0u);
    if (pre) {
      EXPECT_EQ(got, run_layer(whole, c)) << "precomputed ids: the one-GPU layer's bits";
    }
    expect_near_reference(to_float(got), reference(full.weights(), cfg, c),
                          std::string("nccl ep P=1, ") + (pre ? "ids" : "logits"));
  }
  parallel::tp_layer tp(full.weights(), cfg, *comm, {.max_tokens = 64});
  const call_inputs c(cfg, full.weights(), 20, 63, true);
  cuda::device_buffer dout(20 * 128 * 2);
  tp.forward(c.x_view(128), c.device_routing(cfg), dout.view(dtype::bf16, {20, 128}));
  cuda::synchronize();
  EXPECT_EQ(download_bf16(dout, 20 * 128), run_layer(whole, c)) << "tp P=1: the layer's bits";
}

// The NCCL path captured in a CUDA graph (after one eager call, which lets NCCL connect), replayed
// with new inputs: the eager result's bits each time.
TEST(GpuParallelNccl, SingleRankForwardCapturedInAGraph) {
  SKIP_WITHOUT_NCCL();
  auto comm = single_rank_nccl();
  const moe_config cfg = make_cfg(16, 128, 96, 4, activation_kind::silu_mul, layout::gate_up_order::concatenated);
  const synthetic::mxfp4_layer full = synthetic::make_layer(cfg, {.biases = false}, 64);
  parallel::ep_layer ep(full.weights(), cfg, *comm, {.owners = {}, .max_tokens = 16});
  call_inputs c(cfg, full.weights(), 16, 65, false);
  cuda::device_buffer dout(16 * 128 * 2);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ep.forward(c.x_view(128), c.device_routing(cfg), dout.view(dtype::bf16, {16, 128}), s);
  CUDA_OK(cudaStreamSynchronize(s));
  const std::vector<uint16_t> eager = download_bf16(dout, 16 * 128);
  cudaGraph_t g;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  ep.forward(c.x_view(128), c.device_routing(cfg), dout.view(dtype::bf16, {16, 128}), s);
  CUDA_OK(cudaStreamEndCapture(s, &g));
  CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
  dout.fill(0xFF);
  CUDA_OK(cudaGraphLaunch(exec, s));
  CUDA_OK(cudaStreamSynchronize(s));
  EXPECT_EQ(download_bf16(dout, 16 * 128), eager) << "the replay differs from the eager call";
  const call_inputs other(cfg, full.weights(), 16, 66, false);  // new inputs in the captured buffers
  c.x.upload(other.in.x.data(), other.in.x.size() * 2);
  c.logits.upload(other.in.logits.data(), other.in.logits.size() * 4);
  CUDA_OK(cudaGraphLaunch(exec, s));
  CUDA_OK(cudaStreamSynchronize(s));
  expect_near_reference(to_float(download_bf16(dout, 16 * 128)), reference(full.weights(), cfg, other),
                        "nccl ep P=1 graph replay, new inputs");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace mxmoe
