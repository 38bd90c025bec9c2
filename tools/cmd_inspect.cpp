// `mxmoe inspect`: tensors of a safetensors file, the MoE layers found in it and, for MXFP4
// layers, scale statistics and which scale rules the data is consistent with.
//
// Without the BF16 source only a necessary condition can be checked: a rule fixes where the
// block maximum may land relative to the scale (amax / 2^(s-127) lies in [4, 8) for floor,
// [3.5, 7) for even, (3, 6] for rceil, [2, 16) for mse), so the largest |code| of a block is in
// {6, 7} for floor and even, {5, 6, 7} for rceil and {4, ..., 7} for mse. With --source the
// scales are recomputed from the BF16 weights with every rule and compared byte for byte.
#include <fmt/core.h>

#include <array>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "convert.h"
#include "mxmoe/checkpoint.h"
#include "mxmoe/error.h"
#include "mxmoe/safetensors.h"

namespace mxmoe::cli {
namespace {

struct scale_census {
  int64_t blocks = 0;
  std::array<int64_t, 256> scale_hist{};
  std::array<int64_t, 8> max_code_hist{};  // largest |code| of the block (0 = all zero)
  int64_t clamped_range = 0;               // scale byte 0 or 254: the rule's window may not apply
  std::array<int64_t, 4> inconsistent{};   // per rule (mx::kAllScaleRules order)
};

// Smallest and largest max |code| each rule allows for a block of ordinary magnitude.
constexpr std::array<int, 4> kMinMaxCode{6, 6, 5, 4};

scale_census take_census(std::span<const uint8_t> blocks, std::span<const uint8_t> scales) {
  scale_census c;
  c.blocks = static_cast<int64_t>(scales.size());
  for (size_t b = 0; b < scales.size(); ++b) {
    const uint8_t s = scales[b];
    ++c.scale_hist[s];
    int max_code = 0;
    for (int i = 0; i < mx::kBlockSize; ++i)
      max_code = std::max(max_code, mx::unpack_e2m1(blocks[b * mx::kPackedBlockBytes + static_cast<size_t>(i / 2)], i) & 7);
    ++c.max_code_hist[static_cast<size_t>(max_code)];
    if (s == mx::kE8M0Nan || max_code == 0) continue;
    if (s == 0 || s == 254) {
      ++c.clamped_range;
      continue;
    }
    for (size_t r = 0; r < 4; ++r) c.inconsistent[r] += max_code < kMinMaxCode[r] ? 1 : 0;
  }
  return c;
}

double pct(int64_t part, int64_t whole) { return whole > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0; }

nlohmann::json census_json(const scale_census& c) {
  nlohmann::json hist = nlohmann::json::object();
  for (int s = 0; s < 256; ++s)
    if (c.scale_hist[static_cast<size_t>(s)]) hist[std::to_string(s)] = c.scale_hist[static_cast<size_t>(s)];
  nlohmann::json consistent = nlohmann::json::array();
  for (size_t r = 0; r < 4; ++r)
    if (c.inconsistent[r] == 0) consistent.push_back(mx::to_string(mx::kAllScaleRules[r]));
  return {{"blocks", c.blocks},
          {"scale_histogram", hist},
          {"nan_scales", c.scale_hist[mx::kE8M0Nan]},
          {"max_code_histogram", c.max_code_hist},
          {"blocks_at_6_pct", pct(c.max_code_hist[7], c.blocks)},
          {"consistent_rules", consistent}};
}

void print_census(const std::string& name, const scale_census& c) {
  fmt::print("  {}: {} blocks\n", name, c.blocks);
  int lo = 256, hi = -1;
  for (int s = 0; s < 255; ++s)
    if (c.scale_hist[static_cast<size_t>(s)]) lo = std::min(lo, s), hi = std::max(hi, s);
  fmt::print("    scale bytes (2^(s-127)):");
  if (hi >= 0)
    for (int s = lo; s <= hi; ++s)
      if (c.scale_hist[static_cast<size_t>(s)])
        fmt::print(" {}:{:.1f}%", s, pct(c.scale_hist[static_cast<size_t>(s)], c.blocks));
  fmt::print("\n    0xFF (NaN) scales: {}\n", c.scale_hist[mx::kE8M0Nan]);
  fmt::print("    largest |value| per block: 6.0 {:.1f}%  4.0 {:.1f}%  3.0 {:.1f}%  2.0 {:.1f}%  <=1.5 {:.1f}%  zero {:.1f}%\n",
             pct(c.max_code_hist[7], c.blocks), pct(c.max_code_hist[6], c.blocks), pct(c.max_code_hist[5], c.blocks),
             pct(c.max_code_hist[4], c.blocks),
             pct(c.max_code_hist[1] + c.max_code_hist[2] + c.max_code_hist[3], c.blocks), pct(c.max_code_hist[0], c.blocks));
  std::string consistent;
  for (size_t r = 0; r < 4; ++r)
    if (c.inconsistent[r] == 0) consistent += std::string(consistent.empty() ? "" : ", ") + mx::to_string(mx::kAllScaleRules[r]);
  fmt::print("    consistent with: {}\n", consistent.empty() ? "no rule (scales from another scheme)" : consistent);
}

struct rule_match {
  int64_t scales_equal = 0, blocks_equal = 0, blocks = 0;
};

// Recomputes every MXFP4 scale of `info` from the source's BF16 weights with each rule.
std::array<rule_match, 4> match_source(const safetensors_reader& file, const checkpoint::moe_layer_info& info,
                                       const safetensors_reader& source) {
  const auto src = checkpoint::find_moe_layer(source, info.layer);
  MXMOE_CHECK_ARG(src.layout != checkpoint::moe_layout::mxfp4_gpt_oss, "--source", "a BF16 checkpoint", "an MXFP4 one");
  MXMOE_CHECK_ARG(src.shape.experts == info.shape.experts && src.shape.hidden == info.shape.hidden &&
                      src.shape.intermediate == info.shape.intermediate,
                  "--source", "the same layer shape", "a different one for layer " + std::to_string(info.layer));
  const auto n = checkpoint::mxfp4_tensor_names(info.prefix);
  const auto gu = checkpoint::gate_up_geometry(info.shape), dn = checkpoint::down_geometry(info.shape);
  std::array<rule_match, 4> m{};
  std::vector<float> w13, w2;
  std::vector<uint8_t> packed, scales;
  for (int64_t e = 0; e < info.shape.experts; ++e) {
    checkpoint::read_expert_f32(source, src, e, w13, w2);
    for (const auto* g : {&gu, &dn}) {
      const bool is13 = g == &gu;
      const uint8_t* fb = file.bytes(file.entry(is13 ? n.gate_up_blocks : n.down_blocks)).data() + g->code_offset(e, 0, 0).byte;
      const uint8_t* fs = file.bytes(file.entry(is13 ? n.gate_up_scales : n.down_scales)).data() + g->scale_offset(e, 0, 0);
      packed.resize(static_cast<size_t>(g->rows * g->row_bytes()));
      scales.resize(static_cast<size_t>(g->rows * g->scale_cols()));
      for (size_t r = 0; r < 4; ++r) {
        quantize_matrix(is13 ? w13.data() : w2.data(), g->rows, g->cols, mx::kAllScaleRules[r], device_kind::cpu,
                        packed.data(), scales.data());
        for (size_t b = 0; b < scales.size(); ++b) {
          m[r].scales_equal += scales[b] == fs[b];
          m[r].blocks_equal += scales[b] == fs[b] && std::equal(packed.begin() + static_cast<int64_t>(b) * 16,
                                                                packed.begin() + static_cast<int64_t>(b + 1) * 16, fb + b * 16);
        }
        m[r].blocks += static_cast<int64_t>(scales.size());
      }
    }
  }
  return m;
}

struct inspect_args {
  std::string file, source;
  bool json = false;
};

int run_inspect(const inspect_args& a) {
  const safetensors_reader r(a.file);
  std::unique_ptr<safetensors_reader> source;
  if (!a.source.empty()) source = std::make_unique<safetensors_reader>(a.source);
  const auto layers = checkpoint::find_moe_layers(r);
  nlohmann::json j;
  j["file"] = a.file;
  j["metadata"] = r.metadata();
  j["tensors"] = nlohmann::json::array();
  if (!a.json) {
    fmt::print("{}: {} tensors\n", a.file, r.entries().size());
    for (const auto& [k, v] : r.metadata()) fmt::print("  metadata {} = {}\n", k, v.size() > 100 ? v.substr(0, 97) + "..." : v);
  }
  for (const auto& e : r.entries()) {
    j["tensors"].push_back({{"name", e.name}, {"dtype", safetensors_dtype_name(e.type)}, {"shape", e.shape}, {"bytes", e.nbytes()}});
    if (!a.json)
      fmt::print("  {:<60} {:<5} {:<24} {:>10.3f} MiB\n", e.name, safetensors_dtype_name(e.type), shape_string(e.shape),
                 e.nbytes() / 1048576.0);
  }
  j["moe_layers"] = nlohmann::json::array();
  for (const auto& l : layers) {
    nlohmann::json lj = {{"layer", l.layer},
                         {"prefix", l.prefix},
                         {"layout", checkpoint::to_string(l.layout)},
                         {"experts", l.shape.experts},
                         {"hidden", l.shape.hidden},
                         {"intermediate", l.shape.intermediate},
                         {"biases", !l.gate_up_bias.empty() || !l.down_bias.empty()},
                         {"router", l.router_weight}};
    if (!a.json)
      fmt::print("MoE layer {} ({}): {}, E={} H={} I={}{}{}\n", l.layer, l.prefix, checkpoint::to_string(l.layout),
                 l.shape.experts, l.shape.hidden, l.shape.intermediate, l.gate_up_bias.empty() ? "" : ", biases",
                 l.router_weight.empty() ? "" : ", router " + l.router_weight);
    if (l.layout == checkpoint::moe_layout::mxfp4_gpt_oss) {
      const auto n = checkpoint::mxfp4_tensor_names(l.prefix);
      const std::pair<std::string, std::string> weights[] = {{n.gate_up_blocks, n.gate_up_scales}, {n.down_blocks, n.down_scales}};
      for (const auto& [blocks, scales] : weights) {
        const scale_census c = take_census(r.bytes(r.entry(blocks)), r.bytes(r.entry(scales)));
        lj["weights"][blocks] = census_json(c);
        if (!a.json) print_census(blocks, c);
      }
      if (source) {
        const auto m = match_source(r, l, *source);
        for (size_t k = 0; k < 4; ++k) {
          const char* rule = mx::to_string(mx::kAllScaleRules[k]);
          lj["source_match"][rule] = {{"scales_equal_pct", pct(m[k].scales_equal, m[k].blocks)},
                                      {"blocks_equal_pct", pct(m[k].blocks_equal, m[k].blocks)}};
          if (!a.json)
            fmt::print("  rule {:<5} recomputed from {}: {:.2f}% of scales and {:.2f}% of blocks identical\n", rule,
                       a.source, pct(m[k].scales_equal, m[k].blocks), pct(m[k].blocks_equal, m[k].blocks));
        }
      }
    }
    j["moe_layers"].push_back(lj);
  }
  if (a.json) fmt::print("{}\n", j.dump(2));
  return kOk;
}

}  // namespace

command add_inspect_command(CLI::App& root) {
  auto a = std::make_shared<inspect_args>();
  CLI::App* cmd = root.add_subcommand("inspect", "List tensors, MoE layers and MXFP4 scale statistics of a safetensors file");
  set_details(cmd,
      "Lists every tensor (name, dtype, shape, size), the MoE layers found and their layout. For MXFP4 layers, per "
      "weight: the scale-byte histogram, 0xFF (NaN) scales, the distribution of each block's largest |value| "
      "(in units of its scale) and the scale rules the data is consistent with.\n"
      "Consistency is a necessary condition, checked per block: floor and even always put the block maximum at "
      "|code value| 4 or 6, rceil at 3, 4 or 6, mse at 2..6. So a block topping out at 3.0 rules out floor and even, "
      "one at 2.0 rules out rceil too. floor and even cannot be told apart without the source: floor leaves more "
      "blocks at 6.0 (about 68% for log-uniform magnitudes, even about 49%, rceil about 26%). Blocks with scale byte "
      "0 or 254 (clamped) and all-zero blocks are not judged.\n"
      "With --source BF16 (the checkpoint it was quantized from) every rule is recomputed and compared byte for byte: "
      "the rule that reproduces 100% of the scales and blocks is the one used.\n\n"
      "Examples:\n  mxmoe inspect model-mxfp4.safetensors\n"
      "  mxmoe inspect model-mxfp4.safetensors --source model-bf16.safetensors --json");
  cmd->add_option("FILE", a->file, "safetensors file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--source", a->source, "the BF16 checkpoint FILE was quantized from: recompute every rule")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--json", a->json, "print the report as JSON on stdout");
  return {cmd, [a] { return run_inspect(*a); }};
}

}  // namespace mxmoe::cli
