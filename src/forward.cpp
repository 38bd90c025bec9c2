// The dispatch floor of the MoE layer (include/mxmoe/forward.h): the backend choice, weights
// prepared for a backend, and one forward that checks where the tensors live and runs there.
#include "mxmoe/forward.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
#include "mxmoe/validate.h"

namespace mxmoe {

struct prepared_moe::impl {
  device_kind device = device_kind::cpu;
  moe_config cfg;
  std::vector<int32_t> expert_map;
  // cpu: copies of the caller's tensors, and weights viewing them.
  std::vector<std::vector<uint8_t>> owned;
  moe_weights weights;
  // cuda
  std::unique_ptr<cuda::moe_layer> layer;
};

namespace {

const char* device_name(device_kind d) { return d == device_kind::cuda ? "cuda" : "cpu"; }

// A copy of `v` (host, contiguous: validate() checked) kept in `owned`; absent stays absent.
tensor_view keep(const tensor_view& v, std::vector<std::vector<uint8_t>>& owned) {
  if (is_absent(v)) return {};
  const auto* p = static_cast<const uint8_t*>(v.data);
  owned.emplace_back(p, p + v.nbytes());
  return tensor_view(owned.back().data(), v.type, v.shape);
}

// `v` (when given) lives on `device`; a cuda tensor without a usable cuda backend says why.
void check_on(const tensor_view& v, const char* name, device_kind device, const char* prepared_for) {
  if (is_absent(v) || v.device == device) return;
  std::string why;
  if (v.device == device_kind::cuda && !cuda::available(&why))
    throw unsupported(std::string(name) + " is a cuda tensor, but the cuda backend is unavailable: " + why);
  MXMOE_CHECK_ARG(false, name, std::string("a ") + device_name(device) + " tensor (" + prepared_for + ")",
                  std::string("a ") + device_name(v.device) + " tensor");
}

void check_routing_on(const routing_input& r, device_kind device, const char* why) {
  check_on(r.logits, "routing.logits", device, why);
  check_on(r.ids, "routing.ids", device, why);
  check_on(r.weights, "routing.weights", device, why);
}

}  // namespace

backend_choice choose_backend(backend_request request) {
  MXMOE_CHECK_ARG(request == backend_request::automatic || request == backend_request::cpu ||
                      request == backend_request::cuda,
                  "request", "automatic | cpu | cuda", std::to_string(static_cast<int>(request)));
  if (request == backend_request::cpu) return {device_kind::cpu, "cpu", "cpu was requested"};
  std::string why;
  if (cuda::available(&why)) {
    return {device_kind::cuda, "cuda (" + cuda::device_name() + ")",
            request == backend_request::cuda ? "cuda was requested" : "auto: a usable sm_90 GPU was found"};
  }
  if (request == backend_request::cuda) throw unsupported("cuda: no usable GPU: " + why);
  return {device_kind::cpu, "cpu", "auto: no usable GPU (" + why + "), so the CPU backend runs"};
}

prepared_moe::prepared_moe(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
prepared_moe::~prepared_moe() = default;
prepared_moe::prepared_moe(prepared_moe&&) noexcept = default;
prepared_moe& prepared_moe::operator=(prepared_moe&&) noexcept = default;

const prepared_moe::impl& prepared_moe::state() const {
  MXMOE_CHECK_ARG(impl_ != nullptr, "layer", "a prepared layer", "an empty (moved-from) prepared_moe");
  return *impl_;
}

device_kind prepared_moe::device() const { return state().device; }
const moe_config& prepared_moe::config() const { return state().cfg; }
const std::vector<int32_t>& prepared_moe::expert_map() const { return state().expert_map; }

size_t prepared_moe::weight_bytes() const {
  const impl& m = state();
  if (m.layer) return m.layer->weight_bytes();
  size_t n = 0;
  for (const auto& b : m.owned) n += b.size();
  return n;
}

size_t prepared_moe::workspace_bytes(int64_t max_tokens) const {
  MXMOE_CHECK_ARG(max_tokens >= 0, "max_tokens", ">= 0", std::to_string(max_tokens));
  const impl& m = state();
  return m.layer ? m.layer->workspace_bytes(max_tokens) : 0;
}

uint32_t prepared_moe::read_error_flags(const void* workspace, size_t workspace_size) const {
  const impl& m = state();
  return m.layer ? m.layer->read_error_flags(workspace, workspace_size) : 0;
}

prepared_moe prepare(const moe_weights& weights, const moe_config& cfg, device_kind target,
                     const prepare_options& options) {
  MXMOE_CHECK_ARG(target == device_kind::cpu || target == device_kind::cuda, "target", "cpu | cuda",
                  std::to_string(static_cast<int>(target)));
  if (options.tp.ranks != 1 || options.tp.rank != 0) {
    const owned_weights shard = shard_weights(weights, cfg, options.tp, options.expert_map);
    return prepare(shard.weights(), shard.cfg, target, {options.expert_map, {}});
  }
  auto m = std::make_unique<prepared_moe::impl>();
  m->device = target;
  m->cfg = cfg;
  m->expert_map = options.expert_map;
  if (target == device_kind::cuda) {
    std::string why;
    if (!cuda::available(&why)) throw unsupported("prepare for cuda: the cuda backend is unavailable: " + why);
    m->layer = std::make_unique<cuda::moe_layer>(weights, cfg, options.expert_map);
    return prepared_moe(std::move(m));
  }
  validate(weights, cfg, options.expert_map);
  const bool mxfp4 = weights.format == weight_format::mxfp4;
  check_on(mxfp4 ? weights.gate_up_blocks : weights.gate_up, mxfp4 ? "weights.gate_up_blocks" : "weights.gate_up",
           device_kind::cpu, "the cpu backend reads host memory");
  moe_weights& w = m->weights;
  w.format = weights.format;
  const auto own = [&](const tensor_view& v) { return keep(v, m->owned); };
  w.gate_up_blocks = own(weights.gate_up_blocks);
  w.gate_up_scales = own(weights.gate_up_scales);
  w.down_blocks = own(weights.down_blocks);
  w.down_scales = own(weights.down_scales);
  w.gate_up = own(weights.gate_up);
  w.down = own(weights.down);
  w.gate_up_bias = own(weights.gate_up_bias);
  w.down_bias = own(weights.down_bias);
  w.router_weight = own(weights.router_weight);
  w.router_bias = own(weights.router_bias);
  w.correction_bias = own(weights.correction_bias);
  return prepared_moe(std::move(m));
}

void moe_forward(const prepared_moe& layer, const tensor_view& x, const routing_input& routing, const tensor_view& out,
                 void* workspace, size_t workspace_size, void* stream) {
  const prepared_moe::impl& m = layer.state();
  const char* why = m.device == device_kind::cuda ? "the layer was prepared for cuda" : "the layer was prepared for cpu";
  check_on(x, "x", m.device, why);
  check_on(out, "out", m.device, why);
  check_routing_on(routing, m.device, why);
  // Each backend validates the rest (shapes, dtypes, values) before it writes anything.
  if (m.layer) return m.layer->forward(x, routing, out, workspace, workspace_size, stream);
  cpu::moe_forward(x, routing, m.weights, m.cfg, out, cpu::precision::f32, 0, m.expert_map);
}

void moe_forward_host(const prepared_moe& layer, const tensor_view& x, const routing_input& routing,
                      const tensor_view& out) {
  const char* why = "moe_forward_host takes host tensors";
  check_on(x, "x", device_kind::cpu, why);
  check_on(out, "out", device_kind::cpu, why);
  check_routing_on(routing, device_kind::cpu, why);
  if (layer.device() == device_kind::cpu) return moe_forward(layer, x, routing, out, nullptr, 0, nullptr);

  const moe_config& cfg = layer.config();
  validate_moe_io(x, out, cfg);
  const int64_t T = x.dim(0), H = cfg.shape.hidden;
  // Copies on the device (at least 16 bytes each, so that no view has a null pointer).
  auto upload = [](const tensor_view& v, std::vector<cuda::device_buffer>& keep_alive) {
    if (is_absent(v)) return tensor_view();
    keep_alive.emplace_back(std::max<size_t>(v.nbytes(), 16));
    if (v.nbytes()) keep_alive.back().upload(v.data, v.nbytes());
    return keep_alive.back().view(v.type, v.shape);
  };
  std::vector<cuda::device_buffer> buffers;
  buffers.reserve(4);
  const tensor_view dx = upload(x, buffers);
  routing_input dr;
  dr.logits = upload(routing.logits, buffers);
  dr.ids = upload(routing.ids, buffers);
  dr.weights = upload(routing.weights, buffers);
  cuda::device_buffer dout(std::max<size_t>(static_cast<size_t>(T * H) * 2, 16));
  const size_t ws_bytes = layer.workspace_bytes(T);
  cuda::device_buffer ws(std::max<size_t>(ws_bytes, 16));
  moe_forward(layer, dx, dr, dout.view(dtype::bf16, {T, H}), ws.data(), ws_bytes, nullptr);
  cuda::synchronize();
  std::vector<uint16_t> out16(static_cast<size_t>(T * H));
  if (!out16.empty()) dout.download(out16.data(), out16.size() * 2);
  if (out.type == dtype::bf16) {
    std::memcpy(out.data, out16.data(), out16.size() * 2);
  } else {
    for (size_t i = 0; i < out16.size(); ++i) out.as<float>()[i] = bf16_to_float(out16[i]);
  }
}

}  // namespace mxmoe
