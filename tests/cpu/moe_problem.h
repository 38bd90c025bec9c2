// Random MoE problems for the CPU MoE tests: MXFP4 checkpoint-layout weights (synthetic.h) with
// their float values (decoded with mx::dequantize_value at layout::checkpoint_mxfp4 offsets, never
// by hand), optional f32 biases, inputs and precomputed routing. Sizes are runtime arguments.
#pragma once

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "mxmoe/layout.h"
#include "mxmoe/moe.h"
#include "mxmoe/mx.h"
#include "mxmoe/synthetic.h"

namespace mxmoe::test {

struct moe_problem {
  moe_config cfg;
  int64_t tokens = 0;
  std::vector<uint8_t> gate_up_blocks, gate_up_scales, down_blocks, down_scales;
  std::vector<float> gate_up_bias, down_bias;  // f32 [E, 2I], [E, H]; empty: no biases
  std::vector<float> x;               // f32 [T, H]
  std::vector<float> logits;          // f32 [T, E]
  std::vector<int32_t> ids;           // i32 [T, k], distinct experts per token
  std::vector<float> route_weights;   // f32 [T, k], positive

  int64_t e() const { return cfg.shape.experts; }
  int64_t h() const { return cfg.shape.hidden; }
  int64_t i() const { return cfg.shape.intermediate; }
  int64_t k() const { return cfg.routing.top_k; }
  layout::checkpoint_mxfp4 w13_layout() const { return {e(), 2 * i(), h()}; }
  layout::checkpoint_mxfp4 w2_layout() const { return {e(), h(), i()}; }

  moe_weights weights() const {
    moe_weights w;
    w.format = weight_format::mxfp4;
    w.gate_up_blocks = tensor_view(gate_up_blocks.data(), dtype::u8, {e(), 2 * i(), h() / 32, 16});
    w.gate_up_scales = tensor_view(gate_up_scales.data(), dtype::u8, {e(), 2 * i(), h() / 32});
    w.down_blocks = tensor_view(down_blocks.data(), dtype::u8, {e(), h(), i() / 32, 16});
    w.down_scales = tensor_view(down_scales.data(), dtype::u8, {e(), h(), i() / 32});
    if (!gate_up_bias.empty()) w.gate_up_bias = tensor_view(gate_up_bias.data(), dtype::f32, {e(), 2 * i()});
    if (!down_bias.empty()) w.down_bias = tensor_view(down_bias.data(), dtype::f32, {e(), h()});
    return w;
  }
  tensor_view x_view() const { return tensor_view(x.data(), dtype::f32, {tokens, h()}); }
  routing_input precomputed() const {
    routing_input r;
    r.ids = tensor_view(ids.data(), dtype::i32, {tokens, k()});
    r.weights = tensor_view(route_weights.data(), dtype::f32, {tokens, k()});
    return r;
  }
  routing_input by_logits() const {
    routing_input r;
    r.logits = tensor_view(logits.data(), dtype::f32, {tokens, e()});
    return r;
  }

  // Dense float values of W13 [E, 2I, H] and W2 [E, H, I], checkpoint row order.
  static std::vector<float> decode(const std::vector<uint8_t>& blocks, const std::vector<uint8_t>& scales,
                                   const layout::checkpoint_mxfp4& g) {
    std::vector<float> v(static_cast<size_t>(g.experts * g.rows * g.cols));
    for (int64_t e = 0; e < g.experts; ++e)
      for (int64_t n = 0; n < g.rows; ++n)
        for (int64_t c = 0; c < g.cols; ++c) {
          const layout::nibble_pos pos = g.code_offset(e, n, c);
          const uint8_t code = mx::unpack_e2m1(blocks[static_cast<size_t>(pos.byte)], pos.high);
          v[static_cast<size_t>((e * g.rows + n) * g.cols + c)] =
              mx::dequantize_value(code, scales[static_cast<size_t>(g.scale_offset(e, n, c / 32))]);
        }
    return v;
  }
  std::vector<float> w13_values() const { return decode(gate_up_blocks, gate_up_scales, w13_layout()); }
  std::vector<float> w2_values() const { return decode(down_blocks, down_scales, w2_layout()); }
};

inline moe_problem make_problem(int64_t experts, int64_t hidden, int64_t inter, int64_t tokens, int top_k,
                                activation_kind act, layout::gate_up_order order, bool biases, uint32_t seed) {
  moe_problem p;
  p.cfg.shape = {experts, hidden, inter};
  p.cfg.routing.kind = routing_kind::softmax_topk;
  p.cfg.routing.top_k = top_k;
  p.cfg.activation.kind = act;
  p.cfg.gate_up = order;
  p.tokens = tokens;
  // The expert weights from the one synthetic-layer generator; f32 biases, inputs and routing here.
  synthetic::mxfp4_layer layer = synthetic::make_layer(p.cfg, {}, seed);
  p.gate_up_blocks = std::move(layer.gate_up_blocks);
  p.gate_up_scales = std::move(layer.gate_up_scales);
  p.down_blocks = std::move(layer.down_blocks);
  p.down_scales = std::move(layer.down_scales);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  if (biases) {
    p.gate_up_bias.resize(static_cast<size_t>(experts * 2 * inter));
    p.down_bias.resize(static_cast<size_t>(experts * hidden));
    for (float& v : p.gate_up_bias) v = normal(rng);
    for (float& v : p.down_bias) v = normal(rng);
  }
  p.x.resize(static_cast<size_t>(tokens * hidden));
  for (float& v : p.x) v = normal(rng);
  p.logits.resize(static_cast<size_t>(tokens * experts));
  for (float& v : p.logits) v = 2.0f * normal(rng);
  std::vector<int32_t> perm(static_cast<size_t>(experts));
  std::iota(perm.begin(), perm.end(), 0);
  std::uniform_real_distribution<float> weight(0.05f, 1.0f);
  for (int64_t t = 0; t < tokens; ++t) {
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int j = 0; j < top_k; ++j) {
      p.ids.push_back(perm[static_cast<size_t>(j)]);
      p.route_weights.push_back(weight(rng));
    }
  }
  return p;
}

}  // namespace mxmoe::test
