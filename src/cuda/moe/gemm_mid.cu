// moe/gemm_mid.cu — the MoE grouped GEMM instantiated for the 64-token transition: two
// warpgroups of 64 rows x 64 tokens (wgmma). The tile shape is mid_tile in gemm.cuh.
#include "gemm.cuh"
#include "gemm_instances.h"

namespace mxmoe::cuda::sm90 {

void launch_gemm_mid(const gemm_launch& l, const gemm_weights& w, const uint16_t* b_rows, const moe_workspace& ws,
                     int top_k, epilogue_kind ep, const activation_config& act, cudaStream_t stream) {
  launch_gemm_with<mid_tile>(l, w, b_rows, ws, top_k, ep, act, stream);
}

cudaError_t allow_gemm_smem_mid() { return allow_gemm_smem<mid_tile>(); }

}  // namespace mxmoe::cuda::sm90
