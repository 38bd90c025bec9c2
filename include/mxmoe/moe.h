// mxmoe/moe.h — Mixture-of-Experts semantics: configuration, weights, routing, and the CPU
// reference layer that defines what every backend must compute (the models: docs/models.md).
//
//   x [T, H]; router logits [T, E] (given, or x·Wrᵀ + br from the router weights);
//   routing -> expert ids [T, k] and weights [T, k];
//   per selected expert e: h = x·gate_upₑᵀ (+ gate_up_biasₑ) [2I]; a = act(gate, up) [I];
//                           y = a·downₑᵀ (+ down_biasₑ) [H];  out = Σ_k w_k · y_k.
// The backends behind one call: include/mxmoe/forward.h.
#pragma once

#include <cstdint>
#include <vector>

#include "mxmoe/dtype.h"
#include "mxmoe/layout.h"

namespace mxmoe {

enum class routing_kind : uint8_t {
  softmax_topk,          // Mixtral, Qwen3-MoE: softmax over E, top-k, optional renormalize
  topk_softmax,          // gpt-oss: top-k of the logits, softmax over those k
  sigmoid_grouped_topk,  // DeepSeek-V3, Kimi-K2: sigmoid, correction bias, groups, scaling
};
enum class activation_kind : uint8_t {
  silu_mul,        // silu(gate) * up
  swiglu_clamped,  // gpt-oss: g = min(gate, limit); u = clamp(up, -limit, limit);
                   //          g * sigmoid(alpha * g) * (u + 1)
};
enum class weight_format : uint8_t { mxfp4, bf16 };

const char* to_string(routing_kind);
const char* to_string(activation_kind);
const char* to_string(weight_format);

struct routing_config {
  routing_kind kind = routing_kind::softmax_topk;
  int top_k = 1;
  bool renormalize = true;            // softmax_topk: divide the k weights by their sum
  int n_group = 1;                    // sigmoid_grouped_topk
  int topk_group = 1;                 // sigmoid_grouped_topk
  float routed_scaling_factor = 1.0f; // sigmoid_grouped_topk
};

struct activation_config {
  activation_kind kind = activation_kind::silu_mul;
  float alpha = 1.702f;  // swiglu_clamped
  float limit = 7.0f;    // swiglu_clamped
};

struct moe_shape {
  int64_t experts = 0, hidden = 0, intermediate = 0;  // E, H, I
};

struct moe_config {
  moe_shape shape;
  routing_config routing;
  activation_config activation;
  layout::gate_up_order gate_up = layout::gate_up_order::concatenated;
};

// Throws mxmoe::invalid_argument naming the field: E in [1, 512], top_k in [1, min(16, E)],
// H and I positive multiples of 32, n_group divides E, topk_group in [1, n_group],
// top_k <= topk_group * E / n_group, finite positive alpha/limit/scaling factor.
void validate(const moe_config& cfg);

// Expert weights in the checkpoint layout (docs/formats.md). The expert matrices live in host
// memory, or (for a cuda target: prepare, cuda::moe_layer) all in device memory; biases and router
// tensors in host memory.
// Optional tensors: a default-constructed tensor_view means "not given".
struct moe_weights {
  weight_format format = weight_format::mxfp4;
  tensor_view gate_up_blocks, gate_up_scales;  // mxfp4: u8 [E, 2I, H/32, 16], u8 [E, 2I, H/32]
  tensor_view down_blocks, down_scales;    // mxfp4: u8 [E, H, I/32, 16],  u8 [E, H, I/32]
  tensor_view gate_up, down;           // bf16:  bf16 [E, 2I, H], bf16 [E, H, I]
  tensor_view gate_up_bias, down_bias; // optional bf16 | f16 | f32 [E, 2I], [E, H]
  tensor_view router_weight;           // optional bf16 | f16 | f32 [E, H] (when logits are not given)
  tensor_view router_bias;             // optional bf16 | f16 | f32 [E]
  tensor_view correction_bias;         // optional f32 [E] (sigmoid_grouped_topk only)
};

// Expert maps (expert parallelism, docs/parallel.md). A layer may hold a subset of the E experts:
// expert_map has E entries, expert_map[e] = the index of global expert e in the weights' expert
// dimension, or -1 for an expert held elsewhere; the indices >= 0 are 0 .. E_held - 1, each once
// (E_held >= 1). The expert tensors and their biases then have E_held experts; the router weight,
// router bias and correction bias keep all E: routing runs over every expert. A slot routed to an
// expert held elsewhere contributes nothing (it is not an error; an id outside [0, E) still is).
// Summed over ranks whose maps partition the experts, the layers give the whole layer. An empty
// map holds every expert, index = id.
//
// Throws mxmoe::invalid_argument naming the tensor when a shape or dtype does not match cfg (and
// expert_map), or naming "expert_map" when the map is malformed.
void validate(const moe_weights& w, const moe_config& cfg, const std::vector<int32_t>& expert_map = {});

// Either logits (f32 | bf16 [T, E]), or precomputed ids (i32 [T, k], each in [0, E)) and
// weights (f32 [T, k]). When all three are empty, logits are computed from the router weights.
struct routing_input {
  tensor_view logits;
  tensor_view ids;
  tensor_view weights;
};

namespace cpu {

// logits f32 | bf16 [T, E] -> ids_out i32 [T, k], weights_out f32 [T, k]. Ties: lower expert
// index wins. correction_bias: optional f32 [E], sigmoid_grouped_topk only.
void route(const tensor_view& logits, const tensor_view& correction_bias, const routing_config& cfg,
           const tensor_view& ids_out, const tensor_view& weights_out);

// Router logits from weights: x [T, H] bf16 | f32, router_weight [E, H] and router_bias [E] bf16 | f16 | f32
// -> logits_out f32 [T, E], accumulated in float64.
void router_logits(const tensor_view& x, const tensor_view& router_weight, const tensor_view& router_bias,
                   const tensor_view& logits_out);

enum class precision : uint8_t {
  f32,  // float32 accumulation, multithreaded: the CPU backend
  f64,  // float64 everywhere: the test oracle
};

// The reference MoE layer. x: bf16 | f32 [T, H]; out: f32 | bf16 [T, H]. MXFP4 weights are
// dequantized with mx::dequantize_value; nothing is rounded to bf16 between the GEMMs.
// expert_map: the experts `weights` holds (above; empty: all); slots routed elsewhere are skipped
// in the combine, so a token none of whose experts is held gets exactly 0.
void moe_forward(const tensor_view& x, const routing_input& routing, const moe_weights& weights,
                 const moe_config& cfg, const tensor_view& out, precision prec = precision::f32,
                 int threads = 0, const std::vector<int32_t>& expert_map = {});

}  // namespace cpu
}  // namespace mxmoe
