// Expert parallelism (include/mxmoe/parallel.h): route, plan, pack, exchange, run the local
// experts, exchange back, combine. One sequence for both devices: the steps are ops.h's (host or
// GPU), the exchanges the communicator's, the experts a prepared_moe with this rank's expert map.
#include <algorithm>
#include <optional>
#include <string>

#include "buffer.h"
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
#include "mxmoe/parallel.h"
#include "mxmoe/validate.h"
#include "ops.h"

namespace mxmoe::parallel {

struct ep_layer::impl {
  communicator* comm = nullptr;
  moe_config cfg;
  device_kind device = device_kind::cpu;
  int ranks = 1, rank = 0;
  int64_t max_tokens = 0, capacity_option = 0;
  std::vector<int32_t> owners;
  std::optional<prepared_moe> layer;  // set by the constructor
  owned_tensor router_weight, router_bias, correction_bias;  // routing on the host (cpu)
  buffer owners_d, pad_ids_d, correction_d, logits, ids, weights, sent, slot_token, flags;
  buffer send_x, send_ids, send_w, recv_x, recv_ids, recv_w, recv_y, ret, workspace;
  size_t workspace_bytes = 0;
  uint32_t host_flags = 0;

  int64_t capacity(int64_t tokens) const {
    return capacity_option > 0 ? std::min(capacity_option, tokens) : tokens;
  }
  dtype partial_type() const { return device == device_kind::cuda ? dtype::bf16 : dtype::f32; }
};

namespace {

void check_on(const tensor_view& v, const char* name, device_kind d) {
  if (is_absent(v)) return;
  MXMOE_CHECK_ARG(v.device == d, name, d == device_kind::cuda ? "a cuda tensor (the communicator's device)"
                                                              : "a host tensor (the communicator's device)",
                  v.device == device_kind::cuda ? "a cuda tensor" : "a host tensor");
}

}  // namespace

ep_layer::ep_layer(const moe_weights& weights, const moe_config& cfg, communicator& comm, const ep_options& options)
    : impl_(std::make_unique<impl>()) {
  impl& m = *impl_;
  validate(cfg);
  const int64_t E = cfg.shape.experts, H = cfg.shape.hidden, k = cfg.routing.top_k;
  m.comm = &comm;
  m.cfg = cfg;
  m.device = comm.device();
  m.ranks = comm.size();
  m.rank = comm.rank();
  m.owners = options.owners.empty() ? contiguous_owners(E, m.ranks) : options.owners;
  MXMOE_CHECK_ARG(static_cast<int64_t>(m.owners.size()) == E, "options.owners", "one rank per expert (" + std::to_string(E) + ")",
                  std::to_string(m.owners.size()) + " entries");
  std::vector<int64_t> held(static_cast<size_t>(m.ranks), 0);
  for (size_t e = 0; e < m.owners.size(); ++e) {
    MXMOE_CHECK_ARG(m.owners[e] >= 0 && m.owners[e] < m.ranks, "options.owners",
                    "ranks in [0, " + std::to_string(m.ranks) + ")", std::to_string(m.owners[e]) + " at [" + std::to_string(e) + "]");
    ++held[static_cast<size_t>(m.owners[e])];
  }
  for (int q = 0; q < m.ranks; ++q)
    MXMOE_CHECK_ARG(held[static_cast<size_t>(q)] > 0, "options.owners", "at least one expert on every rank",
                    "none on rank " + std::to_string(q));
  MXMOE_CHECK_ARG(options.max_tokens >= 1, "options.max_tokens", ">= 1", std::to_string(options.max_tokens));
  MXMOE_CHECK_ARG(options.capacity >= 0, "options.capacity", ">= 0 (0: T)", std::to_string(options.capacity));
  m.max_tokens = options.max_tokens;
  m.capacity_option = options.capacity;
  const int64_t rows = m.ranks * m.capacity(m.max_tokens);
  if (m.device == device_kind::cuda)
    MXMOE_CHECK_ARG(rows <= 65536, "options", "ranks * capacity(max_tokens) <= 65536 rows (the cuda layer's T)",
                    std::to_string(rows));

  m.layer.emplace(prepare(weights, cfg, m.device, {expert_map_of(m.owners, m.rank), {}}));
  m.router_weight = owned_tensor::copy_of(weights.router_weight);
  m.router_bias = owned_tensor::copy_of(weights.router_bias);
  m.correction_bias = owned_tensor::copy_of(weights.correction_bias);

  // pad_ids[q]: an expert q does not own (-1 when it owns all: then every row is used).
  std::vector<int32_t> pad(static_cast<size_t>(m.ranks), -1);
  for (int q = 0; q < m.ranks; ++q)
    for (int64_t e = E - 1; e >= 0; --e)
      if (m.owners[static_cast<size_t>(e)] != q) pad[static_cast<size_t>(q)] = static_cast<int32_t>(e);
  const device_kind d = m.device;
  const auto put = [d](const void* src, size_t bytes) {
    buffer b(d, bytes);
    b.upload(src, bytes);
    return b;
  };
  m.owners_d = put(m.owners.data(), m.owners.size() * 4);
  m.pad_ids_d = put(pad.data(), pad.size() * 4);
  if (!m.correction_bias.shape.empty()) m.correction_d = put(m.correction_bias.bytes.data(), m.correction_bias.bytes.size());

  const size_t T = static_cast<size_t>(m.max_tokens), C = static_cast<size_t>(m.capacity(m.max_tokens)),
               P = static_cast<size_t>(m.ranks), Hs = static_cast<size_t>(H), ks = static_cast<size_t>(k);
  const size_t x_bytes = d == device_kind::cuda ? 2 : 4;  // bf16 on cuda; on the cpu x may be f32
  const size_t y_bytes = static_cast<size_t>(dtype_size(m.partial_type()));
  m.logits = buffer(d, d == device_kind::cpu ? T * static_cast<size_t>(E) * 4 : 0);
  m.ids = buffer(d, T * ks * 4);
  m.weights = buffer(d, T * ks * 4);
  m.sent = buffer(d, P * T * 4);
  m.slot_token = buffer(d, P * C * 4);
  m.flags = buffer(d, 4);
  m.send_x = buffer(d, P * C * Hs * x_bytes);
  m.send_ids = buffer(d, P * C * ks * 4);
  m.send_w = buffer(d, P * C * ks * 4);
  m.recv_x = buffer(d, P * C * Hs * x_bytes);
  m.recv_ids = buffer(d, P * C * ks * 4);
  m.recv_w = buffer(d, P * C * ks * 4);
  m.recv_y = buffer(d, P * C * Hs * y_bytes);
  m.ret = buffer(d, P * C * Hs * y_bytes);
  m.workspace_bytes = m.layer->workspace_bytes(static_cast<int64_t>(P * C));
  m.workspace = buffer(d, m.workspace_bytes);
}

ep_layer::~ep_layer() = default;

const moe_config& ep_layer::config() const { return impl_->cfg; }

int64_t ep_layer::capacity(int64_t tokens) const {
  MXMOE_CHECK_ARG(tokens >= 0, "tokens", ">= 0", std::to_string(tokens));
  return impl_->capacity(tokens);
}

size_t ep_layer::dispatch_bytes(int64_t tokens) const {
  const impl& m = *impl_;
  return static_cast<size_t>(capacity(tokens)) *
         static_cast<size_t>(m.cfg.shape.hidden * 2 + 8 * m.cfg.routing.top_k);
}

size_t ep_layer::return_bytes(int64_t tokens) const {
  const impl& m = *impl_;
  return static_cast<size_t>(capacity(tokens) * m.cfg.shape.hidden * dtype_size(m.partial_type()));
}

void ep_layer::forward(const tensor_view& x, const routing_input& routing, const tensor_view& out, void* stream) {
  impl& m = *impl_;
  const moe_config& c = m.cfg;
  const int64_t E = c.shape.experts, H = c.shape.hidden;
  const int k = c.routing.top_k;
  const device_kind d = m.device;
  check_on(x, "x", d);
  check_on(out, "out", d);
  check_on(routing.logits, "routing.logits", d);
  check_on(routing.ids, "routing.ids", d);
  check_on(routing.weights, "routing.weights", d);
  validate_moe_io(x, out, c);
  const int64_t T = x.dim(0);
  MXMOE_CHECK_ARG(T <= m.max_tokens, "x", "at most options.max_tokens = " + std::to_string(m.max_tokens) + " tokens",
                  std::to_string(T));
  if (d == device_kind::cuda) {
    MXMOE_CHECK_ARG(x.type == dtype::bf16, "x", "dtype bf16 (cuda)", to_string(x.type));
    MXMOE_CHECK_ARG(out.type == dtype::bf16, "out", "dtype bf16 (cuda)", to_string(out.type));
  }
  validate_routing_input(routing, c, T);
  const routing_source source = routing_source_of(routing);
  if (source == routing_source::router_weights)
    MXMOE_CHECK_ARG(d == device_kind::cpu && !m.router_weight.shape.empty(), "routing",
                    d == device_kind::cpu ? "logits, ids + weights, or weights.router_weight to compute logits from"
                                          : "logits or ids + weights on the device (cuda)",
                    "none of them");
  m.host_flags = 0;
  if (T == 0) return;  // every rank has T == 0 (a collective)

  // 1. Routing over all E experts.
  const int32_t* ids = m.ids.as<int32_t>();
  const float* wts = m.weights.as<float>();
  const tensor_view ids_view = m.ids.view(dtype::i32, {T, k}), w_view = m.weights.view(dtype::f32, {T, k});
  if (source == routing_source::precomputed) {
    ids = routing.ids.as<const int32_t>();
    wts = routing.weights.as<const float>();
  } else if (d == device_kind::cuda) {
    const tensor_view correction = m.correction_bias.shape.empty() ? tensor_view() : m.correction_d.view(dtype::f32, {E});
    cuda::route(routing.logits, correction, c.routing, ids_view, w_view, stream);
  } else {
    tensor_view logits = routing.logits;
    if (source == routing_source::router_weights) {
      logits = m.logits.view(dtype::f32, {T, E});
      cpu::router_logits(x, m.router_weight.view(), m.router_bias.view(), logits);
    }
    cpu::route(logits, m.correction_bias.view(), c.routing, ids_view, w_view);
  }

  // 2. Plan and pack the rows for every rank.
  const int64_t C = m.capacity(T);
  ep_call call;
  call.ranks = m.ranks;
  call.top_k = k;
  call.tokens = T;
  call.capacity = C;
  call.hidden = H;
  call.experts = E;
  call.owners = m.owners_d.as<int32_t>();
  call.pad_ids = m.pad_ids_d.as<int32_t>();
  call.ids = ids;
  call.weights = wts;
  call.x = x.data;
  call.x_type = x.type;
  call.sent = m.sent.as<int32_t>();
  call.slot_token = m.slot_token.as<int32_t>();
  call.flags = m.flags.as<uint32_t>();
  call.send_x = m.send_x.data();
  call.send_ids = m.send_ids.as<int32_t>();
  call.send_w = m.send_w.as<float>();
  call.ret = m.ret.data();
  call.ret_type = m.partial_type();
  call.out = out.data;
  call.out_type = out.type;
  const bool gpu = d == device_kind::cuda;
  if (gpu) {
    cuda_ops::ep_plan(call, stream);
    cuda_ops::ep_pack(call, stream);
  } else {
    cpu_ops::ep_plan(call);
    cpu_ops::ep_pack(call);
  }

  // 3. Dispatch, the local experts on every received row, the results back.
  const size_t xe = static_cast<size_t>(dtype_size(x.type)), ye = static_cast<size_t>(dtype_size(m.partial_type()));
  const size_t rows_per_peer = static_cast<size_t>(C);
  m.comm->all_to_all({{m.send_x.data(), m.recv_x.data(), rows_per_peer * static_cast<size_t>(H) * xe},
                      {m.send_ids.data(), m.recv_ids.data(), rows_per_peer * static_cast<size_t>(k) * 4},
                      {m.send_w.data(), m.recv_w.data(), rows_per_peer * static_cast<size_t>(k) * 4}},
                     stream);
  const int64_t rows = m.ranks * C;
  routing_input received;
  received.ids = m.recv_ids.view(dtype::i32, {rows, k});
  received.weights = m.recv_w.view(dtype::f32, {rows, k});
  moe_forward(*m.layer, m.recv_x.view(x.type, {rows, H}), received, m.recv_y.view(m.partial_type(), {rows, H}),
              m.workspace.data(), m.workspace_bytes, stream);
  m.comm->all_to_all({{m.recv_y.data(), m.ret.data(), rows_per_peer * static_cast<size_t>(H) * ye}}, stream);

  // 4. Each token's results in rank order.
  if (gpu) {
    cuda_ops::ep_combine(call, stream);
  } else {
    cpu_ops::ep_combine(call);
    m.host_flags = *call.flags;
  }
}

uint32_t ep_layer::read_error_flags() const {
  const impl& m = *impl_;
  if (m.device == device_kind::cpu) return m.host_flags;
  const uint32_t inner = m.layer->read_error_flags(m.workspace.data(), m.workspace_bytes) & 1u;
  return cuda_ops::read_flags(static_cast<const uint32_t*>(m.flags.data())) | (inner ? kBadExpertFlag : 0u);
}

}  // namespace mxmoe::parallel
