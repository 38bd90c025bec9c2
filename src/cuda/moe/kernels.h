// Internal interface between the MoE host launcher (moe_layer.cu) and the sm_90a device code:
// routing + scheduling (routing.cu), weight repacking (repack.cu), the grouped
// GEMMs (gemm_*.cu) and the combine (combine.cu).
//
// Data flow of one forward (T tokens, k slots, E experts; "pair" p = t*k + j):
//   routing and schedule -> ids[p], weights[p]; offsets[e] (exclusive scan of the pairs per
//                           expert); tiles[] = (expert, start, count) of at most BN pairs each,
//                           in expert order; num_tiles; sorted[offsets[e] + rank] = p.
//                           Up to kPlanMaxPairs pairs: [route] + plan (one CTA, no memset);
//                           more: memset, route / import (counts[e], pos[p] by atomics),
//                           schedule, scatter (routing.cu).
//   (prefill path: gather -> ybuf as [sorted position, H] = x[sorted[s] / k], GEMM1's B rows;
//                           combine_slots[p] = (sorted position, weights[p]))
//   GEMM1 (+act)        -> act[s, I] bf16 for sorted position s
//   GEMM2 (+b2)         -> decode: ybuf[p, H] bf16, routing weight applied (weighted_down);
//                          prefill: ybuf[s, H] bf16, unweighted (down_sorted)
//   combine             -> out[t, H] = sum_j w_j ybuf[row_j]   (fixed order: deterministic)
// Every kernel but the four-step routing is a programmatic dependent launch (pdl.cuh).
// The order of pairs inside an expert comes from atomics and may differ between calls; the
// result does not, since every output column of an mma is computed independently of the others.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include <cute/arch/copy_sm90_desc.hpp>

#include "mxmoe/moe.h"
#include "decode_split.h"  // the decode CTA's warps

namespace mxmoe::cuda::sm90 {

struct tile_desc {
  int32_t expert;
  int32_t start;  // first sorted position
  int32_t count;  // pairs in this tile (<= BN)
};

// Device pointers into the workspace.
// Where the combine finds a pair's output row and how it weighs it (moe_workspace::combine_slots).
struct alignas(8) combine_slot {
  int32_t row;
  float weight;
};

struct moe_workspace {
  int32_t* counts;      // [E]
  int32_t* offsets;     // [E + 1]
  int32_t* num_tiles;   // [1]
  int32_t* error_flag;  // [1]: bit 0 = an expert id was out of range (that slot contributes 0)
  // [2]: the next work item of the prefill GEMM1 and GEMM2 (gemm_prefill.cuh hands items out
  // through them), set to 0 by whichever kernel writes num_tiles.
  int32_t* item_counters;
  tile_desc* tiles;     // [max_tiles]
  int32_t* ids;         // [T*k]
  float* weights;       // [T*k]
  int32_t* pos;         // [T*k]: rank of pair p within its expert, s = offsets[ids[p]] + pos[p]
  int32_t* sorted;      // [T*k]
  float* sorted_weights;  // [T*k]: weights[sorted[s]], written with sorted (the decode GEMM2's epilogue reads it)
  // [T*k]: pair p's ybuf row after the prefill GEMM2 (its sorted position, -1: dropped) and routing
  // weight, written by gather_rows.cu; the combine's one load per slot (ybuf_rows::by_sorted_position).
  combine_slot* combine_slots;
  uint16_t* act;        // [T*k, I] bf16
  uint16_t* ybuf;       // [T*k, H] bf16
  // L2 policies (createpolicy encodings, l2_hint.cuh) of GEMM2's ybuf stores and of the combine's
  // ybuf loads: evict-last and evict-first where moe_layer.cu keeps GEMM2's outputs in the L2 for
  // the combine (keep_outputs_in_l2), normal elsewhere.
  uint64_t ybuf_store_l2_policy = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL);
  uint64_t ybuf_load_l2_policy = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL);
};

// Weights of one GEMM in the sm90 fragment layout, all experts back to back.
struct gemm_weights {
  const uint8_t* codes;   // [E][layout::sm90_fragment{rows, cols}.weight_bytes()]
  const uint8_t* scales;  // [E][... .scale_bytes()]
  const float* bias;      // [E, rows] in kernel row order, or nullptr
  int64_t rows, cols;     // N, K
  int64_t expert_code_stride, expert_scale_stride;
  // Every scale byte of the weights (padding aside) is in [1, 128], so each dequantized register
  // needs one multiply and no per-fragment test (dequant.cuh); found when the layer is prepared.
  bool scales_in_range = false;
};

// GEMM2's two epilogues differ in where a pair's output row lands and who weighs it:
//   weighted_down: (acc + b2) * routing weight -> ybuf[pair] (decode GEMM, wgmma tiles);
//     combine with ybuf_rows::by_pair.
//   down_sorted: acc + b2 -> ybuf[sorted position] (prefill GEMM: stored like GEMM1's act, with no
//     per-column pair or weight); combine with ybuf_rows::by_sorted_position, which applies the weight.
enum class epilogue_kind : int { gate_up_activation, weighted_down, down_sorted };
// How the combine finds and weighs pair p's ybuf row (see epilogue_kind).
enum class ybuf_rows : int { by_pair, by_sorted_position };

// Tile shapes the launcher can pick from.
//   decode: gemm_decode.cuh (weights streamed by each warp through a cp.async ring, mma.sync;
//           BN = 8 or 16 tokens, K optionally split over the CTA's warps); needs the one-CTA
//           plan (<= kPlanMaxPairs).
//   mid, large: gemm.cuh (wgmma, 64 / 128 tokens); MXMOE_MOE_PATH=tiles and legacy only.
//   legacy_decode: gemm.cuh's mma.sync tile of 16 tokens (the decode path before gemm_decode.cuh;
//           kept selectable, see docs/moe_layer.md).
//   prefill_narrow, prefill_mid, prefill_wide: gemm_prefill.cuh (persistent, warp-specialized,
//           TMA rings, wgmma N per tile; up to 64 / 96 / 176 tokens), the default beyond the decode GEMM
//           (docs/moe_layer.md). Their B rows are contiguous in sorted
//           order (row s = sorted position s): GEMM1 reads x gathered by launch_gather_sorted_rows.
enum class gemm_config : int { decode, mid, large, legacy_decode, prefill_narrow, prefill_mid, prefill_wide };
int gemm_tokens_per_tile(gemm_config c);  // BN (for decode: the largest, 16)

// How one GEMM launch runs.
struct gemm_launch {
  gemm_config config = gemm_config::mid;
  int tokens_per_tile = 64;    // BN the schedule used (decode: 8 or 16)
  int64_t max_tiles = 0;       // grid bound on the scheduled tiles
  int k_groups = 1;            // decode: warps of a CTA splitting K (1, 2 or 4, <= 32 / BN)
  int warps = kDecodeWarps;    // decode: warps per CTA (kDecodeWarps, or kDecodeWarpsNarrow for
                               // 8-token tiles with k_groups <= 2)
  int ring_rows = 0;           // decode: B rows per fragment tile in shared memory: a power of 2
                               // <= BN at least as large as any tile's pair count
  size_t min_smem_bytes = 0;   // decode: dynamic shared memory to ask for at least (more than the kernel
                               // uses caps the CTAs an SM takes; 0: what the kernel uses)
  bool early_weights = false;  // decode: start copying weights before waiting for the previous kernel
                               // (the tile list was written two kernels back: GEMM2)
  bool one_b_row = false;      // decode GEMM1: b_rows holds one row (T = 1), which every pair reads:
                               // its rows come without a load of the sorted pairs, one round trip
                               // less before its first stage (docs/performance.md, thirty-third session)
  bool dependent = true;       // programmatic dependent launch
  int64_t experts = 0;         // prefill: experts in the weights, and
  int64_t b_row_count = 0;     // the rows of b_rows (T·k): the extents of the kernel's tensor maps
  bool weights_evict_first = false;  // prefill: the weight copies ask the L2 to evict their lines first
                                     // (moe_layer.cu's weights_evict_first says where)
};

// Raises the kernels' shared-memory limit; call once before launching (not while capturing).
void prepare_gemm_kernels();
// The same for the prefill GEMMs, and looks the driver's tensor-map encoder up; only where they run.
void prepare_prefill_kernels();
void launch_gemm(const gemm_launch& l, const gemm_weights& w, const uint16_t* b_rows, const moe_workspace& ws,
                 int top_k, epilogue_kind ep, const activation_config& act, cudaStream_t stream);
// Decode GEMM CTAs resident per SM with that tile, K split, ring_rows and warps per CTA (for the
// host's choice of k_groups and warps).
int decode_ctas_per_sm(int tokens_per_tile, int k_groups, int ring_rows, int warps);

// rows[s, :] = x[sorted[s] / top_k, :] for the valid sorted positions (gather_rows.cu, token by
// token: s = offsets[ids[p]] + pos[p]): GEMM1's B rows for the prefill GEMMs. A programmatic
// dependent launch.
void launch_gather_sorted_rows(const uint16_t* x, int64_t pairs, int top_k, int64_t hidden,
                               const moe_workspace& ws, uint16_t* rows, cudaStream_t stream);

// ---- routing ----
inline constexpr int64_t kPlanMaxPairs = 8192;   // pairs the one-CTA plan handles (rank < 2^16)
inline constexpr int kPlanThreads = 512;          // one per expert (E <= 512)
inline constexpr int kPlanRouteMaxTokens = kPlanThreads / 32;  // the plan routes itself up to this T
inline constexpr int kPlanRouteMaxExperts = 256;                // ... and this E
inline constexpr size_t kPlanMaxSmemBytes = 160 * 1024;
// The few-token plan (plan_few.cu): routed tokens only, one kernel of T warps.
inline constexpr int kPlanFewMaxTokens = 8;
inline constexpr int kPlanFewMaxPairs = 32;

enum class plan_source : int {
  route_kernel,  // ids / weights in the workspace, from launch_route(count_pairs = false)
  precomputed,   // caller-provided ids / weights (range-checked, copied)
  route,         // logits: the plan kernel routes (plan_can_route; the few-token plan where
                 // plan_few_applies)
};
struct plan_args {
  plan_source source = plan_source::route_kernel;
  const void* logits = nullptr;  // route
  bool logits_bf16 = false;
  const float* correction_bias = nullptr;
  routing_config r;  // top_k always; the rest for route
  const int32_t* ids = nullptr;  // precomputed
  const float* weights = nullptr;
  const int32_t* expert_map = nullptr;  // [E] local index or -1 (routing.cu); null: every expert
  int tokens = 0, experts = 0, tokens_per_tile = 0;
  int64_t max_tiles = 0;
};
// Whether the plan routes T tokens itself (plan_source::route): the few-token plan
// (plan_few_applies: T <= kPlanFewMaxTokens, T * k <= kPlanFewMaxPairs, T <= tokens_per_tile, any
// E <= 512) or the one-CTA plan (T <= kPlanRouteMaxTokens, E <= kPlanRouteMaxExperts).
bool plan_few_applies(int64_t tokens, int top_k, int tokens_per_tile);
bool plan_can_route(int64_t tokens, int64_t experts, int top_k, int tokens_per_tile);
void prepare_plan_kernel();
// The plan of a forward: the few-token plan where it applies to a routed forward, else the one-CTA
// plan.
void launch_plan(const plan_args& a, const moe_workspace& ws, cudaStream_t stream);
void launch_plan_few(const plan_args& a, const moe_workspace& ws, cudaStream_t stream);

// An L2 prefetch of the first local experts' GEMM1 weights (prefetch.cu): the codes' and scales'
// shares of `budget` bytes, each a linear range from expert 0. Launch it on a stream the forward's
// chain does not wait on.
struct weight_prefetch {
  const uint8_t* codes = nullptr;
  int64_t code_bytes = 0;  // all experts' codes (contiguous)
  const uint8_t* scales = nullptr;
  int64_t scale_bytes = 0;
  int64_t budget = 0;      // bytes to prefetch in all (0: none)
};
void launch_weight_prefetch(const weight_prefetch& pf, cudaStream_t stream);
// Routing from logits (f32 or bf16 [T, E]); fills ids, weights (and with count_pairs counts, pos).
// expert_map (null: none) turns the ids into local indices (routing.cu).
void launch_route(const void* logits, bool logits_bf16, const float* correction_bias, const routing_config& r,
                  int64_t tokens, int64_t experts, bool count_pairs, bool dependent, const int32_t* expert_map,
                  const moe_workspace& ws, cudaStream_t stream);
// Precomputed ids/weights: copies them (through expert_map when not null), counts, flags
// out-of-range ids (four-step path).
void launch_import_routing(const int32_t* ids, const float* weights, int64_t tokens, int top_k, int64_t experts,
                           const int32_t* expert_map, const moe_workspace& ws, cudaStream_t stream);
void launch_schedule(int64_t experts, int tokens_per_tile, int64_t max_tiles, const moe_workspace& ws,
                     cudaStream_t stream);
void launch_scatter(int64_t pairs, const moe_workspace& ws, cudaStream_t stream);
void launch_combine(int64_t tokens, int top_k, int64_t hidden, const moe_workspace& ws, ybuf_rows rows, uint16_t* out,
                    bool dependent, cudaStream_t stream);

// Checkpoint layout (device memory, one expert) -> sm90 fragment layout (device memory).
// GEMM1 passes its layout::gate_up_rows; GEMM2 passes has_gate_up = false (rows kept in order).
// Sets *scale_out_of_range (device memory) to 1 when a scale byte is outside [1, 128]
// (gemm_weights::scales_in_range); never clears it.
void launch_repack_expert(const uint8_t* ckpt_blocks, const uint8_t* ckpt_scales, int64_t rows, int64_t cols,
                          bool has_gate_up, layout::gate_up_rows gate_up, uint8_t* codes, uint8_t* scales,
                          uint32_t* scale_out_of_range, cudaStream_t stream);
// A bias [experts, rows] (bf16, f16 or f32, device memory) -> float [experts, rows] in kernel row
// order (GEMM1: layout::gate_up_rows; otherwise rows kept in order).
void launch_prepare_bias(const void* src, dtype type, int64_t experts, int64_t rows, bool has_gate_up,
                         layout::gate_up_rows gate_up, float* dst, cudaStream_t stream);

}  // namespace mxmoe::cuda::sm90
