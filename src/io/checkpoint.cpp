// MoE layers in safetensors checkpoints: detection by name, shape validation, the gpt-oss
// MXFP4 names, per-expert reading of BF16 weights as (rows = outputs, K contiguous) matrices in
// their own element type.
#include "mxmoe/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "mxmoe/error.h"

namespace mxmoe::checkpoint {
namespace {

// The entry `name` with a float type (or exactly `type` when given) and `shape`.
const safetensors_entry& need(const safetensors_reader& file, const std::string& name, const std::vector<int64_t>& shape,
                              bool want_float, dtype type = dtype::u8) {
  const safetensors_entry& e = file.entry(name);
  if (want_float ? !is_float_type(e.type) : e.type != type)
    throw format_error(file.path(), name, std::string("dtype ") + safetensors_dtype_name(e.type) + ", expected " +
                                              (want_float ? "BF16, F16 or F32" : safetensors_dtype_name(type)));
  if (e.shape != shape)
    throw format_error(file.path(), name, "shape " + shape_string(e.shape) + ", expected " + shape_string(shape));
  return e;
}

// Optional tensor: its name when present (and well-formed), else "".
std::string optional(const safetensors_reader& file, const std::string& name, const std::vector<int64_t>& shape) {
  if (!file.contains(name)) return {};
  need(file, name, shape, true);
  return name;
}

int64_t dim_of(const safetensors_reader& file, const safetensors_entry& e, int rank, int i) {
  if (static_cast<int>(e.shape.size()) != rank)
    throw format_error(file.path(), e.name, "rank " + std::to_string(e.shape.size()) + ", expected " + std::to_string(rank));
  return e.shape[static_cast<size_t>(i)];
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// "<P>layers.<L>.mlp.experts.<rest>" -> prefix "<P>layers.<L>.mlp.", "<L>", "<rest>".
bool split_expert_name(const std::string& name, std::string* prefix, std::string* layer, std::string* rest) {
  static const std::string kKey = ".mlp.experts.";
  const size_t pos = name.find(kKey);
  if (pos == std::string::npos) return false;
  size_t d = pos;
  while (d > 0 && name[d - 1] >= '0' && name[d - 1] <= '9') --d;
  if (d == pos || d < 7 || name.compare(d - 7, 7, "layers.") != 0) return false;
  *layer = name.substr(d, pos - d);
  *prefix = name.substr(0, pos + 5);
  *rest = name.substr(pos + kKey.size());
  return true;
}

struct candidate {
  std::string prefix;
  moe_layout layout;
  std::set<int64_t> experts;  // per-expert layout: the expert ids seen
};

void check_positive(const safetensors_reader& file, const std::string& name, const moe_shape& s) {
  if (s.experts <= 0 || s.hidden <= 0 || s.intermediate <= 0)
    throw format_error(file.path(), name, "implies an empty layer (E=" + std::to_string(s.experts) + ", H=" +
                                              std::to_string(s.hidden) + ", I=" + std::to_string(s.intermediate) + ")");
}

moe_layer_info describe_layer(const safetensors_reader& file, const candidate& c, int64_t layer) {
  moe_layer_info info;
  info.layer = layer;
  info.prefix = c.prefix;
  info.layout = c.layout;
  const std::string& p = c.prefix;
  moe_shape& s = info.shape;
  if (c.layout == moe_layout::mxfp4_gpt_oss) {
    const mxfp4_names n = mxfp4_tensor_names(p);
    const auto& gub = file.entry(n.gate_up_blocks);
    s.experts = dim_of(file, gub, 4, 0);
    const int64_t rows = dim_of(file, gub, 4, 1);
    s.hidden = dim_of(file, gub, 4, 2) * mx::kBlockSize;
    if (rows % 2 != 0) throw format_error(file.path(), gub.name, "has an odd number of gate/up rows");
    const auto& db = file.entry(n.down_blocks);
    s.intermediate = dim_of(file, db, 4, 2) * mx::kBlockSize;
    check_positive(file, gub.name, s);
    need(file, n.gate_up_blocks, {s.experts, 2 * s.intermediate, s.hidden / 32, 16}, false, dtype::u8);
    need(file, n.gate_up_scales, {s.experts, 2 * s.intermediate, s.hidden / 32}, false, dtype::u8);
    need(file, n.down_blocks, {s.experts, s.hidden, s.intermediate / 32, 16}, false, dtype::u8);
    need(file, n.down_scales, {s.experts, s.hidden, s.intermediate / 32}, false, dtype::u8);
    info.weight_type = dtype::u8;
    info.expert_tensors = {n.gate_up_blocks, n.gate_up_scales, n.down_blocks, n.down_scales};
  } else if (c.layout == moe_layout::bf16_gpt_oss) {
    const bf16_names n = bf16_gpt_oss_tensor_names(p);
    const auto& gu = file.entry(n.gate_up);
    s.experts = dim_of(file, gu, 3, 0);
    s.hidden = dim_of(file, gu, 3, 1);
    if (dim_of(file, gu, 3, 2) % 2 != 0) throw format_error(file.path(), gu.name, "has an odd number of gate/up columns");
    s.intermediate = dim_of(file, gu, 3, 2) / 2;
    check_positive(file, gu.name, s);
    need(file, n.gate_up, {s.experts, s.hidden, 2 * s.intermediate}, true);
    need(file, n.down, {s.experts, s.intermediate, s.hidden}, true);
    if (file.entry(n.down).type != gu.type)
      throw format_error(file.path(), n.down, "dtype differs from " + n.gate_up);
    info.weight_type = gu.type;
    info.expert_tensors = {n.gate_up, n.down};
  } else {
    // Expert ids must be exactly 0..E-1.
    s.experts = static_cast<int64_t>(c.experts.size());
    if (*c.experts.rbegin() != s.experts - 1)
      throw format_error(file.path(), p + "experts." + std::to_string(*c.experts.rbegin()) + ".gate_proj.weight",
                         "expert ids are not contiguous from 0 (" + std::to_string(s.experts) + " experts seen)");
    const std::string e0 = p + "experts.0.";
    const auto& g0 = file.entry(e0 + "gate_proj.weight");
    s.intermediate = dim_of(file, g0, 2, 0);
    s.hidden = dim_of(file, g0, 2, 1);
    check_positive(file, g0.name, s);
    info.weight_type = g0.type;
    for (int64_t e = 0; e < s.experts; ++e) {
      const std::string ep = p + "experts." + std::to_string(e) + ".";
      for (const char* part : {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}) {
        const std::string name = ep + part;
        const bool down = part[0] == 'd';
        const auto& t = need(file, name, down ? std::vector<int64_t>{s.hidden, s.intermediate}
                                              : std::vector<int64_t>{s.intermediate, s.hidden}, true);
        if (t.type != info.weight_type) throw format_error(file.path(), name, "dtype differs from " + g0.name);
        info.expert_tensors.push_back(name);
      }
    }
  }
  info.gate_up_bias = optional(file, p + "experts.gate_up_proj_bias", {s.experts, 2 * s.intermediate});
  info.down_bias = optional(file, p + "experts.down_proj_bias", {s.experts, s.hidden});
  info.router_weight = optional(file, p + "router.weight", {s.experts, s.hidden});
  if (info.router_weight.empty()) info.router_weight = optional(file, p + "gate.weight", {s.experts, s.hidden});
  info.router_bias = optional(file, p + "router.bias", {s.experts});
  info.correction_bias = optional(file, p + "gate.e_score_correction_bias", {s.experts});
  return info;
}

}  // namespace

const char* to_string(moe_layout l) {
  switch (l) {
    case moe_layout::mxfp4_gpt_oss: return "mxfp4 (gpt-oss)";
    case moe_layout::bf16_gpt_oss: return "bf16 (gpt-oss fused gate_up)";
    case moe_layout::bf16_per_expert: return "bf16 (per-expert gate/up/down, Qwen3/DeepSeek)";
  }
  return "?";
}

std::string gpt_oss_prefix(int64_t layer) { return "model.layers." + std::to_string(layer) + ".mlp."; }

mxfp4_names mxfp4_tensor_names(const std::string& p) {
  return {p + "experts.gate_up_proj_blocks", p + "experts.gate_up_proj_scales", p + "experts.down_proj_blocks",
          p + "experts.down_proj_scales"};
}

bf16_names bf16_gpt_oss_tensor_names(const std::string& p) { return {p + "experts.gate_up_proj", p + "experts.down_proj"}; }

layout::checkpoint_mxfp4 gate_up_geometry(const moe_shape& s) { return {s.experts, 2 * s.intermediate, s.hidden}; }
layout::checkpoint_mxfp4 down_geometry(const moe_shape& s) { return {s.experts, s.hidden, s.intermediate}; }

std::vector<tensor_decl> mxfp4_layer_decls(const std::string& prefix, const moe_shape& s) {
  const mxfp4_names n = mxfp4_tensor_names(prefix);
  const auto gu = gate_up_geometry(s), dn = down_geometry(s);
  return {{n.gate_up_blocks, dtype::u8, {gu.experts, gu.rows, gu.scale_cols(), mx::kPackedBlockBytes}},
          {n.gate_up_scales, dtype::u8, {gu.experts, gu.rows, gu.scale_cols()}},
          {n.down_blocks, dtype::u8, {dn.experts, dn.rows, dn.scale_cols(), mx::kPackedBlockBytes}},
          {n.down_scales, dtype::u8, {dn.experts, dn.rows, dn.scale_cols()}}};
}

std::string layout_label(const moe_layer_info& info) {
  switch (info.layout) {
    case moe_layout::mxfp4_gpt_oss: return to_string(info.layout);
    case moe_layout::bf16_gpt_oss: return std::string(to_string(info.weight_type)) + " (gpt-oss fused gate_up)";
    case moe_layout::bf16_per_expert:
      return std::string(to_string(info.weight_type)) + " (per-expert gate/up/down, Qwen3/DeepSeek)";
  }
  return "?";
}

namespace {
// The MoE layers the tensor names announce, by layer index (not yet checked).
std::map<int64_t, candidate> find_candidates(const safetensors_reader& file) {
  std::map<int64_t, candidate> found;
  auto add = [&](const std::string& name, const std::string& prefix, const std::string& layer_text, moe_layout l) {
    if (layer_text.size() > 9) throw format_error(file.path(), name, "layer index out of range");
    auto [it, fresh] = found.try_emplace(std::stoll(layer_text), candidate{prefix, l, {}});
    if (!fresh && (it->second.prefix != prefix || it->second.layout != l))
      throw format_error(file.path(), name, "layer " + layer_text + " has experts in two layouts or under two prefixes");
    return &it->second;
  };
  std::string prefix, layer, rest;
  for (const auto& e : file.entries()) {
    if (!split_expert_name(e.name, &prefix, &layer, &rest)) continue;
    if (rest == "gate_up_proj_blocks" || rest == "gate_up_proj") {
      add(e.name, prefix, layer, rest == "gate_up_proj" ? moe_layout::bf16_gpt_oss : moe_layout::mxfp4_gpt_oss);
      continue;
    }
    // "<e>.gate_proj.weight" and friends
    const size_t dot = rest.find('.');
    if (dot == 0 || dot == std::string::npos || dot > 6 || !all_digits(rest.substr(0, dot))) continue;
    const std::string part = rest.substr(dot + 1);
    if (part != "gate_proj.weight" && part != "up_proj.weight" && part != "down_proj.weight") continue;
    add(e.name, prefix, layer, moe_layout::bf16_per_expert)->experts.insert(std::stoll(rest.substr(0, dot)));
  }
  return found;
}
}  // namespace

std::vector<moe_layer_info> find_moe_layers(const safetensors_reader& file) {
  std::vector<moe_layer_info> layers;
  for (const auto& [index, c] : find_candidates(file)) layers.push_back(describe_layer(file, c, index));
  return layers;
}

moe_layer_scan scan_moe_layers(const safetensors_reader& file) {
  moe_layer_scan scan;
  for (const auto& [index, c] : find_candidates(file)) {
    try {
      scan.layers.push_back(describe_layer(file, c, index));
    } catch (const format_error& e) {
      scan.refused.push_back({index, c.prefix, e.tensor(), e.what()});
    }
  }
  return scan;
}

moe_layer_info find_moe_layer(const safetensors_reader& file, int64_t layer) {
  std::string have;
  for (auto& info : find_moe_layers(file)) {
    if (info.layer == layer) return info;
    have += (have.empty() ? "" : ", ") + std::to_string(info.layer);
  }
  MXMOE_CHECK_ARG(false, "layer", have.empty() ? std::string("a file with MoE layers") : "one of " + have,
                  std::to_string(layer) + " in " + file.path());
  return {};
}

std::string config_to_json(const moe_config& c) {
  nlohmann::json j = {{"routing", to_string(c.routing.kind)},
                      {"top_k", c.routing.top_k},
                      {"renormalize", c.routing.renormalize},
                      {"n_group", c.routing.n_group},
                      {"topk_group", c.routing.topk_group},
                      {"routed_scaling_factor", c.routing.routed_scaling_factor},
                      {"activation", to_string(c.activation.kind)},
                      {"alpha", c.activation.alpha},
                      {"limit", c.activation.limit},
                      {"gate_up", layout::to_string(c.gate_up)}};
  return j.dump();
}

moe_config config_from_json(const std::string& text, const moe_shape& shape) {
  moe_config c;
  c.shape = shape;
  c.gate_up = layout::gate_up_order::interleaved;
  try {
    const auto j = nlohmann::json::parse(text);
    const std::string routing = j.at("routing").get<std::string>();
    if (routing == "softmax_topk") c.routing.kind = routing_kind::softmax_topk;
    else if (routing == "topk_softmax") c.routing.kind = routing_kind::topk_softmax;
    else if (routing == "sigmoid_grouped_topk") c.routing.kind = routing_kind::sigmoid_grouped_topk;
    else throw std::runtime_error("unknown routing '" + routing + "'");
    c.routing.top_k = j.at("top_k").get<int>();
    c.routing.renormalize = j.value("renormalize", true);
    c.routing.n_group = j.value("n_group", 1);
    c.routing.topk_group = j.value("topk_group", 1);
    c.routing.routed_scaling_factor = j.value("routed_scaling_factor", 1.0f);
    const std::string act = j.at("activation").get<std::string>();
    if (act == "silu_mul") c.activation.kind = activation_kind::silu_mul;
    else if (act == "swiglu_clamped") c.activation.kind = activation_kind::swiglu_clamped;
    else throw std::runtime_error("unknown activation '" + act + "'");
    c.activation.alpha = j.value("alpha", 1.702f);
    c.activation.limit = j.value("limit", 7.0f);
    if (j.value("gate_up", std::string("interleaved")) == "concatenated") c.gate_up = layout::gate_up_order::concatenated;
  } catch (const std::exception& e) {
    MXMOE_CHECK_ARG(false, "mxmoe.moe_config", "a JSON MoE configuration (routing, top_k, activation, ...)",
                    std::string("'") + text.substr(0, 200) + "' (" + e.what() + ")");
  }
  return c;
}

moe_config layer_config(const safetensors_reader& file, const moe_layer_info& info) {
  const auto it = file.metadata().find("mxmoe.moe_config");
  if (it != file.metadata().end()) return config_from_json(it->second, info.shape);
  moe_config c;
  c.shape = info.shape;
  c.gate_up = layout::gate_up_order::interleaved;
  const auto k = [&](int want) { return static_cast<int>(std::min<int64_t>(want, info.shape.experts)); };
  if (info.layout != moe_layout::bf16_per_expert) {
    c.routing = {routing_kind::topk_softmax, k(4), false, 1, 1, 1.0f};
    c.activation.kind = activation_kind::swiglu_clamped;
  } else if (!info.correction_bias.empty()) {
    const bool v3_groups = info.shape.experts % 8 == 0;
    c.routing = {routing_kind::sigmoid_grouped_topk, k(8), true, v3_groups ? 8 : 1, v3_groups ? 4 : 1, 2.5f};
    if (c.routing.top_k > c.routing.topk_group * info.shape.experts / c.routing.n_group) c.routing.n_group = c.routing.topk_group = 1;
  } else {
    c.routing = {routing_kind::softmax_topk, k(8), true, 1, 1, 1.0f};
  }
  return c;
}

namespace {
// The biases and router tensors a layer carries, whatever its weight format.
void attach_layer_tensors(const safetensors_reader& file, const moe_layer_info& info, moe_weights& w) {
  if (!info.gate_up_bias.empty()) w.gate_up_bias = file.tensor(info.gate_up_bias);
  if (!info.down_bias.empty()) w.down_bias = file.tensor(info.down_bias);
  if (!info.router_weight.empty()) w.router_weight = file.tensor(info.router_weight);
  if (!info.router_bias.empty()) w.router_bias = file.tensor(info.router_bias);
  if (!info.correction_bias.empty()) {
    // The routing reads the correction bias as float32 (moe.h); say so in the file's terms
    // rather than letting validate() name an internal field.
    const safetensors_entry& e = file.entry(info.correction_bias);
    if (e.type != dtype::f32)
      throw format_error(file.path(), e.name, std::string("dtype ") + safetensors_dtype_name(e.type) + ", expected F32");
    w.correction_bias = file.tensor(info.correction_bias);
  }
}
}  // namespace

moe_weights mxfp4_weights(const safetensors_reader& file, const moe_layer_info& info) {
  MXMOE_CHECK_ARG(info.layout == moe_layout::mxfp4_gpt_oss, "checkpoint", "an MXFP4 layer",
                  std::string("a layer in layout ") + to_string(info.layout) + " (run `mxmoe quantize` first)");
  const mxfp4_names n = mxfp4_tensor_names(info.prefix);
  moe_weights w;
  w.format = weight_format::mxfp4;
  w.gate_up_blocks = file.tensor(n.gate_up_blocks);
  w.gate_up_scales = file.tensor(n.gate_up_scales);
  w.down_blocks = file.tensor(n.down_blocks);
  w.down_scales = file.tensor(n.down_scales);
  attach_layer_tensors(file, info, w);
  return w;
}

namespace {
// Rows [n0, n1) of row-major [rows, K] from the x·W form [K, rows], in tiles of 32 k by the band's
// rows, so that both sides are read and written a cache line at a time (an element-wise walk down
// the columns misses on every one). The x·W form is affine in (n, k): its two strides are read off
// layout::matrix_source once, and the inner loop is a strided copy.
template <class T>
void transpose_tiles(const uint8_t* src_bytes, const layout::matrix_source& s, int64_t n0, int64_t n1, uint8_t* dst_bytes) {
  constexpr int64_t kTile = 32;
  const T* src = reinterpret_cast<const T*>(src_bytes);
  T* dst = reinterpret_cast<T*>(dst_bytes);
  const int64_t origin = s.offset(0, 0);
  const int64_t n_stride = s.rows > 1 ? s.offset(1, 0) - origin : 0;
  const int64_t k_stride = s.cols > 1 ? s.offset(0, 1) - origin : 0;
  for (int64_t k0 = 0; k0 < s.cols; k0 += kTile) {
    const int64_t kn = std::min(kTile, s.cols - k0);
    for (int64_t n = n0; n < n1; ++n) {
      const T* from = src + origin + n * n_stride + k0 * k_stride;
      T* to = dst + (n - n0) * s.cols + k0;
      for (int64_t k = 0; k < kn; ++k) to[k] = from[k * k_stride];
    }
  }
}
}  // namespace

layout::checkpoint_xw gate_up_xw_geometry(const moe_shape& s) { return {s.experts, 2 * s.intermediate, s.hidden}; }
layout::checkpoint_xw down_xw_geometry(const moe_shape& s) { return {s.experts, s.hidden, s.intermediate}; }

uint64_t expert_matrix::bytes() const {
  uint64_t n = 0;
  for (const auto& p : pieces) n += p.bytes;
  return n;
}

expert_matrix expert_matrix_of(const safetensors_reader& file, const moe_layer_info& info, int64_t expert, bool gate_up) {
  MXMOE_CHECK_ARG(info.layout != moe_layout::mxfp4_gpt_oss, "checkpoint", "a BF16 layer", "an MXFP4 layer");
  MXMOE_CHECK_ARG(expert >= 0 && expert < info.shape.experts, "expert",
                  "in [0, " + std::to_string(info.shape.experts) + ")", std::to_string(expert));
  const int64_t H = info.shape.hidden, I = info.shape.intermediate;
  const uint64_t es = static_cast<uint64_t>(dtype_size(info.weight_type));
  expert_matrix m;
  m.type = info.weight_type;
  const int64_t rows = gate_up ? 2 * I : H, cols = gate_up ? H : I;
  const auto piece = [&](const std::string& name, uint64_t offset, int64_t r, int64_t c) {
    return matrix_piece{&file.entry(name), offset, static_cast<uint64_t>(r * c) * es, r, c};
  };
  if (info.layout == moe_layout::bf16_gpt_oss) {
    // Column c of gate_up_proj[e] is checkpoint row c: the interleaved order is kept as it is.
    const bf16_names n = bf16_gpt_oss_tensor_names(info.prefix);
    const layout::checkpoint_xw xw = gate_up ? gate_up_xw_geometry(info.shape) : down_xw_geometry(info.shape);
    m.source = {layout::source_order::xw, rows, cols};
    m.pieces.push_back(piece(gate_up ? n.gate_up : n.down, static_cast<uint64_t>(xw.offset(expert, 0, 0)) * es, cols, rows));
    return m;
  }
  const std::string ep = info.prefix + "experts." + std::to_string(expert) + ".";
  if (gate_up) {
    m.source = {layout::source_order::gate_up_pair, rows, cols};
    m.pieces.push_back(piece(ep + "gate_proj.weight", 0, I, H));
    m.pieces.push_back(piece(ep + "up_proj.weight", 0, I, H));
  } else {
    m.source = {layout::source_order::row_major, rows, cols};
    m.pieces.push_back(piece(ep + "down_proj.weight", 0, H, I));
  }
  return m;
}

void reorder_rows(const expert_matrix& m, const uint8_t* const* pieces, int64_t n0, int64_t n1, uint8_t* dst) {
  const layout::matrix_source& s = m.source;
  MXMOE_CHECK_ARG(0 <= n0 && n0 <= n1 && n1 <= s.rows, "rows", "0 <= n0 <= n1 <= " + std::to_string(s.rows),
                  "[" + std::to_string(n0) + ", " + std::to_string(n1) + ")");
  const size_t es = static_cast<size_t>(dtype_size(m.type));
  if (s.order == layout::source_order::xw) {
    if (es == 2) transpose_tiles<uint16_t>(pieces[0], s, n0, n1, dst);
    else transpose_tiles<uint32_t>(pieces[0], s, n0, n1, dst);
    return;
  }
  // Every row is contiguous in one piece (the pieces split the source at whole rows).
  const int64_t piece_elements = s.size() / static_cast<int64_t>(m.pieces.size());
  const size_t row_bytes = static_cast<size_t>(s.cols) * es;
  for (int64_t n = n0; n < n1; ++n) {
    const int64_t at = s.offset(n, 0);
    std::memcpy(dst + static_cast<size_t>(n - n0) * row_bytes,
                pieces[at / piece_elements] + static_cast<size_t>(at % piece_elements) * es, row_bytes);
  }
}

void reorder_matrix(const expert_matrix& m, const uint8_t* const* pieces, uint8_t* dst) {
  reorder_rows(m, pieces, 0, m.source.rows, dst);
}

expert_weights read_expert(const safetensors_reader& file, const moe_layer_info& info, int64_t expert,
                           std::vector<uint8_t>& gate_up_buf, std::vector<uint8_t>& down_buf) {
  expert_weights w;
  for (const bool gate_up : {true, false}) {
    const expert_matrix m = expert_matrix_of(file, info, expert, gate_up);
    std::vector<uint8_t>& buf = gate_up ? gate_up_buf : down_buf;
    buf.resize(m.bytes());
    std::vector<const uint8_t*> pieces;
    for (const auto& p : m.pieces) pieces.push_back(file.bytes(*p.entry).data() + p.offset);
    reorder_matrix(m, pieces.data(), buf.data());
    (gate_up ? w.gate_up : w.down) = tensor_view(buf.data(), m.type, {m.source.rows, m.source.cols});
  }
  return w;
}

moe_weights bf16_weights(const safetensors_reader& file, const moe_layer_info& info, std::vector<uint16_t>& gate_up,
                         std::vector<uint16_t>& down) {
  const int64_t E = info.shape.experts, H = info.shape.hidden, I = info.shape.intermediate;
  gate_up.resize(static_cast<size_t>(E * 2 * I * H));
  down.resize(static_cast<size_t>(E * H * I));
  std::vector<uint8_t> gu_buf, dn_buf;
  const auto to_bf16 = [](const tensor_view& v, uint16_t* dst) {
    for (int64_t i = 0; i < v.numel(); ++i) dst[i] = float_to_bf16(load_float(v.data, v.type, i));
  };
  for (int64_t e = 0; e < E; ++e) {
    const expert_weights x = read_expert(file, info, e, gu_buf, dn_buf);
    to_bf16(x.gate_up, gate_up.data() + e * 2 * I * H);
    to_bf16(x.down, down.data() + e * H * I);
  }
  moe_weights w;
  w.format = weight_format::bf16;
  w.gate_up = tensor_view(gate_up.data(), dtype::bf16, {E, 2 * I, H});
  w.down = tensor_view(down.data(), dtype::bf16, {E, H, I});
  attach_layer_tensors(file, info, w);
  return w;
}

}  // namespace mxmoe::checkpoint
