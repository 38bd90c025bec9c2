// The C ABI's MoE layer (mxmoe_moe_*): prepared weights that own their memory, and forward.
// The one place the C ABI maps onto the C++ MoE API: the CPU backend (cpu::moe_forward on a
// private copy of the weights) or the CUDA layer (cuda::moe_layer, weights in device memory).
#include <cstddef>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bridge.h"
#include "device_guard.h"
#include "mxmoe/c_api.h"
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
#include "mxmoe/moe.h"
#include "mxmoe/validate.h"

struct mxmoe_moe {
  mxmoe::c_api::device_ref device;
  mxmoe::moe_config cfg;
  // CPU backend: the weights, copied into storage the layer owns.
  mxmoe::moe_weights weights;
  std::vector<std::unique_ptr<std::byte[]>> storage;
  // CUDA backend.
  std::optional<mxmoe::cuda::moe_layer> layer;
};

namespace mxmoe::c_api {
namespace {

// The CPU backend accumulates in float32; its bound against the float64 reference is the one the
// command line checks (docs/cli.md, `mxmoe run`).
constexpr double kCpuForwardRelL2Tolerance = 1e-4;

static_assert(MXMOE_ROUTING_SIGMOID_GROUPED_TOPK == static_cast<int>(routing_kind::sigmoid_grouped_topk));
static_assert(MXMOE_ACT_SWIGLU_CLAMPED == static_cast<int>(activation_kind::swiglu_clamped));
static_assert(MXMOE_GATE_UP_INTERLEAVED == static_cast<int>(layout::gate_up_order::interleaved));
static_assert(MXMOE_WEIGHTS_BF16 == static_cast<int>(weight_format::bf16));

template <class E>
E to_enum(int32_t v, int32_t last, const char* name, const char* expected) {
  MXMOE_CHECK_ARG(v >= 0 && v <= last, name, expected, std::to_string(v));
  return static_cast<E>(v);
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

struct weight_slot {
  const char* name;
  const mxmoe_tensor* mxmoe_moe_weights::*src;
  tensor_view moe_weights::*dst;
};
constexpr weight_slot kWeightSlots[] = {
    {"weights.gate_up_blocks", &mxmoe_moe_weights::gate_up_blocks, &moe_weights::gate_up_blocks},
    {"weights.gate_up_scales", &mxmoe_moe_weights::gate_up_scales, &moe_weights::gate_up_scales},
    {"weights.down_blocks", &mxmoe_moe_weights::down_blocks, &moe_weights::down_blocks},
    {"weights.down_scales", &mxmoe_moe_weights::down_scales, &moe_weights::down_scales},
    {"weights.gate_up", &mxmoe_moe_weights::gate_up, &moe_weights::gate_up},
    {"weights.down", &mxmoe_moe_weights::down, &moe_weights::down},
    {"weights.gate_up_bias", &mxmoe_moe_weights::gate_up_bias, &moe_weights::gate_up_bias},
    {"weights.down_bias", &mxmoe_moe_weights::down_bias, &moe_weights::down_bias},
    {"weights.router_weight", &mxmoe_moe_weights::router_weight, &moe_weights::router_weight},
    {"weights.router_bias", &mxmoe_moe_weights::router_bias, &moe_weights::router_bias},
    {"weights.correction_bias", &mxmoe_moe_weights::correction_bias, &moe_weights::correction_bias},
};

moe_weights to_weights(const mxmoe_moe_weights* w) {
  MXMOE_CHECK_ARG(w != nullptr, "weights", "the layer's weights", "NULL");
  moe_weights out;
  out.format = to_enum<weight_format>(w->format, MXMOE_WEIGHTS_BF16, "weights.format", "0 (mxfp4) or 1 (bf16)");
  for (const weight_slot& s : kWeightSlots) out.*s.dst = optional_view(w->*s.src, s.name);
  return out;
}

// The CPU backend reads the weights on every forward: it keeps its own copy (validated, so each
// given tensor is contiguous and nbytes() covers it).
void copy_weights(mxmoe_moe& m) {
  for (const weight_slot& s : kWeightSlots) {
    tensor_view& v = m.weights.*s.dst;
    if (is_absent(v)) continue;
    MXMOE_CHECK_ARG(v.device == device_kind::cpu, s.name, "a cpu tensor (the layer is prepared for the cpu)",
                    "a cuda tensor");
    auto bytes = std::make_unique<std::byte[]>(v.nbytes());
    if (v.nbytes()) std::memcpy(bytes.get(), v.data, v.nbytes());
    v.data = bytes.get();
    v.strides.clear();
    m.storage.push_back(std::move(bytes));
  }
}

const mxmoe_moe& require_layer(const mxmoe_moe* layer) {
  MXMOE_CHECK_ARG(layer != nullptr, "layer", "a prepared layer", "NULL");
  return *layer;
}

}  // namespace
}  // namespace mxmoe::c_api

using namespace mxmoe;
using namespace mxmoe::c_api;

extern "C" {

mxmoe_status mxmoe_moe_prepare(const mxmoe_moe_config* cfg, const mxmoe_moe_weights* weights, int32_t device_type,
                               int32_t device_id, mxmoe_moe** layer) {
  return guarded([&] {
    MXMOE_CHECK_ARG(layer != nullptr, "layer", "a pointer to the result", "NULL");
    *layer = nullptr;
    MXMOE_CHECK_ARG(device_type == MXMOE_DEVICE_CPU || device_type == MXMOE_DEVICE_CUDA, "device_type",
                    "0 (cpu) or 1 (cuda)", std::to_string(device_type));
    auto m = std::make_unique<mxmoe_moe>();
    m->device = {device_type == MXMOE_DEVICE_CUDA ? device_kind::cuda : device_kind::cpu,
                 device_type == MXMOE_DEVICE_CUDA ? device_id : 0};
    m->cfg = to_config(cfg);
    m->weights = to_weights(weights);
    validate(m->weights, m->cfg);
    if (m->device.kind == device_kind::cpu) {
      copy_weights(*m);
    } else {
      // Expert matrices may be host or device memory; device ones must be on the target device.
      for (const weight_slot& s : kWeightSlots) {
        const mxmoe_tensor* t = weights->*s.src;
        if (t && t->device_type == MXMOE_DEVICE_CUDA) require_device(m->device, "the device prepared for", {{s.name, t}});
      }
      device_guard guard(m->device.id);
      m->layer.emplace(m->weights, m->cfg);
      m->weights = {};  // the layer holds what it needs; the caller's pointers are not kept
    }
    *layer = m.release();
  });
}

void mxmoe_moe_free(mxmoe_moe* layer) {
  if (!layer) return;
  try {
    std::optional<device_guard> guard;
    if (layer->layer) guard.emplace(layer->device.id);
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
    *bytes = m.layer ? static_cast<int64_t>(m.layer->workspace_bytes(max_tokens)) : 0;
  });
}

mxmoe_status mxmoe_moe_weight_bytes(const mxmoe_moe* layer, int64_t* bytes) {
  return guarded([&] {
    const mxmoe_moe& m = require_layer(layer);
    MXMOE_CHECK_ARG(bytes != nullptr, "bytes", "a pointer to the result", "NULL");
    int64_t n = 0;
    if (m.layer) n = static_cast<int64_t>(m.layer->weight_bytes());
    else
      for (const weight_slot& s : kWeightSlots)
        if (!is_absent(m.weights.*s.dst)) n += static_cast<int64_t>((m.weights.*s.dst).nbytes());
    *bytes = n;
  });
}

mxmoe_status mxmoe_moe_forward(const mxmoe_moe* layer, const mxmoe_tensor* x, const mxmoe_tensor* logits,
                               const mxmoe_tensor* ids, const mxmoe_tensor* weights, const mxmoe_tensor* out,
                               void* workspace, int64_t workspace_bytes, void* stream) {
  return guarded([&] {
    const mxmoe_moe& m = require_layer(layer);
    const tensor_view xv = required_view(x, "x"), ov = required_view(out, "out");
    routing_input routing;
    routing.logits = optional_view(logits, "routing.logits");
    routing.ids = optional_view(ids, "routing.ids");
    routing.weights = optional_view(weights, "routing.weights");
    require_device(m.device, "where the layer's weights are",
                   {{"x", x}, {"routing.logits", logits}, {"routing.ids", ids}, {"routing.weights", weights}, {"out", out}});
    if (!m.layer) return cpu::moe_forward(xv, routing, m.weights, m.cfg, ov, cpu::precision::f32);
    MXMOE_CHECK_ARG(workspace_bytes >= 0, "workspace_bytes", "a size >= 0", std::to_string(workspace_bytes));
    device_guard guard(m.device.id);
    m.layer->forward(xv, routing, ov, workspace, static_cast<size_t>(workspace_bytes), stream);
  });
}

mxmoe_status mxmoe_forward_rel_l2_tolerance(int32_t device_type, double* tolerance) {
  return guarded([&] {
    MXMOE_CHECK_ARG(device_type == MXMOE_DEVICE_CPU || device_type == MXMOE_DEVICE_CUDA, "device_type",
                    "0 (cpu) or 1 (cuda)", std::to_string(device_type));
    MXMOE_CHECK_ARG(tolerance != nullptr, "tolerance", "a pointer to the result", "NULL");
    *tolerance = device_type == MXMOE_DEVICE_CUDA ? cuda::kForwardRelL2Tolerance : kCpuForwardRelL2Tolerance;
  });
}

mxmoe_status mxmoe_moe_error_flags(const mxmoe_moe* layer, const void* workspace, int64_t workspace_bytes,
                                   uint32_t* flags) {
  return guarded([&] {
    const mxmoe_moe& m = require_layer(layer);
    MXMOE_CHECK_ARG(flags != nullptr, "flags", "a pointer to the result", "NULL");
    MXMOE_CHECK_ARG(workspace_bytes >= 0, "workspace_bytes", "a size >= 0", std::to_string(workspace_bytes));
    if (!m.layer) {
      *flags = 0;
      return;
    }
    device_guard guard(m.device.id);
    *flags = m.layer->read_error_flags(workspace, static_cast<size_t>(workspace_bytes));
  });
}

}  // extern "C"
