// The CUDA backend's entry points in a build without CUDA: each says so and does nothing.
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"

namespace mxmoe::cuda {
namespace {
[[noreturn]] void no_cuda() {
  throw unsupported("mxmoe was built without CUDA (no nvcc at configure time); the cuda backend is unavailable");
}
}  // namespace

bool available(std::string* why, int) {
  if (why) *why = "mxmoe was built without CUDA";
  return false;
}
std::string device_name(int) { return "none (built without CUDA)"; }

device_buffer::device_buffer(size_t) { no_cuda(); }
device_buffer::~device_buffer() = default;
device_buffer::device_buffer(device_buffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {}
device_buffer& device_buffer::operator=(device_buffer&&) noexcept { return *this; }
void device_buffer::upload(const void*, size_t, size_t) { no_cuda(); }
void device_buffer::download(void*, size_t, size_t) const { no_cuda(); }
void device_buffer::fill(uint8_t) { no_cuda(); }
void synchronize() { no_cuda(); }

quant_stats quantize(const tensor_view&, mx::scale_rule, scale_layout, const tensor_view&, const tensor_view&, void*) {
  no_cuda();
}
void quantize_async(const tensor_view&, mx::scale_rule, scale_layout, const tensor_view&, const tensor_view&,
                    quant_stats*, void*) {
  no_cuda();
}
void dequantize(const tensor_view&, const tensor_view&, scale_layout, const tensor_view&, void*) { no_cuda(); }

void route(const tensor_view&, const tensor_view&, const routing_config&, const tensor_view&, const tensor_view&,
           void*) {
  no_cuda();
}

struct moe_layer::impl {};
moe_layer::moe_layer(const moe_weights&, const moe_config&, const std::vector<int32_t>&) { no_cuda(); }
moe_layer::~moe_layer() = default;
moe_layer::moe_layer(moe_layer&&) noexcept = default;
moe_layer& moe_layer::operator=(moe_layer&&) noexcept = default;
const moe_config& moe_layer::config() const { no_cuda(); }
size_t moe_layer::workspace_bytes(int64_t) const { no_cuda(); }
size_t moe_layer::weight_bytes() const { no_cuda(); }
uint32_t moe_layer::read_error_flags(const void*, size_t) const { no_cuda(); }
void moe_layer::forward(const tensor_view&, const routing_input&, const tensor_view&, void*, size_t, void*) const {
  no_cuda();
}

struct matrix_pipeline::impl {};
matrix_pipeline::matrix_pipeline(int, size_t, int64_t) { no_cuda(); }
matrix_pipeline::~matrix_pipeline() = default;
int matrix_pipeline::slots() const { return 0; }
uint8_t* matrix_pipeline::input(int) { no_cuda(); }
void matrix_pipeline::submit(int, dtype, const layout::matrix_source&, mx::scale_rule) { no_cuda(); }
quant_stats matrix_pipeline::wait(int) { no_cuda(); }
const uint8_t* matrix_pipeline::packed(int) const { no_cuda(); }
const uint8_t* matrix_pipeline::scales(int) const { no_cuda(); }

}  // namespace mxmoe::cuda
