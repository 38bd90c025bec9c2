// Streaming checkpoint conversion (include/mxmoe/convert.h). Built into the top library (it
// quantizes through the dispatch of quantize.h), beside the checkpoint reader it stands on.
#include "mxmoe/convert.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <set>

#include "mxmoe/checkpoint.h"
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
#include "mxmoe/safetensors.h"

namespace mxmoe {
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

// Counts the steps of a conversion and reports each to the callback (when there is one).
class progress {
 public:
  progress(const progress_callback& cb, const safetensors_reader& r, const std::vector<checkpoint::moe_layer_info>& layers)
      : cb_(cb), total_(static_cast<int64_t>(r.entries().size())) {
    for (const auto& l : layers) total_ += l.shape.experts;
  }
  void step(const std::string& note) {
    ++done_;
    if (cb_) cb_({done_, total_, note});
  }

 private:
  const progress_callback& cb_;
  int64_t done_ = 0, total_ = 0;
};

std::string expert_note(const checkpoint::moe_layer_info& l, int64_t expert) {
  return "layer " + std::to_string(l.layer) + " expert " + std::to_string(expert);
}

// Quantizes host matrices [rows, K] (bf16 | f16 | f32, row-major) into host packed [rows, K/2]
// and linear scales [rows, K/32], on the CPU or the current CUDA device. The device buffers are
// kept between calls and grown when a larger matrix comes.
class matrix_quantizer {
 public:
  matrix_quantizer(mx::scale_rule rule, device_kind device) : rule_(rule), device_(device) {}

  quant_stats run(const tensor_view& x, uint8_t* packed, uint8_t* scales) {
    const int64_t rows = x.dim(0), k = x.dim(1);
    const std::vector<int64_t> ps{rows, k / 2}, ss{rows, k / mx::kBlockSize};
    if (device_ == device_kind::cpu)
      return quantize(x, rule_, scale_layout::linear, tensor_view(packed, dtype::u8, ps), tensor_view(scales, dtype::u8, ss));
    const size_t pb = static_cast<size_t>(rows * k / 2), sb = static_cast<size_t>(rows * k / mx::kBlockSize);
    grow(x_, x.nbytes());
    grow(packed_, pb);
    grow(scales_, sb);
    x_.upload(x.data, x.nbytes());
    const quant_stats st = quantize(tensor_view(x_.data(), x.type, x.shape, device_kind::cuda), rule_, scale_layout::linear,
                                    packed_.view(dtype::u8, ps), scales_.view(dtype::u8, ss));
    packed_.download(packed, pb);
    scales_.download(scales, sb);
    return st;
  }

 private:
  static void grow(cuda::device_buffer& b, size_t bytes) {
    if (b.size() < bytes) b = cuda::device_buffer(bytes);
  }
  mx::scale_rule rule_;
  device_kind device_;
  cuda::device_buffer x_, packed_, scales_;
};

uint64_t decl_bytes(const std::vector<tensor_decl>& decls) {
  uint64_t total = 0;
  for (const auto& d : decls) {
    uint64_t n = static_cast<uint64_t>(dtype_size(d.type));
    for (int64_t s : d.shape) n *= static_cast<uint64_t>(s);
    total += n;
  }
  return total;
}

}  // namespace

quantize_report quantize_checkpoint(const std::string& in, const std::string& out, const quantize_options& options) {
  const auto start = std::chrono::steady_clock::now();
  MXMOE_CHECK_ARG(options.device == device_kind::cpu || options.device == device_kind::cuda, "options.device",
                  "cpu | cuda", std::to_string(static_cast<int>(options.device)));
  if (options.device == device_kind::cuda) {
    std::string why;
    if (!cuda::available(&why)) throw unsupported("quantize_checkpoint on cuda: no usable GPU: " + why);
  }
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
  meta["mxmoe.scale_rule"] = mx::to_string(options.rule);
  if (!meta.count("format")) meta["format"] = "pt";

  const auto decls = output_decls(r, layers, [](const checkpoint::moe_layer_info& l) {
    return checkpoint::mxfp4_layer_decls(l.prefix, l.shape);
  });
  safetensors_writer w(out, decls, meta, options.overwrite);

  quantize_report rep;
  progress prog(options.on_progress, r, layers);
  for (const auto& e : r.entries()) {
    rep.input_bytes += e.nbytes();
    if (is_expert_tensor(layers, e.name)) continue;
    copy_tensor(r, e, w);
    ++rep.copied_tensors;
    rep.copied_bytes += e.nbytes();
    prog.step(e.name);
  }
  matrix_quantizer quantizer(options.rule, options.device);
  std::vector<uint8_t> gate_up_buf, down_buf, packed, scales;
  for (const auto& l : layers) {
    const auto names = checkpoint::mxfp4_tensor_names(l.prefix);
    const auto gu = checkpoint::gate_up_geometry(l.shape), dn = checkpoint::down_geometry(l.shape);
    tensor_report rep_gu{names.gate_up_blocks, {gu.experts, gu.rows, gu.scale_cols(), mx::kPackedBlockBytes}, {}};
    tensor_report rep_dn{names.down_blocks, {dn.experts, dn.rows, dn.scale_cols(), mx::kPackedBlockBytes}, {}};
    for (int64_t ex = 0; ex < l.shape.experts; ++ex) {
      const checkpoint::expert_weights x = checkpoint::read_expert(r, l, ex, gate_up_buf, down_buf);
      for (const auto* g : {&gu, &dn}) {
        const bool is_gu = g == &gu;
        packed.resize(static_cast<size_t>(g->rows * g->row_bytes()));
        scales.resize(static_cast<size_t>(g->rows * g->scale_cols()));
        (is_gu ? rep_gu : rep_dn).stats.merge(quantizer.run(is_gu ? x.gate_up : x.down, packed.data(), scales.data()));
        w.write(is_gu ? names.gate_up_blocks : names.down_blocks, packed.data(), packed.size(),
                static_cast<uint64_t>(g->code_offset(ex, 0, 0).byte));
        w.write(is_gu ? names.gate_up_scales : names.down_scales, scales.data(), scales.size(),
                static_cast<uint64_t>(g->scale_offset(ex, 0, 0)));
      }
      prog.step(expert_note(l, ex));
    }
    rep.total.merge(rep_gu.stats);
    rep.total.merge(rep_dn.stats);
    rep.tensors.push_back(std::move(rep_gu));
    rep.tensors.push_back(std::move(rep_dn));
  }
  w.commit();
  rep.output_bytes = decl_bytes(decls);
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return rep;
}

void dequantize_checkpoint(const std::string& in, const std::string& out, const dequantize_options& options) {
  const safetensors_reader r(in);
  const auto layers = checkpoint::find_moe_layers(r);
  MXMOE_CHECK_ARG(!layers.empty(), "IN", "a checkpoint with MXFP4 MoE layers", "no MoE layer in " + in);
  for (const auto& l : layers)
    MXMOE_CHECK_ARG(l.layout == checkpoint::moe_layout::mxfp4_gpt_oss, "IN", "an MXFP4 checkpoint",
                    "layer " + std::to_string(l.layer) + " in layout " + checkpoint::to_string(l.layout));
  const auto decls = output_decls(r, layers, [](const checkpoint::moe_layer_info& l) {
    const auto n = checkpoint::bf16_gpt_oss_tensor_names(l.prefix);
    const auto gu = checkpoint::gate_up_xw_geometry(l.shape), dn = checkpoint::down_xw_geometry(l.shape);
    return std::vector<tensor_decl>{{n.gate_up, dtype::bf16, {gu.experts, gu.cols, gu.rows}},
                                    {n.down, dtype::bf16, {dn.experts, dn.cols, dn.rows}}};
  });
  safetensors_writer w(out, decls, r.metadata(), options.overwrite);
  progress prog(options.on_progress, r, layers);
  for (const auto& e : r.entries()) {
    if (is_expert_tensor(layers, e.name)) continue;
    copy_tensor(r, e, w);
    prog.step(e.name);
  }
  std::vector<uint16_t> values, transposed;
  for (const auto& l : layers) {
    const auto q = checkpoint::mxfp4_tensor_names(l.prefix);
    const auto n = checkpoint::bf16_gpt_oss_tensor_names(l.prefix);
    const auto gu = checkpoint::gate_up_geometry(l.shape), dn = checkpoint::down_geometry(l.shape);
    const auto gu_xw = checkpoint::gate_up_xw_geometry(l.shape), dn_xw = checkpoint::down_xw_geometry(l.shape);
    for (int64_t ex = 0; ex < l.shape.experts; ++ex) {
      for (const auto* g : {&gu, &dn}) {
        const bool is_gu = g == &gu;
        const layout::checkpoint_xw& xw = is_gu ? gu_xw : dn_xw;
        const uint8_t* blocks = r.bytes(r.entry(is_gu ? q.gate_up_blocks : q.down_blocks)).data();
        const uint8_t* scales = r.bytes(r.entry(is_gu ? q.gate_up_scales : q.down_scales)).data();
        values.resize(static_cast<size_t>(g->rows * g->cols));
        dequantize(tensor_view(blocks + g->code_offset(ex, 0, 0).byte, dtype::u8, {g->rows, g->row_bytes()}),
                   tensor_view(scales + g->scale_offset(ex, 0, 0), dtype::u8, {g->rows, g->scale_cols()}),
                   scale_layout::linear, tensor_view(values.data(), dtype::bf16, {g->rows, g->cols}));
        // Checkpoint rows are outputs; the gpt-oss BF16 layout stores the x·W form.
        transposed.resize(values.size());
        for (int64_t row = 0; row < g->rows; ++row)
          for (int64_t k = 0; k < g->cols; ++k)
            transposed[static_cast<size_t>(xw.offset(0, row, k))] = values[static_cast<size_t>(row * g->cols + k)];
        w.write(is_gu ? n.gate_up : n.down, transposed.data(), transposed.size() * 2,
                static_cast<uint64_t>(xw.offset(ex, 0, 0)) * 2);
      }
      prog.step(expert_note(l, ex));
    }
  }
  w.commit();
}

}  // namespace mxmoe
