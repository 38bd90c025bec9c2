// The C ABI's synthetic layers and inputs (mxmoe/synthetic.h) and model presets
// (mxmoe/presets.h), written into the caller's tensors.
#include <cstring>

#include "bridge.h"
#include "mxmoe/c_api.h"
#include "mxmoe/error.h"
#include "mxmoe/presets.h"
#include "mxmoe/synthetic.h"
#include "mxmoe/validate.h"

using namespace mxmoe;
using namespace mxmoe::c_api;

extern "C" {

mxmoe_status mxmoe_synthetic_layer(const mxmoe_moe_config* cfg, int32_t biases, int32_t correction_bias, uint64_t seed,
                                   const mxmoe_moe_weights* out) {
  return guarded([&] {
    const moe_config c = to_config(cfg);
    MXMOE_CHECK_ARG(out != nullptr, "out", "the tensors to write the layer into", "NULL");
    MXMOE_CHECK_ARG(!correction_bias || c.routing.kind == routing_kind::sigmoid_grouped_topk, "correction_bias",
                    "0 unless the routing is sigmoid_grouped_topk (the only kind that reads one)", "1");
    const synthetic::mxfp4_layer layer =
        synthetic::make_layer(c, {.biases = biases != 0, .correction_bias = correction_bias != 0}, seed);
    copy_weights_out(layer.weights(), out);
  });
}

mxmoe_status mxmoe_synthetic_inputs(const mxmoe_moe_config* cfg, const mxmoe_moe_weights* weights, int64_t tokens,
                                    uint64_t seed, const mxmoe_tensor* x, const mxmoe_tensor* logits) {
  return guarded([&] {
    const moe_config c = to_config(cfg);
    const moe_weights w = weights ? to_weights(weights) : moe_weights{};
    MXMOE_CHECK_ARG(tokens >= 0, "tokens", "a token count >= 0", std::to_string(tokens));
    const tensor_view xv = required_view(x, "x"), lv = required_view(logits, "logits");
    check_output(xv, "x", dtype::bf16, {tokens, c.shape.hidden});
    check_output(lv, "logits", dtype::f32, {tokens, c.shape.experts});
    if (!is_absent(w.router_weight)) validate(w, c);  // the router tensors are read
    const synthetic::layer_inputs in = synthetic::make_inputs(c, w, tokens, seed);
    if (!in.x.empty()) std::memcpy(xv.data, in.x.data(), in.x.size() * sizeof(in.x[0]));
    if (!in.logits.empty()) std::memcpy(lv.data, in.logits.data(), in.logits.size() * sizeof(in.logits[0]));
  });
}

mxmoe_status mxmoe_preset_count(int32_t* count) {
  return guarded([&] {
    MXMOE_CHECK_ARG(count != nullptr, "count", "a pointer to the result", "NULL");
    *count = static_cast<int32_t>(model_presets().size());
  });
}

mxmoe_status mxmoe_preset(int32_t index, const char** name, mxmoe_moe_config* cfg, int32_t* has_biases) {
  return guarded([&] {
    const auto presets = model_presets();
    MXMOE_CHECK_ARG(index >= 0 && static_cast<size_t>(index) < presets.size(), "index",
                    "in [0, " + std::to_string(presets.size()) + ")", std::to_string(index));
    const model_preset& p = presets[static_cast<size_t>(index)];
    if (name) *name = p.name;
    if (cfg) *cfg = from_config(p.config);
    if (has_biases) *has_biases = p.has_biases ? 1 : 0;
  });
}

}  // extern "C"
