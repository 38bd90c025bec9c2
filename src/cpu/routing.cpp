// CPU routing (the kinds of include/mxmoe/moe.h, the models of docs/models.md): router logits ->
// top-k expert ids and weights, and the router GEMM. Everything is computed in float64 and
// rounded to float32 once, at the end.
//
// Policies, shared with every backend's tests:
//   * Ties: the lower expert index wins (and the lower group index, for groups).
//   * Selection compares logits (softmax_topk, topk_softmax) or choice scores
//     (sigmoid_grouped_topk); a NaN ranks below -inf, so it is chosen only when it must be, and
//     then makes that token's weights NaN rather than silently picking something.
//   * Infinite logits: softmax over a set whose maximum is +-inf gives the maximal entries equal
//     shares (the limit of equal logits); all -inf logits therefore route uniformly.
//   * Output ids of a token are sorted by descending weight (computed in float64), ties by
//     the lower index.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "mxmoe/error.h"
#include "mxmoe/moe.h"
#include "mxmoe/validate.h"

namespace mxmoe::cpu {
namespace {

constexpr int64_t kMaxExperts = 512;

double element(const tensor_view& v, int64_t i) { return static_cast<double>(load_float(v.data, v.type, i)); }

void check_host(const tensor_view& v, const char* name) {
  MXMOE_CHECK_ARG(v.device == device_kind::cpu, name, "a tensor in host (cpu) memory", "a cuda tensor");
}

void check_matrix(const tensor_view& v, const char* name, const char* expected_dims) {
  MXMOE_CHECK_ARG(!is_absent(v), name, std::string("a tensor ") + expected_dims, "no tensor");
  MXMOE_CHECK_ARG(v.rank() == 2, name, std::string("a rank-2 tensor ") + expected_dims,
                  "shape " + shape_string(v.shape));
  check_host(v, name);
}

// Selection key: NaN ranks below everything, -inf included.
double rank_key(double v) { return std::isnan(v) ? -std::numeric_limits<double>::infinity() : v; }

// The k indices of `candidates` with the largest keys, ties to the lower index, best first.
std::vector<int> top_k(const std::vector<double>& keys, std::vector<int> candidates, int k) {
  const auto better = [&](int a, int b) {
    const double ka = rank_key(keys[static_cast<size_t>(a)]), kb = rank_key(keys[static_cast<size_t>(b)]);
    return ka > kb || (ka == kb && a < b);
  };
  std::partial_sort(candidates.begin(), candidates.begin() + k, candidates.end(), better);
  candidates.resize(static_cast<size_t>(k));
  return candidates;
}

std::vector<int> all_indices(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// Softmax of values[idx] over the selected indices, in idx order.
std::vector<double> softmax(const std::vector<double>& values, const std::vector<int>& idx) {
  std::vector<double> p(idx.size());
  double m = -std::numeric_limits<double>::infinity();
  bool any_nan = false;
  for (int i : idx) {
    const double v = values[static_cast<size_t>(i)];
    any_nan = any_nan || std::isnan(v);
    if (v > m) m = v;
  }
  if (any_nan) {
    std::fill(p.begin(), p.end(), std::numeric_limits<double>::quiet_NaN());
    return p;
  }
  double sum = 0.0;
  for (size_t j = 0; j < idx.size(); ++j) {
    const double v = values[static_cast<size_t>(idx[j])];
    p[j] = std::isinf(m) ? (v == m ? 1.0 : 0.0) : std::exp(v - m);
    sum += p[j];
  }
  for (double& x : p) x /= sum;  // sum >= 1: the maximum contributes exp(0) or 1
  return p;
}

// One token: logits[E] -> (ids, weights) of length k, unsorted.
void route_token(const std::vector<double>& logits, const std::vector<double>& correction_bias,
                 const routing_config& cfg, std::vector<int>* ids, std::vector<double>* weights) {
  const int e = static_cast<int>(logits.size()), k = cfg.top_k;
  switch (cfg.kind) {
    case routing_kind::softmax_topk: {
      // Softmax is monotone, so the top-k by probability are the top-k by logit; comparing
      // logits also keeps experts apart whose probabilities underflow to the same 0.
      const std::vector<double> p = softmax(logits, all_indices(e));
      *ids = top_k(logits, all_indices(e), k);
      weights->resize(static_cast<size_t>(k));
      double sum = 0.0;
      for (int j = 0; j < k; ++j) sum += (*weights)[static_cast<size_t>(j)] = p[static_cast<size_t>((*ids)[static_cast<size_t>(j)])];
      if (cfg.renormalize)
        for (double& w : *weights) w /= sum;  // sum >= p(max) >= 1/E > 0
      return;
    }
    case routing_kind::topk_softmax:
      *ids = top_k(logits, all_indices(e), k);
      *weights = softmax(logits, *ids);
      return;
    case routing_kind::sigmoid_grouped_topk: {
      std::vector<double> score(static_cast<size_t>(e)), choice(static_cast<size_t>(e));
      for (size_t i = 0; i < score.size(); ++i) {
        score[i] = 1.0 / (1.0 + std::exp(-logits[i]));
        choice[i] = score[i] + (correction_bias.empty() ? 0.0 : correction_bias[i]);
      }
      const int group_size = e / cfg.n_group, per_group = std::min(group_size, 2);
      std::vector<double> group_score(static_cast<size_t>(cfg.n_group), 0.0);
      for (int g = 0; g < cfg.n_group; ++g) {
        std::vector<int> members(static_cast<size_t>(group_size));
        std::iota(members.begin(), members.end(), g * group_size);
        for (int i : top_k(choice, members, per_group)) group_score[static_cast<size_t>(g)] += choice[static_cast<size_t>(i)];
      }
      std::vector<int> candidates;
      for (int g : top_k(group_score, all_indices(cfg.n_group), cfg.topk_group))
        for (int i = g * group_size; i < (g + 1) * group_size; ++i) candidates.push_back(i);
      *ids = top_k(choice, std::move(candidates), k);
      weights->resize(static_cast<size_t>(k));
      double sum = 0.0;
      for (int j = 0; j < k; ++j) sum += (*weights)[static_cast<size_t>(j)] = score[static_cast<size_t>((*ids)[static_cast<size_t>(j)])];
      // All selected sigmoids can be 0 (logits -inf): keep the zeros instead of dividing by 0.
      const double norm = cfg.renormalize && sum > 0.0 ? sum : 1.0;
      for (double& w : *weights) w = w / norm * static_cast<double>(cfg.routed_scaling_factor);
      return;
    }
  }
}

}  // namespace

void route(const tensor_view& logits, const tensor_view& correction_bias, const routing_config& cfg,
           const tensor_view& ids_out, const tensor_view& weights_out) {
  check_matrix(logits, "logits", "f32 | bf16 [T, E]");
  const int64_t t = logits.dim(0), e = logits.dim(1);
  MXMOE_CHECK_ARG(e >= 1 && e <= kMaxExperts, "logits", "[T, E] with E in [1, 512]", shape_string(logits.shape));
  check_tensor(logits, "logits", {dtype::f32, dtype::bf16}, {t, e});
  validate_routing_config(cfg, e, "cfg");
  std::vector<double> bias;
  if (!is_absent(correction_bias)) {
    MXMOE_CHECK_ARG(cfg.kind == routing_kind::sigmoid_grouped_topk, "correction_bias",
                    "no tensor (only sigmoid_grouped_topk uses a correction bias)",
                    "a tensor of shape " + shape_string(correction_bias.shape));
    check_host(correction_bias, "correction_bias");
    check_tensor(correction_bias, "correction_bias", {dtype::f32}, {e});
    for (int64_t i = 0; i < e; ++i) {
      bias.push_back(element(correction_bias, i));
      MXMOE_CHECK_ARG(std::isfinite(bias.back()), "correction_bias", "finite values",
                      std::to_string(bias.back()) + " at [" + std::to_string(i) + "]");
    }
  }
  const int64_t k = cfg.top_k;
  check_host(ids_out, "ids_out");
  check_tensor(ids_out, "ids_out", {dtype::i32}, {t, k});
  check_host(weights_out, "weights_out");
  check_tensor(weights_out, "weights_out", {dtype::f32}, {t, k});

  std::vector<double> row(static_cast<size_t>(e)), weights;
  std::vector<int> ids;
  int32_t* ids_dst = ids_out.as<int32_t>();
  float* weights_dst = weights_out.as<float>();
  for (int64_t tok = 0; tok < t; ++tok) {
    for (int64_t i = 0; i < e; ++i) row[static_cast<size_t>(i)] = element(logits, tok * e + i);
    route_token(row, bias, cfg, &ids, &weights);
    std::vector<int> order = all_indices(static_cast<int>(k));
    std::sort(order.begin(), order.end(), [&](int a, int b) {
      const double wa = rank_key(weights[static_cast<size_t>(a)]), wb = rank_key(weights[static_cast<size_t>(b)]);
      return wa > wb || (wa == wb && ids[static_cast<size_t>(a)] < ids[static_cast<size_t>(b)]);
    });
    for (int64_t j = 0; j < k; ++j) {
      const size_t src = static_cast<size_t>(order[static_cast<size_t>(j)]);
      ids_dst[tok * k + j] = ids[src];
      weights_dst[tok * k + j] = static_cast<float>(weights[src]);
    }
  }
}

void router_logits(const tensor_view& x, const tensor_view& router_weight, const tensor_view& router_bias,
                   const tensor_view& logits_out) {
  check_matrix(x, "x", "bf16 | f32 [T, H]");
  check_matrix(router_weight, "router_weight", "bf16 | f16 | f32 [E, H]");
  const int64_t t = x.dim(0), h = x.dim(1), e = router_weight.dim(0);
  check_tensor(x, "x", {dtype::bf16, dtype::f32}, {t, h});
  check_tensor(router_weight, "router_weight", {dtype::bf16, dtype::f16, dtype::f32}, {e, h});
  if (!is_absent(router_bias)) {
    check_host(router_bias, "router_bias");
    check_tensor(router_bias, "router_bias", {dtype::bf16, dtype::f16, dtype::f32}, {e});
  }
  check_host(logits_out, "logits_out");
  check_tensor(logits_out, "logits_out", {dtype::f32}, {t, e});

  std::vector<double> w(static_cast<size_t>(e * h)), xr(static_cast<size_t>(h));
  for (int64_t i = 0; i < e * h; ++i) w[static_cast<size_t>(i)] = element(router_weight, i);
  float* dst = logits_out.as<float>();
  for (int64_t tok = 0; tok < t; ++tok) {
    for (int64_t i = 0; i < h; ++i) xr[static_cast<size_t>(i)] = element(x, tok * h + i);
    for (int64_t ex = 0; ex < e; ++ex) {
      const double* wr = w.data() + ex * h;
      double acc = 0.0;
      for (int64_t i = 0; i < h; ++i) acc += xr[static_cast<size_t>(i)] * wr[i];
      if (!is_absent(router_bias)) acc += element(router_bias, ex);
      dst[tok * e + ex] = static_cast<float>(acc);
    }
  }
}

}  // namespace mxmoe::cpu
