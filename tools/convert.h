// Checkpoint conversion behind `mxmoe quantize`, `mxmoe dequantize` and `mxmoe demo`: streamed
// tensor by tensor (expert weights one expert at a time), so memory stays at about one expert's
// float32 weights whatever the checkpoint size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli_common.h"
#include "mxmoe/quantize.h"

namespace mxmoe::cli {

struct tensor_report {
  std::string name;  // the MXFP4 blocks tensor
  std::vector<int64_t> shape;
  quant_stats stats;
};

struct quantize_report {
  std::vector<tensor_report> tensors;  // per quantized weight (gate_up and down of each layer)
  quant_stats total;
  int64_t copied_tensors = 0;
  uint64_t copied_bytes = 0;
  uint64_t input_bytes = 0, output_bytes = 0;
  double seconds = 0;
};

// BF16 MoE checkpoint -> MXFP4 checkpoint in the gpt-oss layout: every MoE layer's expert
// weights quantized with `rule` on `backend`, every other tensor copied; the MoE configuration
// recorded in the "mxmoe.moe_config" metadata. Validates everything (layers found, H and I
// multiples of 32, output absent unless `overwrite`) before creating the output.
quantize_report quantize_checkpoint(const std::string& in, const std::string& out, mx::scale_rule rule,
                                    const backend_choice& backend, bool overwrite, bool show_progress);

// MXFP4 checkpoint -> BF16 checkpoint in the gpt-oss BF16 layout (gate_up_proj [E, H, 2I],
// down_proj [E, I, H]); other tensors copied.
void dequantize_checkpoint(const std::string& in, const std::string& out, bool overwrite, bool show_progress);

// Quantizes one row-major f32 matrix [rows, K] on `device` into packed [rows, K/2] and linear
// scales [rows, K/32] (host memory).
quant_stats quantize_matrix(const float* x, int64_t rows, int64_t k, mx::scale_rule rule, device_kind device,
                            uint8_t* packed, uint8_t* scales);

}  // namespace mxmoe::cli
