// Tests of expert and tensor parallelism on the CPU (include/mxmoe/shard.h, parallel.h): the
// expert map of the reference layer, the tensor-parallel cuts of the weights, and the EP / TP layers
// over P simulated ranks (make_local_group: threads and plain copies, no NCCL) against the
// single-layer reference.
//
// Two kinds of check. By definition: the EP layer's output is, bit for bit, the f32 sum in rank
// order of the per-rank layers (cpu backend with each rank's expert map) over the tokens each rank
// was sent, which proves the dispatch bookkeeping (positions, padding, return, combine); the TP
// layer's output is the same sum over the shards. Against the float64 reference of the whole layer:
// within the cpu backend's tolerance (tolerance_for(cpu), rel-L2 1e-4; the float32 error is ~1e-7).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "mxmoe/error.h"
#include "mxmoe/forward.h"
#include "mxmoe/layout.h"
#include "mxmoe/moe.h"
#include "mxmoe/parallel.h"
#include "mxmoe/shard.h"
#include "mxmoe/synthetic.h"
#include "mxmoe/verify.h"

using namespace mxmoe;

namespace {

moe_config make_cfg(int64_t experts, int64_t hidden, int64_t inter, int top_k, activation_kind act,
                    layout::gate_up_order order, routing_kind kind = routing_kind::softmax_topk) {
  moe_config c;
  c.shape = {experts, hidden, inter};
  c.routing.kind = kind;
  c.routing.top_k = top_k;
  if (kind == routing_kind::sigmoid_grouped_topk) {
    c.routing.n_group = 4;
    c.routing.topk_group = 2;
    c.routing.routed_scaling_factor = 2.5f;
  }
  c.activation.kind = act;
  c.gate_up = order;
  return c;
}

synthetic::mxfp4_layer make_layer(const moe_config& cfg, bool biases, uint64_t seed) {
  return synthetic::make_layer(
      cfg, {.biases = biases, .correction_bias = cfg.routing.kind == routing_kind::sigmoid_grouped_topk}, seed);
}

// The float64 reference of the whole layer, f32 [T, H].
std::vector<float> reference(const moe_weights& w, const moe_config& cfg, const tensor_view& x,
                             const routing_input& r, const std::vector<int32_t>& map = {}) {
  std::vector<float> out(static_cast<size_t>(x.dim(0) * cfg.shape.hidden));
  cpu::moe_forward(x, r, w, cfg, tensor_view(out.data(), dtype::f32, {x.dim(0), cfg.shape.hidden}), cpu::precision::f64,
                   0, map);
  return out;
}

// The cpu backend (f32) of a layer holding `map`'s experts.
std::vector<float> backend(const moe_weights& w, const moe_config& cfg, const tensor_view& x, const routing_input& r,
                           const std::vector<int32_t>& map = {}) {
  std::vector<float> out(static_cast<size_t>(x.dim(0) * cfg.shape.hidden));
  cpu::moe_forward(x, r, w, cfg, tensor_view(out.data(), dtype::f32, {x.dim(0), cfg.shape.hidden}), cpu::precision::f32,
                   0, map);
  return out;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  return compare(tensor_view(a.data(), dtype::f32, {static_cast<int64_t>(a.size())}),
                 tensor_view(b.data(), dtype::f32, {static_cast<int64_t>(b.size())}))
      .rel_l2;
}

double norm(const std::vector<float>& a) {
  double s = 0;
  for (float v : a) s += static_cast<double>(v) * v;
  return std::sqrt(s);
}

// Expert ids and weights from logits by the routing cpu::route defines.
struct routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
  routing_input input(int64_t t, int k) const {
    routing_input r;
    r.ids = tensor_view(ids.data(), dtype::i32, {t, k});
    r.weights = tensor_view(weights.data(), dtype::f32, {t, k});
    return r;
  }
};
routed route(const synthetic::layer_inputs& in, const synthetic::mxfp4_layer& l) {
  const int64_t T = in.tokens, k = l.cfg.routing.top_k, E = l.cfg.shape.experts;
  routed r;
  r.ids.resize(static_cast<size_t>(T * k));
  r.weights.resize(r.ids.size());
  cpu::route(tensor_view(in.logits.data(), dtype::f32, {T, E}), l.weights().correction_bias, l.cfg.routing,
             tensor_view(r.ids.data(), dtype::i32, {T, k}), tensor_view(r.weights.data(), dtype::f32, {T, k}));
  return r;
}

// ---- the expert map of the reference layer ---------------------------------------------------

TEST(ExpertMap, MalformedMapsAreRejected) {
  const moe_config cfg = make_cfg(4, 32, 32, 2, activation_kind::silu_mul, layout::gate_up_order::concatenated);
  const synthetic::mxfp4_layer full = make_layer(cfg, false, 1);
  const owned_weights two = select_experts(full.weights(), cfg, {0, -1, 1, -1});
  for (const std::vector<int32_t>& bad : std::vector<std::vector<int32_t>>{
           {0, 1, -1},         // wrong size
           {0, -1, 2, -1},     // local index 2 with two experts held
           {0, -1, 0, -1},     // local index 0 twice (and 1 never)
           {-1, -1, -1, -1},   // nothing held
           {0, -2, 1, -1}}) {  // -2
    try {
      validate(two.weights(), cfg, bad);
      FAIL() << "accepted a malformed expert map";
    } catch (const invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("expert_map"), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(validate(two.weights(), cfg, {0, -1, 1, -1}));
  // The expert tensors hold the map's experts: the whole layer's do not fit a map of two.
  EXPECT_THROW(validate(full.weights(), cfg, {0, -1, 1, -1}), invalid_argument);
}

// Ranks whose maps partition the experts: their outputs sum to the whole layer's, for contiguous
// and scattered placements, with biases, and with routing that leaves experts and whole ranks empty.
TEST(ExpertMap, PartitionSumsToTheLayer) {
  for (const auto& [act, order] :
       {std::pair{activation_kind::swiglu_clamped, layout::gate_up_order::interleaved},
        std::pair{activation_kind::silu_mul, layout::gate_up_order::concatenated}}) {
    const moe_config cfg = make_cfg(8, 64, 96, 2, act, order);
    const synthetic::mxfp4_layer full = make_layer(cfg, true, 3);
    synthetic::layer_inputs in = synthetic::make_inputs(cfg, full.weights(), 13, 4);
    routed r = route(in, full);
    for (int pass = 0; pass < 2; ++pass) {
      if (pass == 1)  // every token on experts 1 and 2: experts 0 and 3..7 empty, rank 2 of {0..2} idle
        for (size_t p = 0; p < r.ids.size(); ++p) r.ids[p] = 1 + static_cast<int32_t>(p % 2);
      const routing_input ri = r.input(in.tokens, 2);
      const std::vector<float> want = reference(full.weights(), cfg, in.x_view(), ri);
      for (const std::vector<int32_t>& owners :
           {contiguous_owners(8, 3), std::vector<int32_t>{2, 0, 1, 0, 2, 2, 1, 0}, contiguous_owners(8, 8)}) {
        std::vector<double> sum(want.size(), 0.0);
        int ranks = 0;
        for (int32_t o : owners) ranks = std::max(ranks, o + 1);
        for (int q = 0; q < ranks; ++q) {
          const std::vector<int32_t> map = expert_map_of(owners, q);
          const owned_weights mine = select_experts(full.weights(), cfg, map);
          const std::vector<float> part = reference(mine.weights(), cfg, in.x_view(), ri, map);
          for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
        }
        const std::vector<float> got(sum.begin(), sum.end());
        EXPECT_LT(rel_l2(got, want), 1e-6) << "pass " << pass << " ranks " << ranks;
        EXPECT_GT(norm(want), 0.0);
      }
    }
  }
}

// A token none of whose experts a rank holds gets exactly 0 there; prepare() takes the map.
TEST(ExpertMap, TokensRoutedElsewhereGiveZeroAndPrepareTakesTheMap) {
  const moe_config cfg = make_cfg(6, 32, 64, 2, activation_kind::silu_mul, layout::gate_up_order::concatenated);
  const synthetic::mxfp4_layer full = make_layer(cfg, true, 5);
  const synthetic::layer_inputs in = synthetic::make_inputs(cfg, full.weights(), 4, 6);
  const std::vector<int32_t> ids{0, 1, 4, 5, 0, 5, 2, 3}, map{0, 1, -1, -1, -1, -1};
  const std::vector<float> w(8, 0.5f);
  routing_input ri;
  ri.ids = tensor_view(ids.data(), dtype::i32, {4, 2});
  ri.weights = tensor_view(w.data(), dtype::f32, {4, 2});
  const owned_weights mine = select_experts(full.weights(), cfg, map);
  const prepared_moe layer = prepare(mine.weights(), cfg, device_kind::cpu, {map, {}});
  EXPECT_EQ(layer.expert_map(), map);
  std::vector<float> out(static_cast<size_t>(4 * 32), -1.0f);
  moe_forward_host(layer, in.x_view(), ri, tensor_view(out.data(), dtype::f32, {4, 32}));
  EXPECT_EQ(out, backend(mine.weights(), cfg, in.x_view(), ri, map));
  for (int64_t t : {1, 3})  // experts 4, 5 and 2, 3: none held
    for (int64_t n = 0; n < 32; ++n) EXPECT_EQ(out[static_cast<size_t>(t * 32 + n)], 0.0f) << t;
  EXPECT_GT(norm(std::vector<float>(out.begin(), out.begin() + 32)), 0.0);
  // Out-of-range ids are still an error.
  std::vector<int32_t> bad = ids;
  bad[3] = 6;
  ri.ids = tensor_view(bad.data(), dtype::i32, {4, 2});
  EXPECT_THROW(moe_forward_host(layer, in.x_view(), ri, tensor_view(out.data(), dtype::f32, {4, 32})), invalid_argument);
}

// ---- tensor-parallel cuts -----------------------------------------------------------------------

// Every byte of the layer is found, through layout::even_split's inverse and gate_up_rows, in the
// one shard that holds it (the last shard's rows included), and the shards hold nothing else.
TEST(Shard, EveryBlockInItsShardAndNothingElse) {
  for (const auto& [inter, ranks, order] :
       {std::tuple{int64_t{2880}, 8, layout::gate_up_order::interleaved},
        std::tuple{int64_t{544}, 3, layout::gate_up_order::concatenated}}) {
    const moe_config cfg = make_cfg(2, 64, inter, 1, activation_kind::silu_mul, order);
    const synthetic::mxfp4_layer full = make_layer(cfg, true, 7);
    const int64_t E = 2, H = 64, B = inter / 32;
    const layout::even_split split{B, ranks};
    std::vector<owned_weights> shards;
    int64_t total_i = 0;
    for (int r = 0; r < ranks; ++r) {
      shards.push_back(shard_weights(full.weights(), cfg, {r, ranks}));
      EXPECT_EQ(shards.back().cfg.shape.intermediate, split.count(r) * 32);
      EXPECT_EQ(shard_intermediate(inter, {r, ranks}), split.count(r) * 32);
      EXPECT_EQ(shard_begin(inter, {r, ranks}), split.begin(r) * 32);
      total_i += shards.back().cfg.shape.intermediate;
      EXPECT_NO_THROW(validate(shards.back().weights(), shards.back().cfg));
      EXPECT_EQ(shards.back().down_bias.shape.empty(), r != 0) << "the down bias lives on rank 0 only";
    }
    ASSERT_EQ(total_i, inter);
    const layout::gate_up_rows whole{inter, order};
    const layout::checkpoint_mxfp4 gu{E, 2 * inter, H}, dn{E, H, inter};
    size_t shard_bytes = 0, whole_bytes = full.gate_up_blocks.size() + full.gate_up_scales.size() +
                                         full.down_blocks.size() + full.down_scales.size();
    for (const owned_weights& s : shards)
      shard_bytes += s.gate_up_blocks.bytes.size() + s.gate_up_scales.bytes.size() + s.down_blocks.bytes.size() +
                     s.down_scales.bytes.size();
    EXPECT_EQ(shard_bytes, whole_bytes);
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t i = 0; i < inter; ++i) {
        const int64_t r = split.part_of(i / 32), j = i - split.begin(r) * 32, ir = split.count(r) * 32;
        const owned_weights& s = shards[static_cast<size_t>(r)];
        const layout::gate_up_rows part{ir, order};
        const layout::checkpoint_mxfp4 sgu{E, 2 * ir, H};
        for (int up = 0; up < 2; ++up) {
          const int64_t src = whole.checkpoint_row(i, up), dst = part.checkpoint_row(j, up);
          ASSERT_EQ(0, std::memcmp(full.gate_up_blocks.data() + gu.code_offset(e, src, 0).byte,
                                   s.gate_up_blocks.bytes.data() + sgu.code_offset(e, dst, 0).byte,
                                   static_cast<size_t>(gu.row_bytes())))
              << "I " << inter << " e " << e << " i " << i << " up " << up;
          ASSERT_EQ(0, std::memcmp(full.gate_up_scales.data() + gu.scale_offset(e, src, 0),
                                   s.gate_up_scales.bytes.data() + sgu.scale_offset(e, dst, 0),
                                   static_cast<size_t>(gu.scale_cols())));
          ASSERT_EQ(full.gate_up_bias[static_cast<size_t>(e * 2 * inter + src)],
                    reinterpret_cast<const uint16_t*>(s.gate_up_bias.bytes.data())[e * 2 * ir + dst]);
        }
      }
      for (int64_t n = 0; n < H; ++n)
        for (int64_t b = 0; b < B; ++b) {
          const int64_t r = split.part_of(b), j = split.index_in_part(b);
          const owned_weights& s = shards[static_cast<size_t>(r)];
          const layout::checkpoint_mxfp4 sdn{E, H, split.count(r) * 32};
          ASSERT_EQ(0, std::memcmp(full.down_blocks.data() + dn.code_offset(e, n, b * 32).byte,
                                   s.down_blocks.bytes.data() + sdn.code_offset(e, n, j * 32).byte, 16));
          ASSERT_EQ(full.down_scales[static_cast<size_t>(dn.scale_offset(e, n, b))],
                    s.down_scales.bytes[static_cast<size_t>(sdn.scale_offset(e, n, j))]);
        }
    }
  }
}

// The shards' outputs sum to the layer, I = 2880 over 8 ranks (11.25 blocks each) and 544 over 3;
// without the last shard they do not.
TEST(Shard, PartialOutputsSumToTheLayer) {
  for (const auto& [inter, ranks, act, order] :
       {std::tuple{int64_t{2880}, 8, activation_kind::swiglu_clamped, layout::gate_up_order::interleaved},
        std::tuple{int64_t{544}, 3, activation_kind::silu_mul, layout::gate_up_order::concatenated}}) {
    const moe_config cfg = make_cfg(3, 64, inter, 2, act, order);
    const synthetic::mxfp4_layer full = make_layer(cfg, true, 9);
    const synthetic::layer_inputs in = synthetic::make_inputs(cfg, full.weights(), 5, 10);
    const std::vector<float> want = reference(full.weights(), cfg, in.x_view(), in.routing());
    std::vector<double> sum(want.size(), 0.0), last;
    for (int r = 0; r < ranks; ++r) {
      const owned_weights s = shard_weights(full.weights(), cfg, {r, ranks});
      const std::vector<float> part = reference(s.weights(), s.cfg, in.x_view(), in.routing());
      if (r == ranks - 1) last.assign(part.begin(), part.end());
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
    }
    EXPECT_LT(rel_l2(std::vector<float>(sum.begin(), sum.end()), want), 1e-6) << "I " << inter;
    std::vector<float> without_last(sum.size());
    for (size_t i = 0; i < sum.size(); ++i) without_last[i] = static_cast<float>(sum[i] - last[i]);
    EXPECT_GT(rel_l2(without_last, want), 1e-2) << "the last shard carries part of the layer";
  }
}

TEST(Shard, BadShardsAreRejected) {
  const moe_config cfg = make_cfg(2, 32, 96, 1, activation_kind::silu_mul, layout::gate_up_order::concatenated);
  const synthetic::mxfp4_layer full = make_layer(cfg, false, 11);
  EXPECT_THROW(shard_weights(full.weights(), cfg, {0, 4}), invalid_argument);  // 3 blocks over 4 ranks
  EXPECT_THROW(shard_weights(full.weights(), cfg, {3, 3}), invalid_argument);
  EXPECT_THROW(shard_weights(full.weights(), cfg, {-1, 2}), invalid_argument);
  EXPECT_NO_THROW(shard_weights(full.weights(), cfg, {2, 3}));
  // prepare() cuts the shard itself.
  const prepared_moe p = prepare(full.weights(), cfg, device_kind::cpu, {{}, {2, 3}});
  EXPECT_EQ(p.config().shape.intermediate, 32);
  EXPECT_THROW(contiguous_owners(4, 5), invalid_argument);
  EXPECT_THROW(expert_map_of({0, 0, 1}, 2), invalid_argument);
}

// ---- the in-process communicator -------------------------------------------------------------

TEST(LocalGroup, AllToAllAndAllGatherMoveTheRightBytes) {
  constexpr int P = 3;
  auto group = parallel::make_local_group(P, device_kind::cpu);
  std::vector<std::vector<int32_t>> recv_a(P, std::vector<int32_t>(2 * P)), recv_b(P, std::vector<int32_t>(P)),
      gathered(P, std::vector<int32_t>(3 * P));
  parallel::run_ranks(P, [&](int r) {
    std::vector<int32_t> a(2 * P), b(P), mine{100 * r, 100 * r + 1, 100 * r + 2};
    for (int q = 0; q < P; ++q) {
      a[2 * q] = 10 * r + q;  // two words for q
      a[2 * q + 1] = -(10 * r + q);
      b[q] = 1000 + 10 * r + q;
    }
    parallel::communicator& c = *group[static_cast<size_t>(r)];
    c.all_to_all({{a.data(), recv_a[static_cast<size_t>(r)].data(), 8}, {b.data(), recv_b[static_cast<size_t>(r)].data(), 4}},
                 nullptr);
    c.all_gather(mine.data(), gathered[static_cast<size_t>(r)].data(), 12, nullptr);
  });
  for (int r = 0; r < P; ++r)
    for (int q = 0; q < P; ++q) {
      EXPECT_EQ(recv_a[r][2 * q], 10 * q + r) << "rank " << r << " from " << q;
      EXPECT_EQ(recv_a[r][2 * q + 1], -(10 * q + r));
      EXPECT_EQ(recv_b[r][q], 1000 + 10 * q + r);
      for (int j = 0; j < 3; ++j) EXPECT_EQ(gathered[r][3 * q + j], 100 * q + j);
    }
  // Different sizes on different ranks: every rank throws, none hangs.
  int threw = 0;
  std::mutex m;
  parallel::run_ranks(P, [&](int r) {
    std::vector<uint8_t> s(16 * P), d(16 * P);
    try {
      group[static_cast<size_t>(r)]->all_to_all({{s.data(), d.data(), r == 1 ? size_t{8} : size_t{16}}}, nullptr);
    } catch (const invalid_argument&) {
      std::lock_guard<std::mutex> lock(m);
      ++threw;
    }
  });
  EXPECT_EQ(threw, P);
}

// ---- expert parallelism over simulated ranks ---------------------------------------------------

enum class source { logits, precomputed, router_weights };

struct ep_case {
  int ranks = 2;
  int64_t tokens = 11, capacity = 0;
  moe_config cfg;
  source src = source::logits;
  std::vector<int32_t> owners;  // empty: contiguous
  // Overrides the routed ids of rank r's tokens (precomputed routing); null: keep the routing's.
  std::function<void(int, std::vector<int32_t>&)> force_ids;
};

struct ep_result {
  std::vector<std::vector<float>> out, again, expect, ref;
  std::vector<uint32_t> flags;
};

// Rank r's tokens: seed 100 + r. Expected by definition: for each token, the sum over the ranks it
// went to (token order positions < capacity) of that rank's expert-map layer output, in rank order.
ep_result run_ep(const ep_case& c, uint64_t seed) {
  const moe_config& cfg = c.cfg;
  const int64_t E = cfg.shape.experts, H = cfg.shape.hidden, T = c.tokens;
  const int k = cfg.routing.top_k, P = c.ranks;
  synthetic::mxfp4_layer full = make_layer(cfg, true, seed);
  std::vector<uint16_t> router;  // bf16 [E, H] when the layer routes from its router weights
  moe_weights fw = full.weights();
  if (c.src == source::router_weights) {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::normal_distribution<float> nd(0.0f, 0.2f);
    router.resize(static_cast<size_t>(E * H));
    for (auto& v : router) v = float_to_bf16(nd(rng));
    fw.router_weight = tensor_view(router.data(), dtype::bf16, {E, H});
  }
  const std::vector<int32_t> owners = c.owners.empty() ? contiguous_owners(E, P) : c.owners;
  std::vector<synthetic::layer_inputs> in;
  std::vector<routed> routes;
  for (int r = 0; r < P; ++r) {
    in.push_back(synthetic::make_inputs(cfg, fw, T, 100 + static_cast<uint64_t>(r)));
    routes.push_back(route(in.back(), full));
    if (c.force_ids) c.force_ids(r, routes.back().ids);
  }
  const auto routing_of = [&](int r) {
    if (c.src == source::logits) return in[static_cast<size_t>(r)].routing();
    if (c.src == source::router_weights) return routing_input{};
    return routes[static_cast<size_t>(r)].input(T, k);
  };

  ep_result res;
  res.out.assign(P, std::vector<float>(static_cast<size_t>(T * H), -7.0f));
  res.again = res.out;
  res.flags.assign(P, 0);
  auto group = parallel::make_local_group(P, device_kind::cpu);
  parallel::run_ranks(P, [&](int r) {
    const owned_weights mine = select_experts(fw, cfg, expert_map_of(owners, r));
    parallel::ep_layer ep(mine.weights(), cfg, *group[static_cast<size_t>(r)],
                          {.owners = owners, .max_tokens = T + 3, .capacity = c.capacity});
    const routing_input ri = routing_of(r);
    ep.forward(in[static_cast<size_t>(r)].x_view(), ri, tensor_view(res.out[r].data(), dtype::f32, {T, H}));
    res.flags[static_cast<size_t>(r)] = ep.read_error_flags();
    ep.forward(in[static_cast<size_t>(r)].x_view(), ri, tensor_view(res.again[r].data(), dtype::f32, {T, H}));
  });

  for (int r = 0; r < P; ++r) {
    const routing_input ri = routes[static_cast<size_t>(r)].input(T, k);
    res.ref.push_back(reference(fw, cfg, in[static_cast<size_t>(r)].x_view(), ri));
    std::vector<std::vector<float>> part;
    for (int q = 0; q < P; ++q) {
      const std::vector<int32_t> map = expert_map_of(owners, q);
      part.push_back(backend(select_experts(fw, cfg, map).weights(), cfg, in[static_cast<size_t>(r)].x_view(), ri, map));
    }
    std::vector<float> expect(static_cast<size_t>(T * H), 0.0f);
    for (int q = 0; q < P; ++q) {
      const int64_t cap = c.capacity > 0 ? std::min(c.capacity, T) : T;
      int64_t pos = 0;
      for (int64_t t = 0; t < T; ++t) {
        bool goes = false;
        for (int j = 0; j < k; ++j) goes |= owners[static_cast<size_t>(routes[static_cast<size_t>(r)].ids[static_cast<size_t>(t * k + j)])] == q;
        if (!goes) continue;
        if (pos++ >= cap) continue;
        for (int64_t n = 0; n < H; ++n) expect[static_cast<size_t>(t * H + n)] += part[static_cast<size_t>(q)][static_cast<size_t>(t * H + n)];
      }
    }
    res.expect.push_back(std::move(expect));
  }
  return res;
}

void expect_ep(const ep_result& res, uint32_t flags, bool near_reference, const std::string& what) {
  for (size_t r = 0; r < res.out.size(); ++r) {
    EXPECT_EQ(res.out[r], res.expect[r]) << what << ": rank " << r << " differs from the per-rank layers' sum";
    EXPECT_EQ(res.out[r], res.again[r]) << what << ": rank " << r << " is not deterministic";
    EXPECT_EQ(res.flags[r], flags) << what << ": rank " << r;
    EXPECT_GT(norm(res.out[r]), 0.0) << what;
    if (near_reference) {
      EXPECT_LT(rel_l2(res.out[r], res.ref[r]), tolerance_for(device_kind::cpu).rel_l2) << what;
    }
  }
}

TEST(ExpertParallel, MatchesTheLayerForEveryRoutingSource) {
  const moe_config softmax = make_cfg(8, 64, 96, 2, activation_kind::swiglu_clamped, layout::gate_up_order::interleaved);
  const moe_config grouped = make_cfg(16, 64, 64, 3, activation_kind::silu_mul, layout::gate_up_order::concatenated,
                                      routing_kind::sigmoid_grouped_topk);
  for (int ranks : {2, 3}) {
    for (source src : {source::logits, source::precomputed, source::router_weights}) {
      ep_case c;
      c.ranks = ranks;
      c.cfg = softmax;
      c.src = src;
      expect_ep(run_ep(c, 20), 0, true, "softmax ranks " + std::to_string(ranks) + " source " + std::to_string(int(src)));
    }
    ep_case g;
    g.ranks = ranks;
    g.cfg = grouped;
    g.tokens = 17;
    expect_ep(run_ep(g, 21), 0, true, "grouped ranks " + std::to_string(ranks));
  }
  ep_case scattered;  // a placement that is not contiguous; one token
  scattered.cfg = softmax;
  scattered.ranks = 3;
  scattered.tokens = 1;
  scattered.owners = {2, 0, 1, 0, 2, 2, 1, 0};
  expect_ep(run_ep(scattered, 22), 0, true, "scattered owners");
}

// Every token of every rank on rank 0's experts: the other ranks receive only unused rows, most
// experts get nothing.
TEST(ExpertParallel, AllTokensOnOneRanksExperts) {
  ep_case c;
  c.ranks = 3;
  c.cfg = make_cfg(9, 64, 96, 2, activation_kind::silu_mul, layout::gate_up_order::concatenated);
  c.src = source::precomputed;
  c.force_ids = [](int r, std::vector<int32_t>& ids) {
    for (size_t p = 0; p < ids.size(); ++p) ids[p] = static_cast<int32_t>((p + static_cast<size_t>(r)) % 2);  // experts 0, 1
  };
  expect_ep(run_ep(c, 23), 0, true, "all on rank 0");
}

// A capacity below the tokens a peer gets: the first `capacity` tokens (token order) go, the rest
// lose their slots there and bit 1 is set; the other ranks' contributions stay.
TEST(ExpertParallel, CapacityDropsTheLastTokensAndSaysSo) {
  ep_case c;
  c.ranks = 2;
  c.tokens = 8;
  c.capacity = 3;
  c.cfg = make_cfg(4, 64, 64, 2, activation_kind::silu_mul, layout::gate_up_order::concatenated);
  c.src = source::precomputed;
  c.force_ids = [](int, std::vector<int32_t>& ids) {
    for (size_t t = 0; t < ids.size() / 2; ++t) {  // slot 0 on rank 1 (experts 2, 3); slot 1 on rank 0 for odd t
      ids[2 * t] = 2 + static_cast<int32_t>(t % 2);
      ids[2 * t + 1] = t % 2 ? 0 : 3 - static_cast<int32_t>(t % 2);
    }
  };
  const ep_result res = run_ep(c, 24);
  expect_ep(res, parallel::kOverflowFlag, false, "capacity 3");
  // Token 6 (even: both slots on rank 1, past the capacity) gets nothing at all.
  for (size_t r = 0; r < 2; ++r)
    for (int64_t n = 0; n < 64; ++n) EXPECT_EQ(res.out[r][static_cast<size_t>(6 * 64 + n)], 0.0f);
}

TEST(ExpertParallel, BadOptionsAreRejected) {
  const moe_config cfg = make_cfg(4, 32, 32, 1, activation_kind::silu_mul, layout::gate_up_order::concatenated);
  const synthetic::mxfp4_layer full = make_layer(cfg, false, 25);
  auto group = parallel::make_local_group(2, device_kind::cpu);
  const owned_weights mine = select_experts(full.weights(), cfg, expert_map_of({0, 0, 0, 1}, 0));
  EXPECT_THROW(parallel::ep_layer(mine.weights(), cfg, *group[0], {.owners = {0, 0, 0, 0}, .max_tokens = 4}),
               invalid_argument);  // rank 1 owns nothing
  EXPECT_THROW(parallel::ep_layer(mine.weights(), cfg, *group[0], {.owners = {0, 0, 0, 2}, .max_tokens = 4}),
               invalid_argument);  // no rank 2
  EXPECT_THROW(parallel::ep_layer(mine.weights(), cfg, *group[0], {.owners = {0, 0, 0, 1}, .max_tokens = 0}),
               invalid_argument);
  EXPECT_THROW(parallel::ep_layer(full.weights(), cfg, *group[0], {.owners = {0, 0, 0, 1}, .max_tokens = 4}),
               invalid_argument);  // weights of all four experts for a rank holding three
  parallel::ep_layer ep(mine.weights(), cfg, *group[0], {.owners = {0, 0, 0, 1}, .max_tokens = 4});
  const synthetic::layer_inputs in = synthetic::make_inputs(cfg, full.weights(), 5, 26);
  std::vector<float> out(5 * 32);
  EXPECT_THROW(ep.forward(in.x_view(), in.routing(), tensor_view(out.data(), dtype::f32, {5, 32})), invalid_argument);
  EXPECT_EQ(ep.capacity(3), 3);
  EXPECT_EQ(ep.dispatch_bytes(3), size_t{3 * (32 * 2 + 8)});
}

// ---- tensor parallelism over simulated ranks ---------------------------------------------------

TEST(TensorParallel, MatchesTheLayerOnEveryRank) {
  for (const auto& [ranks, inter, out_type] :
       {std::tuple{3, int64_t{544}, dtype::f32}, std::tuple{2, int64_t{96}, dtype::bf16}, std::tuple{1, int64_t{64}, dtype::f32}}) {
    const moe_config cfg = make_cfg(6, 64, inter, 2, activation_kind::swiglu_clamped, layout::gate_up_order::interleaved);
    const synthetic::mxfp4_layer full = make_layer(cfg, true, 30);
    const synthetic::layer_inputs in = synthetic::make_inputs(cfg, full.weights(), 9, 31);
    const int64_t T = 9, H = 64;
    std::vector<std::vector<uint8_t>> out(static_cast<size_t>(ranks),
                                          std::vector<uint8_t>(static_cast<size_t>(T * H * dtype_size(out_type))));
    auto group = parallel::make_local_group(ranks, device_kind::cpu);
    std::vector<std::vector<uint8_t>> from_shards = out;  // the ranks given their shards only
    parallel::run_ranks(ranks, [&](int r) {
      parallel::tp_layer tp(full.weights(), cfg, *group[static_cast<size_t>(r)], {.max_tokens = T});
      EXPECT_EQ(tp.shard().config().shape.intermediate, shard_intermediate(inter, {r, ranks}));
      tp.forward(in.x_view(), in.routing(), tensor_view(out[static_cast<size_t>(r)].data(), out_type, {T, H}));
      const owned_weights mine = shard_weights(full.weights(), cfg, {r, ranks});
      parallel::tp_layer pre(mine.weights(), cfg, *group[static_cast<size_t>(r)], {.max_tokens = T, .sharded = true});
      pre.forward(in.x_view(), in.routing(), tensor_view(from_shards[static_cast<size_t>(r)].data(), out_type, {T, H}));
    });
    EXPECT_EQ(from_shards, out) << "pre-sharded weights give other bits";
    // By definition: the f32 sum in rank order of the shards' cpu outputs.
    std::vector<float> expect(static_cast<size_t>(T * H), 0.0f);
    for (int r = 0; r < ranks; ++r) {
      const owned_weights s = shard_weights(full.weights(), cfg, {r, ranks});
      const std::vector<float> part = backend(s.weights(), s.cfg, in.x_view(), in.routing());
      for (size_t i = 0; i < expect.size(); ++i) expect[i] += part[i];
    }
    std::vector<float> got(expect.size());
    for (size_t i = 0; i < got.size(); ++i)
      got[i] = load_float(out[0].data(), out_type, static_cast<int64_t>(i));
    for (int r = 1; r < ranks; ++r) EXPECT_EQ(out[static_cast<size_t>(r)], out[0]) << "rank " << r << " differs from rank 0";
    const std::vector<float> want = reference(full.weights(), cfg, in.x_view(), in.routing());
    if (out_type == dtype::f32) {
      EXPECT_EQ(got, expect) << "ranks " << ranks;
      EXPECT_LT(rel_l2(got, want), tolerance_for(device_kind::cpu).rel_l2);
    } else {
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], bf16_to_float(float_to_bf16(expect[i])));
      EXPECT_LT(rel_l2(got, want), 4e-3);  // one bf16 rounding
    }
  }
}

// ---- NCCL and the launch environment ---------------------------------------------------------

// Without a loadable NCCL the library says so and why, and never falls back.
TEST(Nccl, AbsentLibraryIsReportedWithTheReason) {
  setenv("MXMOE_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
  std::string why;
  EXPECT_FALSE(parallel::nccl_available(&why));
  EXPECT_FALSE(why.empty());
  EXPECT_THROW(parallel::nccl_new_unique_id(), unsupported);
  EXPECT_THROW(parallel::nccl_communicator({}, 0, 1), unsupported);
}

TEST(Launch, EnvironmentIsReadAndCheckedByName) {
  unsetenv("WORLD_SIZE");
  EXPECT_FALSE(parallel::launch_info_from_environment().launched);
  setenv("WORLD_SIZE", "4", 1);
  setenv("RANK", "3", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("MXMOE_NCCL_ID_FILE", "/tmp/id", 1);
  const parallel::launch_info info = parallel::launch_info_from_environment();
  EXPECT_TRUE(info.launched);
  EXPECT_EQ(info.ranks, 4);
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.id_file, "/tmp/id");
  setenv("RANK", "4", 1);  // not below WORLD_SIZE
  try {
    parallel::launch_info_from_environment();
    FAIL() << "accepted RANK = WORLD_SIZE";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("RANK"), std::string::npos) << e.what();
  }
  setenv("RANK", "x1", 1);
  EXPECT_THROW(parallel::launch_info_from_environment(), invalid_argument);
  for (const char* v : {"WORLD_SIZE", "RANK", "LOCAL_RANK", "MXMOE_NCCL_ID_FILE"}) unsetenv(v);
}

}  // namespace
