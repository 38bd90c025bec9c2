// Internal interface between the MoE host launcher (moe_layer.cu) and the sm_90a device code:
// routing + scheduling (routing.cu), weight repacking (repack.cu), the grouped
// GEMMs (gemm_*.cu) and the combine (combine.cu).
//
// Data flow of one forward (T tokens, k slots, E experts; "pair" p = t*k + j):
//   route / import ids  -> ids[p], weights[p], counts[e] (atomics), pos[p] (rank within expert)
//   schedule            -> offsets[e] (exclusive scan), tiles[] = (expert, start, count) of at
//                          most BN pairs each, in expert order; num_tiles
//   scatter             -> sorted[offsets[e] + pos[p]] = p
//   (prefill: gather    -> ybuf as [sorted position, H] = x[sorted[s] / k], GEMM1's B rows)
//   GEMM1 (+act)        -> act[s, I] bf16 for sorted position s
//   GEMM2 (*w, +b2)     -> ybuf[p, H] bf16 (routing weight applied)
//   combine             -> out[t, H] = sum_j ybuf[t*k + j]   (fixed order: deterministic)
// The order of pairs inside an expert comes from atomics and may differ between calls; the
// result does not, since every output column of an mma is computed independently of the others.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "mxmoe/moe.h"

namespace mxmoe::cuda::sm90 {

struct tile_desc {
  int32_t expert;
  int32_t start;  // first sorted position
  int32_t count;  // pairs in this tile (<= BN)
};

// Device pointers into the workspace.
struct moe_workspace {
  int32_t* counts;      // [E]
  int32_t* offsets;     // [E + 1]
  int32_t* num_tiles;   // [1]
  int32_t* error_flag;  // [1]: bit 0 = an expert id was out of range (that slot contributes 0)
  tile_desc* tiles;     // [max_tiles]
  int32_t* ids;         // [T*k]
  float* weights;       // [T*k]
  int32_t* pos;         // [T*k]
  int32_t* sorted;      // [T*k]
  uint16_t* act;        // [T*k, I] bf16
  uint16_t* ybuf;       // [T*k, H] bf16
};

// Weights of one GEMM in the sm90 fragment layout, all experts back to back.
struct gemm_weights {
  const uint8_t* codes;   // [E][layout::sm90_fragment{rows, cols}.weight_bytes()]
  const uint8_t* scales;  // [E][... .scale_bytes()]
  const float* bias;      // [E, rows] in kernel row order, or nullptr
  int64_t rows, cols;     // N, K
  int64_t expert_code_stride, expert_scale_stride;
};

enum class epilogue_kind : int { gate_up_activation, weighted_down };


// Tile shapes the launcher can pick from (one instantiation per translation unit).
enum class gemm_config : int { decode, mid, large };
int gemm_tokens_per_tile(gemm_config c);  // BN

// Raises the kernels' shared-memory limit; call once before launching (not while capturing).
void prepare_gemm_kernels();
void launch_gemm(gemm_config c, const gemm_weights& w, const uint16_t* b_rows, const moe_workspace& ws,
                 int top_k, epilogue_kind ep, const activation_config& act, int64_t max_tiles,
                 cudaStream_t stream);

// Prefill and the 512–2048-token transition (gemm_prefill.cuh): persistent warp-specialized
// GEMMs whose B rows are contiguous in expert-sorted order (row s = sorted position s).
enum class prefill_config : int { narrow, wide };
int prefill_tokens_per_tile(prefill_config c);  // tokens_per_tile of the schedule
void prepare_prefill_kernels();                 // like prepare_gemm_kernels
void launch_gemm_prefill(prefill_config c, const gemm_weights& w, int64_t experts, const uint16_t* b_rows,
                         int64_t b_row_count, const moe_workspace& ws, epilogue_kind ep, const activation_config& act,
                         int64_t max_tiles, cudaStream_t stream);
// rows[s, :] = x[sorted[s] / top_k, :] for the valid sorted positions (gather_rows.cu).
void launch_gather_sorted_rows(const uint16_t* x, int64_t pairs, int top_k, int64_t hidden, int64_t experts,
                               const moe_workspace& ws, uint16_t* rows, cudaStream_t stream);

// Routing from logits (f32 or bf16 [T, E]); fills ids, weights, counts, pos.
void launch_route(const void* logits, bool logits_bf16, const float* correction_bias, const routing_config& r,
                  int64_t tokens, int64_t experts, const moe_workspace& ws, cudaStream_t stream);
// Precomputed ids/weights: copies them, counts, flags out-of-range ids.
void launch_import_routing(const int32_t* ids, const float* weights, int64_t tokens, int top_k, int64_t experts,
                           const moe_workspace& ws, cudaStream_t stream);
void launch_schedule(int64_t experts, int tokens_per_tile, int64_t max_tiles, const moe_workspace& ws,
                     cudaStream_t stream);
void launch_scatter(int64_t pairs, const moe_workspace& ws, cudaStream_t stream);
void launch_combine(int64_t tokens, int top_k, int64_t hidden, const moe_workspace& ws, uint16_t* out,
                    cudaStream_t stream);

// Checkpoint layout (device memory, one expert) -> sm90 fragment layout (device memory).
// GEMM1 passes its layout::gate_up_rows; GEMM2 passes has_gate_up = false (rows kept in order).
void launch_repack_expert(const uint8_t* ckpt_blocks, const uint8_t* ckpt_scales, int64_t rows, int64_t cols,
                          bool has_gate_up, layout::gate_up_rows gate_up, uint8_t* codes, uint8_t* scales,
                          cudaStream_t stream);

}  // namespace mxmoe::cuda::sm90
