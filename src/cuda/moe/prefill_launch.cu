// moe/prefill_launch.cu — host side of the prefill GEMMs (gemm_prefill.cuh): the TMA tensor map
// of the activation rows, the choice between the two instantiations, the shared-memory opt-in.
// Launchers validate, kernels assume: the map is encoded here for every launch (it holds the
// row count of this call), so a captured graph replays with the addresses it was captured with.
#include <cuda.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "check.h"
#include "gemm_prefill.cuh"

namespace mxmoe::cuda::sm90 {
namespace {

using encode_tiled_fn = decltype(&cuTensorMapEncodeTiled);

// The driver's encoder, found through the runtime (no link against libcuda).
encode_tiled_fn tensor_map_encoder() {
  static const encode_tiled_fn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    MXMOE_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || p == nullptr)
      throw std::runtime_error("CUDA driver without cuTensorMapEncodeTiled (the prefill GEMM needs CUDA 12+)");
    return reinterpret_cast<encode_tiled_fn>(p);
  }();
  return fn;
}

// bf16 rows [n_rows, cols], row-major: boxes of kPrefillBoxRows rows x kPrefillBoxCols columns,
// 128-byte swizzle, out-of-range elements read as zero.
CUtensorMap rows_tensor_map(const uint16_t* rows, int64_t n_rows, int64_t cols) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(n_rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
  const cuuint32_t box[2] = {kPrefillBoxCols, kPrefillBoxRows};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint16_t*>(rows),
                                          dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                          CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("cuTensorMapEncodeTiled failed (" + std::to_string(static_cast<int>(r)) + ") for " +
                             std::to_string(n_rows) + " x " + std::to_string(cols) + " bf16 rows");
  return map;
}

}  // namespace

int prefill_tokens_per_tile(prefill_config c) {
  return c == prefill_config::narrow ? prefill_narrow_tile::NMAX : prefill_wide_tile::NMAX;
}

// Also looks the encoder up here, outside any stream capture.
void prepare_prefill_kernels() {
  tensor_map_encoder();
  MXMOE_CUDA_CHECK(allow_prefill_smem_narrow());
  MXMOE_CUDA_CHECK(allow_prefill_smem_wide());
}

void launch_gemm_prefill(prefill_config c, const gemm_weights& w, const uint16_t* b_rows, int64_t b_row_count,
                         const moe_workspace& ws, epilogue_kind ep, const activation_config& act, int64_t max_tiles,
                         cudaStream_t stream) {
  if (b_row_count < 1 || w.cols % 32 != 0 || w.rows % 16 != 0 || reinterpret_cast<uintptr_t>(b_rows) % 16 != 0)
    throw std::logic_error("launch_gemm_prefill: needs >= 1 B row, 16-byte aligned, K % 32 == 0, rows % 16 == 0");
  const CUtensorMap b_map = rows_tensor_map(b_rows, b_row_count, w.cols);
  int device = 0, sms = 0;
  MXMOE_CUDA_CHECK(cudaGetDevice(&device));
  MXMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if (c == prefill_config::narrow)
    launch_gemm_prefill_narrow(w, b_map, ws, ep, act, max_tiles, sms, stream);
  else
    launch_gemm_prefill_wide(w, b_map, ws, ep, act, max_tiles, sms, stream);
  MXMOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mxmoe::cuda::sm90
