// moe/gemm_legacy_decode.cu — gemm.cuh's mma.sync tile of 64 rows x 16 tokens (4 warps, A and B
// through cp.async stages of 4 K-steps): the decode path before gemm_decode.cuh, kept selectable
// (docs/moe_layer.md).
#include "gemm.cuh"
#include "gemm_instances.h"

namespace mxmoe::cuda::sm90 {

void launch_gemm_legacy_decode(const gemm_launch& l, const gemm_weights& w, const uint16_t* b_rows,
                               const moe_workspace& ws, int top_k, epilogue_kind ep, const activation_config& act,
                               cudaStream_t stream) {
  launch_gemm_with<legacy_decode_tile>(l, w, b_rows, ws, top_k, ep, act, stream);
}

cudaError_t allow_gemm_smem_legacy_decode() { return allow_gemm_smem<legacy_decode_tile>(); }

}  // namespace mxmoe::cuda::sm90
