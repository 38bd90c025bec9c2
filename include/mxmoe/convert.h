// mxmoe/convert.h — checkpoint conversion: a BF16 MoE checkpoint (safetensors) to MXFP4 in the
// gpt-oss layout, and back. The first step of the road checkpoint -> convert -> prepare ->
// forward -> verify (docs/architecture.md); `mxmoe quantize` and `mxmoe dequantize` call it.
//
// Both directions stream: tensors are copied in 64 MiB pieces from the memory-mapped input and
// expert weights are converted one expert at a time, so memory stays at about one expert's
// weights (in their own element type) plus its packed output, whatever the checkpoint size.
// Everything is validated first (MoE layers found, H and I multiples of 32, the device usable, the
// output absent unless `overwrite`), before the output is created. The output is written to a
// temporary file next to it and renamed into place when complete (safetensors_writer): a failure
// never leaves a half-written file and never touches an existing output.
//
// The library prints nothing: progress goes to the optional callback.
// Errors: mxmoe::invalid_argument (bad input: no MoE layer, wrong layout, output exists),
// mxmoe::format_error (a malformed file), mxmoe::unsupported (device cuda without a usable GPU),
// std::system_error (I/O).
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
};
using progress_callback = std::function<void(const convert_progress&)>;

struct quantize_options {
  mx::scale_rule rule = mx::scale_rule::even;
  // Where the quantizer runs. cuda: the current device; each expert's weights are uploaded in
  // their own element type (bf16 stays bf16) and quantized there. The output bytes are the same
  // on both devices, for every rule.
  device_kind device = device_kind::cpu;
  bool overwrite = false;         // replace an existing output
  progress_callback on_progress;  // optional; called after every step
  bool allow_nonfinite = false;
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
};

// BF16 MoE checkpoint `in` -> MXFP4 checkpoint `out`. Every MoE layer (checkpoint::find_moe_layers:
// gpt-oss fused or Qwen3/DeepSeek per-expert names; BF16, F16 or F32 weights) becomes the gpt-oss
// MXFP4 layout (gate/up rows interleaved), quantized with options.rule; every other tensor is
// copied unchanged under its name. The metadata keeps the input's and adds "mxmoe.scale_rule" and
// "mxmoe.moe_config" (checkpoint::layer_config of the first layer).
quantize_report quantize_checkpoint(const std::string& in, const std::string& out, const quantize_options& options);

struct dequantize_options {
  bool overwrite = false;         // replace an existing output
  progress_callback on_progress;  // optional; called after every step
};

// MXFP4 checkpoint `in` -> BF16 checkpoint `out` in the gpt-oss BF16 layout (layout::checkpoint_xw:
// gate_up_proj [E, H, 2I], down_proj [E, I, H]); other tensors copied. MXFP4 values are exact in
// bf16: nothing is lost.
void dequantize_checkpoint(const std::string& in, const std::string& out, const dequantize_options& options);

}  // namespace mxmoe
