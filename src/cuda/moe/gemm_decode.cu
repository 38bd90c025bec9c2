// moe/gemm_decode.cu — the decode GEMM (gemm_decode.cuh) for 8, 16 and 32 tokens per tile: the
// host picks the smallest that holds every tile (a tile has at most T pairs).
#include <string>

#include "check.h"
#include "gemm_decode.cuh"
#include "mxmoe/error.h"
#include "gemm_instances.h"

namespace mxmoe::cuda::sm90 {
namespace {

template <class S, int KG>
void launch_decode_groups(const gemm_launch& l, const gemm_weights& w, const uint16_t* b_rows, const moe_workspace& ws,
                          int top_k, epilogue_kind ep, const activation_config& act, cudaStream_t stream) {
  const layout::sm90_fragment frag{w.rows, w.cols};
  const dim3 grid(static_cast<unsigned>(layout::ceil_div(frag.row_tiles(), S::kWarps / KG)),
                  static_cast<unsigned>(l.max_tiles));
  auto* kernel = w.scales_in_range ? moe_gemm_decode_kernel<S, KG, true> : moe_gemm_decode_kernel<S, KG, false>;
  launch_pdl(kernel, grid, dim3(S::kThreads), static_cast<size_t>(S::smem_bytes(KG)), stream, l.dependent, w, b_rows,
             ws, top_k, ep, act, l.early_weights);
}

template <class S>
void launch_decode(const gemm_launch& l, const gemm_weights& w, const uint16_t* b_rows, const moe_workspace& ws,
                   int top_k, epilogue_kind ep, const activation_config& act, cudaStream_t stream) {
  MXMOE_CHECK_ARG(l.k_groups >= 1 && l.k_groups <= S::kMaxGroups && (l.k_groups & (l.k_groups - 1)) == 0,
                  "gemm_launch.k_groups", "1, 2 or 4 and at most " + std::to_string(S::kMaxGroups),
                  std::to_string(l.k_groups));
  MXMOE_CHECK_ARG(l.max_tiles >= 1 && l.max_tiles <= 65535, "gemm_launch.max_tiles", "in [1, 65535]",
                  std::to_string(l.max_tiles));
  switch (l.k_groups) {
    case 1: launch_decode_groups<S, 1>(l, w, b_rows, ws, top_k, ep, act, stream); break;
    case 2:
      if constexpr (S::kMaxGroups >= 2) launch_decode_groups<S, 2>(l, w, b_rows, ws, top_k, ep, act, stream);
      break;
    default:
      if constexpr (S::kMaxGroups >= 4) launch_decode_groups<S, 4>(l, w, b_rows, ws, top_k, ep, act, stream);
      break;
  }
}

template <class S, int KG>
cudaError_t allow_smem_groups() {
  for (auto* kernel : {moe_gemm_decode_kernel<S, KG, false>, moe_gemm_decode_kernel<S, KG, true>}) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::smem_bytes(KG));
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

template <class S>
cudaError_t allow_smem() {
  cudaError_t e = allow_smem_groups<S, 1>();
  if constexpr (S::kMaxGroups >= 2)
    if (e == cudaSuccess) e = allow_smem_groups<S, 2>();
  if constexpr (S::kMaxGroups >= 4)
    if (e == cudaSuccess) e = allow_smem_groups<S, 4>();
  return e;
}

}  // namespace

void launch_gemm_decode(const gemm_launch& l, const gemm_weights& w, const uint16_t* b_rows, const moe_workspace& ws,
                        int top_k, epilogue_kind ep, const activation_config& act, cudaStream_t stream) {
  switch (l.tokens_per_tile) {
    case decode_8::BN: launch_decode<decode_8>(l, w, b_rows, ws, top_k, ep, act, stream); break;
    case decode_16::BN: launch_decode<decode_16>(l, w, b_rows, ws, top_k, ep, act, stream); break;
    case decode_32::BN: launch_decode<decode_32>(l, w, b_rows, ws, top_k, ep, act, stream); break;
    default:
      MXMOE_CHECK_ARG(false, "gemm_launch.tokens_per_tile", "8, 16 or 32 for the decode GEMM",
                      std::to_string(l.tokens_per_tile));
  }
}

cudaError_t allow_gemm_smem_decode() {
  cudaError_t e = allow_smem<decode_8>();
  if (e == cudaSuccess) e = allow_smem<decode_16>();
  if (e == cudaSuccess) e = allow_smem<decode_32>();
  return e;
}

int decode_tokens_per_tile_max() { return decode_32::BN; }

int decode_ctas_per_sm() {
  int n = 0;
  MXMOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, moe_gemm_decode_kernel<decode_32, 1, true>,
                                                                 decode_32::kThreads, decode_32::smem_bytes(1)));
  return n;
}

}  // namespace mxmoe::cuda::sm90
