// The synthetic MXFP4 layer and its inputs (include/mxmoe/synthetic.h). Top floor: the inputs'
// router logits come from cpu::router_logits.
#include "mxmoe/synthetic.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "mxmoe/layout.h"

namespace mxmoe::synthetic {
namespace {

void fill_mxfp4(std::mt19937_64& rng, int64_t k, std::vector<uint8_t>& blocks, std::vector<uint8_t>& scales) {
  for (size_t i = 0; i < blocks.size(); i += 8) {
    const uint64_t r = rng();
    for (size_t b = 0; b < 8 && i + b < blocks.size(); ++b) blocks[i + b] = static_cast<uint8_t>(r >> (8 * b));
  }
  const int centre = scale_centre(k);
  std::uniform_int_distribution<int> jitter(-kScaleSpread, kScaleSpread);
  for (auto& s : scales) s = static_cast<uint8_t>(centre + jitter(rng));
}

template <class T>
tensor_view view_of(const std::vector<T>& v, dtype t, std::vector<int64_t> shape) {
  return v.empty() ? tensor_view() : tensor_view(v.data(), t, std::move(shape));
}

}  // namespace

uint8_t scale_centre(int64_t k) {
  const long c = 127 + std::lround(std::log2(1.0 / (2.93 * std::sqrt(static_cast<double>(k)))));
  return static_cast<uint8_t>(std::clamp<long>(c, kScaleSpread, 254 - kScaleSpread));
}

moe_weights mxfp4_layer::weights() const {
  const int64_t E = cfg.shape.experts, H = cfg.shape.hidden, I = cfg.shape.intermediate;
  moe_weights w;
  w.format = weight_format::mxfp4;
  w.gate_up_blocks = view_of(gate_up_blocks, dtype::u8, {E, 2 * I, H / mx::kBlockSize, mx::kPackedBlockBytes});
  w.gate_up_scales = view_of(gate_up_scales, dtype::u8, {E, 2 * I, H / mx::kBlockSize});
  w.down_blocks = view_of(down_blocks, dtype::u8, {E, H, I / mx::kBlockSize, mx::kPackedBlockBytes});
  w.down_scales = view_of(down_scales, dtype::u8, {E, H, I / mx::kBlockSize});
  w.gate_up_bias = view_of(gate_up_bias, dtype::bf16, {E, 2 * I});
  w.down_bias = view_of(down_bias, dtype::bf16, {E, H});
  w.correction_bias = view_of(correction_bias, dtype::f32, {E});
  return w;
}

mxfp4_layer make_layer(const moe_config& cfg, const layer_options& options, uint64_t seed) {
  validate(cfg);
  const int64_t E = cfg.shape.experts, H = cfg.shape.hidden, I = cfg.shape.intermediate;
  mxfp4_layer s;
  s.cfg = cfg;
  std::mt19937_64 rng(seed);
  if (options.expert_weights) {
    const layout::checkpoint_mxfp4 gu{E, 2 * I, H}, dn{E, H, I};
    s.gate_up_blocks.resize(static_cast<size_t>(gu.block_bytes()));
    s.gate_up_scales.resize(static_cast<size_t>(gu.scale_bytes()));
    s.down_blocks.resize(static_cast<size_t>(dn.block_bytes()));
    s.down_scales.resize(static_cast<size_t>(dn.scale_bytes()));
    fill_mxfp4(rng, H, s.gate_up_blocks, s.gate_up_scales);
    fill_mxfp4(rng, I, s.down_blocks, s.down_scales);
  }
  std::normal_distribution<float> normal(0.0f, 0.1f);
  if (options.biases) {
    s.gate_up_bias.resize(static_cast<size_t>(E * 2 * I));
    s.down_bias.resize(static_cast<size_t>(E * H));
    for (auto& v : s.gate_up_bias) v = float_to_bf16(normal(rng));
    for (auto& v : s.down_bias) v = float_to_bf16(normal(rng));
  }
  if (options.correction_bias) {
    // N(0, 0.05): small next to the spread of the sigmoid scores it is added to, so that routing
    // still spreads over the experts (with 0.1, Kimi-K2 at T = 128 touched ~170 of 384 experts
    // instead of ~270); bench/peer_triton.py draws the peer's correction bias the same way.
    std::normal_distribution<float> small(0.0f, 0.05f);
    s.correction_bias.resize(static_cast<size_t>(E));
    for (auto& v : s.correction_bias) v = small(rng);
  }
  return s;
}

tensor_view layer_inputs::x_view() const { return tensor_view(x.data(), dtype::bf16, {tokens, hidden}); }

routing_input layer_inputs::routing() const {
  routing_input r;
  r.logits = tensor_view(logits.data(), dtype::f32, {tokens, experts});
  return r;
}

layer_inputs make_inputs(const moe_config& cfg, const moe_weights& weights, int64_t tokens, uint64_t seed) {
  const int64_t H = cfg.shape.hidden, E = cfg.shape.experts;
  layer_inputs in;
  in.tokens = tokens;
  in.hidden = H;
  in.experts = E;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  in.x.resize(static_cast<size_t>(tokens * H));
  for (auto& v : in.x) v = float_to_bf16(normal(rng));
  in.logits.resize(static_cast<size_t>(tokens * E));
  if (!weights.router_weight.empty() && tokens > 0) {
    cpu::router_logits(in.x_view(), weights.router_weight, weights.router_bias,
                       tensor_view(in.logits.data(), dtype::f32, {tokens, E}));
  } else {
    for (auto& v : in.logits) v = normal(rng);
  }
  return in;
}

}  // namespace mxmoe::synthetic
