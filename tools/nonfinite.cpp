// NaN / Inf / 0xFF-scale detection of `mxmoe run`'s tensors (nonfinite.h).
#include "nonfinite.h"

#include <cmath>

#include "mxmoe/mx.h"

namespace mxmoe::cli {
namespace {

// The multi-index of flat element `i` of a row-major `shape`.
std::vector<int64_t> unravel(int64_t i, const std::vector<int64_t>& shape) {
  std::vector<int64_t> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = i % shape[d];
    i /= shape[d];
  }
  return index;
}

}  // namespace

void check_finite(const std::vector<named_tensor>& tensors) {
  for (const auto& t : tensors) {
    if (t.view.empty()) continue;
    const int64_t n = t.view.numel();
    for (int64_t i = 0; i < n; ++i) {
      std::string what;
      if (t.scales) {
        if (static_cast<const uint8_t*>(t.view.data)[i] == mx::kE8M0Nan) what = "scale byte 0xFF (NaN)";
      } else {
        const float v = load_float(t.view.data, t.view.type, i);
        if (std::isnan(v)) what = "NaN";
        else if (std::isinf(v)) what = "Inf";
      }
      if (what.empty()) continue;
      throw nonfinite_input(t.name, "tensor '" + t.name + "' holds " + what + " at " +
                                        shape_string(unravel(i, t.view.shape)) +
                                        ": a layer with it gives non-finite outputs; fix the tensor (or the checkpoint "
                                        "it was quantized from)");
    }
  }
}

}  // namespace mxmoe::cli
