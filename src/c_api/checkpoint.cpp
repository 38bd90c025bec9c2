// The C ABI's checkpoints: a safetensors file opened once (mxmoe/safetensors.h), its MoE layers
// (mxmoe/checkpoint.h) listed, read into caller tensors or prepared straight from the mapping,
// and whole-checkpoint conversion (mxmoe/convert.h) with its report and a progress callback.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bridge.h"
#include "device_guard.h"
#include "mxmoe/c_api.h"
#include "mxmoe/checkpoint.h"
#include "mxmoe/convert.h"
#include "mxmoe/error.h"
#include "mxmoe/safetensors.h"
#include "mxmoe/shard.h"

struct mxmoe_checkpoint {
  mxmoe::safetensors_reader file;
  std::vector<mxmoe::checkpoint::moe_layer_info> layers;
};

struct mxmoe_quantize_report {
  mxmoe::quantize_report report;
};

namespace mxmoe::c_api {
namespace {

static_assert(MXMOE_LAYOUT_BF16_PER_EXPERT == static_cast<int>(checkpoint::moe_layout::bf16_per_expert));

const mxmoe_checkpoint& require_file(const mxmoe_checkpoint* file) {
  MXMOE_CHECK_ARG(file != nullptr, "file", "an open checkpoint", "NULL");
  return *file;
}

const char* require_path(const char* path, const char* name) {
  MXMOE_CHECK_ARG(path != nullptr && *path != '\0', name, "a file path", path ? "an empty string" : "NULL");
  return path;
}

int32_t dtype_or_absent(const safetensors_reader& f, const std::string& tensor) {
  return tensor.empty() ? MXMOE_ABSENT : static_cast<int32_t>(f.entry(tensor).type);
}

// A layer's weights in the checkpoint layout (moe.h), viewing the file's mapping (MXFP4) or
// `gate_up` / `down` (a BF16 layer, converted to bf16).
moe_weights layer_weights(const mxmoe_checkpoint& c, const checkpoint::moe_layer_info& info,
                          std::vector<uint16_t>& gate_up, std::vector<uint16_t>& down) {
  if (info.layout == checkpoint::moe_layout::mxfp4_gpt_oss) return checkpoint::mxfp4_weights(c.file, info);
  return checkpoint::bf16_weights(c.file, info, gate_up, down);
}

// The progress callback of the C ABI as convert.h's: a non-zero return stops the conversion.
progress_callback to_callback(mxmoe_progress_fn fn, void* data) {
  if (!fn) return {};
  return [fn, data](const convert_progress& p) {
    if (fn(p.done, p.total, p.note.c_str(), data) != 0) throw cancelled();
  };
}

}  // namespace
}  // namespace mxmoe::c_api

using namespace mxmoe;
using namespace mxmoe::c_api;

extern "C" {

mxmoe_status mxmoe_checkpoint_open(const char* path, mxmoe_checkpoint** file) {
  return guarded([&] {
    MXMOE_CHECK_ARG(file != nullptr, "file", "a pointer to the result", "NULL");
    *file = nullptr;
    safetensors_reader r(require_path(path, "path"));
    auto layers = checkpoint::find_moe_layers(r);
    *file = new mxmoe_checkpoint{std::move(r), std::move(layers)};
  });
}

void mxmoe_checkpoint_close(mxmoe_checkpoint* file) { delete file; }

mxmoe_status mxmoe_checkpoint_layer_count(const mxmoe_checkpoint* file, int64_t* count) {
  return guarded([&] {
    const mxmoe_checkpoint& c = require_file(file);
    MXMOE_CHECK_ARG(count != nullptr, "count", "a pointer to the result", "NULL");
    *count = static_cast<int64_t>(c.layers.size());
  });
}

mxmoe_status mxmoe_checkpoint_layer_info(const mxmoe_checkpoint* file, int64_t index, mxmoe_layer_info* info) {
  return guarded([&] {
    const mxmoe_checkpoint& c = require_file(file);
    MXMOE_CHECK_ARG(index >= 0 && static_cast<size_t>(index) < c.layers.size(), "index",
                    "in [0, " + std::to_string(c.layers.size()) + ")", std::to_string(index));
    MXMOE_CHECK_ARG(info != nullptr, "info", "a pointer to the result", "NULL");
    const checkpoint::moe_layer_info& l = c.layers[static_cast<size_t>(index)];
    mxmoe_layer_info r{};
    r.layer = l.layer;
    r.layout = static_cast<int32_t>(l.layout);
    r.weight_dtype = static_cast<int32_t>(l.weight_type);
    r.format = l.layout == checkpoint::moe_layout::mxfp4_gpt_oss ? MXMOE_WEIGHTS_MXFP4 : MXMOE_WEIGHTS_BF16;
    r.gate_up_bias_dtype = dtype_or_absent(c.file, l.gate_up_bias);
    r.down_bias_dtype = dtype_or_absent(c.file, l.down_bias);
    r.router_weight_dtype = dtype_or_absent(c.file, l.router_weight);
    r.router_bias_dtype = dtype_or_absent(c.file, l.router_bias);
    r.correction_bias_dtype = dtype_or_absent(c.file, l.correction_bias);
    r.config = from_config(checkpoint::layer_config(c.file, l));
    *info = r;
  });
}

mxmoe_status mxmoe_checkpoint_read_layer(const mxmoe_checkpoint* file, int64_t layer, const mxmoe_moe_weights* out) {
  return guarded([&] {
    const mxmoe_checkpoint& c = require_file(file);
    const checkpoint::moe_layer_info info = checkpoint::find_moe_layer(c.file, layer);
    MXMOE_CHECK_ARG(out != nullptr, "out", "the tensors to read the layer into", "NULL");
    std::vector<uint16_t> gate_up, down;
    copy_weights_out(layer_weights(c, info, gate_up, down), out);
  });
}

mxmoe_status mxmoe_checkpoint_prepare_layer(const mxmoe_checkpoint* file, int64_t layer, const mxmoe_moe_config* cfg,
                                            int32_t device_type, int32_t device_id, mxmoe_moe** out) {
  return mxmoe_checkpoint_prepare_layer_with_options(file, layer, cfg, nullptr, device_type, device_id, out);
}

mxmoe_status mxmoe_checkpoint_prepare_layer_with_options(const mxmoe_checkpoint* file, int64_t layer,
                                                         const mxmoe_moe_config* cfg,
                                                         const mxmoe_prepare_options* options, int32_t device_type,
                                                         int32_t device_id, mxmoe_moe** out) {
  return guarded([&] {
    MXMOE_CHECK_ARG(out != nullptr, "out", "a pointer to the result", "NULL");
    *out = nullptr;
    const mxmoe_checkpoint& c = require_file(file);
    const device_ref d = to_device(device_type, device_id, "device_type");
    const checkpoint::moe_layer_info info = checkpoint::find_moe_layer(c.file, layer);
    MXMOE_CHECK_ARG(d.kind == device_kind::cpu || info.layout == checkpoint::moe_layout::mxfp4_gpt_oss, "device_type",
                    "0 (cpu) for a BF16 layer (the cuda layer runs MXFP4 weights: quantize the checkpoint first)",
                    "1 (cuda)");
    const moe_config config = cfg ? to_config(cfg) : checkpoint::layer_config(c.file, info);
    const prepare_options o = to_options(options);
    std::vector<uint16_t> gate_up, down;
    const moe_weights all = layer_weights(c, info, gate_up, down);
    if (o.expert_map.empty()) {
      *out = prepare_on(all, config, d, o).release();
      return;
    }
    // prepare takes the held experts' tensors only ([E_held, ...]); the file has all E
    // (select_experts checks the map against them).
    const owned_weights held = select_experts(all, config, o.expert_map);
    *out = prepare_on(held.weights(), config, d, o).release();
  });
}

mxmoe_status mxmoe_quantize_checkpoint(const char* in_path, const char* out_path, const mxmoe_quantize_options* options,
                                       mxmoe_quantize_report** report) {
  return guarded([&] {
    if (report) *report = nullptr;
    MXMOE_CHECK_ARG(options != nullptr, "options", "quantize options", "NULL");
    const std::string in = require_path(in_path, "in_path"), out = require_path(out_path, "out_path");
    quantize_options o;
    o.rule = to_rule(options->rule);
    const device_ref d = to_device(options->device_type, options->device_id, "options.device_type");
    o.device = d.kind;
    o.overwrite = options->overwrite != 0;
    o.allow_nonfinite = options->allow_nonfinite != 0;
    o.on_progress = to_callback(options->progress, options->progress_data);
    const optional_device_guard guard(d.kind == device_kind::cuda, d.id);
    auto r = std::make_unique<mxmoe_quantize_report>(mxmoe_quantize_report{quantize_checkpoint(in, out, o)});
    if (report) *report = r.release();
  });
}

mxmoe_status mxmoe_quantize_report_summary(const mxmoe_quantize_report* report, mxmoe_quantize_summary* summary) {
  return guarded([&] {
    MXMOE_CHECK_ARG(report != nullptr, "report", "a quantize report", "NULL");
    MXMOE_CHECK_ARG(summary != nullptr, "summary", "a pointer to the result", "NULL");
    const quantize_report& r = report->report;
    mxmoe_quantize_summary s{};
    static_assert(sizeof(s.total) == sizeof(r.total));
    std::memcpy(&s.total, &r.total, sizeof s.total);
    s.tensors = static_cast<int64_t>(r.tensors.size());
    s.copied_tensors = r.copied_tensors;
    s.copied_bytes = r.copied_bytes;
    s.input_bytes = r.input_bytes;
    s.output_bytes = r.output_bytes;
    s.seconds = r.seconds;
    *summary = s;
  });
}

mxmoe_status mxmoe_quantize_report_tensor(const mxmoe_quantize_report* report, int64_t index,
                                          mxmoe_tensor_report* tensor) {
  return guarded([&] {
    MXMOE_CHECK_ARG(report != nullptr, "report", "a quantize report", "NULL");
    const auto& tensors = report->report.tensors;
    MXMOE_CHECK_ARG(index >= 0 && static_cast<size_t>(index) < tensors.size(), "index",
                    "in [0, " + std::to_string(tensors.size()) + ")", std::to_string(index));
    MXMOE_CHECK_ARG(tensor != nullptr, "tensor", "a pointer to the result", "NULL");
    const tensor_report& t = tensors[static_cast<size_t>(index)];
    MXMOE_CHECK_ARG(t.shape.size() <= MXMOE_MAX_RANK, "index", "a tensor of rank <= 8", shape_string(t.shape));
    mxmoe_tensor_report r{};
    r.name = t.name.c_str();
    r.ndim = static_cast<int32_t>(t.shape.size());
    for (size_t i = 0; i < t.shape.size(); ++i) r.shape[i] = t.shape[i];
    std::memcpy(&r.stats, &t.stats, sizeof r.stats);
    *tensor = r;
  });
}

void mxmoe_quantize_report_free(mxmoe_quantize_report* report) { delete report; }

mxmoe_status mxmoe_dequantize_checkpoint(const char* in_path, const char* out_path, int32_t overwrite,
                                         mxmoe_progress_fn progress, void* progress_data) {
  return guarded([&] {
    const std::string in = require_path(in_path, "in_path"), out = require_path(out_path, "out_path");
    dequantize_options o;
    o.overwrite = overwrite != 0;
    o.on_progress = to_callback(progress, progress_data);
    dequantize_checkpoint(in, out, o);
  });
}

}  // extern "C"
