// quantize/kernels.cuh — the quantize and dequantize kernels (fast and reference), the statistics
// reduction kernel and the tiled-scale padding: they assume what launcher.cu has validated.
// Internal to src/cuda/quantize (included by launcher.cu only).
#pragma once

#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "addressing.cuh"
#include "encoders.cuh"
#include "mse.cuh"
#include "mxmoe/dtype.h"
#include "mxmoe/layout.h"
#include "mxmoe/mx.h"
#include "mxmoe/quantize.h"
#include "statistics.cuh"

namespace mxmoe::cuda::quant {

using mx::scale_rule;

// Programmatic dependent launch: the next kernel in the stream may be scheduled from here on (it
// still waits for this grid to complete before touching memory, see wait_for_previous_grid).
__device__ __forceinline__ void allow_dependent_launch() { asm volatile("griddepcontrol.launch_dependents;"); }

// The quantize kernels are launched as programmatic dependents of whatever precedes them in the
// stream, so that their CTAs are resident when it ends: before any memory access they wait for that
// grid to complete and its writes to be visible (immediately when it was not a programmatic launch).
__device__ __forceinline__ void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// One CTA: thread t sums partials t, t + kThreads, ... in that order, then cta_sum combines the
// threads: the order of every double addition depends only on `count`, so identical calls give
// identical statistics. Launched as a programmatic dependent of the quantize kernel (see
// launch_finalize): it may start while the quantize kernel drains, and waits for it to complete
// before reading the partials.
__global__ void __launch_bounds__(kThreads) finalize_stats(const stats_partial* partials, int count, int64_t blocks,
                                                           quant_stats* out) {
  wait_for_previous_grid();
  allow_dependent_launch();
  stats_partial mine{0, 0, 0, 0, 0.0, 0.0};
  for (int i = threadIdx.x; i < count; i += kThreads) add_partial(mine, partials[i]);
  const stats_partial t = cta_sum(mine);
  if (threadIdx.x != 0) return;
  out->elements = blocks * mx::kBlockSize;
  out->blocks = blocks;
  out->saturated_blocks = static_cast<int64_t>(t.saturated);
  out->clamped_elements = static_cast<int64_t>(t.clamped);
  out->flushed_elements = static_cast<int64_t>(t.flushed);
  out->nonfinite_blocks = static_cast<int64_t>(t.nonfinite);
  out->signal_sq = t.signal;
  out->error_sq = t.error;
}

// Tiled scale storage pads rows to 128 and columns to 4: those bytes get 0, like the CPU writes.
// Padding entries of one matrix are enumerated as the padded rows (all columns), then the padded
// columns of the real rows.
__device__ void zero_tiled_padding(const quant_params& p) {
  if (p.pad_entries == 0) return;
  const layout::scale_tiled_128x4& t = p.scale.tile;
  const int64_t pr = t.padded_rows(), pc = t.padded_cols();
  const int64_t per_matrix = pr * pc - t.rows * t.cols, row_pad = (pr - t.rows) * pc;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < p.pad_entries;
       i += int64_t{gridDim.x} * kThreads) {
    const int64_t b = i / per_matrix, j = i % per_matrix;
    int64_t m, k;
    if (j < row_pad) {
      m = t.rows + j / pc;
      k = j % pc;
    } else {
      m = (j - row_pad) / (pc - t.cols);
      k = t.cols + (j - row_pad) % (pc - t.cols);
    }
    p.scales[b * p.scale.matrix_bytes + t.offset(m, k)] = 0;
  }
}

// 16-byte chunk c of a warp tile sits at c ^ ((c >> 3) & (chunks per block - 1)) in shared memory:
// conflict-free both for the tile-order copies and for each thread reading its own block.
template <int kChunksPerBlock>
__device__ __forceinline__ int swizzle(int c) {
  return c ^ ((c >> 3) & (kChunksPerBlock - 1));
}

template <dtype D>
__device__ __forceinline__ void issue_tile_loads(const quant_params& p, int tile, uint4* stage) {
  constexpr int kChunksPerBlock = 32 * elem_bytes<D>() / 16;
  const int lane = threadIdx.x & 31;
  if (p.dense) {
    // The tile is one contiguous range: chunk c is at byte c * 16 of it.
    const uint8_t* base = p.x + int64_t{tile} * (32 * mx::kBlockSize * elem_bytes<D>());
    if (tile < (p.total_blocks >> 5)) {
      // A whole tile (every tile but a partial last one): no bounds checks, and copy i's addresses
      // are this lane's plus constants. Its chunk c = 32 i + lane goes to swizzle(c) = 32 i + (lane ^ t)
      // with t = (4 i + lane / 8) & (chunks per block - 1) = ((4 i) & (chunks - 1)) ^ ((lane / 8) & (chunks - 1))
      // (lane / 8 < 4 shares no bit with 4 i).
      const uint8_t* src = base + lane * 16;
      const int lane_sw = lane ^ ((lane >> 3) & (kChunksPerBlock - 1));
#pragma unroll
      for (int i = 0; i < kChunksPerBlock; ++i)
        __pipeline_memcpy_async(stage + 32 * i + (lane_sw ^ ((4 * i) & (kChunksPerBlock - 1))), src + i * 512, 16);
      return;
    }
#pragma unroll
    for (int i = 0; i < kChunksPerBlock; ++i) {
      const int c = i * 32 + lane;
      const bool valid = tile * 32 + c / kChunksPerBlock < p.total_blocks;
      __pipeline_memcpy_async(stage + swizzle<kChunksPerBlock>(c), valid ? base + c * 16 : p.x, 16, valid ? 0 : 16);
    }
    return;
  }
  const int g = tile * 32 + lane;
  int64_t src = -1;  // byte offset of this lane's block, -1 past the end
  if (g < p.total_blocks) {
    int row, kb;
    p.blocks_per_row(row, kb, g);
    src = (p.rows.offset(row) + int64_t{kb} * mx::kBlockSize) * elem_bytes<D>();
  }
#pragma unroll
  for (int i = 0; i < kChunksPerBlock; ++i) {
    const int c = i * 32 + lane;
    const int64_t s = __shfl_sync(kFullMask, src, c / kChunksPerBlock);
    const uint8_t* gp = s >= 0 ? p.x + s + (c % kChunksPerBlock) * 16 : p.x;
    __pipeline_memcpy_async(stage + swizzle<kChunksPerBlock>(c), gp, 16, s >= 0 ? 0 : 16);
  }
}

// CTAs per SM (occupancy as measured): 3 for 16-bit input (at most 80 registers), 2 for f32 and for
// the bf16 mse kernel (at most 128 registers: it carries three candidates' codes and sums through the
// block; compute-bound, so 16 warps per SM still cover the load latency many times over).
template <dtype D, scale_rule R>
constexpr int min_ctas_per_sm() {
  return D == dtype::f32 || (D == dtype::bf16 && R == scale_rule::mse) ? 2 : 3;
}

// kStats: the statistics are wanted (quantize_async with a quant_stats pointer); without them the
// counts and sums are not computed and no partials are written.
template <dtype D, scale_rule R, bool kStats>
__global__ void __launch_bounds__(kThreads, min_ctas_per_sm<D, R>()) quantize_fast(const quant_params p) {
  constexpr int kChunksPerBlock = 32 * elem_bytes<D>() / 16;
  constexpr int kTileChunks = 32 * kChunksPerBlock;
  extern __shared__ __align__(128) uint4 smem[];  // 128-byte aligned: the swizzle assumes it
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint4* stage0 = smem + (2 * warp) * kTileChunks;
  uint4* stage1 = stage0 + kTileChunks;

  wait_for_previous_grid();
  allow_dependent_launch();
  zero_tiled_padding(p);

  stats_acc acc;
  const int tiles = (p.total_blocks + 31) / 32;
  const int stride = gridDim.x * kWarpsPerCta;
  int tile = blockIdx.x * kWarpsPerCta + warp;
  // This lane's block: its chunk q sits at swizzle(lane * chunks + q) = block_chunk0 ^ q, because
  // lane * chunks has no bits below the chunk count and (lane * chunks + q) / 8 = lane * chunks / 8.
  const int block_chunk0 = lane * kChunksPerBlock + (((lane * kChunksPerBlock) >> 3) & (kChunksPerBlock - 1));
  if (tile < tiles) issue_tile_loads<D>(p, tile, stage0);
  __pipeline_commit();
  for (int it = 0; tile < tiles; tile += stride, ++it) {
    uint4* cur = (it & 1) ? stage1 : stage0;
    if (tile + stride < tiles) issue_tile_loads<D>(p, tile + stride, (it & 1) ? stage0 : stage1);
    __pipeline_commit();
    __pipeline_wait_prior(1);
    __syncwarp();

    const int g = tile * 32 + lane;
    if (g < p.total_blocks) {
      uint32_t w[kChunksPerBlock * 4];
#pragma unroll
      for (int q = 0; q < kChunksPerBlock; ++q) {
        const uint4 v = cur[block_chunk0 ^ q];
        w[4 * q] = v.x;
        w[4 * q + 1] = v.y;
        w[4 * q + 2] = v.z;
        w[4 * q + 3] = v.w;
      }
      uint32_t min_abs;
      const uint32_t amax = amax_bits<D>(w, min_abs);
      const bool has_zero = min_abs == 0;
      uint8_t scale;
      block_codes c{};
      float signal = 0.0f, error = 0.0f;  // in units of the scale
      bool encoded = false;
      if constexpr (R == scale_rule::mse && D == dtype::bf16)
        encoded = mse_encode_bf16<kStats>(w, amax, min_abs, scale, c, signal, error);
      if (!encoded) {
        if constexpr (R == scale_rule::mse) scale = mse_scale<D>(w, amax);
        else scale = mx::scale_from_amax(mx::bits_float(amax), R);
        if (scale != mx::kE8M0Nan) c = encode_block<D, R, kStats>(w, scale, signal, error);
      }
      uint4 out = make_uint4(0, 0, 0, 0);
      if (scale == mx::kE8M0Nan) {
        acc.nonfinite += 1;
      } else {
        out = c.packed;
        if constexpr (kStats) {
          acc.clamped += c.clamped;
          acc.saturated += c.clamped != 0 ? 1u : 0u;
          acc.flushed += mx::kBlockSize - c.nonzero - (has_zero ? count_zeros<D>(w) : 0);
          // unit^2 = 2^(2 (scale - 127)), a normal double for every byte <= 254, built from its exponent
          // bits. Multiplying by it is exact, so the fma rounds once, like the product-then-add it replaces.
          const double unit_sq = __hiloint2double((2 * static_cast<int>(scale) + 769) << 20, 0);
          acc.signal = fma(static_cast<double>(signal), unit_sq, acc.signal);
          acc.error = fma(static_cast<double>(error), unit_sq, acc.error);
        }
      }
      __stcs(reinterpret_cast<uint4*>(p.packed) + g, out);
      p.scales[p.scale.offset(g)] = scale;
    }
    __syncwarp();  // every lane has read `cur` before the next iteration refills it
  }
  if constexpr (kStats) store_cta_stats(acc, p.partials);
}

// ---- the reference quantize kernel ------------------------------------------------------------

template <dtype D>
__global__ void __launch_bounds__(kThreads) quantize_reference(const quant_params p) {
  wait_for_previous_grid();
  allow_dependent_launch();
  zero_tiled_padding(p);
  stats_acc acc;
  for (int g = blockIdx.x * kThreads + threadIdx.x; g < p.total_blocks; g += gridDim.x * kThreads) {
    int row, kb;
    p.blocks_per_row(row, kb, g);
    const uint8_t* src = p.x + (p.rows.offset(row) + int64_t{kb} * mx::kBlockSize) * elem_bytes<D>();
    float x[mx::kBlockSize];
    for (int i = 0; i < mx::kBlockSize; ++i) {
      if constexpr (D == dtype::f32) x[i] = reinterpret_cast<const float*>(src)[i];
      else if constexpr (D == dtype::bf16) x[i] = bf16_to_float(reinterpret_cast<const uint16_t*>(src)[i]);
      else x[i] = f16_to_float(reinterpret_cast<const uint16_t*>(src)[i]);
    }
    uint8_t scale, codes[mx::kPackedBlockBytes];
    const mx::block_stats st = mx::quantize_block(x, p.rule, &scale, codes);
    for (int j = 0; j < mx::kPackedBlockBytes; ++j) p.packed[int64_t{g} * mx::kPackedBlockBytes + j] = codes[j];
    p.scales[p.scale.offset(g)] = scale;
    if (st.nonfinite) {
      acc.nonfinite += 1;
      continue;
    }
    acc.clamped += st.clamped;
    acc.flushed += st.flushed;
    acc.saturated += st.clamped > 0 ? 1u : 0u;
    for (int i = 0; i < mx::kBlockSize; ++i) {
      const double v = x[i];
      const double e = v - static_cast<double>(mx::dequantize_value(mx::unpack_e2m1(codes[i >> 1], i), scale));
      acc.signal += v * v;
      acc.error += e * e;
    }
  }
  if (p.partials != nullptr) store_cta_stats(acc, p.partials);
}

// ---- dequantize ---------------------------------------------------------------------------------

// Element values of one block: e2m1(code) * 2^(scale-127) is exact for every code and scale byte
// (the smallest, 0.5 * 2^-127, is a float subnormal), so it equals mx::dequantize_value, which
// gets there in two steps for byte 0. Such a value has at most two significant bits, so its bf16
// is its float's upper half (what float_to_bf16 returns for it). Scale 0xFF: every element is the
// canonical NaN dequantize_value returns (bf16 0x7FC0, as float_to_bf16 converts it).
template <dtype D>
__device__ __forceinline__ void dequantize_words(uint4 codes, uint8_t scale, uint32_t* out) {
  constexpr int kWords = D == dtype::f32 ? 32 : 16;
  if (scale == mx::kE8M0Nan) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) out[i] = D == dtype::f32 ? 0x7FC00000u : 0x7FC07FC0u;
    return;
  }
  const uint32_t cw[4] = {codes.x, codes.y, codes.z, codes.w};
  const float s = mx::e8m0_to_float(scale);
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const uint8_t code = static_cast<uint8_t>((cw[i >> 3] >> (4 * (i & 7))) & 0xFu);
    const uint32_t v = mx::float_bits(mx::e2m1_to_float(code) * s);
    if constexpr (D == dtype::f32) out[i] = v;
    else out[i >> 1] = (i & 1) ? (out[i >> 1] | (v & 0xFFFF0000u)) : (v >> 16);
  }
}

template <dtype D>
__global__ void __launch_bounds__(kThreads) dequantize_fast(const dequant_params p) {
  constexpr int kChunksPerBlock = 32 * elem_bytes<D>() / 16;
  constexpr int kTileChunks = 32 * kChunksPerBlock;
  __shared__ __align__(128) uint4 smem[kWarpsPerCta * kTileChunks];  // 128-byte aligned: the swizzle assumes it
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint4* stage = smem + warp * kTileChunks;
  const int tiles = (p.total_blocks + 31) / 32;
  const int stride = gridDim.x * kWarpsPerCta;
  const uint4* packed = reinterpret_cast<const uint4*>(p.packed);
  uint4* out = reinterpret_cast<uint4*>(p.out);

  int tile = blockIdx.x * kWarpsPerCta + warp;
  uint4 codes = make_uint4(0, 0, 0, 0);
  uint8_t scale = 0;
  auto load = [&](int t, uint4& c, uint8_t& s) {
    const int g = t * 32 + lane;
    if (t < tiles && g < p.total_blocks) {
      c = __ldcs(packed + g);
      s = p.scales[p.scale.offset(g)];
    }
  };
  load(tile, codes, scale);
  for (; tile < tiles; tile += stride) {
    uint4 next_codes = make_uint4(0, 0, 0, 0);
    uint8_t next_scale = 0;
    load(tile + stride, next_codes, next_scale);

    uint32_t w[kChunksPerBlock * 4];
    dequantize_words<D>(codes, scale, w);
#pragma unroll
    for (int q = 0; q < kChunksPerBlock; ++q)
      stage[swizzle<kChunksPerBlock>(lane * kChunksPerBlock + q)] =
          make_uint4(w[4 * q], w[4 * q + 1], w[4 * q + 2], w[4 * q + 3]);
    __syncwarp();
#pragma unroll
    for (int i = 0; i < kChunksPerBlock; ++i) {
      const int c = i * 32 + lane;
      if (tile * 32 + c / kChunksPerBlock < p.total_blocks)
        __stcs(out + int64_t{tile} * kTileChunks + c, stage[swizzle<kChunksPerBlock>(c)]);
    }
    __syncwarp();  // the stage is rewritten next iteration
    codes = next_codes;
    scale = next_scale;
  }
}

template <dtype D>
__global__ void __launch_bounds__(kThreads) dequantize_reference(const dequant_params p) {
  for (int g = blockIdx.x * kThreads + threadIdx.x; g < p.total_blocks; g += gridDim.x * kThreads) {
    const uint8_t scale = p.scales[p.scale.offset(g)];
    const uint8_t* codes = p.packed + int64_t{g} * mx::kPackedBlockBytes;
    for (int i = 0; i < mx::kBlockSize; ++i) {
      const float v = mx::dequantize_value(mx::unpack_e2m1(codes[i >> 1], i), scale);
      const int64_t e = int64_t{g} * mx::kBlockSize + i;
      if constexpr (D == dtype::f32) reinterpret_cast<float*>(p.out)[e] = v;
      else reinterpret_cast<uint16_t*>(p.out)[e] = float_to_bf16(v);
    }
  }
}

}  // namespace mxmoe::cuda::quant
