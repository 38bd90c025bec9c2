// quantize/addressing.cuh — where the quantize and dequantize kernels find things: the launch
// constants, the row and scale-byte addressing of [..., rows, K] tensors and the kernel parameters.
// Internal to src/cuda/quantize (included by launcher.cu only).
#pragma once

#include <cutlass/fast_math.h>

#include <cstdint>

#include "mxmoe/dtype.h"
#include "mxmoe/layout.h"
#include "mxmoe/mx.h"

namespace mxmoe::cuda::quant {

using mx::scale_rule;

constexpr int kThreads = 256;
constexpr int kWarpsPerCta = kThreads / 32;
constexpr int kMaxLeadingDims = 4;
constexpr uint32_t kFullMask = 0xFFFFFFFFu;

template <dtype D>
constexpr int elem_bytes() {
  return D == dtype::f32 ? 4 : 2;
}


// Row r of a [..., rows, K] tensor (r flattened over all dimensions but the last) starts at element
// offset sum_d index_d(r) * stride_d. Dimensions are stored innermost first, with size-1 dimensions
// dropped and mergeable neighbours merged on the host: a contiguous tensor has one dimension.
struct row_map {
  int ndims = 1;
  cutlass::FastDivmod size[kMaxLeadingDims];
  int64_t stride[kMaxLeadingDims] = {};

  __device__ int64_t offset(int row) const {
    int64_t off = 0;
#pragma unroll
    for (int d = 0; d < kMaxLeadingDims - 1; ++d) {
      if (d + 1 >= ndims) break;
      int q, i;
      size[d](q, i, row);
      off += static_cast<int64_t>(i) * stride[d];
      row = q;
    }
    return off + static_cast<int64_t>(row) * stride[ndims - 1];
  }
};

// Byte offset of block g's scale (g = row * K/32 + kb over all rows).
struct scale_index {
  bool tiled = false;
  cutlass::FastDivmod blocks_per_row;  // K / 32
  cutlass::FastDivmod rows;            // rows per matrix (dim -2)
  layout::scale_tiled_128x4 tile;      // {rows, K/32}
  int64_t matrix_bytes = 0;            // tile.size()

  __device__ int64_t offset(int g) const {
    if (!tiled) return g;
    int row, kb, b, m;
    blocks_per_row(row, kb, g);
    rows(b, m, row);
    // m and kb are non-negative (g is): passed zero-extended so the compiler knows it and turns the
    // layout's signed divisions by 128, 32 and 4 into plain shifts and masks.
    return b * matrix_bytes + tile.offset(static_cast<uint32_t>(m), static_cast<uint32_t>(kb));
  }
};

struct stats_partial;  // statistics.cuh

struct quant_params {
  const uint8_t* x;
  uint8_t* packed;
  uint8_t* scales;
  int total_blocks;
  cutlass::FastDivmod blocks_per_row;
  row_map rows;
  scale_index scale;
  int64_t pad_entries;  // tiled padding bytes over all matrices (0 for linear)
  bool dense;           // block g starts at element g * 32 (rows back to back): no row arithmetic
  scale_rule rule;      // for the reference kernel (the fast ones are one per rule)
  stats_partial* partials;  // one per CTA; nullptr: no statistics wanted
};

struct dequant_params {
  const uint8_t* packed;
  const uint8_t* scales;
  uint8_t* out;
  int total_blocks;
  scale_index scale;
};

}  // namespace mxmoe::cuda::quant
