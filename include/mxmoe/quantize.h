// mxmoe/quantize.h — quantize and dequantize tensors to / from MXFP4 along the last dimension.
//
// x: [..., rows, K] bf16 | f16 | f32, K a multiple of 32, the last dimension contiguous (other
//    dimensions may have any stride: a row stride is fine).
// packed: u8 [..., rows, K/2] contiguous (element 2j in the low nibble).
// scales: u8, contiguous; scale_layout::linear: [..., rows, K/32];
//         scale_layout::tiled_128x4: [..., layout::scale_tiled_128x4{rows, K/32}.size()]
//         (one tiled matrix per leading index; padding written as 0).
// The views' device (cpu or cuda) picks the backend; mixing devices is an error. Every argument
// is validated before anything is written.
#pragma once

#include <cstdint>

#include "mxmoe/dtype.h"
#include "mxmoe/mx.h"

namespace mxmoe {

enum class scale_layout : uint8_t { linear, tiled_128x4 };

inline const char* to_string(scale_layout l) {
  return l == scale_layout::tiled_128x4 ? "tiled_128x4" : "linear";
}

struct quant_stats {
  int64_t elements = 0;
  int64_t blocks = 0;
  int64_t saturated_blocks = 0;   // blocks with at least one element clamped to +-6
  int64_t clamped_elements = 0;   // |x / scale| > 6
  int64_t flushed_elements = 0;   // x != 0 that became +-0
  int64_t nonfinite_blocks = 0;   // blocks holding NaN/Inf (scale 0xFF)
  double signal_sq = 0.0;         // sum x^2 over finite blocks
  double error_sq = 0.0;          // sum (x - dequant(x))^2 over finite blocks
  double sqnr_db() const;         // 10 log10(signal / error); +inf when error is 0
  void merge(const quant_stats& o);
};

// The role of the values tensor in an (values, packed, scales) triple, which fixes its checks and
// its name in messages:
//   quantize_input     "x":   bf16 | f16 | f32, last dimension contiguous, rows may be strided;
//   dequantize_output  "out": bf16 | f32, contiguous (written by several threads).
enum class mx_values : uint8_t { quantize_input, dequantize_output };

// Checks shapes and dtypes of a (x | out, packed, scales) triple; throws mxmoe::invalid_argument.
// Devices are not checked here.
void validate_mx_tensor(const tensor_view& values, const tensor_view& packed, const tensor_view& scales,
                        scale_layout layout, mx_values role);

quant_stats quantize(const tensor_view& x, mx::scale_rule rule, scale_layout layout,
                     const tensor_view& packed, const tensor_view& scales);

// out: bf16 | f32 [..., rows, K], contiguous.
void dequantize(const tensor_view& packed, const tensor_view& scales, scale_layout layout,
                const tensor_view& out);

namespace cpu {
// The CPU implementations (multithreaded; `threads` 0 = hardware concurrency).
quant_stats quantize(const tensor_view& x, mx::scale_rule rule, scale_layout layout,
                     const tensor_view& packed, const tensor_view& scales, int threads = 0);
void dequantize(const tensor_view& packed, const tensor_view& scales, scale_layout layout,
                const tensor_view& out, int threads = 0);

// Rows of a [rows, K] matrix whose statistics cpu::quantize sums before merging them, in order,
// into the result: quantizing a matrix in bands of exactly this many rows (the last may be
// shorter), merging the bands' statistics in order, gives the bytes and the statistics of one
// call on the whole matrix. Depends on K only.
int64_t quantize_chunk_rows(int64_t k);

// One block as cpu::quantize does it: mx::quantize_block's scale byte and 16 packed codes, and
// the block's statistics added to `st` (the sums in element order, as quant_stats documents).
void quantize_block_with_stats(const float* x, mx::scale_rule rule, uint8_t* scale, uint8_t* packed,
                               quant_stats& st);
// The two paths it picks between (exposed for the tests that hold them equal bit for bit).
// fast: a finite block whose scale byte is at most 253 (for mse: whose floor byte is at most 252,
// so that every candidate is), where 2^(127 - scale) is one normal float and every element takes
// the same operations, written so that the compiler vectorizes them; returns false, having
// written nothing, for any other block. general: mx::quantize_block, then the statistics element
// by element.
bool quantize_block_fast(const float* x, mx::scale_rule rule, uint8_t* scale, uint8_t* packed, quant_stats& st);
void quantize_block_general(const float* x, mx::scale_rule rule, uint8_t* scale, uint8_t* packed,
                            quant_stats& st);
}  // namespace cpu

}  // namespace mxmoe
