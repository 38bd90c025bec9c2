// Picks one of the GEMM instantiations (gemm_instances.h) at run time.
#include "check.h"
#include "mxmoe/error.h"
#include "gemm_instances.h"

namespace mxmoe::cuda::sm90 {

int gemm_tokens_per_tile(gemm_config c) {
  switch (c) {
    case gemm_config::decode: return decode_tokens_per_tile_max();
    case gemm_config::mid: return 64;
    case gemm_config::large: return 128;
    case gemm_config::legacy_decode: return 16;
    case gemm_config::prefill_narrow:
    case gemm_config::prefill_mid:
    case gemm_config::prefill_wide: return prefill_tokens_per_tile(c);
  }
  return 0;
}

void prepare_gemm_kernels() {
  MXMOE_CUDA_CHECK(allow_gemm_smem_decode());
  MXMOE_CUDA_CHECK(allow_gemm_smem_legacy_decode());
  MXMOE_CUDA_CHECK(allow_gemm_smem_mid());
  MXMOE_CUDA_CHECK(allow_gemm_smem_large());
}

void launch_gemm(const gemm_launch& l, const gemm_weights& w, const uint16_t* b_rows, const moe_workspace& ws,
                 int top_k, epilogue_kind ep, const activation_config& act, cudaStream_t stream) {
  const bool prefill = l.config == gemm_config::prefill_narrow || l.config == gemm_config::prefill_mid ||
                       l.config == gemm_config::prefill_wide;
  MXMOE_CHECK_ARG(ep == epilogue_kind::gate_up_activation || (ep == epilogue_kind::down_sorted) == prefill, "ep",
                  prefill ? "gate_up_activation or down_sorted (a prefill GEMM)"
                          : "gate_up_activation or weighted_down (not a prefill GEMM)",
                  ep == epilogue_kind::down_sorted ? "down_sorted" : "weighted_down");
  switch (l.config) {
    case gemm_config::decode: launch_gemm_decode(l, w, b_rows, ws, top_k, ep, act, stream); break;
    case gemm_config::legacy_decode: launch_gemm_legacy_decode(l, w, b_rows, ws, top_k, ep, act, stream); break;
    case gemm_config::mid: launch_gemm_mid(l, w, b_rows, ws, top_k, ep, act, stream); break;
    case gemm_config::large: launch_gemm_large(l, w, b_rows, ws, top_k, ep, act, stream); break;
    case gemm_config::prefill_narrow:
    case gemm_config::prefill_mid:
    case gemm_config::prefill_wide: launch_gemm_prefill(l, w, b_rows, ws, ep, act, stream); break;
  }
  MXMOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mxmoe::cuda::sm90
