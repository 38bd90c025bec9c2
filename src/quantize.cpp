// The quantize dispatch (include/mxmoe/quantize.h): validates, then the views' device picks the backend.
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
#include "mxmoe/quantize.h"

namespace mxmoe {
namespace {
device_kind common_device(std::initializer_list<std::pair<const char*, const tensor_view*>> views) {
  const device_kind d = views.begin()->second->device;
  for (const auto& [name, v] : views)
    MXMOE_CHECK_ARG(v->device == d, name, d == device_kind::cuda ? "a cuda tensor" : "a cpu tensor",
                    v->device == device_kind::cuda ? "a cuda tensor" : "a cpu tensor");
  return d;
}
}  // namespace

quant_stats quantize(const tensor_view& x, mx::scale_rule rule, scale_layout layout, const tensor_view& packed,
                     const tensor_view& scales) {
  validate_mx_tensor(x, packed, scales, layout, mx_values::quantize_input);
  if (common_device({{"x", &x}, {"packed", &packed}, {"scales", &scales}}) == device_kind::cuda)
    return cuda::quantize(x, rule, layout, packed, scales);
  return cpu::quantize(x, rule, layout, packed, scales);
}

void dequantize(const tensor_view& packed, const tensor_view& scales, scale_layout layout, const tensor_view& out) {
  validate_mx_tensor(out, packed, scales, layout, mx_values::dequantize_output);
  if (common_device({{"packed", &packed}, {"scales", &scales}, {"out", &out}}) == device_kind::cuda)
    return cuda::dequantize(packed, scales, layout, out);
  cpu::dequantize(packed, scales, layout, out);
}

}  // namespace mxmoe
