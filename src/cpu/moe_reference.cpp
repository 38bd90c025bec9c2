// The CPU MoE layer (include/mxmoe/moe.h): the reference every backend is tested against, and
// the CPU backend.
//
// Work is grouped by expert: the (token, slot) pairs routed to one expert are gathered, and each
// weight row of that expert is dequantized once (per chunk of tokens, see kChunkBytes) and then
// used for all of them. Output rows of the two GEMMs are split among threads; every value is
// computed by exactly one thread in a fixed order, and the final combine sums the slots of a
// token in slot order, so results are bitwise independent of the thread count.
//
// precision::f32 accumulates in float32 (8 interleaved partial sums per dot product, then a
// fixed pairwise reduction); precision::f64 does the same arithmetic in float64 and is the test
// oracle. Nothing is rounded to bf16 between the GEMMs; bf16 output is rounded once, at the end.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "mxmoe/activation.h"
#include "mxmoe/error.h"
#include "mxmoe/moe.h"
#include "mxmoe/validate.h"
#include "dot_rows.h"

namespace mxmoe::cpu {
namespace {

// Upper bound of the per-(token, slot) expert-output buffer; larger calls are processed in
// chunks of tokens (each chunk dequantizes the touched experts' weights again).
constexpr size_t kChunkBytes = size_t{256} << 20;

// Runs fn(begin, end) over [0, n) split into `threads` contiguous ranges.
void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(threads, n));
  if (parts == 1) {
    if (n > 0) fn(0, n);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(parts - 1));
  for (int64_t p = 1; p < parts; ++p) pool.emplace_back(fn, n * p / parts, n * (p + 1) / parts);
  fn(0, n / parts);
  for (auto& th : pool) th.join();
}

double element(const tensor_view& v, int64_t i) { return static_cast<double>(load_float(v.data, v.type, i)); }

// Reads rows of one expert's weight matrix [N, K] (checkpoint MXFP4 or bf16) as F values.
template <class F>
class weight_rows {
 public:
  // blocks/scales for MXFP4 (dense empty), or dense bf16 [E, N, K].
  weight_rows(const tensor_view& blocks, const tensor_view& scales, const tensor_view& dense, int64_t experts,
              int64_t rows, int64_t cols, const F* table)
      : blocks_(blocks.as<const uint8_t>()), scales_(scales.as<const uint8_t>()),
        dense_(dense.as<const uint16_t>()), geom_{experts, rows, cols}, table_(table) {}

  void read(int64_t e, int64_t n, F* dst) const {
    const int64_t k_total = geom_.cols;
    if (dense_ != nullptr) {
      const uint16_t* src = dense_ + (e * geom_.rows + n) * k_total;
      for (int64_t k = 0; k < k_total; ++k) dst[k] = static_cast<F>(bf16_to_float(src[k]));
      return;
    }
    for (int64_t kb = 0; kb < geom_.scale_cols(); ++kb) {
      const F* value = table_ + 16 * scales_[geom_.scale_offset(e, n, kb)];
      for (int64_t k = kb * mx::kBlockSize; k < (kb + 1) * mx::kBlockSize; k += 2) {
        const uint8_t byte = blocks_[geom_.code_offset(e, n, k).byte];  // holds k and k + 1
        dst[k] = value[mx::unpack_e2m1(byte, k)];
        dst[k + 1] = value[mx::unpack_e2m1(byte, k + 1)];
      }
    }
  }

 private:
  const uint8_t* blocks_;
  const uint8_t* scales_;
  const uint16_t* dense_;
  layout::checkpoint_mxfp4 geom_;
  const F* table_;
};

// Expert ids and routing weights for all tokens, from whichever source the call gave.
void resolve_routing(const tensor_view& x, const routing_input& routing, const moe_weights& weights,
                     const moe_config& cfg, std::vector<int32_t>* ids, std::vector<float>* route_weights) {
  const int64_t t = x.dim(0), e = cfg.shape.experts, k = cfg.routing.top_k;
  ids->assign(static_cast<size_t>(t * k), 0);
  route_weights->assign(static_cast<size_t>(t * k), 0.0f);
  if (t == 0) return;
  const tensor_view ids_view(ids->data(), dtype::i32, {t, k}), weights_view(route_weights->data(), dtype::f32, {t, k});
  switch (routing_source_of(routing)) {
    case routing_source::precomputed:
      std::copy_n(routing.ids.as<const int32_t>(), t * k, ids->data());
      std::copy_n(routing.weights.as<const float>(), t * k, route_weights->data());
      return;
    case routing_source::logits:
      route(routing.logits, weights.correction_bias, cfg.routing, ids_view, weights_view);
      return;
    case routing_source::router_weights: {
      std::vector<float> logits(static_cast<size_t>(t * e));
      const tensor_view logits_view(logits.data(), dtype::f32, {t, e});
      router_logits(x, weights.router_weight, weights.router_bias, logits_view);
      route(logits_view, weights.correction_bias, cfg.routing, ids_view, weights_view);
      return;
    }
  }
}

// ids: each pair's expert in the weights (the expert map applied), -1 for one held elsewhere.
template <class F>
void forward(const tensor_view& x, const std::vector<int32_t>& ids, const std::vector<float>& route_weights,
             const moe_weights& w, const moe_config& cfg, int64_t e_count, const tensor_view& out, int threads) {
  const int64_t t_total = x.dim(0), h = cfg.shape.hidden,
                inter = cfg.shape.intermediate, k = cfg.routing.top_k;
  std::vector<F> table(256 * 16);  // every (scale, code) value, from the one definition
  for (int s = 0; s < 256; ++s)
    for (int c = 0; c < 16; ++c)
      table[static_cast<size_t>(s * 16 + c)] = static_cast<F>(mx::dequantize_value(static_cast<uint8_t>(c), static_cast<uint8_t>(s)));
  const bool mxfp4 = w.format == weight_format::mxfp4;
  const weight_rows<F> w13(w.gate_up_blocks, w.gate_up_scales, mxfp4 ? tensor_view() : w.gate_up, e_count, 2 * inter, h, table.data());
  const weight_rows<F> w2(w.down_blocks, w.down_scales, mxfp4 ? tensor_view() : w.down, e_count, h, inter, table.data());
  const layout::gate_up_rows gate_up{inter, cfg.gate_up};

  const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>(kChunkBytes / static_cast<size_t>(k * h) / sizeof(F)));
  for (int64_t t0 = 0; t0 < t_total; t0 += chunk) {
    const int64_t t1 = std::min(t_total, t0 + chunk), pairs = (t1 - t0) * k;
    std::vector<F> xs(static_cast<size_t>((t1 - t0) * h));
    for (int64_t i = 0; i < (t1 - t0) * h; ++i) xs[static_cast<size_t>(i)] = static_cast<F>(element(x, t0 * h + i));

    // Pairs p = (token - t0) * k + slot, grouped by expert (counting sort, stable); pairs of
    // experts held elsewhere (id -1) are left out.
    std::vector<int64_t> start(static_cast<size_t>(e_count + 1), 0), by_expert(static_cast<size_t>(pairs));
    const auto id_of = [&](int64_t p) { return ids[static_cast<size_t>(t0 * k + p)]; };
    for (int64_t p = 0; p < pairs; ++p)
      if (id_of(p) >= 0) ++start[static_cast<size_t>(id_of(p)) + 1];
    for (int64_t e = 0; e < e_count; ++e) start[static_cast<size_t>(e + 1)] += start[static_cast<size_t>(e)];
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t p = 0; p < pairs; ++p)
      if (id_of(p) >= 0) by_expert[static_cast<size_t>(fill[static_cast<size_t>(id_of(p))]++)] = p;

    std::vector<F> y(static_cast<size_t>(pairs * h));  // each pair's expert output
    for (int64_t e = 0; e < e_count; ++e) {
      const int64_t first = start[static_cast<size_t>(e)], count = start[static_cast<size_t>(e + 1)] - first;
      if (count == 0) continue;
      std::vector<const F*> x_rows(static_cast<size_t>(count));
      for (int64_t j = 0; j < count; ++j)
        x_rows[static_cast<size_t>(j)] = xs.data() + (by_expert[static_cast<size_t>(first + j)] / k) * h;

      std::vector<F> h13(static_cast<size_t>(count * 2 * inter));  // [count, 2I], checkpoint row order
      parallel_for(2 * inter, threads, [&](int64_t r0, int64_t r1) {
        std::vector<F> row(static_cast<size_t>(h));
        for (int64_t r = r0; r < r1; ++r) {
          w13.read(e, r, row.data());
          const F bias = w.gate_up_bias.empty() ? F(0) : static_cast<F>(element(w.gate_up_bias, e * 2 * inter + r));
          detail::dot_rows(x_rows.data(), x_rows.size(), row.data(), h, bias, h13.data() + r, 2 * inter);
        }
      });

      std::vector<F> act(static_cast<size_t>(count * inter));
      std::vector<const F*> act_rows(static_cast<size_t>(count));
      for (int64_t j = 0; j < count; ++j) {
        const F* hj = h13.data() + j * 2 * inter;
        for (int64_t i = 0; i < inter; ++i)
          act[static_cast<size_t>(j * inter + i)] =
              activate(hj[gate_up.checkpoint_row(i, 0)], hj[gate_up.checkpoint_row(i, 1)], cfg.activation);
        act_rows[static_cast<size_t>(j)] = act.data() + j * inter;
      }

      parallel_for(h, threads, [&](int64_t n0, int64_t n1) {
        std::vector<F> row(static_cast<size_t>(inter));
        std::vector<F> col(static_cast<size_t>(count));
        for (int64_t n = n0; n < n1; ++n) {
          w2.read(e, n, row.data());
          const F bias = w.down_bias.empty() ? F(0) : static_cast<F>(element(w.down_bias, e * h + n));
          detail::dot_rows(act_rows.data(), act_rows.size(), row.data(), inter, bias, col.data(), 1);
          for (int64_t j = 0; j < count; ++j) y[static_cast<size_t>(by_expert[static_cast<size_t>(first + j)] * h + n)] = col[static_cast<size_t>(j)];
        }
      });
    }

    // out = Σ_slot w_slot · y_slot, slots in order.
    parallel_for(t1 - t0, threads, [&](int64_t a, int64_t b) {
      for (int64_t tl = a; tl < b; ++tl) {
        const int64_t tok = t0 + tl;
        for (int64_t n = 0; n < h; ++n) {
          F acc = 0;
          for (int64_t s = 0; s < k; ++s)
            if (ids[static_cast<size_t>(tok * k + s)] >= 0)
              acc += static_cast<F>(route_weights[static_cast<size_t>(tok * k + s)]) * y[static_cast<size_t>((tl * k + s) * h + n)];
          if (out.type == dtype::f32) out.as<float>()[tok * h + n] = static_cast<float>(acc);
          else out.as<uint16_t>()[tok * h + n] = float_to_bf16(static_cast<float>(acc));
        }
      }
    });
  }
}

void check_host(const tensor_view& v, const char* name) {
  MXMOE_CHECK_ARG(v.device == device_kind::cpu, name, "a tensor in host (cpu) memory", "a cuda tensor");
}

}  // namespace

void moe_forward(const tensor_view& x, const routing_input& routing, const moe_weights& weights,
                 const moe_config& cfg, const tensor_view& out, precision prec, int threads,
                 const std::vector<int32_t>& expert_map) {
  validate(weights, cfg, expert_map);
  const int64_t held = validate_expert_map(expert_map, cfg.shape.experts);
  check_host(weights.format == weight_format::mxfp4 ? weights.gate_up_blocks : weights.gate_up,
             weights.format == weight_format::mxfp4 ? "weights.gate_up_blocks" : "weights.gate_up");
  check_host(x, "x");
  check_host(out, "out");
  validate_moe_io(x, out, cfg);
  const int64_t t = x.dim(0);
  validate_routing_input(routing, cfg, t);
  check_host(routing.logits, "routing.logits");
  check_host(routing.ids, "routing.ids");
  check_host(routing.weights, "routing.weights");
  if (routing_source_of(routing) == routing_source::router_weights)
    MXMOE_CHECK_ARG(!is_absent(weights.router_weight), "routing",
                    "logits, ids + weights, or weights.router_weight to compute logits from", "none of them");
  MXMOE_CHECK_ARG(prec == precision::f32 || prec == precision::f64, "prec", "f32 | f64",
                  std::to_string(static_cast<int>(prec)));
  MXMOE_CHECK_ARG(threads >= 0, "threads", "a value >= 0 (0: one per hardware thread)", std::to_string(threads));
  if (t == 0) return;
  if (threads == 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  std::vector<int32_t> ids;
  std::vector<float> route_weights;
  resolve_routing(x, routing, weights, cfg, &ids, &route_weights);
  if (!expert_map.empty())
    for (int32_t& id : ids) id = expert_map[static_cast<size_t>(id)];
  if (prec == precision::f64) forward<double>(x, ids, route_weights, weights, cfg, held, out, threads);
  else forward<float>(x, ids, route_weights, weights, cfg, held, out, threads);
}

}  // namespace mxmoe::cpu
