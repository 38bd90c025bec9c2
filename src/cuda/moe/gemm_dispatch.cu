// Picks one of the GEMM instantiations (gemm.cuh) at run time.
#include "check.h"
#include "gemm.cuh"

namespace mxmoe::cuda::sm90 {

int gemm_tokens_per_tile(gemm_config c) {
  switch (c) {
    case gemm_config::decode: return decode_tile::BN;
    case gemm_config::mid: return mid_tile::BN;
    case gemm_config::large: return large_tile::BN;
  }
  return 0;
}

void prepare_gemm_kernels() {
  MXMOE_CUDA_CHECK(allow_gemm_smem_decode());
  MXMOE_CUDA_CHECK(allow_gemm_smem_mid());
  MXMOE_CUDA_CHECK(allow_gemm_smem_large());
}

void launch_gemm(gemm_config c, const gemm_weights& w, const uint16_t* b_rows, const moe_workspace& ws, int top_k,
                 epilogue_kind ep, const activation_config& act, int64_t max_tiles, cudaStream_t stream) {
  switch (c) {
    case gemm_config::decode: launch_gemm_decode(w, b_rows, ws, top_k, ep, act, max_tiles, stream); break;
    case gemm_config::mid: launch_gemm_mid(w, b_rows, ws, top_k, ep, act, max_tiles, stream); break;
    case gemm_config::large: launch_gemm_large(w, b_rows, ws, top_k, ep, act, max_tiles, stream); break;
  }
  MXMOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mxmoe::cuda::sm90
