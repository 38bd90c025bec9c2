// moe/gemm_large.cu — the MoE grouped GEMM instantiated for prefill: 8 warps of 32 rows x
// 64 tokens (16 mmas per A fragment pair and k16 step).
#include "gemm.cuh"
#include "gemm_instances.h"

namespace mxmoe::cuda::sm90 {

void launch_gemm_large(const gemm_launch& l, const gemm_weights& w, const uint16_t* b_rows, const moe_workspace& ws,
                       int top_k, epilogue_kind ep, const activation_config& act, cudaStream_t stream) {
  launch_gemm_with<large_tile>(l, w, b_rows, ws, top_k, ep, act, stream);
}

cudaError_t allow_gemm_smem_large() { return allow_gemm_smem<large_tile>(); }

}  // namespace mxmoe::cuda::sm90
