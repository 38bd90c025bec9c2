// moe/gemm_prefill_wide.cu — the prefill GEMM instantiated for more than 72 pairs per expert
// (prefill proper, tensor-core bound): tiles of up to 176 pairs, three consumer warpgroups (192
// weight rows per item); its rings are prefill_wide_tile's (gemm_prefill.cuh).
#include "gemm_prefill.cuh"

namespace mxmoe::cuda::sm90 {

void launch_gemm_prefill_wide(const gemm_launch& l, const gemm_weights& w,
                                const prefill_maps<prefill_wide_tile::WIDTHS>& maps, const moe_workspace& ws,
                                epilogue_kind ep, const activation_config& act, int sms, cudaStream_t stream) {
  launch_gemm_prefill_with<prefill_wide_tile>(l, w, maps, ws, ep, act, sms, stream);
}

cudaError_t allow_prefill_smem_wide() { return allow_prefill_smem<prefill_wide_tile>(); }

}  // namespace mxmoe::cuda::sm90
