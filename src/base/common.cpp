// Names, shape strings and statistics shared by every backend.
#include <cmath>
#include <limits>
#include <string>

#include "mxmoe/dtype.h"
#include "mxmoe/moe.h"
#include "mxmoe/quantize.h"

namespace mxmoe {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

double quant_stats::sqnr_db() const {
  if (error_sq == 0.0) return std::numeric_limits<double>::infinity();
  return 10.0 * std::log10(signal_sq / error_sq);
}

void quant_stats::merge(const quant_stats& o) {
  elements += o.elements;
  blocks += o.blocks;
  saturated_blocks += o.saturated_blocks;
  clamped_elements += o.clamped_elements;
  flushed_elements += o.flushed_elements;
  nonfinite_blocks += o.nonfinite_blocks;
  signal_sq += o.signal_sq;
  error_sq += o.error_sq;
}

const char* to_string(routing_kind k) {
  switch (k) {
    case routing_kind::softmax_topk: return "softmax_topk";
    case routing_kind::topk_softmax: return "topk_softmax";
    case routing_kind::sigmoid_grouped_topk: return "sigmoid_grouped_topk";
  }
  return "?";
}

const char* to_string(activation_kind k) {
  return k == activation_kind::swiglu_clamped ? "swiglu_clamped" : "silu_mul";
}

const char* to_string(weight_format f) { return f == weight_format::bf16 ? "bf16" : "mxfp4"; }

}  // namespace mxmoe
