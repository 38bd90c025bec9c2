// moe/gemm_instances.h — one entry point per GEMM instantiation (one translation unit each:
// gemm_decode.cu, gemm_legacy_decode.cu, gemm_mid.cu, gemm_large.cu; the prefill GEMMs through
// prefill_launch.cu, which encodes their tensor maps), for gemm_dispatch.cu.
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

// The prefill GEMMs (l.config prefill_narrow, prefill_mid or prefill_wide): tokens per tile and the launch
// (prepare_prefill_kernels in kernels.h).
int prefill_tokens_per_tile(gemm_config c);
void launch_gemm_prefill(const gemm_launch& l, const gemm_weights& w, const uint16_t* b_rows, const moe_workspace& ws,
                         epilogue_kind ep, const activation_config& act, cudaStream_t stream);

}  // namespace mxmoe::cuda::sm90
