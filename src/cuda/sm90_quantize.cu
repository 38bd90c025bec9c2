// PLACEHOLDER — replaced by the CUDA quantize work (issue 3).
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
namespace mxmoe::cuda {
quant_stats quantize(const tensor_view&, mx::scale_rule, scale_layout, const tensor_view&, const tensor_view&, void*) {
  throw unsupported("cuda quantize: not built yet");
}
void dequantize(const tensor_view&, const tensor_view&, scale_layout, const tensor_view&, void*) {
  throw unsupported("cuda dequantize: not built yet");
}
}  // namespace mxmoe::cuda
