// Validation of the MoE configuration, the checkpoint-layout weights and a call's routing and
// activation tensors (include/mxmoe/moe.h, include/mxmoe/validate.h). Nothing here reads device
// memory: value checks (expert ids, routing weights) run only on host tensors.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "mxmoe/error.h"
#include "mxmoe/moe.h"
#include "mxmoe/validate.h"

namespace mxmoe {
namespace {

constexpr int64_t kMaxExperts = 512;
constexpr int kMaxTopK = 16;
constexpr std::initializer_list<dtype> kFloatTypes{dtype::bf16, dtype::f16, dtype::f32};

std::string dtype_list(std::initializer_list<dtype> types) {
  std::string s;
  for (dtype t : types) s += (s.empty() ? "" : " | ") + std::string(to_string(t));
  return s;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

void check_positive_finite(float v, const char* name) {
  MXMOE_CHECK_ARG(std::isfinite(v) && v > 0.0f, name, "a finite value > 0", num(v));
}

void check_host(const tensor_view& v, const char* name) {
  MXMOE_CHECK_ARG(v.device == device_kind::cpu, name, "a tensor in host (cpu) memory", "a cuda tensor");
}

// An optional weight tensor: absent, or a host tensor of the given dtypes and shape.
void check_optional(const tensor_view& v, const char* name, std::initializer_list<dtype> types,
                    const std::vector<int64_t>& shape) {
  if (is_absent(v)) return;
  check_host(v, name);
  check_tensor(v, name, types, shape);
}

// The expert matrices may live in host or device memory (the CUDA layer prepares from either);
// they must all live in the same place. Their values are never read here.
void check_required(const tensor_view& v, const char* name, std::initializer_list<dtype> types,
                    const std::vector<int64_t>& shape, device_kind where) {
  MXMOE_CHECK_ARG(!is_absent(v), name, dtype_list(types) + " " + shape_string(shape), "no tensor");
  MXMOE_CHECK_ARG(v.device == where, name, where == device_kind::cpu ? "a host tensor, like the other expert weights"
                                                                     : "a cuda tensor, like the other expert weights",
                  v.device == device_kind::cpu ? "a host tensor" : "a cuda tensor");
  check_tensor(v, name, types, shape);
}

void check_unused(const tensor_view& v, const char* name, const char* why) {
  MXMOE_CHECK_ARG(is_absent(v), name, std::string("no tensor (") + why + ")",
                  "a tensor of shape " + shape_string(v.shape));
}

}  // namespace

void check_tensor(const tensor_view& v, const char* name, std::initializer_list<dtype> types,
                  const std::vector<int64_t>& shape) {
  bool type_ok = false;
  for (dtype t : types) type_ok = type_ok || v.type == t;
  MXMOE_CHECK_ARG(type_ok, name, "dtype " + dtype_list(types), to_string(v.type));
  MXMOE_CHECK_ARG(v.shape == shape, name, "shape " + shape_string(shape), shape_string(v.shape));
  MXMOE_CHECK_ARG(v.strides.empty() || v.strides.size() == v.shape.size(), name,
                  "one stride per dimension", std::to_string(v.strides.size()) + " strides");
  MXMOE_CHECK_ARG(v.contiguous(), name, "contiguous row-major strides", shape_string(v.strides));
  MXMOE_CHECK_ARG(v.data != nullptr || v.numel() == 0, name, "non-null data", "a null pointer");
}

void validate_routing_config(const routing_config& r, int64_t e, const char* prefix) {
  const std::string p = prefix;
  MXMOE_CHECK_ARG(r.kind == routing_kind::softmax_topk || r.kind == routing_kind::topk_softmax ||
                      r.kind == routing_kind::sigmoid_grouped_topk,
                  p + ".kind", "softmax_topk | topk_softmax | sigmoid_grouped_topk",
                  std::to_string(static_cast<int>(r.kind)));
  const int64_t max_k = e < kMaxTopK ? e : kMaxTopK;
  MXMOE_CHECK_ARG(r.top_k >= 1 && r.top_k <= max_k, p + ".top_k",
                  "a value in [1, min(16, experts)] = [1, " + std::to_string(max_k) + "]", std::to_string(r.top_k));
  MXMOE_CHECK_ARG(r.n_group >= 1 && e % r.n_group == 0, p + ".n_group",
                  "a divisor of experts (" + std::to_string(e) + ")", std::to_string(r.n_group));
  MXMOE_CHECK_ARG(r.topk_group >= 1 && r.topk_group <= r.n_group, p + ".topk_group",
                  "a value in [1, n_group] = [1, " + std::to_string(r.n_group) + "]", std::to_string(r.topk_group));
  const int64_t selectable = r.topk_group * (e / r.n_group);
  MXMOE_CHECK_ARG(r.top_k <= selectable, p + ".top_k",
                  "at most topk_group * experts / n_group = " + std::to_string(selectable), std::to_string(r.top_k));
  MXMOE_CHECK_ARG(std::isfinite(r.routed_scaling_factor) && r.routed_scaling_factor > 0.0f,
                  p + ".routed_scaling_factor", "a finite value > 0", num(r.routed_scaling_factor));
}

void validate(const moe_config& cfg) {
  const int64_t e = cfg.shape.experts, h = cfg.shape.hidden, i = cfg.shape.intermediate;
  MXMOE_CHECK_ARG(e >= 1 && e <= kMaxExperts, "cfg.shape.experts", "a value in [1, 512]", std::to_string(e));
  MXMOE_CHECK_ARG(h > 0 && h % mx::kBlockSize == 0, "cfg.shape.hidden", "a positive multiple of 32",
                  std::to_string(h));
  MXMOE_CHECK_ARG(i > 0 && i % mx::kBlockSize == 0, "cfg.shape.intermediate", "a positive multiple of 32",
                  std::to_string(i));

  validate_routing_config(cfg.routing, e, "cfg.routing");

  const activation_config& a = cfg.activation;
  MXMOE_CHECK_ARG(a.kind == activation_kind::silu_mul || a.kind == activation_kind::swiglu_clamped,
                  "cfg.activation.kind", "silu_mul | swiglu_clamped", std::to_string(static_cast<int>(a.kind)));
  check_positive_finite(a.alpha, "cfg.activation.alpha");
  check_positive_finite(a.limit, "cfg.activation.limit");
  MXMOE_CHECK_ARG(cfg.gate_up == layout::gate_up_order::concatenated ||
                      cfg.gate_up == layout::gate_up_order::interleaved,
                  "cfg.gate_up", "concatenated | interleaved", std::to_string(static_cast<int>(cfg.gate_up)));
}

int64_t validate_expert_map(const std::vector<int32_t>& expert_map, int64_t experts) {
  if (expert_map.empty()) return experts;
  MXMOE_CHECK_ARG(static_cast<int64_t>(expert_map.size()) == experts, "expert_map",
                  "one entry per expert (" + std::to_string(experts) + ")", std::to_string(expert_map.size()) + " entries");
  int64_t held = 0;
  for (int32_t v : expert_map) held += v >= 0 ? 1 : 0;
  MXMOE_CHECK_ARG(held >= 1, "expert_map", "at least one expert held (an entry >= 0)", "none");
  std::vector<int64_t> expert_of(static_cast<size_t>(held), -1);
  for (int64_t e = 0; e < experts; ++e) {
    const int32_t v = expert_map[static_cast<size_t>(e)];
    MXMOE_CHECK_ARG(v >= -1 && v < held, "expert_map",
                    "-1 or a local index in [0, " + std::to_string(held) + ") (the experts held)",
                    std::to_string(v) + " at [" + std::to_string(e) + "]");
    if (v < 0) continue;
    MXMOE_CHECK_ARG(expert_of[static_cast<size_t>(v)] < 0, "expert_map", "each local index once",
                    "local index " + std::to_string(v) + " for experts " +
                        std::to_string(expert_of[static_cast<size_t>(v)]) + " and " + std::to_string(e));
    expert_of[static_cast<size_t>(v)] = e;
  }
  return held;
}

void validate(const moe_weights& w, const moe_config& cfg, const std::vector<int32_t>& expert_map) {
  validate(cfg);
  // Expert tensors and their biases hold the experts of the map; router tensors all E.
  const int64_t e = validate_expert_map(expert_map, cfg.shape.experts), h = cfg.shape.hidden,
                i = cfg.shape.intermediate, all = cfg.shape.experts;
  const int64_t bs = mx::kBlockSize, pb = mx::kPackedBlockBytes;
  if (w.format == weight_format::mxfp4) {
    const device_kind where = w.gate_up_blocks.device;
    check_required(w.gate_up_blocks, "weights.gate_up_blocks", {dtype::u8}, {e, 2 * i, h / bs, pb}, where);
    check_required(w.gate_up_scales, "weights.gate_up_scales", {dtype::u8}, {e, 2 * i, h / bs}, where);
    check_required(w.down_blocks, "weights.down_blocks", {dtype::u8}, {e, h, i / bs, pb}, where);
    check_required(w.down_scales, "weights.down_scales", {dtype::u8}, {e, h, i / bs}, where);
    check_unused(w.gate_up, "weights.gate_up", "format is mxfp4: use gate_up_blocks and gate_up_scales");
    check_unused(w.down, "weights.down", "format is mxfp4: use down_blocks and down_scales");
  } else {
    MXMOE_CHECK_ARG(w.format == weight_format::bf16, "weights.format", "mxfp4 | bf16",
                    std::to_string(static_cast<int>(w.format)));
    check_required(w.gate_up, "weights.gate_up", {dtype::bf16}, {e, 2 * i, h}, w.gate_up.device);
    check_required(w.down, "weights.down", {dtype::bf16}, {e, h, i}, w.gate_up.device);
    check_unused(w.gate_up_blocks, "weights.gate_up_blocks", "format is bf16: use gate_up");
    check_unused(w.gate_up_scales, "weights.gate_up_scales", "format is bf16: use gate_up");
    check_unused(w.down_blocks, "weights.down_blocks", "format is bf16: use down");
    check_unused(w.down_scales, "weights.down_scales", "format is bf16: use down");
  }
  // Biases and router tensors in any float type a checkpoint stores them in (quantize copies them
  // unchanged); every backend widens them with load_float (dtype.h) or its device twin.
  check_optional(w.gate_up_bias, "weights.gate_up_bias", kFloatTypes, {e, 2 * i});
  check_optional(w.down_bias, "weights.down_bias", kFloatTypes, {e, h});
  check_optional(w.router_weight, "weights.router_weight", kFloatTypes, {all, h});
  check_optional(w.router_bias, "weights.router_bias", kFloatTypes, {all});
  if (is_absent(w.router_weight))
    check_unused(w.router_bias, "weights.router_bias", "router_bias needs weights.router_weight");
  check_optional(w.correction_bias, "weights.correction_bias", {dtype::f32}, {all});
  if (!is_absent(w.correction_bias)) {
    const float* bias = w.correction_bias.as<const float>();
    for (int64_t n = 0; n < all; ++n)
      MXMOE_CHECK_ARG(std::isfinite(bias[n]), "weights.correction_bias", "finite values",
                      num(bias[n]) + " at [" + std::to_string(n) + "]");
  }
  if (cfg.routing.kind != routing_kind::sigmoid_grouped_topk)
    check_unused(w.correction_bias, "weights.correction_bias",
                 "only sigmoid_grouped_topk uses a correction bias; it would be ignored");
}

routing_source routing_source_of(const routing_input& r) {
  if (!is_absent(r.logits)) return routing_source::logits;
  if (!is_absent(r.ids) || !is_absent(r.weights)) return routing_source::precomputed;
  return routing_source::router_weights;
}

void validate_routing_input(const routing_input& routing, const moe_config& cfg, int64_t tokens) {
  const int64_t e = cfg.shape.experts, k = cfg.routing.top_k;
  switch (routing_source_of(routing)) {
    case routing_source::logits:
      MXMOE_CHECK_ARG(is_absent(routing.ids) && is_absent(routing.weights), "routing",
                      "either logits or ids + weights", "both");
      check_tensor(routing.logits, "routing.logits", {dtype::f32, dtype::bf16}, {tokens, e});
      return;
    case routing_source::router_weights:
      return;
    case routing_source::precomputed:
      break;
  }
  MXMOE_CHECK_ARG(!is_absent(routing.ids), "routing.ids", "i32 " + shape_string({tokens, k}) +
                  " alongside routing.weights", "no tensor");
  MXMOE_CHECK_ARG(!is_absent(routing.weights), "routing.weights", "f32 " + shape_string({tokens, k}) +
                  " alongside routing.ids", "no tensor");
  check_tensor(routing.ids, "routing.ids", {dtype::i32}, {tokens, k});
  check_tensor(routing.weights, "routing.weights", {dtype::f32}, {tokens, k});
  MXMOE_CHECK_ARG(routing.weights.device == routing.ids.device, "routing.weights",
                  "the same device as routing.ids", "a different device");
  if (routing.ids.device != device_kind::cpu) return;  // device values are not readable here
  const int32_t* ids = routing.ids.as<const int32_t>();
  const float* wts = routing.weights.as<const float>();
  for (int64_t n = 0; n < tokens * k; ++n) {
    MXMOE_CHECK_ARG(ids[n] >= 0 && ids[n] < e, "routing.ids",
                    "expert ids in [0, " + std::to_string(e) + ")",
                    std::to_string(ids[n]) + " at " + shape_string({n / k, n % k}));
    MXMOE_CHECK_ARG(std::isfinite(wts[n]), "routing.weights", "finite values",
                    num(wts[n]) + " at " + shape_string({n / k, n % k}));
  }
}

void validate_moe_io(const tensor_view& x, const tensor_view& out, const moe_config& cfg) {
  MXMOE_CHECK_ARG(x.rank() == 2, "x", "a [T, " + std::to_string(cfg.shape.hidden) + "] tensor",
                  "shape " + shape_string(x.shape));
  const int64_t t = x.dim(0);
  MXMOE_CHECK_ARG(t >= 0, "x", "a non-negative token count", std::to_string(t));
  check_tensor(x, "x", {dtype::bf16, dtype::f32}, {t, cfg.shape.hidden});
  check_tensor(out, "out", {dtype::f32, dtype::bf16}, {t, cfg.shape.hidden});
  MXMOE_CHECK_ARG(out.device == x.device, "out", "the same device as x", "a different device");
}

}  // namespace mxmoe
