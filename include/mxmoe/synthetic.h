// mxmoe/synthetic.h — the one generator of synthetic MXFP4 MoE layers and their inputs, for
// `mxmoe run --preset`, the benchmark and the tests. Deterministic in the seed (std::mt19937_64,
// libstdc++'s distributions).
//
// The recipe: every code byte uniformly random (all 16 codes, 6.0 and -0 included, in both
// nibbles); the scale bytes of a weight with reduction length K uniform in
// [scale_centre(K) - 1, scale_centre(K) + 1], where 2^(scale_centre(K) - 127) ~ 1 / (2.93 sqrt(K))
// (2.93 is the RMS of a uniformly random E2M1 value), so that with x ~ N(0, 1) every GEMM output
// is O(1). Biases bf16 N(0, 0.1); the correction bias f32 N(0, 0.05). Inputs: x ~ N(0, 1) rounded
// to bf16; router logits x·Wrᵀ + br when the weights carry a router, else N(0, 1).
#pragma once

#include <cstdint>
#include <vector>

#include "mxmoe/moe.h"

namespace mxmoe::synthetic {

// The centre of the scale bytes of a weight whose rows have K elements.
uint8_t scale_centre(int64_t k);
inline constexpr int kScaleSpread = 1;  // scale bytes lie in [centre - 1, centre + 1]

struct layer_options {
  bool biases = false;           // gate_up_bias [E, 2I] and down_bias [E, H]
  bool correction_bias = false;  // correction_bias [E] (sigmoid_grouped_topk only)
  // false: leave the four expert tensors empty, for a caller that fills them in device memory
  // following the same recipe (the benchmark); everything else is generated as usual.
  bool expert_weights = true;
};

// An MXFP4 layer in the checkpoint layout (moe.h), owning its bytes.
struct mxfp4_layer {
  moe_config cfg;
  std::vector<uint8_t> gate_up_blocks, gate_up_scales, down_blocks, down_scales;
  std::vector<uint16_t> gate_up_bias, down_bias;  // bf16; empty without biases
  std::vector<float> correction_bias;             // f32; empty unless asked for
  // Views of the bytes above (absent where empty); valid while this layer lives.
  moe_weights weights() const;
};

// Validates `cfg` and draws a layer: the four expert tensors (gate_up blocks and scales, then down
// blocks and scales), then the biases, then the correction bias, in that order from one stream.
mxfp4_layer make_layer(const moe_config& cfg, const layer_options& options, uint64_t seed);

// Activations and router logits of one call, in host memory.
struct layer_inputs {
  int64_t tokens = 0, hidden = 0, experts = 0;  // T, H, E
  std::vector<uint16_t> x;    // bf16 [T, H]: what the cuda layer takes; the reference reads the same bits
  std::vector<float> logits;  // f32 [T, E]
  tensor_view x_view() const;
  routing_input routing() const;  // routing by these logits
};

// `tokens` inputs for `cfg`; the logits come from `weights`' router tensors when it has them.
layer_inputs make_inputs(const moe_config& cfg, const moe_weights& weights, int64_t tokens, uint64_t seed);

}  // namespace mxmoe::synthetic
