// mxmoe/checkpoint.h — MoE layers in Hugging Face checkpoints: finding them by tensor name,
// reading them, and the names and shapes of the MXFP4 layout mxmoe writes.
//
// Layouts recognised (prefix P = "<anything>layers.{L}.mlp."):
//   mxfp4_gpt_oss    P experts.gate_up_proj_blocks u8 [E, 2I, H/32, 16], _scales u8 [E, 2I, H/32],
//                    P experts.down_proj_blocks u8 [E, H, I/32, 16], _scales u8 [E, H, I/32]
//                    (docs/formats.md; gate_up rows interleaved: even rows gate, odd rows up).
//   bf16_gpt_oss     P experts.gate_up_proj [E, H, 2I] (x·W form, gate/up interleaved columns),
//                    P experts.down_proj [E, I, H].
//   bf16_per_expert  Qwen3-MoE / DeepSeek: P experts.{e}.gate_proj.weight [I, H],
//                    .up_proj.weight [I, H], .down_proj.weight [H, I].
// Optional in every layout: P experts.gate_up_proj_bias [E, 2I] (interleaved like the rows) and
// P experts.down_proj_bias [E, H]; the router P router.weight [E, H] (gpt-oss) or P gate.weight
// (Qwen3/DeepSeek), P router.bias [E], P gate.e_score_correction_bias [E] (DeepSeek).
// BF16 here means any float type (bf16, f16, f32). Shared experts and everything else are not
// part of the layer and are left to the caller (quantize copies them).
//
// Expert weights are read one expert at a time in what quantization wants (read_expert): rows =
// output features, K = the input dimension, contiguous; the fused GEMM1 weight in gpt-oss
// (interleaved) row order, placed through layout::gate_up_rows.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mxmoe/moe.h"
#include "mxmoe/safetensors.h"

namespace mxmoe::checkpoint {

enum class moe_layout : uint8_t { mxfp4_gpt_oss, bf16_gpt_oss, bf16_per_expert };
const char* to_string(moe_layout l);

struct moe_layer_info {
  int64_t layer = 0;
  std::string prefix;  // "model.layers.{L}.mlp."
  moe_layout layout = moe_layout::mxfp4_gpt_oss;
  moe_shape shape;
  dtype weight_type = dtype::u8;  // element type of the expert weights
  std::string gate_up_bias, down_bias;  // tensor names; empty when absent
  std::string router_weight, router_bias, correction_bias;
  // The tensors holding expert weights (replaced when the layer is converted); biases and router
  // tensors are not among them.
  std::vector<std::string> expert_tensors;
};

// The layout of a layer in words with its own element type: "f16 (gpt-oss fused gate_up)",
// "mxfp4 (gpt-oss)" (the enum's "bf16" stands for any float type).
std::string layout_label(const moe_layer_info& info);

// Every MoE layer of the file, ordered by layer index. Throws format_error naming the tensor
// when a layer is incomplete or its shapes disagree.
std::vector<moe_layer_info> find_moe_layers(const safetensors_reader& file);
// The same, for a tool that must show what it can read (`mxmoe inspect`): the layers that are
// well-formed, and for each one that is not, the first problem found instead of an exception.
struct refused_layer {
  int64_t layer = 0;
  std::string prefix;
  std::string tensor;  // the tensor at fault, as the file names it
  std::string reason;  // the format_error's message
};
struct moe_layer_scan {
  std::vector<moe_layer_info> layers;
  std::vector<refused_layer> refused;
};
moe_layer_scan scan_moe_layers(const safetensors_reader& file);
// The layer with index `layer`; throws mxmoe::invalid_argument ("layer") listing what exists.
moe_layer_info find_moe_layer(const safetensors_reader& file, int64_t layer);

// Names of the gpt-oss MXFP4 tensors under `prefix`.
struct mxfp4_names {
  std::string gate_up_blocks, gate_up_scales, down_blocks, down_scales;
};
mxfp4_names mxfp4_tensor_names(const std::string& prefix);
// Names of the gpt-oss BF16 fused weights under `prefix`.
struct bf16_names {
  std::string gate_up, down;
};
bf16_names bf16_gpt_oss_tensor_names(const std::string& prefix);
// "model.layers.{L}.mlp."
std::string gpt_oss_prefix(int64_t layer);

// Declarations of the four MXFP4 tensors of a layer of `shape` (for safetensors_writer), and
// the storage geometry of each weight (use its offsets; never hand-write them).
std::vector<tensor_decl> mxfp4_layer_decls(const std::string& prefix, const moe_shape& shape);
layout::checkpoint_mxfp4 gate_up_geometry(const moe_shape& shape);  // [E, 2I, H]
layout::checkpoint_mxfp4 down_geometry(const moe_shape& shape);     // [E, H, I]
// The same weights in the gpt-oss BF16 layout: gate_up_proj [E, H, 2I], down_proj [E, I, H].
layout::checkpoint_xw gate_up_xw_geometry(const moe_shape& shape);
layout::checkpoint_xw down_xw_geometry(const moe_shape& shape);

// The configuration a layer's checkpoint implies: gate_up interleaved for the gpt-oss layouts,
// concatenated never (per-expert layers are converted to interleaved when written); routing and
// activation from the file's "mxmoe.moe_config" metadata when present, else the model family's
// defaults (gpt-oss: topk_softmax k=4, swiglu_clamped; with a correction bias: DeepSeek-V3
// grouped sigmoid k=8; otherwise Qwen3 softmax_topk k=8 renormalized, silu_mul), with top_k
// capped at E.
moe_config layer_config(const safetensors_reader& file, const moe_layer_info& info);
std::string config_to_json(const moe_config& cfg);
// Throws mxmoe::invalid_argument ("mxmoe.moe_config") on malformed text.
moe_config config_from_json(const std::string& text, const moe_shape& shape);

// MXFP4 layer -> weights in the checkpoint layout, views into the file's mapping (the router
// and biases included when present).
moe_weights mxfp4_weights(const safetensors_reader& file, const moe_layer_info& info);

// One expert of a BF16 layer, laid out for quantization and in the file's own element type
// (info.weight_type: bf16, f16 or f32; nothing is widened): gate_up [2I, H] in interleaved
// (gpt-oss) row order, placed through layout::gate_up_rows, and down [H, I], both row-major with
// rows = output features. Reads only that expert's bytes. The views point into `gate_up_buf` and
// `down_buf`, which are resized here and must outlive them. Throws mxmoe::invalid_argument for an
// MXFP4 layer or an expert outside [0, E).
struct expert_weights {
  tensor_view gate_up, down;
};
// read_expert in parts, for readers that fetch the bytes themselves (the converter reads them with
// pread into its own buffers, or uploads them to a GPU that reorders them): one expert matrix of a
// BF16 layer as the file stores it.
struct matrix_piece {
  const safetensors_entry* entry = nullptr;  // the tensor, as the file names it
  uint64_t offset = 0, bytes = 0;            // the expert's bytes within the tensor's data
  int64_t rows = 0, cols = 0;                // their shape there (gate_up_proj[e]: [H, 2I])
};
struct expert_matrix {
  dtype type = dtype::bf16;
  layout::matrix_source source;     // rows, cols: the quantizer's [N, K]
  std::vector<matrix_piece> pieces;  // read back to back, in this order
  uint64_t bytes() const;
};
// gate_up: the fused [2I, H] matrix (interleaved rows); otherwise down [H, I].
expert_matrix expert_matrix_of(const safetensors_reader& file, const moe_layer_info& info, int64_t expert, bool gate_up);
// The pieces' bytes (piece i at pieces[i]) -> row-major [rows, K] at `dst`, same element type.
void reorder_matrix(const expert_matrix& m, const uint8_t* const* pieces, uint8_t* dst);
// Rows [n0, n1) of that matrix only, at `dst` ((n1 - n0) * K elements): the CPU converter reorders
// a band of rows and quantizes it while it is in cache. Throws mxmoe::invalid_argument unless
// 0 <= n0 <= n1 <= rows.
void reorder_rows(const expert_matrix& m, const uint8_t* const* pieces, int64_t n0, int64_t n1, uint8_t* dst);
expert_weights read_expert(const safetensors_reader& file, const moe_layer_info& info, int64_t expert,
                           std::vector<uint8_t>& gate_up_buf, std::vector<uint8_t>& down_buf);

// A whole BF16 layer materialised as bf16 [E, 2I, H] (interleaved rows) and [E, H, I] in the
// given buffers (f16 and f32 weights rounded to bf16), and weights viewing them (biases and router
// viewing the file). For layers small enough to hold in memory (the reference, tests, the demo).
moe_weights bf16_weights(const safetensors_reader& file, const moe_layer_info& info, std::vector<uint16_t>& gate_up,
                         std::vector<uint16_t>& down);

}  // namespace mxmoe::checkpoint
