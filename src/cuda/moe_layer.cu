// PLACEHOLDER — replaced by the MoE work (issue 4).
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
namespace mxmoe::cuda {
struct moe_layer::impl { moe_config cfg; };
moe_layer::moe_layer(const moe_weights&, const moe_config&) { throw unsupported("cuda moe: not built yet"); }
moe_layer::~moe_layer() = default;
moe_layer::moe_layer(moe_layer&&) noexcept = default;
moe_layer& moe_layer::operator=(moe_layer&&) noexcept = default;
const moe_config& moe_layer::config() const { return impl_->cfg; }
size_t moe_layer::workspace_bytes(int64_t) const { return 0; }
size_t moe_layer::weight_bytes() const { return 0; }
void moe_layer::forward(const tensor_view&, const routing_input&, const tensor_view&, void*, size_t, void*) const {}
}  // namespace mxmoe::cuda
