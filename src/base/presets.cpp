// Model shapes and MoE semantics from the models' Hugging Face config.json files (docs/models.md
// names each source).
#include "mxmoe/presets.h"

namespace mxmoe {
namespace {

moe_config make(int64_t e, int64_t h, int64_t i, routing_config r, activation_kind act, layout::gate_up_order order) {
  moe_config c;
  c.shape = {e, h, i};
  c.routing = r;
  c.activation.kind = act;
  c.gate_up = order;
  return c;
}

routing_config topk_softmax(int k) { return {routing_kind::topk_softmax, k, false, 1, 1, 1.0f}; }
routing_config softmax_topk(int k) { return {routing_kind::softmax_topk, k, true, 1, 1, 1.0f}; }
routing_config grouped(int k, int n_group, int topk_group, float scale) {
  return {routing_kind::sigmoid_grouped_topk, k, true, n_group, topk_group, scale};
}

const model_preset kPresets[] = {
    {"gpt-oss-120b", make(128, 2880, 2880, topk_softmax(4), activation_kind::swiglu_clamped, layout::gate_up_order::interleaved), true},
    {"gpt-oss-20b", make(32, 2880, 2880, topk_softmax(4), activation_kind::swiglu_clamped, layout::gate_up_order::interleaved), true},
    {"qwen3-30b-a3b", make(128, 2048, 768, softmax_topk(8), activation_kind::silu_mul, layout::gate_up_order::concatenated), false},
    {"deepseek-v3", make(256, 7168, 2048, grouped(8, 8, 4, 2.5f), activation_kind::silu_mul, layout::gate_up_order::concatenated), false},
    {"kimi-k2", make(384, 7168, 2048, grouped(8, 1, 1, 2.827f), activation_kind::silu_mul, layout::gate_up_order::concatenated), false},
    // A synthetic shape, not a published model (docs/models.md); the routing is an assumption (it
    // barely moves the timing).
    {"deepseek-v4-flash-like", make(256, 4096, 2048, softmax_topk(6), activation_kind::silu_mul, layout::gate_up_order::concatenated), false},
};

}  // namespace

std::span<const model_preset> model_presets() { return kPresets; }

std::string model_preset_names() {
  std::string s;
  for (const auto& p : kPresets) s += (s.empty() ? "" : " | ") + std::string(p.name);
  return s;
}

const model_preset* find_model_preset(std::string_view name) {
  for (const auto& p : kPresets)
    if (name == p.name) return &p;
  return nullptr;
}

}  // namespace mxmoe
