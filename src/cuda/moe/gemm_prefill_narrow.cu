// moe/gemm_prefill_narrow.cu — the prefill GEMM instantiated for 8..48 pairs per expert (the
// 512–2048-token transition of models with many experts): tiles of up to 64 pairs, four consumer
// warpgroups (256 weight rows per item); its rings are prefill_narrow_tile's (gemm_prefill.cuh,
// with the measurements that sized them).
#include "gemm_prefill.cuh"

namespace mxmoe::cuda::sm90 {

void launch_gemm_prefill_narrow(const gemm_launch& l, const gemm_weights& w,
                                const prefill_maps<prefill_narrow_tile::WIDTHS>& maps, const moe_workspace& ws,
                                epilogue_kind ep, const activation_config& act, int sms, cudaStream_t stream) {
  launch_gemm_prefill_with<prefill_narrow_tile>(l, w, maps, ws, ep, act, sms, stream);
}

cudaError_t allow_prefill_smem_narrow() { return allow_prefill_smem<prefill_narrow_tile>(); }

}  // namespace mxmoe::cuda::sm90
