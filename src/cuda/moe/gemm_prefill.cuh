// moe/gemm_prefill.cuh — the persistent, warp-specialized W4A16 expert GEMM of the MoE layer for
// prefill and the 512–2048-token transition (both GEMMs), sm_90a.
//
// C[rows, tokens] = W_e[rows, K] · B[tokens, K]ᵀ per work item (prefill_schedule.cuh): one
// scheduled tile of expert e (count <= NMAX expert-sorted pairs) times 64·G weight rows (G = 3
// consumer warpgroups in the wide tile, 4 in the narrow one). B rows
// are contiguous in sorted order (GEMM1: x gathered by gather_rows.cu; GEMM2: act), so the
// tensor-memory-access engine (TMA) loads them.
//
// One CTA per SM, 4G + 4 warps (G + 1 warpgroups), no CTA-wide barrier after set-up:
//   warpgroup G, the producers (setmaxnreg down to 32 or 24 registers; its last two warps leave):
//     warp 4G, one lane — work items (taken from a global counter and passed
//       to the other roles) and weights: per stage 4 K-steps (256 k) of the block's 4G fragment row
//       tiles (layout::sm90_fragment, [N/16][K/64] tiles of 512 code + 32 scale bytes), two TMA
//       loads (codes, scales) through 3-D tensor maps over [experts x row tiles][K/64][tile], into
//       a ring of A_STAGES slots;
//     warp 4G + 1, one lane — activations: per K-step one TMA box of 16·ceil(count/16) rows x 64 k
//       (one tensor map per width), 128-byte swizzled (layout::sw128_rows: what the
//       wgmma descriptor reads), into a ring of B_STAGES slots; rows past the tensor and the K
//       tail arrive as zeros;
//   warpgroups 0..G-1, the consumers (setmaxnreg up to 160 or 112 registers), 64 weight rows each (warp q
//     of warpgroup h owns row tile 4h + q). Per K-step a warp turns its 16-byte fragment share and
//     4 scale bytes into bf16 A registers (dequant.cuh) and its warpgroup issues four wgmma
//     m64nNk16 with A from registers. The A registers are double-buffered: the conversion for
//     step s+1 runs while the tensor cores work on step s (wgmma.wait_group 1). A weight slot is
//     released as soon as its bytes are in registers; an activation slot when the wgmmas that
//     read it completed.
// Why three consumer warpgroups (two until 2026-12-05): the conversion is a chain of dependent
// integer and bf16 operations per K-step; with two consumer warps per scheduler, stall sampling
// found ~48 % of the consumers' samples waiting inside that chain while both rings were full and
// the wgmmas done (docs/performance.md, "What limits it now"). Three per scheduler hide more of
// it, and 192 rows per CTA read each activation slot three times instead of twice.
// Few, large copies (1.5 per K-step): the first version, with ~20 small ones per K-step (16-row
// activation boxes, one bulk copy per fragment row tile), ran at ~100-125 cycles per copy
// instruction whatever its size (docs/performance.md, "2026-12-01").
// N = 16·ceil(count/16) per tile (the K-step picks the wgmma instruction): a tile of 18 pairs
// costs a 32-wide product, not an NMAX-wide one; NMAX sets the ring slot and the accumulators
// (NMAX/2 floats per thread). fp32 accumulation over the whole K, one CTA per output: deterministic.
// Epilogues: prefill_epilogue.cuh (activation fused in GEMM1, GEMM2's rows in sorted order); each
// consumer warp transposes its accumulators through 512 bytes of its own shared memory (stmatrix)
// and stores 16-byte vectors: 8x fewer store instructions than 2-byte stores straight from the
// accumulators (with the stagger below and bf16x2 packing by cvt: 0.89-0.99 of the layer time at
// T >= 2048 on three shapes, docs/performance.md, "2026-12-05 (eleventh session)").
// The consumer warpgroups start STAGGER K-steps apart (a named barrier once per CTA) and keep
// that distance through the rings, so one warpgroup's first conversion and epilogue overlap the
// others' wgmmas instead of all of them idling the tensor cores at once.
//
// Limits (launchers check): K a multiple of 32, rows a multiple of 16 (layout::sm90_fragment),
// B rows and weights 16-byte aligned, at least one B row; tiles as routing.cu's schedule writes
// them with tokens_per_tile = NMAX. Three tiles (one translation unit each):
// prefill_narrow_tile for up to 48 pairs per expert (weight streaming), prefill_mid_tile up to
// 72, prefill_wide_tile above; each with and without the per-fragment test of the scale bytes
// (gemm_weights::scales_in_range).
// A programmatic dependent launch (pdl.cuh): every CTA waits for the previous kernel after
// initialising its barriers, before any global memory access.
// Selected by moe_layer.cu's pick_config beyond the decode GEMM (MXMOE_MOE_PATH=tiles runs
// gemm.cuh's wgmma tiles there instead, for A/B timing). Tests: tests/gpu/test_gpu_moe_prefill.cpp.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include <cute/arch/cluster_sm90.hpp>
#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "mxmoe/layout.h"

#include "dequant.cuh"
#include "kernels.h"
#include "mma.cuh"
#include "pdl.cuh"
#include "prefill_epilogue.cuh"
#include "prefill_pipeline.cuh"
#include "prefill_schedule.cuh"

#if defined(__CUDA_ARCH__) && !defined(CUDA_CTA_RECONFIG_ACTIVATED)
#error "the prefill GEMM needs setmaxnreg: compile it for sm_90a"
#endif

namespace mxmoe::cuda::sm90 {

// Columns of an activation box (prefill_launch.cu encodes the maps, the kernel loads them): one
// K-step of bf16, a 128-byte swizzle row.
inline constexpr int kPrefillBoxCols = 64;

template <int NMAX_, int A_STAGES_, int B_STAGES_, int CONSUMER_GROUPS_, int STAGGER_, int B_KSTEPS_ = 1>
struct prefill_tile {
  static constexpr int CONSUMER_GROUPS = CONSUMER_GROUPS_;  // warpgroups of 64 weight rows
  static constexpr int CONSUMER_WARPS = 4 * CONSUMER_GROUPS;
  static constexpr int ROW_TILES = CONSUMER_WARPS;      // 16-row fragment tiles per CTA
  static constexpr int NMAX = NMAX_;   // pairs per scheduled tile
  static constexpr int N_STEP = 16;    // granularity of the per-tile wgmma N
  // One K-step loop serves every width (a uniform branch per K-step picks the instruction). A
  // second loop for full-width tiles (one wgmma instruction, no branch) made ptxas serialize the
  // wgmmas (C7512, "insufficient register resources") in the 176-wide tile (found 2026-12-05
  // after an H100 run where it lost 4-14 % at T = 16384) and in every four-warpgroup tile, and
  // so did a second loop for the CTA's first item (2026-12-06): these kernels hold one.
  static constexpr int WIDTHS = NMAX / N_STEP;
  static constexpr int A_STAGES = A_STAGES_, B_STAGES = B_STAGES_;
  static constexpr int A_KSTEPS = 4;  // K-steps per weight stage
  // K-steps per activation slot (one TMA box each, one barrier for the slot): with 2, a consumer
  // waits for, releases and advances the B ring every other K-step.
  static constexpr int B_KSTEPS = B_KSTEPS_;
  // K-steps of one pass of the consumers' loop: three weight stages in the narrow and mid tiles,
  // so their per-pass bookkeeping is paid once per 12 K-steps instead of 4 (they are issue-bound
  // in part). One in the wide tile: unrolled over two, it measured 0.4-0.5 % slower at T = 2048.
  static constexpr int LOOP_KSTEPS = (NMAX_ <= 96 ? 3 : 1) * A_KSTEPS;
  // Consumer warpgroup h starts h * STAGGER K-steps behind warpgroup 0, so that they do not
  // reach an item's first conversion and its epilogue at the same time. The B ring bounds how far
  // warpgroup 0 may run ahead: STAGGER * (CONSUMER_GROUPS - 1) K-steps must leave it a slot.
  static constexpr int STAGGER = STAGGER_;
  static constexpr int TILE_CODES = layout::sm90_fragment::kTileBytes;
  static constexpr int TILE_SCALES = layout::sm90_fragment::kTileScaleBytes;
  // Weight stage: codes [ROW_TILES][A_KSTEPS][512], then scales [ROW_TILES][A_KSTEPS][32] (the
  // tensor maps' boxes, innermost last).
  static constexpr int A_CODE_BYTES = ROW_TILES * A_KSTEPS * TILE_CODES;
  static constexpr int A_STAGE_BYTES = A_CODE_BYTES + ROW_TILES * A_KSTEPS * TILE_SCALES;
  static constexpr int B_ROW_BYTES = kPrefillBoxCols * 2;
  static constexpr int B_KSTEP_BYTES = NMAX * B_ROW_BYTES;
  static constexpr int B_STAGE_BYTES = B_KSTEPS * B_KSTEP_BYTES;
  // The producer warpgroup follows the consumers: warp 0 of it loads weights, warp 1 activations.
  static constexpr int WEIGHT_WARP = CONSUMER_WARPS, ACTIVATION_WARP = CONSUMER_WARPS + 1;
  static constexpr int THREADS = 32 * CONSUMER_WARPS + 128;
  // Registers: every thread starts with LAUNCH_REGISTERS (the register file over the threads, in
  // the hardware's steps of 8). setmaxnreg moves registers only within the CTA's own pool (PTX ISA,
  // "setmaxnreg": .inc blocks until the CTA's pool can supply them): the consumers can take only
  // what the producers give back, never the part of the register file the launch left unallocated
  // (with four consumer warpgroups 640 x 96 = 61440 of 65536; asking for 120 hung every launch,
  // docs/performance.md, thirteenth session). Three consumer warpgroups: 32 and 160 of 128; four:
  // 32 and 112 of 96 (24 spilled the weight loader, which takes the work items from the counter).
  static constexpr int LAUNCH_REGISTERS = 65536 / THREADS / 8 * 8;
  static constexpr int PRODUCER_REGISTERS = 32;
  static constexpr int CTA_REGISTERS = THREADS * LAUNCH_REGISTERS;
  static constexpr int CONSUMER_REGISTERS = (CTA_REGISTERS - 128 * PRODUCER_REGISTERS) / (32 * CONSUMER_WARPS) / 8 * 8;
  // Work items handed from the weight loader to the other roles (load_weights): slots enough that
  // the loader, at most A_STAGES weight stages ahead, never waits for one while the rings have room.
  static constexpr int ITEM_SLOTS = 8;
  // Shared memory, from a 1024-byte aligned base: [B slots][A slots][epilogue stages][barriers]
  // [item slots].
  static constexpr int A_OFFSET = B_STAGES * B_STAGE_BYTES;
  static constexpr int STAGE_OFFSET = A_OFFSET + A_STAGES * A_STAGE_BYTES;
  static constexpr int BAR_OFFSET = STAGE_OFFSET + CONSUMER_WARPS * kEpilogueStageBytes;
  static constexpr int BARRIERS = 2 * (A_STAGES + B_STAGES + ITEM_SLOTS);
  static constexpr int ITEM_OFFSET = BAR_OFFSET + BARRIERS * 8;
  static constexpr int SMEM_BYTES = 1024 + ITEM_OFFSET + ITEM_SLOTS * 4;
  static_assert(STAGGER * (CONSUMER_GROUPS - 1) < (B_STAGES - 1) * B_KSTEPS + 1,
                "warpgroup 0 must not wait for a slot the others hold");
  static_assert(A_KSTEPS % B_KSTEPS == 0, "activation slots of 1, 2 or 4 K-steps (a divisor of a weight stage's)");
  static_assert(LOOP_KSTEPS % A_KSTEPS == 0, "one loop pass: whole weight stages");
  static_assert(NMAX % N_STEP == 0 && NMAX <= 176, "per-tile wgmma widths: multiples of 16 up to 176 (mma.cuh)");
  static_assert(CONSUMER_GROUPS == 3 || CONSUMER_GROUPS == 4, "named barriers 1..3 stagger the consumer warpgroups");
  static_assert(PRODUCER_REGISTERS <= LAUNCH_REGISTERS && LAUNCH_REGISTERS <= CONSUMER_REGISTERS &&
                    128 * PRODUCER_REGISTERS + 32 * CONSUMER_WARPS * CONSUMER_REGISTERS <= CTA_REGISTERS,
                "setmaxnreg.inc takes only registers the producers gave back to the CTA's pool");
  static_assert(B_KSTEP_BYTES % 1024 == 0,
                "B slots stay 1024-byte aligned: the swizzle is a function of address bits 4..9");
  static_assert(A_STAGE_BYTES % 128 == 0, "TMA destinations are 128-byte aligned");
  static_assert(SMEM_BYTES <= 232448, "sm_90 dynamic shared memory per block");
};

// The three instantiations (one per translation unit); rings sized to fill the 227 KB.
// Narrow, 8..48 pairs per expert (weight streaming): four consumer warpgroups (256 rows, 112
// registers), because with three the consumers' issue stream, not the tensor cores or the
// memory, set the pace (no warp eligible in half the cycles, docs/performance.md).
// Rings: an activation slot is released only when all four warpgroups have read it, so the B
// ring bounds how far the leading warpgroup runs ahead of the last one: with 5 slots and the
// warpgroups 1 K-step apart it kept 2 slots of slack, and one warpgroup's epilogue stalled the
// others. 9 activation slots (B slots are small here) and 4 weight stages (16 K-steps ahead) let
// them stay 2 K-steps apart: 0.97-0.99 of the layer time at Qwen3-30B-A3B T = 512 and Kimi-K2
// T = 512-2048 (docs/performance.md, eighteenth session). The same 10 K-steps of activations now
// sit in 5 slots of 2 K-steps: the issue-bound consumers wait for, release and advance the B ring
// every other K-step. Kimi-K2 T = 2048 GEMM1 3163 -> 3035 µs, GEMM2 1666 -> 1580 µs (ncu, H100);
// layer 0.93-0.98 at T = 512 (nineteenth session). Then 3 slots of 4 K-steps, one per weight
// stage (the ring advanced once per stage), with 3 weight stages: 0.972-0.994 of the layer at
// T = 512 on gpt-oss-120b, Qwen3-30B-A3B and Kimi-K2 (H100, twentieth session).
using prefill_narrow_tile = prefill_tile<64, 3, 3, 4, 2, 4>;
// Mid, 49..72 pairs per expert: the same warps; 96 pairs, because a 112-wide accumulator does not
// fit 112 registers without serializing the wgmmas (ptxas C7512). 4 slots of 2 K-steps (5 do not
// fit with 3 weight stages), so the warpgroups start 1 K-step apart. Slots of 4 K-steps here
// (<96, 3, 2, 4, 1, 4>) lost 0.5 % at gpt-oss-20b T = 512 (H100, twentieth session).
using prefill_mid_tile = prefill_tile<96, 3, 4, 4, 1, 2>;
// Wide, beyond 72 (tensor-core bound; 176: 156 of 160 registers, no spills). 3 weight stages and
// 6 activation slots took Qwen3-30B-A3B's GEMM2 at T = 16384 from 793 to 762 µs (ncu), but the
// layer at gpt-oss-120b T = 16384 ran 3-8 % slower on two H100s (not on the H200, and not in the
// kernels' ncu durations): kept at 4 and 5 until that is understood (docs/performance.md).
using prefill_wide_tile = prefill_tile<176, 4, 5, 3, 2>;

// The kernel's tensor maps (prefill_launch.cu encodes them for every launch).
template <int WIDTHS>
struct prefill_maps {
  CUtensorMap codes;          // u32 [experts * row tiles][K/64][128], box {128, A_KSTEPS, ROW_TILES}
  CUtensorMap scales;         // u32 [experts * row tiles][K/64][8], box {8, A_KSTEPS, ROW_TILES}
  CUtensorMap rows[WIDTHS];   // bf16 B rows [rows][K], box {64, 16 (w + 1)}, 128-byte swizzle
  // The L2 policy of the weight copies (gemm_launch::weights_evict_first): evict-first where
  // moe_layer.cu's rule says so, so that the weights streaming through the L2 do not push out the
  // gathered rows, GEMM1's activations and GEMM2's outputs, which the next kernel reads back;
  // normal elsewhere.
  uint64_t weight_l2_policy;
};

cudaError_t allow_prefill_smem_narrow();
cudaError_t allow_prefill_smem_mid();
cudaError_t allow_prefill_smem_wide();
void launch_gemm_prefill_narrow(const gemm_launch&, const gemm_weights&,
                                const prefill_maps<prefill_narrow_tile::WIDTHS>&, const moe_workspace&, epilogue_kind,
                                const activation_config&, int sms, cudaStream_t);
void launch_gemm_prefill_mid(const gemm_launch&, const gemm_weights&, const prefill_maps<prefill_mid_tile::WIDTHS>&,
                             const moe_workspace&, epilogue_kind, const activation_config&, int sms, cudaStream_t);
void launch_gemm_prefill_wide(const gemm_launch&, const gemm_weights&, const prefill_maps<prefill_wide_tile::WIDTHS>&,
                              const moe_workspace&, epilogue_kind, const activation_config&, int sms, cudaStream_t);

template <class Cfg>
struct prefill_smem {
  uint8_t* base;     // 1024-byte aligned
  uint64_t b_desc0;  // detail::sw128_desc(base), held (not recomputed from base every K-step)
  __device__ uint8_t* b_slot(int s) const { return base + s * Cfg::B_STAGE_BYTES; }
  // The wgmma descriptor of B slot s: slot 0's plus s slots in the start-address field (16-byte
  // units; shared addresses stay below 2^18, so the field never carries). Built from the slot's
  // address and its k16 steps as `hi | (lo + 2 j)`, a K-step took 8 uniform instructions more.
  __device__ uint64_t b_desc(int s, int sub) const {
    return b_desc0 + static_cast<uint64_t>(s * (Cfg::B_STAGE_BYTES >> 4) + sub * (Cfg::B_KSTEP_BYTES >> 4));
  }
  __device__ uint8_t* a_slot(int s) const { return base + Cfg::A_OFFSET + s * Cfg::A_STAGE_BYTES; }
  __device__ uint8_t* epilogue_stage(int warp) const { return base + Cfg::STAGE_OFFSET + warp * kEpilogueStageBytes; }
  __device__ uint64_t* bar(int i) const { return reinterpret_cast<uint64_t*>(base + Cfg::BAR_OFFSET) + i; }
  __device__ uint64_t* a_full(int s) const { return bar(s); }
  __device__ uint64_t* a_empty(int s) const { return bar(Cfg::A_STAGES + s); }
  __device__ uint64_t* b_full(int s) const { return bar(2 * Cfg::A_STAGES + s); }
  __device__ uint64_t* b_empty(int s) const { return bar(2 * Cfg::A_STAGES + Cfg::B_STAGES + s); }
  __device__ uint64_t* item_full(int s) const { return bar(2 * (Cfg::A_STAGES + Cfg::B_STAGES) + s); }
  __device__ uint64_t* item_empty(int s) const {
    return bar(2 * (Cfg::A_STAGES + Cfg::B_STAGES) + Cfg::ITEM_SLOTS + s);
  }
  __device__ int* item(int s) const { return reinterpret_cast<int*>(base + Cfg::ITEM_OFFSET) + s; }
};

// ---- work items --------------------------------------------------------------------------
// The items are taken at run time, one at a time, from a counter in global memory (the routing
// kernel that wrote num_tiles set it to 0): a CTA that drew short items takes more, and all CTAs
// finish within about one item of each other. Handed out round-robin instead (item c + j·G to
// CTA c, until 2026-12-06), CTAs that drew long items set the kernel's end: ncu put the SMs'
// active cycles at 90 % of the elapsed ones in both GEMMs at Qwen3-30B-A3B T = 2048 (8 items per
// CTA). Which CTA computes an output does not change it: one CTA per output, its K order fixed.
// The weight loader's lane takes the items (it needs them first) and passes each to the
// activation loader and the consumer warps through ITEM_SLOTS shared-memory slots, each with a
// full barrier (its arrival) and an empty one (one arrival per reader). An index >= items ends
// every role's loop. Measured (H100, twentieth session): SM active / elapsed cycles 0.91 -> 0.93-0.95
// in both GEMMs at Qwen3 T = 2048, layer 0.96-0.98 at T = 8192-16384 and at gpt-oss T = 2048.
// The narrow tile kept round-robin items for a day: from the counter its GEMMs took 2-4 % longer
// at Qwen3 T = 512, because its issue-bound K-step loop grew from 625 to 639 SASS instructions per
// weight stage (bench/sass_loops.py). With one counter per item reader instead of a slot and a
// phase (item_reader) the loop is 626, and the layer 0.98-0.99 at gpt-oss T = 512-2048 and Qwen3
// T = 2048, 1.008 at Qwen3 T = 512 (H100, twenty-first session).
constexpr int kItemReaders(int consumer_warps) { return consumer_warps + 1; }

// WHOLE_WARP: read by every lane of the warp (the consumers), one of which gives the slot back;
// else by one lane (the activation loader).
// One counter of the items read (slot and parity derived from it: one register live across the
// consumers' K-step loop instead of two).
template <class Cfg, bool WHOLE_WARP>
struct item_reader {
  static_assert((Cfg::ITEM_SLOTS & (Cfg::ITEM_SLOTS - 1)) == 0, "a power of 2");
  uint32_t read = 0;
  __device__ __forceinline__ int64_t next(const prefill_smem<Cfg>& sm) {
    const int slot = static_cast<int>(read % Cfg::ITEM_SLOTS);
    detail::wait_full(sm.item_full(slot), (read / Cfg::ITEM_SLOTS) & 1u);
    int i = *sm.item(slot);
    if constexpr (WHOLE_WARP) {
      i = warp_uniform(i);
      __syncwarp();
      if (cute::elect_one_sync()) detail::arrive(sm.item_empty(slot));
    } else {
      detail::arrive(sm.item_empty(slot));
    }
    ++read;
    return i;
  }
};

// ---- loaders (one lane each) -------------------------------------------------------------

// One lane. `counter`: this GEMM's in ws.item_counters.
template <class Cfg>
__device__ void load_weights(const prefill_smem<Cfg>& sm, const prefill_maps<Cfg::WIDTHS>& maps,
                             const moe_workspace& ws, const prefill_grid& pg, int* counter) {
  detail::ring_pos<Cfg::A_STAGES> pos;
  detail::ring_pos<Cfg::ITEM_SLOTS> items;
  // The next item is taken right after the current one's last weight stage is issued, while the
  // ring is full and this lane would only wait: the counter's and the tile's round trips overlap
  // the consumers' work on the stages in the ring. (Taken once the ring had room for the item's
  // first stage, those round trips delayed its copies; no difference was measurable. Taken a
  // whole item ahead, the item is one that a CTA becoming free sooner cannot have.)
  auto load_item = [&](int64_t i) {
    const prefill_item it = prefill_item_at<Cfg::ROW_TILES>(ws, pg, i);
    // Row tiles of the block past the matrix are the next expert's (or zeros): loaded, not used.
    const int row0 = it.expert * pg.row_tiles + it.row_tile0;
    for (int ks = 0; ks < pg.ksteps; ks += Cfg::A_KSTEPS) {
      detail::wait_empty(sm.a_empty(pos.slot), pos.phase);
      uint64_t* full = sm.a_full(pos.slot);
      detail::arrive_expect_bytes(full, Cfg::A_STAGE_BYTES);  // K-steps past K arrive as zeros
      detail::tma_load_3d(sm.a_slot(pos.slot), &maps.codes, 0, ks, row0, full, maps.weight_l2_policy);
      detail::tma_load_3d(sm.a_slot(pos.slot) + Cfg::A_CODE_BYTES, &maps.scales, 0, ks, row0, full,
                          maps.weight_l2_policy);
      pos.advance();
    }
  };
  int i = atomicAdd(counter, 1);
  for (;;) {
    detail::wait_empty(sm.item_empty(items.slot), items.phase);
    *sm.item(items.slot) = i;
    detail::arrive(sm.item_full(items.slot));
    items.advance();
    if (i >= pg.items) break;
    load_item(i);
    i = atomicAdd(counter, 1);
  }
}

template <class Cfg>
__device__ void load_activations(const prefill_smem<Cfg>& sm, const prefill_maps<Cfg::WIDTHS>& maps,
                                 const moe_workspace& ws, const prefill_grid& pg) {
  detail::ring_pos<Cfg::B_STAGES> pos;
  auto load_item = [&](int64_t i) {
    const prefill_item it = prefill_item_at<Cfg::ROW_TILES>(ws, pg, i);
    const int n16 = (it.count + Cfg::N_STEP - 1) / Cfg::N_STEP;
    const CUtensorMap* map = &maps.rows[n16 - 1];
    for (int ks = 0; ks < pg.ksteps; ks += Cfg::B_KSTEPS) {
      detail::wait_empty(sm.b_empty(pos.slot), pos.phase);
      uint64_t* full = sm.b_full(pos.slot);
      const int boxes = pg.ksteps - ks < Cfg::B_KSTEPS ? pg.ksteps - ks : Cfg::B_KSTEPS;
      detail::arrive_expect_bytes(full, boxes * n16 * Cfg::N_STEP * Cfg::B_ROW_BYTES);
      for (int b = 0; b < boxes; ++b)
        detail::tma_load_2d(sm.b_slot(pos.slot) + b * Cfg::B_KSTEP_BYTES, map, (ks + b) * kPrefillBoxCols, it.start,
                            full);
      pos.advance();
    }
  };
  item_reader<Cfg, false> items;
  for (int64_t i = items.next(sm); i < pg.items; i = items.next(sm)) load_item(i);
}

// ---- consumers ---------------------------------------------------------------------------


// Called after a wgmma.wait_group, which the whole warp executes together: the wgmmas that read
// the slot are complete for every lane, so one elected lane releases it (elect.sync: no
// divergent branch around the arrive).
template <class Cfg>
__device__ __forceinline__ void release_activations(const prefill_smem<Cfg>& sm, int slot) {
  if (cute::elect_one_sync()) detail::arrive(sm.b_empty(slot));
}

// The four wgmma m64nNk16 of one K-step (k16 steps j = 0..3 of the slot's 64 k), N = 16·n16:
// acc[0, N/2) accumulate, the rest of acc is not touched. `desc` describes the slot; k16 step j
// starts 32 bytes further, i.e. 2 j more in the descriptor's start-address field (16-byte units,
// bits 0..13: shared addresses stay below 2^18, so adding 6 never carries out of it).
// The fence and the commit sit in the same branch as the wgmmas (else ptxas injects fences).
template <int N>
__device__ __forceinline__ void wgmma_kstep(const uint32_t (&a)[4][4], uint64_t desc, float* acc) {
  cute::warpgroup_arrive();
#pragma unroll
  for (int j = 0; j < 4; ++j)
    detail::wgmma_call<N>(a[j], desc + 2 * j, acc, std::make_index_sequence<N / 2>{});
  cute::warpgroup_commit_batch();
}
// The instruction for widths LO..HI (in N_STEP units) picked by bisection: about log2(WIDTHS)
// uniform branches per K-step instead of one test per width.
template <class Cfg, int LO, int HI>
__device__ __forceinline__ void wgmma_kstep(int n16, const uint32_t (&a)[4][4], uint64_t desc, float* acc) {
  if constexpr (LO == HI) {
    wgmma_kstep<LO * Cfg::N_STEP>(a, desc, acc);
  } else {
    constexpr int MID = (LO + HI) / 2;
    if (n16 <= MID)
      wgmma_kstep<Cfg, LO, MID>(n16, a, desc, acc);
    else
      wgmma_kstep<Cfg, MID + 1, HI>(n16, a, desc, acc);
  }
}

// One K-step of a warpgroup on the activation slot, then a wait until only these wgmmas are in
// flight: the previous step's are complete, so its A registers may be overwritten and, at a
// slot's first K-step (sub 0), the slot before is released (unless it is the previous item's:
// `release_previous`). The ring advances after a slot's last K-step (sub = B_KSTEPS - 1). `sub` is
// a constant of the unrolled K-step loop. All widths share the accumulators, and ptxas pipelines
// the wgmmas.
template <class Cfg>
__device__ __forceinline__ void mma_kstep(const prefill_smem<Cfg>& sm, int n16, int sub, uint32_t (&a)[4][4],
                                          float (&acc)[Cfg::NMAX / 2], detail::ring_pos<Cfg::B_STAGES>& b,
                                          bool release_previous) {
  if (sub == 0) detail::wait_full(sm.b_full(b.slot), b.phase);
#pragma unroll
  for (int i = 0; i < Cfg::NMAX / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) cute::warpgroup_fence_operand(a[j][r]);
  wgmma_kstep<Cfg, 1, Cfg::WIDTHS>(n16, a, sm.b_desc(b.slot, sub), acc);
  cute::warpgroup_wait<1>();
#pragma unroll
  for (int i = 0; i < Cfg::NMAX / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
  if (sub == 0 && release_previous) release_activations(sm, b.slot == 0 ? Cfg::B_STAGES - 1 : b.slot - 1);
  if (sub == Cfg::B_KSTEPS - 1) b.advance();
}

// A warp's share of a weight stage: 16 code bytes and 4 scale bytes per K-step.
template <class Cfg>
__device__ __forceinline__ const uint8_t* fragment_codes(const prefill_smem<Cfg>& sm, int slot, int local_tile,
                                                         int kstep) {
  return sm.a_slot(slot) + (local_tile * Cfg::A_KSTEPS + kstep) * Cfg::TILE_CODES + (threadIdx.x & 31) * 16;
}
template <class Cfg>
__device__ __forceinline__ const uint8_t* fragment_scales(const prefill_smem<Cfg>& sm, int slot, int local_tile,
                                                          int kstep) {
  return sm.a_slot(slot) + Cfg::A_CODE_BYTES + (local_tile * Cfg::A_KSTEPS + kstep) * Cfg::TILE_SCALES +
         ((threadIdx.x & 31) >> 2) * 4;
}

// Named barrier h (h = 1 .. G-1): warpgroup 0's 128 threads arrive once they issued h * STAGGER
// K-steps of their first item, warpgroup h's 128 wait for it before their first item. Nothing
// re-synchronizes the warpgroups after that: they share the rings but wait only for the loaders.
constexpr uint32_t kStaggerThreads = 256;
template <class Cfg>
__device__ __forceinline__ void stagger_release(int issued_before, int issued_after) {
#pragma unroll
  for (int h = 1; h < Cfg::CONSUMER_GROUPS; ++h)
    if (issued_before < h * Cfg::STAGGER && issued_after >= h * Cfg::STAGGER)
      cutlass::arch::NamedBarrier::arrive(kStaggerThreads, h);
}

// A warp past the matrix's last row tile (a partial last row block) keeps zero A registers: its
// rows are computed and dropped. (Converting whatever its slot rows hold instead, without the
// test, made ptxas serialize every wgmma: C7513, "non wgmma instructions defining input
// registers".)
template <class Cfg, bool kScalesInRange>
__device__ void consume_item(const prefill_smem<Cfg>& sm, const prefill_grid& pg, int64_t item, int n16,
                             const gemm_weights& w, const moe_workspace& ws, epilogue_kind ep,
                             const activation_config& act, detail::ring_pos<Cfg::A_STAGES>& a_pos,
                             detail::ring_pos<Cfg::B_STAGES>& b_pos, bool releases_stagger) {
  const int ksteps = pg.ksteps;
  const int local_tile = warp_index();  // warp q of warpgroup h: row tile 4h + q of the block
  float acc[Cfg::NMAX / 2];
#pragma unroll
  for (int i = 0; i < Cfg::NMAX / 2; ++i) acc[i] = 0.0f;
  uint32_t a[2][4][4] = {};  // the K-step being converted, and the previous one's in flight
  // A warp's fragment share of a K-step: two in registers at a time (the one being converted and
  // the next), read two K-steps ahead; K-steps past K are zeros in the slot (read, not used).
  uint4 codes[2] = {};
  uint32_t scales[2] = {};
  const bool rows_valid = local_tile < warp_uniform(prefill_item_at<Cfg::ROW_TILES>(ws, pg, item).row_tiles);
  const auto read_fragment = [&](int slot, int j) {
    if (!rows_valid) return;
    codes[j & 1] = *reinterpret_cast<const uint4*>(fragment_codes(sm, slot, local_tile, j));
    scales[j & 1] = *reinterpret_cast<const uint32_t*>(fragment_scales(sm, slot, local_tile, j));
  };
  // Weights whose scales need the per-fragment test (a branch per K-step): one stage per pass, as
  // before the unrolling, which there made ptxas fold the K-steps into the item loop (SASS).
  constexpr int kLoopKsteps = kScalesInRange ? Cfg::LOOP_KSTEPS : Cfg::A_KSTEPS;
  for (int ks0 = 0; ks0 < ksteps; ks0 += kLoopKsteps) {
#pragma unroll
    for (int u = 0; u < kLoopKsteps; u += Cfg::A_KSTEPS) {
      const int ks = ks0 + u;
      if (ks >= ksteps) break;  // the loader sends no stage past K
      detail::wait_full(sm.a_full(a_pos.slot), a_pos.phase);
      read_fragment(a_pos.slot, 0);
      read_fragment(a_pos.slot, 1);
#pragma unroll
      for (int j = 0; j < Cfg::A_KSTEPS; ++j) {
        const bool live = ks + j < ksteps;
        uint32_t(&aj)[4][4] = a[j & 1];  // stages hold an even number of K-steps
        if (live && rows_valid) detail::dequant_fragment<kScalesInRange>(codes[j & 1], scales[j & 1], aj);
        if (j + 2 < Cfg::A_KSTEPS) read_fragment(a_pos.slot, j + 2);
        if (j + 3 == Cfg::A_KSTEPS) {  // the stage's last read is issued: release the slot
          detail::fence_reads_before_copies();
          __syncwarp();
          if (cute::elect_one_sync()) detail::arrive(sm.a_empty(a_pos.slot));
          a_pos.advance();
        }
        if (live) mma_kstep<Cfg>(sm, n16, j % Cfg::B_KSTEPS, aj, acc, b_pos, ks + j >= Cfg::B_KSTEPS);
        if (releases_stagger && live) stagger_release<Cfg>(ks + j, ks + j + 1);
      }
    }
  }
  if (releases_stagger) stagger_release<Cfg>(ksteps, 1 << 30);  // an item shorter than the stagger
  // The epilogue's loads overlap the last K-step's wgmmas.
  const prefill_item it = prefill_item_at<Cfg::ROW_TILES>(ws, pg, item);
  const prefill_epilogue_inputs inputs = load_prefill_epilogue_inputs(it, local_tile, w);
  cute::warpgroup_wait<0>();
#pragma unroll
  for (int i = 0; i < Cfg::NMAX / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
  // The last K-step's slot: the one before if the ring advanced after it, else the current one
  // (K-steps not a multiple of the slot's), which is then left.
  if (Cfg::B_KSTEPS > 1 && ksteps % Cfg::B_KSTEPS != 0) {
    release_activations(sm, b_pos.slot);
    b_pos.advance();
  } else {
    release_activations(sm, b_pos.slot == 0 ? Cfg::B_STAGES - 1 : b_pos.slot - 1);
  }
  store_prefill_item<Cfg::NMAX>(acc, inputs, it, local_tile, w, ws, ep, act, sm.epilogue_stage(local_tile));
}

// A warpgroup whose 64 rows are all past the matrix (the last row block of a matrix with
// row_tiles % 12 <= 8) only keeps the rings' arrival counts.
template <class Cfg>
__device__ void skip_item(const prefill_smem<Cfg>& sm, int ksteps, detail::ring_pos<Cfg::A_STAGES>& a_pos,
                          detail::ring_pos<Cfg::B_STAGES>& b_pos) {
  const bool leader = (threadIdx.x & 31) == 0;
  for (int ks = 0; ks < ksteps; ++ks) {
    if (ks % Cfg::A_KSTEPS == 0) {
      detail::wait_full(sm.a_full(a_pos.slot), a_pos.phase);
      if (leader) detail::arrive(sm.a_empty(a_pos.slot));
      a_pos.advance();
    }
    if (ks % Cfg::B_KSTEPS == 0) {
      detail::wait_full(sm.b_full(b_pos.slot), b_pos.phase);
      if (leader) detail::arrive(sm.b_empty(b_pos.slot));
      b_pos.advance();
    }
  }
}

template <class Cfg, bool kScalesInRange>
__device__ void consume(const prefill_smem<Cfg>& sm, const gemm_weights& w, const moe_workspace& ws,
                        epilogue_kind ep, const activation_config& act, const prefill_grid& pg) {
  detail::ring_pos<Cfg::A_STAGES> a_pos;
  detail::ring_pos<Cfg::B_STAGES> b_pos;
  const int first_tile_of_group = warp_index() & ~3;
  const int group = first_tile_of_group >> 2;
  // releases_stagger: the CTA's first item, in warpgroup 0 (which never skips an item).
  auto run_item = [&](int64_t i, bool releases_stagger) {
    const prefill_item it = prefill_item_at<Cfg::ROW_TILES>(ws, pg, i);
    if (first_tile_of_group >= warp_uniform(it.row_tiles)) {
      skip_item<Cfg>(sm, pg.ksteps, a_pos, b_pos);
      return;
    }
    const int n16 = warp_uniform((it.count + Cfg::N_STEP - 1) / Cfg::N_STEP);
    consume_item<Cfg, kScalesInRange>(sm, pg, i, n16, w, ws, ep, act, a_pos, b_pos, releases_stagger);
  };
  // Only a CTA that gets an item waits for warpgroup 0's stagger arrivals: it may get none (the
  // grid is sized for the most tiles the routing can make, and others may take them first).
  item_reader<Cfg, true> items;
  for (int64_t i = items.next(sm); i < pg.items; i = items.next(sm)) {
    const bool first = items.read == 1;
    if (first && group > 0) cutlass::arch::NamedBarrier::sync(kStaggerThreads, group);
    run_item(i, first && group == 0);
  }
}

// ---- kernel and launch -------------------------------------------------------------------

// kScalesInRange: gemm_weights::scales_in_range (the dequantization's per-fragment test of the
// scale bytes left out, as in the decode GEMM).
template <class Cfg, bool kScalesInRange>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
    moe_gemm_prefill_kernel(const __grid_constant__ prefill_maps<Cfg::WIDTHS> maps, gemm_weights w,
                            moe_workspace ws, epilogue_kind ep, activation_config act) {
  extern __shared__ uint8_t smem_raw[];
  // Aligned by offsetting smem_raw itself, so that the compiler still sees shared memory (LDS,
  // not generic loads, for the fragments).
  const uint32_t misalign = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023u;
  uint8_t* const base = smem_raw + ((1024u - misalign) & 1023u);
  // Broadcast from lane 0, the descriptor is a value ptxas keeps in uniform registers; computed
  // from `base` where it is used, it cost 4 uniform instructions per K-step (SASS).
  const uint64_t b_desc0 = detail::sw128_desc(base);
  const prefill_smem<Cfg> sm{base, (static_cast<uint64_t>(static_cast<uint32_t>(warp_uniform(static_cast<int>(b_desc0 >> 32)))) << 32) |
                                       static_cast<uint32_t>(warp_uniform(static_cast<int>(b_desc0)))};
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int s = 0; s < Cfg::A_STAGES; ++s) {
      detail::barrier_init(sm.a_full(s), 1);
      detail::barrier_init(sm.a_empty(s), Cfg::CONSUMER_WARPS);
    }
    for (int s = 0; s < Cfg::B_STAGES; ++s) {
      detail::barrier_init(sm.b_full(s), 1);
      detail::barrier_init(sm.b_empty(s), Cfg::CONSUMER_WARPS);
    }
    for (int s = 0; s < Cfg::ITEM_SLOTS; ++s) {
      detail::barrier_init(sm.item_full(s), 1);
      detail::barrier_init(sm.item_empty(s), kItemReaders(Cfg::CONSUMER_WARPS));
    }
    detail::barrier_init_fence();
  }
  __syncthreads();
  // Programmatic dependent launch (pdl.cuh): the tile list, the B rows and the outputs belong to
  // the kernels before; nothing global is touched before this.
  detail::wait_for_previous_grid();
  detail::allow_dependent_launch();
  const prefill_grid pg = make_prefill_grid<Cfg::ROW_TILES>(w, ws);
  // setmaxnreg is executed by every warp of a warpgroup, before any of them leaves.
  if (warp >= Cfg::CONSUMER_WARPS) {
    cutlass::arch::warpgroup_reg_dealloc<Cfg::PRODUCER_REGISTERS>();
    if (warp == Cfg::WEIGHT_WARP) {
      if (lane == 0) {
        cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&maps.codes));
        cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&maps.scales));
        load_weights<Cfg>(sm, maps, ws, pg, ws.item_counters + (ep == epilogue_kind::gate_up_activation ? 0 : 1));
      }
    } else if (warp == Cfg::ACTIVATION_WARP) {
      if (lane < Cfg::WIDTHS)
        cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&maps.rows[lane]));
      __syncwarp();
      if (lane == 0) load_activations<Cfg>(sm, maps, ws, pg);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Cfg::CONSUMER_REGISTERS>();
    consume<Cfg, kScalesInRange>(sm, w, ws, ep, act, pg);
  }
}

// Outside any stream capture (moe_layer's constructor): more than 48 KB of shared memory.
template <class Cfg>
cudaError_t allow_prefill_smem() {
  cudaError_t e = cudaFuncSetAttribute(moe_gemm_prefill_kernel<Cfg, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       Cfg::SMEM_BYTES);
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(moe_gemm_prefill_kernel<Cfg, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             Cfg::SMEM_BYTES);
  return e;
}

// One persistent CTA per SM, never more than the work items the schedule can make.
template <class Cfg>
void launch_gemm_prefill_with(const gemm_launch& l, const gemm_weights& w, const prefill_maps<Cfg::WIDTHS>& maps,
                              const moe_workspace& ws, epilogue_kind ep, const activation_config& act, int sms,
                              cudaStream_t stream) {
  const layout::sm90_fragment frag{w.rows, w.cols};
  const int64_t items = l.max_tiles * layout::ceil_div(frag.row_tiles(), Cfg::ROW_TILES);
  const unsigned grid = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(sms, items)));
  auto* kernel = w.scales_in_range ? moe_gemm_prefill_kernel<Cfg, true> : moe_gemm_prefill_kernel<Cfg, false>;
  launch_pdl(kernel, dim3(grid), dim3(Cfg::THREADS), Cfg::SMEM_BYTES, stream, l.dependent, maps,
             w, ws, ep, act);
}

}  // namespace mxmoe::cuda::sm90
