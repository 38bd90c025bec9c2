// Streaming checkpoint conversion (see convert.h).
#include "convert.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>

#include "mxmoe/checkpoint.h"
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
#include "mxmoe/safetensors.h"

namespace mxmoe::cli {
namespace {

constexpr size_t kCopyChunk = 64u << 20;  // bytes per write when copying a tensor

void copy_tensor(const safetensors_reader& r, const safetensors_entry& e, safetensors_writer& w) {
  const auto bytes = r.bytes(e);
  for (size_t off = 0; off < bytes.size(); off += kCopyChunk)
    w.write(e.name, bytes.data() + off, std::min(kCopyChunk, bytes.size() - off), off);
}

// Output declarations: each layer's expert tensors replaced (at the first of them) by
// `replacement(layer)`, every other tensor kept in file order.
template <class Replace>
std::vector<tensor_decl> output_decls(const safetensors_reader& r, const std::vector<checkpoint::moe_layer_info>& layers,
                                      Replace replacement) {
  std::map<std::string, size_t> owner;
  for (size_t i = 0; i < layers.size(); ++i)
    for (const auto& n : layers[i].expert_tensors) owner[n] = i;
  std::set<size_t> emitted;
  std::vector<tensor_decl> decls;
  for (const auto& e : r.entries()) {
    const auto it = owner.find(e.name);
    if (it == owner.end()) {
      decls.push_back({e.name, e.type, e.shape});
    } else if (emitted.insert(it->second).second) {
      for (auto& d : replacement(layers[it->second])) decls.push_back(std::move(d));
    }
  }
  return decls;
}

bool is_expert_tensor(const std::vector<checkpoint::moe_layer_info>& layers, const std::string& name) {
  for (const auto& l : layers)
    if (std::find(l.expert_tensors.begin(), l.expert_tensors.end(), name) != l.expert_tensors.end()) return true;
  return false;
}

}  // namespace

quant_stats quantize_matrix(const float* x, int64_t rows, int64_t k, mx::scale_rule rule, device_kind device,
                            uint8_t* packed, uint8_t* scales) {
  const std::vector<int64_t> xs{rows, k}, ps{rows, k / 2}, ss{rows, k / mx::kBlockSize};
  if (device == device_kind::cpu)
    return mxmoe::quantize(tensor_view(x, dtype::f32, xs), rule, scale_layout::linear, tensor_view(packed, dtype::u8, ps),
                           tensor_view(scales, dtype::u8, ss));
  const size_t xb = static_cast<size_t>(rows * k) * 4, pb = static_cast<size_t>(rows * k / 2),
               sb = static_cast<size_t>(rows * k / mx::kBlockSize);
  cuda::device_buffer dx(xb), dp(pb), ds(sb);
  dx.upload(x, xb);
  const quant_stats st =
      mxmoe::quantize(dx.view(dtype::f32, xs), rule, scale_layout::linear, dp.view(dtype::u8, ps), ds.view(dtype::u8, ss));
  dp.download(packed, pb);
  ds.download(scales, sb);
  return st;
}

quantize_report quantize_checkpoint(const std::string& in, const std::string& out, mx::scale_rule rule,
                                    const backend_choice& backend, bool overwrite, bool show_progress) {
  const auto start = std::chrono::steady_clock::now();
  const safetensors_reader r(in);
  const auto layers = checkpoint::find_moe_layers(r);
  MXMOE_CHECK_ARG(!layers.empty(), "IN", "a checkpoint with MoE expert weights (gpt-oss or Qwen3/DeepSeek names)",
                  "no MoE layer in " + in);
  for (const auto& l : layers) {
    MXMOE_CHECK_ARG(l.layout != checkpoint::moe_layout::mxfp4_gpt_oss, "IN", "a BF16 checkpoint",
                    "layer " + std::to_string(l.layer) + " already in MXFP4");
    MXMOE_CHECK_ARG(l.shape.hidden % mx::kBlockSize == 0 && l.shape.intermediate % mx::kBlockSize == 0, "IN",
                    "hidden and intermediate sizes that are multiples of 32",
                    "layer " + std::to_string(l.layer) + " with H=" + std::to_string(l.shape.hidden) +
                        ", I=" + std::to_string(l.shape.intermediate));
  }
  moe_config cfg = checkpoint::layer_config(r, layers.front());
  cfg.gate_up = layout::gate_up_order::interleaved;  // what the gpt-oss layout stores
  std::map<std::string, std::string> meta = r.metadata();
  meta["mxmoe.moe_config"] = checkpoint::config_to_json(cfg);
  meta["mxmoe.scale_rule"] = mx::to_string(rule);
  if (!meta.count("format")) meta["format"] = "pt";

  const auto decls = output_decls(r, layers, [](const checkpoint::moe_layer_info& l) {
    return checkpoint::mxfp4_layer_decls(l.prefix, l.shape);
  });
  safetensors_writer w(out, decls, meta, overwrite);

  quantize_report rep;
  int64_t steps = static_cast<int64_t>(r.entries().size());
  for (const auto& l : layers) steps += l.shape.experts;
  progress_bar bar(show_progress ? "quantize" : "", show_progress ? steps : 0);
  for (const auto& e : r.entries()) {
    rep.input_bytes += e.nbytes();
    if (is_expert_tensor(layers, e.name)) continue;
    copy_tensor(r, e, w);
    ++rep.copied_tensors;
    rep.copied_bytes += e.nbytes();
    bar.advance(1, e.name);
  }
  std::vector<float> w13, w2;
  std::vector<uint8_t> packed, scales;
  for (const auto& l : layers) {
    const auto names = checkpoint::mxfp4_tensor_names(l.prefix);
    const auto gu = checkpoint::gate_up_geometry(l.shape), dn = checkpoint::down_geometry(l.shape);
    tensor_report rep13{names.gate_up_blocks, {gu.experts, gu.rows, gu.scale_cols(), mx::kPackedBlockBytes}, {}};
    tensor_report rep2{names.down_blocks, {dn.experts, dn.rows, dn.scale_cols(), mx::kPackedBlockBytes}, {}};
    for (int64_t ex = 0; ex < l.shape.experts; ++ex) {
      checkpoint::read_expert_f32(r, l, ex, w13, w2);
      for (const auto* g : {&gu, &dn}) {
        const bool is13 = g == &gu;
        packed.resize(static_cast<size_t>(g->rows * g->row_bytes()));
        scales.resize(static_cast<size_t>(g->rows * g->scale_cols()));
        const quant_stats st = quantize_matrix(is13 ? w13.data() : w2.data(), g->rows, g->cols, rule, backend.device,
                                               packed.data(), scales.data());
        (is13 ? rep13 : rep2).stats.merge(st);
        w.write(is13 ? names.gate_up_blocks : names.down_blocks, packed.data(), packed.size(),
                static_cast<uint64_t>(g->code_offset(ex, 0, 0).byte));
        w.write(is13 ? names.gate_up_scales : names.down_scales, scales.data(), scales.size(),
                static_cast<uint64_t>(g->scale_offset(ex, 0, 0)));
      }
      bar.advance(1, "layer " + std::to_string(l.layer) + " expert " + std::to_string(ex));
    }
    rep.total.merge(rep13.stats);
    rep.total.merge(rep2.stats);
    rep.tensors.push_back(std::move(rep13));
    rep.tensors.push_back(std::move(rep2));
  }
  w.commit();
  for (const auto& d : decls) {
    uint64_t n = static_cast<uint64_t>(dtype_size(d.type));
    for (int64_t s : d.shape) n *= static_cast<uint64_t>(s);
    rep.output_bytes += n;
  }
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return rep;
}

void dequantize_checkpoint(const std::string& in, const std::string& out, bool overwrite, bool show_progress) {
  const safetensors_reader r(in);
  const auto layers = checkpoint::find_moe_layers(r);
  MXMOE_CHECK_ARG(!layers.empty(), "IN", "a checkpoint with MXFP4 MoE layers", "no MoE layer in " + in);
  for (const auto& l : layers)
    MXMOE_CHECK_ARG(l.layout == checkpoint::moe_layout::mxfp4_gpt_oss, "IN", "an MXFP4 checkpoint",
                    "layer " + std::to_string(l.layer) + " in layout " + checkpoint::to_string(l.layout));
  const auto decls = output_decls(r, layers, [](const checkpoint::moe_layer_info& l) {
    const auto n = checkpoint::bf16_gpt_oss_tensor_names(l.prefix);
    const moe_shape& s = l.shape;
    return std::vector<tensor_decl>{{n.gate_up, dtype::bf16, {s.experts, s.hidden, 2 * s.intermediate}},
                                    {n.down, dtype::bf16, {s.experts, s.intermediate, s.hidden}}};
  });
  safetensors_writer w(out, decls, r.metadata(), overwrite);
  int64_t steps = static_cast<int64_t>(r.entries().size());
  for (const auto& l : layers) steps += l.shape.experts;
  progress_bar bar(show_progress ? "dequantize" : "", show_progress ? steps : 0);
  for (const auto& e : r.entries()) {
    if (is_expert_tensor(layers, e.name)) continue;
    copy_tensor(r, e, w);
    bar.advance(1, e.name);
  }
  std::vector<float> values;
  std::vector<uint16_t> transposed;
  for (const auto& l : layers) {
    const auto q = checkpoint::mxfp4_tensor_names(l.prefix);
    const auto n = checkpoint::bf16_gpt_oss_tensor_names(l.prefix);
    const auto gu = checkpoint::gate_up_geometry(l.shape), dn = checkpoint::down_geometry(l.shape);
    for (int64_t ex = 0; ex < l.shape.experts; ++ex) {
      for (const auto* g : {&gu, &dn}) {
        const bool is13 = g == &gu;
        const uint8_t* blocks = r.bytes(r.entry(is13 ? q.gate_up_blocks : q.down_blocks)).data();
        const uint8_t* scales = r.bytes(r.entry(is13 ? q.gate_up_scales : q.down_scales)).data();
        values.resize(static_cast<size_t>(g->rows * g->cols));
        mxmoe::dequantize(tensor_view(blocks + g->code_offset(ex, 0, 0).byte, dtype::u8, {g->rows, g->row_bytes()}),
                          tensor_view(scales + g->scale_offset(ex, 0, 0), dtype::u8, {g->rows, g->scale_cols()}),
                          scale_layout::linear, tensor_view(values.data(), dtype::f32, {g->rows, g->cols}));
        // Checkpoint rows are outputs; the gpt-oss BF16 layout stores the x·W form [K, rows].
        transposed.resize(values.size());
        for (int64_t row = 0; row < g->rows; ++row)
          for (int64_t k = 0; k < g->cols; ++k)
            transposed[static_cast<size_t>(k * g->rows + row)] = float_to_bf16(values[static_cast<size_t>(row * g->cols + k)]);
        w.write(is13 ? n.gate_up : n.down, transposed.data(), transposed.size() * 2,
                static_cast<uint64_t>(ex) * transposed.size() * 2);
      }
      bar.advance(1, "layer " + std::to_string(l.layer) + " expert " + std::to_string(ex));
    }
  }
  w.commit();
}

}  // namespace mxmoe::cli
