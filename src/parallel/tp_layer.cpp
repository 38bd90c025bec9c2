// Tensor parallelism (include/mxmoe/parallel.h): this rank's shard along I runs the whole call,
// the partial outputs of all ranks are gathered and summed in rank order (ops.h partial_sum), so
// every rank ends with the same bits.
#include <optional>
#include <string>

#include "buffer.h"
#include "mxmoe/error.h"
#include "mxmoe/parallel.h"
#include "mxmoe/validate.h"
#include "ops.h"

namespace mxmoe::parallel {

struct tp_layer::impl {
  communicator* comm = nullptr;
  moe_config cfg;
  device_kind device = device_kind::cpu;
  int64_t max_tokens = 0;
  std::optional<prepared_moe> shard;  // set by the constructor
  buffer partial, gathered, workspace;
  size_t workspace_bytes = 0;
  dtype partial_type() const { return device == device_kind::cuda ? dtype::bf16 : dtype::f32; }
};

tp_layer::tp_layer(const moe_weights& weights, const moe_config& cfg, communicator& comm, const tp_options& options)
    : impl_(std::make_unique<impl>()) {
  impl& m = *impl_;
  validate(cfg);
  const int64_t max_tokens = options.max_tokens;
  MXMOE_CHECK_ARG(max_tokens >= 1, "options.max_tokens", ">= 1", std::to_string(max_tokens));
  m.comm = &comm;
  m.cfg = cfg;
  m.device = comm.device();
  m.max_tokens = max_tokens;
  const tp_shard mine{comm.rank(), comm.size()};
  if (options.sharded) {
    moe_config shard_cfg = cfg;
    shard_cfg.shape.intermediate = shard_intermediate(cfg.shape.intermediate, mine);
    m.shard.emplace(prepare(weights, shard_cfg, m.device));
  } else {
    m.shard.emplace(prepare(weights, cfg, m.device, {{}, mine}));
  }
  const size_t n = static_cast<size_t>(max_tokens * cfg.shape.hidden) * static_cast<size_t>(dtype_size(m.partial_type()));
  m.partial = buffer(m.device, n);
  m.gathered = buffer(m.device, n * static_cast<size_t>(comm.size()));
  m.workspace_bytes = m.shard->workspace_bytes(max_tokens);
  m.workspace = buffer(m.device, m.workspace_bytes);
}

tp_layer::~tp_layer() = default;

const moe_config& tp_layer::config() const { return impl_->cfg; }
const prepared_moe& tp_layer::shard() const { return *impl_->shard; }

size_t tp_layer::gather_bytes(int64_t tokens) const {
  MXMOE_CHECK_ARG(tokens >= 0, "tokens", ">= 0", std::to_string(tokens));
  return static_cast<size_t>(tokens * impl_->cfg.shape.hidden * dtype_size(impl_->partial_type()));
}

void tp_layer::forward(const tensor_view& x, const routing_input& routing, const tensor_view& out, void* stream) {
  impl& m = *impl_;
  validate_moe_io(x, out, m.cfg);
  const int64_t T = x.dim(0), H = m.cfg.shape.hidden;
  MXMOE_CHECK_ARG(T <= m.max_tokens, "x", "at most options.max_tokens = " + std::to_string(m.max_tokens) + " tokens",
                  std::to_string(T));
  MXMOE_CHECK_ARG(out.device == m.device, "out", "a tensor on the communicator's device", "another device");
  if (m.device == device_kind::cuda)
    MXMOE_CHECK_ARG(out.type == dtype::bf16, "out", "dtype bf16 (cuda)", to_string(out.type));
  // The shard checks x and the routing (device, dtype, shape) before anything is written.
  moe_forward(*m.shard, x, routing, m.partial.view(m.partial_type(), {T, H}), m.workspace.data(), m.workspace_bytes,
              stream);
  if (T == 0) return;
  m.comm->all_gather(m.partial.data(), m.gathered.data(), gather_bytes(T), stream);
  partial_sum s;
  s.ranks = m.comm->size();
  s.elements = T * H;
  s.partials = m.gathered.data();
  s.type = m.partial_type();
  s.out = out.data;
  s.out_type = out.type;
  if (m.device == device_kind::cuda) cuda_ops::sum_partials(s, stream);
  else cpu_ops::sum_partials(s);
}

uint32_t tp_layer::read_error_flags() const {
  const impl& m = *impl_;
  return m.shard->read_error_flags(m.workspace.data(), m.workspace_bytes);
}

}  // namespace mxmoe::parallel
