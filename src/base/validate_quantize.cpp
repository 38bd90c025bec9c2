// Validation of the (values, packed, scales) triple that quantize and dequantize take
// (include/mxmoe/quantize.h). Every backend calls this before it writes anything; each error
// names the argument and the shape or dtype it expected. Devices are not checked here: the
// dispatch (src/quantize.cpp) and each backend check those.
#include <string>
#include <vector>

#include "mxmoe/error.h"
#include "mxmoe/layout.h"
#include "mxmoe/quantize.h"

namespace mxmoe {
namespace {

std::string describe(const tensor_view& v) {
  std::string s = std::string(to_string(v.type)) + " " + shape_string(v.shape);
  if (!v.strides.empty()) s += " strides " + shape_string(v.strides);
  return s;
}

// Strides (when given) must have one entry per dimension and dimensions must be non-negative;
// everything after this may call stride() and numel() safely.
void check_well_formed(const tensor_view& v, const std::string& name) {
  MXMOE_CHECK_ARG(v.strides.empty() || v.strides.size() == v.shape.size(), name,
                  "one stride per dimension (" + std::to_string(v.shape.size()) + ")",
                  std::to_string(v.strides.size()) + " strides for shape " + shape_string(v.shape));
  for (int64_t d : v.shape)
    MXMOE_CHECK_ARG(d >= 0, name, "non-negative dimensions", shape_string(v.shape));
  MXMOE_CHECK_ARG(v.data != nullptr || v.numel() == 0, name, "non-null data for a non-empty tensor",
                  "a null pointer with shape " + shape_string(v.shape));
}

void check_u8_contiguous(const tensor_view& v, const std::string& name, const std::vector<int64_t>& shape,
                         const std::string& what) {
  MXMOE_CHECK_ARG(v.type == dtype::u8 && v.shape == shape && v.contiguous(), name,
                  "a contiguous u8 tensor of shape " + shape_string(shape) + " (" + what + ")", describe(v));
}

}  // namespace

void validate_mx_tensor(const tensor_view& values, const tensor_view& packed, const tensor_view& scales,
                        scale_layout layout, mx_values role) {
  const bool is_input = role == mx_values::quantize_input;
  const std::string vname = is_input ? "x" : "out";
  check_well_formed(values, vname);
  MXMOE_CHECK_ARG(values.rank() >= 2, vname, "a tensor of rank >= 2 [..., rows, K]", describe(values));
  if (is_input) {
    MXMOE_CHECK_ARG(values.type == dtype::bf16 || values.type == dtype::f16 || values.type == dtype::f32, vname,
                    "dtype bf16, f16 or f32", describe(values));
  } else {
    MXMOE_CHECK_ARG(values.type == dtype::bf16 || values.type == dtype::f32, vname, "dtype bf16 or f32",
                    describe(values));
  }
  const int64_t k = values.dim(-1), rows = values.dim(-2);
  MXMOE_CHECK_ARG(k > 0 && k % mx::kBlockSize == 0, vname,
                  "a last dimension K > 0 (K must be a multiple of 32)", "K = " + std::to_string(k));
  MXMOE_CHECK_ARG(values.stride(-1) == 1, vname, "a contiguous last dimension (stride 1)", describe(values));
  // Outputs are written by several threads: overlapping rows would race, so require them packed.
  if (!is_input)
    MXMOE_CHECK_ARG(values.contiguous(), vname, "a contiguous tensor", describe(values));

  std::vector<int64_t> lead(values.shape.begin(), values.shape.end() - 2);

  check_well_formed(packed, "packed");
  std::vector<int64_t> packed_shape = lead;
  packed_shape.push_back(rows);
  packed_shape.push_back(k / 2);
  check_u8_contiguous(packed, "packed", packed_shape, "[..., rows, K/2] for " + vname + " " + describe(values));

  check_well_formed(scales, "scales");
  const int64_t cols = k / mx::kBlockSize;
  std::vector<int64_t> scale_shape = lead;
  if (layout == scale_layout::linear) {
    scale_shape.push_back(rows);
    scale_shape.push_back(cols);
    check_u8_contiguous(scales, "scales", scale_shape, "linear [..., rows, K/32]");
  } else {
    scale_shape.push_back(layout::scale_tiled_128x4{rows, cols}.size());
    check_u8_contiguous(scales, "scales", scale_shape, "tiled_128x4 [..., scale_tiled_128x4{rows, K/32}.size()]");
  }
}

}  // namespace mxmoe
