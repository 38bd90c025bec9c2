// moe/gemm_decode.cu — the decode GEMM (gemm_decode.cuh) for 8 and 16 tokens per tile, and the
// narrow CTA of 8-token tiles (the host's choices: moe_layer.cu, decode_tokens_per_tile and
// pick_decode_split).
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
  const layout::sm90_fragment frag{w.rows, w.cols};
  const dim3 grid(static_cast<unsigned>(layout::ceil_div(frag.row_tiles(), S::kWarps / KG)),
                  static_cast<unsigned>(l.max_tiles));
  auto* kernel = w.scales_in_range ? moe_gemm_decode_kernel<S, KG, true> : moe_gemm_decode_kernel<S, KG, false>;
  const size_t smem = std::max<size_t>(S::smem_bytes(KG, l.ring_rows), l.min_smem_bytes);
  launch_pdl(kernel, grid, dim3(S::kThreads), smem, stream, l.dependent, w, b_rows, ws, top_k, ep, act,
             l.early_weights, l.ring_rows, l.one_b_row);
}

template <class S>
void launch_decode(const gemm_launch& l, const gemm_weights& w, const uint16_t* b_rows, const moe_workspace& ws,
                   int top_k, epilogue_kind ep, const activation_config& act, cudaStream_t stream) {
  MXMOE_CHECK_ARG(l.k_groups >= 1 && l.k_groups <= S::kMaxGroups && (l.k_groups & (l.k_groups - 1)) == 0,
                  "gemm_launch.k_groups",
                  "1, 2 or 4 and at most " + std::to_string(S::kMaxGroups) + " with " + std::to_string(S::kWarps) +
                      " warps of " + std::to_string(S::BN) + " tokens",
                  std::to_string(l.k_groups));
  MXMOE_CHECK_ARG(l.max_tiles >= 1 && l.max_tiles <= 65535, "gemm_launch.max_tiles", "in [1, 65535]",
                  std::to_string(l.max_tiles));
  MXMOE_CHECK_ARG(l.ring_rows >= 1 && l.ring_rows <= S::BN && (l.ring_rows & (l.ring_rows - 1)) == 0,
                  "gemm_launch.ring_rows", "a power of 2 in [1, " + std::to_string(S::BN) + "]",
                  std::to_string(l.ring_rows));
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

// The limit is the device's whole per-block opt-in, not the kernel's own need: a launch may ask for
// more than it uses (gemm_launch::min_smem_bytes) to keep CTAs from sharing an SM.
template <class S, int KG>
cudaError_t allow_smem_groups(int optin) {
  for (auto* kernel : {moe_gemm_decode_kernel<S, KG, false>, moe_gemm_decode_kernel<S, KG, true>}) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin);
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

template <class S>
cudaError_t allow_smem(int optin) {
  cudaError_t e = allow_smem_groups<S, 1>(optin);
  if constexpr (S::kMaxGroups >= 2)
    if (e == cudaSuccess) e = allow_smem_groups<S, 2>(optin);
  if constexpr (S::kMaxGroups >= 4)
    if (e == cudaSuccess) e = allow_smem_groups<S, 4>(optin);
  return e;
}

}  // namespace

void launch_gemm_decode(const gemm_launch& l, const gemm_weights& w, const uint16_t* b_rows, const moe_workspace& ws,
                        int top_k, epilogue_kind ep, const activation_config& act, cudaStream_t stream) {
  MXMOE_CHECK_ARG(l.warps == kDecodeWarps || (l.warps == kDecodeWarpsNarrow && l.tokens_per_tile == decode_8::BN),
                  "gemm_launch.warps",
                  std::to_string(kDecodeWarps) + ", or " + std::to_string(kDecodeWarpsNarrow) + " with 8 tokens per tile",
                  std::to_string(l.warps) + " with " + std::to_string(l.tokens_per_tile));
  switch (l.tokens_per_tile) {
    case decode_8::BN:
      if (l.warps == kDecodeWarpsNarrow)
        launch_decode<decode_8_narrow>(l, w, b_rows, ws, top_k, ep, act, stream);
      else
        launch_decode<decode_8>(l, w, b_rows, ws, top_k, ep, act, stream);
      break;
    case decode_16::BN: launch_decode<decode_16>(l, w, b_rows, ws, top_k, ep, act, stream); break;
    default:
      MXMOE_CHECK_ARG(false, "gemm_launch.tokens_per_tile", "8 or 16 for the decode GEMM",
                      std::to_string(l.tokens_per_tile));
  }
}

cudaError_t allow_gemm_smem_decode() {
  int device = 0, optin = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (e == cudaSuccess) e = allow_smem<decode_8>(optin);
  if (e == cudaSuccess) e = allow_smem<decode_16>(optin);
  if (e == cudaSuccess) e = allow_smem<decode_8_narrow>(optin);
  return e;
}

int decode_tokens_per_tile_max() { return decode_16::BN; }

int decode_ctas_per_sm(int tokens_per_tile, int k_groups, int ring_rows, int warps) {
  MXMOE_CHECK_ARG(ring_rows >= 1 && ring_rows <= tokens_per_tile, "ring_rows", "in [1, tokens_per_tile]", std::to_string(ring_rows));
  auto ctas = [&](auto shape, auto kernel, int kg) {
    using S = decltype(shape);
    int n = 0;
    MXMOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, S::kThreads, S::smem_bytes(kg, ring_rows)));
    return n;
  };
  const bool ok = k_groups == 1 || k_groups == 2 || k_groups == 4;
  if (ok && warps == kDecodeWarps && tokens_per_tile == decode_8::BN) {
    if (k_groups == 1) return ctas(decode_8{}, moe_gemm_decode_kernel<decode_8, 1, true>, 1);
    if (k_groups == 2) return ctas(decode_8{}, moe_gemm_decode_kernel<decode_8, 2, true>, 2);
    return ctas(decode_8{}, moe_gemm_decode_kernel<decode_8, 4, true>, 4);
  }
  if (ok && k_groups <= 2 && warps == kDecodeWarps && tokens_per_tile == decode_16::BN) {
    if (k_groups == 1) return ctas(decode_16{}, moe_gemm_decode_kernel<decode_16, 1, true>, 1);
    return ctas(decode_16{}, moe_gemm_decode_kernel<decode_16, 2, true>, 2);
  }
  if (ok && k_groups <= 2 && warps == kDecodeWarpsNarrow && tokens_per_tile == decode_8_narrow::BN) {
    if (k_groups == 1) return ctas(decode_8_narrow{}, moe_gemm_decode_kernel<decode_8_narrow, 1, true>, 1);
    return ctas(decode_8_narrow{}, moe_gemm_decode_kernel<decode_8_narrow, 2, true>, 2);
  }
  MXMOE_CHECK_ARG(false, "tokens_per_tile, k_groups, warps",
                  "a decode GEMM instantiation (8 warps: 8 tokens with 1, 2, 4 groups, 16 with 1, 2; 4 warps: 8 "
                  "tokens with 1, 2)",
                  std::to_string(tokens_per_tile) + ", " + std::to_string(k_groups) + ", " + std::to_string(warps));
  return 0;
}

}  // namespace mxmoe::cuda::sm90
