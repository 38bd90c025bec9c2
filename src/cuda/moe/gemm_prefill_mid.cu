// moe/gemm_prefill_mid.cu — the prefill GEMM instantiated for 49..72 pairs per expert (the
// 2048-token point of models with 128-256 experts): tiles of up to 96 pairs, four consumer
// warpgroups as the narrow tile (256 weight rows per item, 112 registers); its rings are
// prefill_mid_tile's (gemm_prefill.cuh, with the measurements that sized them).
#include "gemm_prefill.cuh"

namespace mxmoe::cuda::sm90 {

void launch_gemm_prefill_mid(const gemm_launch& l, const gemm_weights& w,
                             const prefill_maps<prefill_mid_tile::WIDTHS>& maps, const moe_workspace& ws,
                             epilogue_kind ep, const activation_config& act, int sms, cudaStream_t stream) {
  launch_gemm_prefill_with<prefill_mid_tile>(l, w, maps, ws, ep, act, sms, stream);
}

cudaError_t allow_prefill_smem_mid() { return allow_prefill_smem<prefill_mid_tile>(); }

}  // namespace mxmoe::cuda::sm90
