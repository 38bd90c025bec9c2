// moe/prefill_launch.cu — host side of the prefill GEMMs (gemm_prefill.cuh): the TMA tensor maps
// of the weight fragments and of the activation rows (one per tile width), the choice between the
// two instantiations, the shared-memory opt-in. Launchers validate, kernels assume: the maps are
// encoded here for every launch (they hold this call's row count and addresses) and travel as a
// kernel parameter, so a captured graph replays with the maps it was captured with.
#include <cuda.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "check.h"
#include "gemm_instances.h"
#include "gemm_prefill.cuh"
#include "mxmoe/error.h"

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

void check_encoded(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS)
    throw std::runtime_error(std::string("cuTensorMapEncodeTiled failed (") + std::to_string(static_cast<int>(r)) +
                             ") for the " + what);
}

// bf16 rows [n_rows, cols], row-major: boxes of box_rows rows x kPrefillBoxCols columns,
// 128-byte swizzle, out-of-range elements read as zero.
CUtensorMap rows_tensor_map(const uint16_t* rows, int64_t n_rows, int64_t cols, int box_rows) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(n_rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
  const cuuint32_t box[2] = {kPrefillBoxCols, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  check_encoded(tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint16_t*>(rows), dims,
                                     strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                     CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
                "activation rows");
  return map;
}

// The fragment tiles of all experts (layout::sm90_fragment, expert after expert: one sequence of
// experts * row_tiles row tiles of col_tiles tiles of tile_bytes) as u32 [row tile][col tile][word],
// boxes of rows_box row tiles x ksteps_box col tiles, unswizzled.
CUtensorMap fragment_tensor_map(const uint8_t* base, int64_t tile_bytes, int64_t col_tiles, int64_t row_tiles,
                                int ksteps_box, int rows_box) {
  CUtensorMap map;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(tile_bytes / 4), static_cast<cuuint64_t>(col_tiles),
                              static_cast<cuuint64_t>(row_tiles)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(tile_bytes), static_cast<cuuint64_t>(col_tiles * tile_bytes)};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(tile_bytes / 4), static_cast<cuuint32_t>(ksteps_box),
                             static_cast<cuuint32_t>(rows_box)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  check_encoded(tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT32, 3, const_cast<uint8_t*>(base), dims,
                                     strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                     CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
                "weight fragments");
  return map;
}

template <class Cfg>
prefill_maps<Cfg::WIDTHS> make_prefill_maps(const gemm_weights& w, int64_t experts, const uint16_t* b_rows,
                                             int64_t b_row_count, bool weights_evict_first) {
  const layout::sm90_fragment frag{w.rows, w.cols};
  const int64_t row_tiles = experts * frag.row_tiles(), col_tiles = frag.col_tiles();
  prefill_maps<Cfg::WIDTHS> maps;
  maps.codes = fragment_tensor_map(w.codes, Cfg::TILE_CODES, col_tiles, row_tiles, Cfg::A_KSTEPS, Cfg::ROW_TILES);
  maps.scales = fragment_tensor_map(w.scales, Cfg::TILE_SCALES, col_tiles, row_tiles, Cfg::A_KSTEPS, Cfg::ROW_TILES);
  for (int i = 0; i < Cfg::WIDTHS; ++i)
    maps.rows[i] = rows_tensor_map(b_rows, b_row_count, w.cols, (i + 1) * Cfg::N_STEP);
  maps.weight_l2_policy = static_cast<uint64_t>(weights_evict_first ? cute::TMA::CacheHintSm90::EVICT_FIRST
                                                                    : cute::TMA::CacheHintSm90::EVICT_NORMAL);
  return maps;
}

}  // namespace

int prefill_tokens_per_tile(gemm_config c) {
  switch (c) {
    case gemm_config::prefill_narrow: return prefill_narrow_tile::NMAX;
    case gemm_config::prefill_mid: return prefill_mid_tile::NMAX;
    default: return prefill_wide_tile::NMAX;
  }
}

// Also looks the encoder up here, outside any stream capture.
void prepare_prefill_kernels() {
  tensor_map_encoder();
  MXMOE_CUDA_CHECK(allow_prefill_smem_narrow());
  MXMOE_CUDA_CHECK(allow_prefill_smem_mid());
  MXMOE_CUDA_CHECK(allow_prefill_smem_wide());
}

void launch_gemm_prefill(const gemm_launch& l, const gemm_weights& w, const uint16_t* b_rows, const moe_workspace& ws,
                         epilogue_kind ep, const activation_config& act, cudaStream_t stream) {
  const int nmax = prefill_tokens_per_tile(l.config);
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  MXMOE_CHECK_ARG(l.tokens_per_tile == nmax, "gemm_launch.tokens_per_tile",
                  std::to_string(nmax) + " (the schedule of this prefill GEMM)", std::to_string(l.tokens_per_tile));
  MXMOE_CHECK_ARG(l.experts >= 1 && l.b_row_count >= 1 && l.max_tiles >= 1, "gemm_launch",
                  "experts, b_row_count and max_tiles >= 1",
                  std::to_string(l.experts) + ", " + std::to_string(l.b_row_count) + ", " + std::to_string(l.max_tiles));
  MXMOE_CHECK_ARG(w.cols % 32 == 0 && w.rows % 16 == 0, "gemm_weights", "K % 32 == 0 and rows % 16 == 0",
                  std::to_string(w.cols) + " x " + std::to_string(w.rows));
  MXMOE_CHECK_ARG(aligned(b_rows) && aligned(w.codes) && aligned(w.scales), "b_rows / gemm_weights",
                  "16-byte aligned (TMA)", "a misaligned pointer");
  int device = 0, sms = 0;
  MXMOE_CUDA_CHECK(cudaGetDevice(&device));
  MXMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const bool evict_first = l.weights_evict_first;
  if (l.config == gemm_config::prefill_narrow)
    launch_gemm_prefill_narrow(l, w, make_prefill_maps<prefill_narrow_tile>(w, l.experts, b_rows, l.b_row_count, evict_first),
                               ws, ep, act, sms, stream);
  else if (l.config == gemm_config::prefill_mid)
    launch_gemm_prefill_mid(l, w, make_prefill_maps<prefill_mid_tile>(w, l.experts, b_rows, l.b_row_count, evict_first),
                            ws, ep, act, sms, stream);
  else
    launch_gemm_prefill_wide(l, w, make_prefill_maps<prefill_wide_tile>(w, l.experts, b_rows, l.b_row_count, evict_first),
                             ws, ep, act, sms, stream);
}

}  // namespace mxmoe::cuda::sm90
