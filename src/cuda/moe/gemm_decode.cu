// moe/gemm_decode.cu — the decode GEMM (gemm_decode.cuh) for 8, 16 and 32 tokens per tile: the
// host picks the smallest that holds every tile (a tile has at most T pairs).
#include <algorithm>
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
  const dim3 grid(static_cast<unsigned>(decode_row_blocks(w.rows, KG)), static_cast<unsigned>(l.max_tiles));
  auto* kernel = w.scales_in_range ? moe_gemm_decode_kernel<S, KG, true> : moe_gemm_decode_kernel<S, KG, false>;
  launch_pdl(kernel, grid, dim3(S::kThreads), static_cast<size_t>(S::smem_bytes(KG)), stream, l.dependent, w, b_rows,
             ws, top_k, ep, act, l.early_weights, l.combine);
}

template <class S>
void launch_decode(const gemm_launch& l, const gemm_weights& w, const uint16_t* b_rows, const moe_workspace& ws,
                   int top_k, epilogue_kind ep, const activation_config& act, cudaStream_t stream) {
  MXMOE_CHECK_ARG(l.k_groups >= 1 && l.k_groups <= S::kMaxGroups && (l.k_groups & (l.k_groups - 1)) == 0,
                  "gemm_launch.k_groups", "1, 2 or 4 and at most " + std::to_string(S::kMaxGroups),
                  std::to_string(l.k_groups));
  MXMOE_CHECK_ARG(l.max_tiles >= 1 && l.max_tiles <= 65535, "gemm_launch.max_tiles", "in [1, 65535]",
                  std::to_string(l.max_tiles));
  const decode_combine& fc = l.combine;
  if (fc.out != nullptr) {  // gemm_decode.cuh, "Fused combine"
    MXMOE_CHECK_ARG(fc.done != nullptr && fc.tokens >= 1 && fc.row_blocks >= 1, "gemm_launch.combine",
                    "counters, tokens and row blocks", "a null counter array or an empty shape");
    // Each grid row checks at most 32 tokens (one per lane of a warp) for empty rows.
    MXMOE_CHECK_ARG(fc.tokens <= 32 * l.max_tiles, "gemm_launch.combine.tokens",
                    "at most 32 * max_tiles = " + std::to_string(32 * l.max_tiles), std::to_string(fc.tokens));
    // GEMM1 clears the counters after its wait; GEMM2 counts in its own row blocks.
    if (ep == epilogue_kind::gate_up_activation)
      MXMOE_CHECK_ARG(!l.early_weights, "gemm_launch.early_weights", "false for the GEMM1 of a fused combine",
                      "true");
    else
      MXMOE_CHECK_ARG(fc.row_blocks == decode_row_blocks(w.rows, l.k_groups), "gemm_launch.combine.row_blocks",
                      std::to_string(decode_row_blocks(w.rows, l.k_groups)) + " (GEMM2's row blocks)",
                      std::to_string(fc.row_blocks));
  }
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

int64_t combine_counter_count(int64_t tokens, int top_k, int64_t hidden) {
  static_assert(decode_8::kMaxGroups == kDecodeMaxGroups, "the 8-token tile splits K the most");
  return std::min<int64_t>(tokens, kPlanMaxPairs / top_k) * decode_row_blocks(hidden, kDecodeMaxGroups);
}

int decode_ctas_per_sm() {
  int n = 0;
  MXMOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, moe_gemm_decode_kernel<decode_32, 1, true>,
                                                                 decode_32::kThreads, decode_32::smem_bytes(1)));
  return n;
}

}  // namespace mxmoe::cuda::sm90
