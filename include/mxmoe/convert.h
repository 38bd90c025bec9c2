// mxmoe/convert.h — checkpoint conversion: a BF16 MoE checkpoint (safetensors) to MXFP4 in the
// gpt-oss layout, and back. The first step of the road checkpoint -> convert -> prepare ->
// forward -> verify (docs/architecture.md); `mxmoe quantize` and `mxmoe dequantize` call it.
//
// quantize_checkpoint works on expert matrices (one expert's gate_up or down), read from the file
// with pread into reusable buffers (so the input's pages never pile up in the process's memory,
// whatever the file size), reordered into the quantizer's row-major [N, K] and quantized:
//   cpu:  a pool of worker threads, each taking the next matrix, reordering and quantizing it
//         single-threaded in bands of rows that stay in cache, and writing it; as many workers
//         as cores, fewer when their buffers (about 1.3x the largest matrix each: the bytes read,
//         one band, the codes and scales) would pass 1.5 GiB (16 workers on gpt-oss shapes take
//         0.7 GB);
//   cuda: a pipeline of 3 slots: the calling thread reads a matrix into pinned memory (with 3
//         more threads, in 4 MiB pieces) and submits it (upload, transposition / gate-up
//         interleave and quantization on the GPU, download: cuda::matrix_pipeline) while a
//         second thread writes finished slots.
// The output bytes are the same on both devices and for any number of workers (the statistics too
// on one device: each matrix's are merged in file order). Other tensors are copied in 64 MiB
// pieces, also by pread. dequantize_checkpoint reads one expert matrix at a time by pread too.
//
// Everything is validated first (MoE layers found, H and I multiples of 32, the device usable, the
// output absent unless `overwrite`), before the output is created. The output is written to an
// unnamed temporary file next to it and linked into place when complete (safetensors_writer): a
// failure, or a killed process, never leaves a half-written file or a temporary, and never touches
// an existing output.
//
// NaN / Inf weights are refused unless allow_nonfinite: mxmoe::nonfinite_error naming the tensor
// as the file names it, the expert, and the first non-finite element (in file order) as [row, col]
// of that expert's matrix in the file (gpt-oss gate_up_proj[e]: [h, c] of [H, 2I]; Qwen3/DeepSeek
// experts.E.up_proj.weight: [i, h] of [I, H]); nothing is written.
//
// The library prints nothing: progress goes to the optional callback, called from the library's
// threads but one call at a time, in step order.
// Errors: mxmoe::invalid_argument (bad input: no MoE layer, wrong layout, output exists),
// mxmoe::nonfinite_error (NaN / Inf weights), mxmoe::format_error (a malformed file),
// mxmoe::unsupported (device cuda without a usable GPU), std::system_error (I/O).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mxmoe/dtype.h"
#include "mxmoe/mx.h"
#include "mxmoe/quantize.h"

namespace mxmoe {

// Where a conversion is: `done` of `total` steps (one per copied tensor, one per converted expert).
struct convert_progress {
  int64_t done = 0, total = 0;
  std::string note;  // the tensor just copied, or "layer L expert E"
  uint64_t bytes_done = 0, bytes_total = 0;  // input tensor bytes behind the steps done, and all of them
};
using progress_callback = std::function<void(const convert_progress&)>;

struct quantize_options {
  mx::scale_rule rule = mx::scale_rule::even;
  // Where the quantizer runs. cuda: the current device; weights are uploaded in their own element
  // type (bf16 stays bf16) and reordered and quantized there. The output bytes are the same on
  // both devices, for every rule.
  device_kind device = device_kind::cpu;
  bool overwrite = false;         // replace an existing output
  progress_callback on_progress;  // optional; called after every step
  // Keep NaN / Inf weights: their blocks get scale 0xFF (NaN) and are counted in
  // quant_stats::nonfinite_blocks. false: refused with mxmoe::nonfinite_error.
  bool allow_nonfinite = false;
  int threads = 0;  // cpu workers; 0: one per core (capped by memory, see above)
};

struct tensor_report {
  std::string name;            // the MXFP4 blocks tensor written ("...experts.gate_up_proj_blocks")
  std::vector<int64_t> shape;  // its shape, [E, N, K/32, 16]
  quant_stats stats;           // over all its experts
};

struct quantize_report {
  std::vector<tensor_report> tensors;  // gate_up and down of every MoE layer, in layer order
  quant_stats total;                   // all of them merged
  int64_t copied_tensors = 0;          // tensors copied unchanged (router, biases, attention, ...)
  uint64_t copied_bytes = 0;
  uint64_t input_bytes = 0, output_bytes = 0;  // tensor data, headers excluded
  double seconds = 0;                          // wall time of the whole conversion
  int workers = 0;  // threads that quantized (cpu), or pipeline slots (cuda)
  double input_gb_per_s() const { return seconds > 0 ? static_cast<double>(input_bytes) / seconds / 1e9 : 0.0; }
};

// BF16 MoE checkpoint `in` -> MXFP4 checkpoint `out`. Every MoE layer (checkpoint::find_moe_layers:
// gpt-oss fused or Qwen3/DeepSeek per-expert names; BF16, F16 or F32 weights) becomes the gpt-oss
// MXFP4 layout (gate/up rows interleaved), quantized with options.rule; every other tensor is
// copied unchanged under its name. The metadata keeps the input's and adds "mxmoe.scale_rule" and
// "mxmoe.moe_config" (checkpoint::layer_config of the first layer). Progress: one step per copied
// tensor, one per converted expert (both its matrices), `done` ending at `total`.
quantize_report quantize_checkpoint(const std::string& in, const std::string& out, const quantize_options& options);

struct dequantize_options {
  bool overwrite = false;         // replace an existing output
  progress_callback on_progress;  // optional; called after every step
};

// MXFP4 checkpoint `in` -> BF16 checkpoint `out` in the gpt-oss BF16 layout (layout::checkpoint_xw:
// gate_up_proj [E, H, 2I], down_proj [E, I, H]); other tensors copied. MXFP4 values are exact in
// bf16: nothing is lost. The metadata keeps the input's without "mxmoe.scale_rule" (it describes
// MXFP4 content only); "mxmoe.moe_config" stays (routing and activation hold for the BF16 layer
// too, and its gate_up order is the gpt-oss interleaved one this layout keeps).
void dequantize_checkpoint(const std::string& in, const std::string& out, const dequantize_options& options);

}  // namespace mxmoe
