// moe/gemm_decode.cu — the MoE grouped GEMM instantiated for memory-bound decode (few
// tokens per expert): 4 warps x 16 rows, 8 cp.async stages in flight to cover DRAM latency.
#include "gemm.cuh"

namespace mxmoe::cuda::sm90 {

void launch_gemm_decode(const gemm_weights& w, const uint16_t* b_rows, const moe_workspace& ws, int top_k,
                       epilogue_kind ep, const activation_config& act, int64_t max_tiles, cudaStream_t stream) {
  launch_gemm_with<decode_tile>(w, b_rows, ws, top_k, ep, act, max_tiles, stream);
}

cudaError_t allow_gemm_smem_decode() { return allow_gemm_smem<decode_tile>(); }

}  // namespace mxmoe::cuda::sm90
