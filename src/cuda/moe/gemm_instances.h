// moe/gemm_instances.h — one entry point per GEMM instantiation (one translation unit each:
// gemm_decode.cu, gemm_legacy_decode.cu, gemm_mid.cu, gemm_large.cu), for gemm_dispatch.cu.
#pragma once

#include <cuda_runtime.h>

#include "kernels.h"

namespace mxmoe::cuda::sm90 {

#define MXMOE_GEMM_INSTANCE(name)                                                                          \
  cudaError_t allow_gemm_smem_##name();                                                                    \
  void launch_gemm_##name(const gemm_launch& l, const gemm_weights& w, const uint16_t* b_rows,            \
                          const moe_workspace& ws, int top_k, epilogue_kind ep, const activation_config& act, \
                          cudaStream_t stream);
MXMOE_GEMM_INSTANCE(decode)
MXMOE_GEMM_INSTANCE(legacy_decode)
MXMOE_GEMM_INSTANCE(mid)
MXMOE_GEMM_INSTANCE(large)
#undef MXMOE_GEMM_INSTANCE

int decode_tokens_per_tile_max();

}  // namespace mxmoe::cuda::sm90
