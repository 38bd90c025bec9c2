// The C ABI's MoE layer (mxmoe_moe_*): the configuration and weight structs, layers prepared
// through forward.h (mxmoe::prepare, which owns what it needs), and forward (mxmoe::moe_forward),
// with the CUDA device of the call made current.
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "bridge.h"
#include "device_guard.h"
#include "mxmoe/c_api.h"
#include "mxmoe/error.h"
#include "mxmoe/forward.h"
#include "mxmoe/moe.h"
#include "mxmoe/shard.h"
#include "mxmoe/validate.h"

namespace mxmoe::c_api {
namespace {

static_assert(MXMOE_ROUTING_SIGMOID_GROUPED_TOPK == static_cast<int>(routing_kind::sigmoid_grouped_topk));
static_assert(MXMOE_ACT_SWIGLU_CLAMPED == static_cast<int>(activation_kind::swiglu_clamped));
static_assert(MXMOE_GATE_UP_INTERLEAVED == static_cast<int>(layout::gate_up_order::interleaved));
static_assert(MXMOE_WEIGHTS_BF16 == static_cast<int>(weight_format::bf16));

template <class E>
E to_enum(int32_t v, int32_t last, const char* name, const char* expected) {
  MXMOE_CHECK_ARG(v >= 0 && v <= last, name, expected, std::to_string(v));
  return static_cast<E>(v);
}

constexpr weight_slot kWeightSlots[] = {
    {"gate_up_blocks", &mxmoe_moe_weights::gate_up_blocks, &moe_weights::gate_up_blocks},
    {"gate_up_scales", &mxmoe_moe_weights::gate_up_scales, &moe_weights::gate_up_scales},
    {"down_blocks", &mxmoe_moe_weights::down_blocks, &moe_weights::down_blocks},
    {"down_scales", &mxmoe_moe_weights::down_scales, &moe_weights::down_scales},
    {"gate_up", &mxmoe_moe_weights::gate_up, &moe_weights::gate_up},
    {"down", &mxmoe_moe_weights::down, &moe_weights::down},
    {"gate_up_bias", &mxmoe_moe_weights::gate_up_bias, &moe_weights::gate_up_bias},
    {"down_bias", &mxmoe_moe_weights::down_bias, &moe_weights::down_bias},
    {"router_weight", &mxmoe_moe_weights::router_weight, &moe_weights::router_weight},
    {"router_bias", &mxmoe_moe_weights::router_bias, &moe_weights::router_bias},
    {"correction_bias", &mxmoe_moe_weights::correction_bias, &moe_weights::correction_bias},
};

// The routing tensors of a forward, checked like every other tensor.
routing_input to_routing(const mxmoe_tensor* logits, const mxmoe_tensor* ids, const mxmoe_tensor* weights) {
  routing_input r;
  r.logits = optional_view(logits, "routing.logits");
  r.ids = optional_view(ids, "routing.ids");
  r.weights = optional_view(weights, "routing.weights");
  return r;
}

// What mxmoe_moe_forward and mxmoe_moe_forward_timed check before they call moe_forward.
struct forward_call {
  tensor_view x, out;
  routing_input routing;
  size_t workspace_bytes = 0;
};

forward_call to_forward_call(const mxmoe_moe& m, const mxmoe_tensor* x, const mxmoe_tensor* logits,
                             const mxmoe_tensor* ids, const mxmoe_tensor* weights, const mxmoe_tensor* out,
                             int64_t workspace_bytes) {
  forward_call c{required_view(x, "x"), required_view(out, "out"), to_routing(logits, ids, weights), 0};
  require_device(m.device, "where the layer's weights are",
                 {{"x", x}, {"routing.logits", logits}, {"routing.ids", ids}, {"routing.weights", weights}, {"out", out}});
  MXMOE_CHECK_ARG(workspace_bytes >= 0, "workspace_bytes", "a size >= 0", std::to_string(workspace_bytes));
  c.workspace_bytes = static_cast<size_t>(workspace_bytes);
  return c;
}

}  // namespace

std::span<const weight_slot> weight_slots() { return kWeightSlots; }

// mxmoe_prepare_options -> prepare_options (NULL: the defaults); the map's size and the shard are
// checked here only as far as C needs (a NULL map with entries); prepare checks the rest.
prepare_options to_options(const mxmoe_prepare_options* o) {
  prepare_options r;
  if (!o) return r;
  MXMOE_CHECK_ARG(o->expert_map_size >= 0, "options.expert_map_size", "a size >= 0", std::to_string(o->expert_map_size));
  MXMOE_CHECK_ARG(o->expert_map != nullptr || o->expert_map_size == 0, "options.expert_map",
                  std::to_string(o->expert_map_size) + " entries", "NULL");
  if (o->expert_map) r.expert_map.assign(o->expert_map, o->expert_map + o->expert_map_size);
  if (o->tp_ranks != 0) r.tp = {o->tp_rank, o->tp_ranks};
  else MXMOE_CHECK_ARG(o->tp_rank == 0, "tp.rank", "0 when tp_ranks is 0 (no tensor parallelism)", std::to_string(o->tp_rank));
  return r;
}

moe_config to_config(const mxmoe_moe_config* c) {
  MXMOE_CHECK_ARG(c != nullptr, "cfg", "a configuration", "NULL");
  moe_config cfg;
  cfg.shape = {c->experts, c->hidden, c->intermediate};
  cfg.routing.kind = to_enum<routing_kind>(c->routing_kind, MXMOE_ROUTING_SIGMOID_GROUPED_TOPK, "cfg.routing.kind",
                                           "0 (softmax_topk), 1 (topk_softmax) or 2 (sigmoid_grouped_topk)");
  cfg.routing.top_k = c->top_k;
  cfg.routing.renormalize = c->renormalize != 0;
  cfg.routing.n_group = c->n_group;
  cfg.routing.topk_group = c->topk_group;
  cfg.routing.routed_scaling_factor = c->routed_scaling_factor;
  cfg.activation.kind = to_enum<activation_kind>(c->activation_kind, MXMOE_ACT_SWIGLU_CLAMPED, "cfg.activation.kind",
                                                 "0 (silu_mul) or 1 (swiglu_clamped)");
  cfg.activation.alpha = c->alpha;
  cfg.activation.limit = c->limit;
  cfg.gate_up = to_enum<layout::gate_up_order>(c->gate_up_order, MXMOE_GATE_UP_INTERLEAVED, "cfg.gate_up",
                                               "0 (concatenated) or 1 (interleaved)");
  validate(cfg);
  return cfg;
}

mxmoe_moe_config from_config(const moe_config& c) {
  mxmoe_moe_config r{};
  r.experts = c.shape.experts;
  r.hidden = c.shape.hidden;
  r.intermediate = c.shape.intermediate;
  r.routing_kind = static_cast<int32_t>(c.routing.kind);
  r.top_k = c.routing.top_k;
  r.renormalize = c.routing.renormalize ? 1 : 0;
  r.n_group = c.routing.n_group;
  r.topk_group = c.routing.topk_group;
  r.routed_scaling_factor = c.routing.routed_scaling_factor;
  r.activation_kind = static_cast<int32_t>(c.activation.kind);
  r.alpha = c.activation.alpha;
  r.limit = c.activation.limit;
  r.gate_up_order = static_cast<int32_t>(c.gate_up);
  return r;
}

moe_weights to_weights(const mxmoe_moe_weights* w, const char* prefix) {
  const std::string p = prefix;
  MXMOE_CHECK_ARG(w != nullptr, p, "the layer's weights", "NULL");
  moe_weights out;
  out.format = to_enum<weight_format>(w->format, MXMOE_WEIGHTS_BF16, (p + ".format").c_str(), "0 (mxfp4) or 1 (bf16)");
  for (const weight_slot& s : kWeightSlots) out.*s.dst = optional_view(w->*s.src, (p + "." + s.field).c_str());
  return out;
}

void copy_weights_out(const moe_weights& src, const mxmoe_moe_weights* out) {
  MXMOE_CHECK_ARG(out != nullptr, "out", "the tensors to write the weights into", "NULL");
  const moe_weights dst = to_weights(out, "out");
  MXMOE_CHECK_ARG(dst.format == src.format, "out.format",
                  std::to_string(static_cast<int>(src.format)) + " (" + to_string(src.format) + ")",
                  std::to_string(out->format));
  for (const weight_slot& s : kWeightSlots) {
    const tensor_view &from = src.*s.dst, &to = dst.*s.dst;
    const std::string name = std::string("out.") + s.field;
    if (is_absent(to)) continue;
    MXMOE_CHECK_ARG(!is_absent(from), name, "NULL (the layer has no such tensor)", "a tensor");
    check_output(to, name, from.type, from.shape);
  }
  for (const weight_slot& s : kWeightSlots) {
    const tensor_view &from = src.*s.dst, &to = dst.*s.dst;
    if (!is_absent(to) && from.nbytes()) std::memcpy(to.data, from.data, from.nbytes());
  }
}

std::unique_ptr<mxmoe_moe> prepare_on(const moe_weights& weights, const moe_config& cfg, device_ref d,
                                      const prepare_options& options) {
  const optional_device_guard guard(d.kind == device_kind::cuda, d.id);
  return std::unique_ptr<mxmoe_moe>(new mxmoe_moe{d, prepare(weights, cfg, d.kind, options)});
}

const mxmoe_moe& require_layer(const mxmoe_moe* layer) {
  MXMOE_CHECK_ARG(layer != nullptr, "layer", "a prepared layer", "NULL");
  return *layer;
}

}  // namespace mxmoe::c_api

using namespace mxmoe;
using namespace mxmoe::c_api;

extern "C" {

mxmoe_status mxmoe_moe_config_validate(const mxmoe_moe_config* cfg) {
  return guarded([&] { to_config(cfg); });
}

mxmoe_status mxmoe_moe_prepare(const mxmoe_moe_config* cfg, const mxmoe_moe_weights* weights, int32_t device_type,
                               int32_t device_id, mxmoe_moe** layer) {
  return mxmoe_moe_prepare_with_options(cfg, weights, nullptr, device_type, device_id, layer);
}

mxmoe_status mxmoe_moe_prepare_with_options(const mxmoe_moe_config* cfg, const mxmoe_moe_weights* weights,
                                            const mxmoe_prepare_options* options, int32_t device_type,
                                            int32_t device_id, mxmoe_moe** layer) {
  return guarded([&] {
    MXMOE_CHECK_ARG(layer != nullptr, "layer", "a pointer to the result", "NULL");
    *layer = nullptr;
    const device_ref d = to_device(device_type, device_id, "device_type");
    const moe_config c = to_config(cfg);
    const moe_weights w = to_weights(weights);
    const prepare_options o = to_options(options);
    if (d.kind == device_kind::cuda) {
      // Device expert matrices must be on the device prepared for (forward.h sees only "cuda").
      for (const weight_slot& s : weight_slots()) {
        const mxmoe_tensor* t = weights->*s.src;
        if (t && t->device_type == MXMOE_DEVICE_CUDA)
          require_device(d, "the device prepared for", {{(std::string("weights.") + s.field).c_str(), t}});
      }
    }
    *layer = prepare_on(w, c, d, o).release();
  });
}

mxmoe_status mxmoe_moe_config_of(const mxmoe_moe* layer, mxmoe_moe_config* cfg) {
  return guarded([&] {
    const mxmoe_moe& m = require_layer(layer);
    MXMOE_CHECK_ARG(cfg != nullptr, "cfg", "a pointer to the result", "NULL");
    *cfg = from_config(m.layer.config());
  });
}

mxmoe_status mxmoe_moe_expert_map(const mxmoe_moe* layer, int32_t* map, int64_t capacity, int64_t* size) {
  return guarded([&] {
    const mxmoe_moe& m = require_layer(layer);
    MXMOE_CHECK_ARG(size != nullptr, "size", "a pointer to the result", "NULL");
    const std::vector<int32_t>& held = m.layer.expert_map();
    const auto n = static_cast<int64_t>(held.size());
    if (map && n) {
      MXMOE_CHECK_ARG(capacity >= n, "capacity", ">= " + std::to_string(n) + " (the map's entries)",
                      std::to_string(capacity));
      std::memcpy(map, held.data(), held.size() * sizeof(int32_t));
    }
    *size = n;
  });
}

mxmoe_status mxmoe_shard_intermediate(int64_t intermediate, int32_t rank, int32_t ranks, int64_t* begin,
                                      int64_t* size) {
  return guarded([&] {
    MXMOE_CHECK_ARG(begin != nullptr && size != nullptr, begin ? "size" : "begin", "a pointer to the result", "NULL");
    MXMOE_CHECK_ARG(intermediate > 0 && intermediate % 32 == 0, "intermediate", "a positive multiple of 32",
                    std::to_string(intermediate));
    const tp_shard s{rank, ranks};
    const int64_t b = shard_begin(intermediate, s), n = shard_intermediate(intermediate, s);
    *begin = b;
    *size = n;
  });
}

mxmoe_status mxmoe_contiguous_expert_map(int64_t experts, int32_t ranks, int32_t rank, int32_t* map) {
  return guarded([&] {
    MXMOE_CHECK_ARG(map != nullptr, "map", "room for `experts` entries", "NULL");
    const std::vector<int32_t> m = expert_map_of(contiguous_owners(experts, ranks), rank);
    std::memcpy(map, m.data(), m.size() * sizeof(int32_t));
  });
}

void mxmoe_moe_free(mxmoe_moe* layer) {
  if (!layer) return;
  try {
    const optional_device_guard guard(layer->device.kind == device_kind::cuda, layer->device.id);
    delete layer;
  } catch (...) {
    delete layer;
  }
}

mxmoe_status mxmoe_moe_device(const mxmoe_moe* layer, int32_t* device_type, int32_t* device_id) {
  return guarded([&] {
    const mxmoe_moe& m = require_layer(layer);
    if (device_type) *device_type = m.device.kind == device_kind::cuda ? MXMOE_DEVICE_CUDA : MXMOE_DEVICE_CPU;
    if (device_id) *device_id = m.device.id;
  });
}

mxmoe_status mxmoe_moe_workspace_bytes(const mxmoe_moe* layer, int64_t max_tokens, int64_t* bytes) {
  return guarded([&] {
    const mxmoe_moe& m = require_layer(layer);
    MXMOE_CHECK_ARG(max_tokens >= 0, "max_tokens", "a token count >= 0", std::to_string(max_tokens));
    MXMOE_CHECK_ARG(bytes != nullptr, "bytes", "a pointer to the result", "NULL");
    *bytes = static_cast<int64_t>(m.layer.workspace_bytes(max_tokens));
  });
}

mxmoe_status mxmoe_moe_weight_bytes(const mxmoe_moe* layer, int64_t* bytes) {
  return guarded([&] {
    const mxmoe_moe& m = require_layer(layer);
    MXMOE_CHECK_ARG(bytes != nullptr, "bytes", "a pointer to the result", "NULL");
    *bytes = static_cast<int64_t>(m.layer.weight_bytes());
  });
}

mxmoe_status mxmoe_moe_forward(const mxmoe_moe* layer, const mxmoe_tensor* x, const mxmoe_tensor* logits,
                               const mxmoe_tensor* ids, const mxmoe_tensor* weights, const mxmoe_tensor* out,
                               void* workspace, int64_t workspace_bytes, void* stream) {
  return guarded([&] {
    const mxmoe_moe& m = require_layer(layer);
    const forward_call c = to_forward_call(m, x, logits, ids, weights, out, workspace_bytes);
    const optional_device_guard guard(m.device.kind == device_kind::cuda, m.device.id);
    moe_forward(m.layer, c.x, c.routing, c.out, workspace, c.workspace_bytes, stream);
  });
}

mxmoe_status mxmoe_moe_forward_timed(const mxmoe_moe* layer, const mxmoe_tensor* x, const mxmoe_tensor* logits,
                                     const mxmoe_tensor* ids, const mxmoe_tensor* weights, const mxmoe_tensor* out,
                                     void* workspace, int64_t workspace_bytes, void* stream, int64_t iterations,
                                     double* seconds) {
  return guarded([&] {
    const mxmoe_moe& m = require_layer(layer);
    MXMOE_CHECK_ARG(iterations >= 1, "iterations", "a count >= 1", std::to_string(iterations));
    MXMOE_CHECK_ARG(seconds != nullptr, "seconds", "a pointer to the result", "NULL");
    const forward_call c = to_forward_call(m, x, logits, ids, weights, out, workspace_bytes);
    const optional_device_guard guard(m.device.kind == device_kind::cuda, m.device.id);
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < iterations; ++i)
      moe_forward(m.layer, c.x, c.routing, c.out, workspace, c.workspace_bytes, stream);
    *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
}

mxmoe_status mxmoe_moe_error_flags(const mxmoe_moe* layer, const void* workspace, int64_t workspace_bytes,
                                   uint32_t* flags) {
  return guarded([&] {
    const mxmoe_moe& m = require_layer(layer);
    MXMOE_CHECK_ARG(flags != nullptr, "flags", "a pointer to the result", "NULL");
    MXMOE_CHECK_ARG(workspace_bytes >= 0, "workspace_bytes", "a size >= 0", std::to_string(workspace_bytes));
    const optional_device_guard guard(m.device.kind == device_kind::cuda, m.device.id);
    *flags = m.layer.read_error_flags(workspace, static_cast<size_t>(workspace_bytes));
  });
}

}  // extern "C"
