// moe/route.cu — cuda::route (include/mxmoe/cuda.h): the MoE layer's routing kernel on its own,
// for callers that route before they dispatch (expert parallelism, src/parallel/). Validates,
// then launches routing.cu's route kernel with only the ids and weights of a workspace bound.
#include <cuda_runtime.h>

#include "check.h"
#include "kernels.h"
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
#include "mxmoe/validate.h"

namespace mxmoe::cuda {

void route(const tensor_view& logits, const tensor_view& correction_bias, const routing_config& cfg,
           const tensor_view& ids_out, const tensor_view& weights_out, void* stream) {
  const int device = current_device();
  MXMOE_CHECK_ARG(logits.rank() == 2, "logits", "a [T, E] tensor", "shape " + shape_string(logits.shape));
  const int64_t T = logits.dim(0), E = logits.dim(1), k = cfg.top_k;
  validate_routing_config(cfg, E, "cfg");
  check_tensor(logits, "logits", {dtype::f32, dtype::bf16}, {T, E});
  check_tensor(ids_out, "ids_out", {dtype::i32}, {T, k});
  check_tensor(weights_out, "weights_out", {dtype::f32}, {T, k});
  check_device_view(logits, "logits", device);
  check_device_view(ids_out, "ids_out", device, 4);
  check_device_view(weights_out, "weights_out", device, 4);
  const float* bias = nullptr;
  if (!is_absent(correction_bias)) {
    MXMOE_CHECK_ARG(cfg.kind == routing_kind::sigmoid_grouped_topk, "correction_bias",
                    "no tensor (only sigmoid_grouped_topk uses one)", "a tensor");
    check_tensor(correction_bias, "correction_bias", {dtype::f32}, {E});
    check_device_view(correction_bias, "correction_bias", device, 4);
    bias = correction_bias.as<const float>();
  }
  MXMOE_CHECK_ARG(T <= 65536, "logits", "at most 65536 tokens", std::to_string(T));
  if (T == 0) return;
  sm90::moe_workspace ws{};
  ws.ids = ids_out.as<int32_t>();
  ws.weights = weights_out.as<float>();
  sm90::launch_route(logits.data, logits.type == dtype::bf16, bias, cfg, T, E, false, false, nullptr, ws,
                     static_cast<cudaStream_t>(stream));
}

}  // namespace mxmoe::cuda
