// `mxmoe inspect`: tensors of a safetensors file, the MoE layers found in it and, for MXFP4
// layers, scale statistics and which scale rules the data is consistent with (the census and the
// rule matching are the library's: include/mxmoe/inspect.h; this file prints them).
#include <fmt/core.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "mxmoe/checkpoint.h"
#include "mxmoe/inspect.h"
#include "mxmoe/safetensors.h"

namespace mxmoe::cli {
namespace {

double pct(int64_t part, int64_t whole) { return whole > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0; }

using checkpoint::scale_census;

nlohmann::json census_json(const scale_census& c) {
  nlohmann::json hist = nlohmann::json::object();
  for (int s = 0; s < 256; ++s)
    if (c.scale_histogram[static_cast<size_t>(s)]) hist[std::to_string(s)] = c.scale_histogram[static_cast<size_t>(s)];
  nlohmann::json consistent = nlohmann::json::array();
  for (mx::scale_rule r : mx::kAllScaleRules)
    if (c.consistent(r)) consistent.push_back(mx::to_string(r));
  return {{"blocks", c.blocks},
          {"scale_histogram", hist},
          {"nan_scales", c.scale_histogram[mx::kE8M0Nan]},
          {"max_code_histogram", c.max_code_histogram},
          {"blocks_at_6_pct", pct(c.max_code_histogram[7], c.blocks)},
          {"consistent_rules", consistent}};
}

void print_census(const std::string& name, const scale_census& c) {
  fmt::print("  {}: {} blocks\n", name, c.blocks);
  int lo = 256, hi = -1;
  for (int s = 0; s < 255; ++s)
    if (c.scale_histogram[static_cast<size_t>(s)]) lo = std::min(lo, s), hi = std::max(hi, s);
  fmt::print("    scale bytes (2^(s-127)):");
  if (hi >= 0)
    for (int s = lo; s <= hi; ++s)
      if (c.scale_histogram[static_cast<size_t>(s)])
        fmt::print(" {}:{:.1f}%", s, pct(c.scale_histogram[static_cast<size_t>(s)], c.blocks));
  fmt::print("\n    0xFF (NaN) scales: {}\n", c.scale_histogram[mx::kE8M0Nan]);
  fmt::print("    largest |value| per block: 6.0 {:.1f}%  4.0 {:.1f}%  3.0 {:.1f}%  2.0 {:.1f}%  <=1.5 {:.1f}%  zero {:.1f}%\n",
             pct(c.max_code_histogram[7], c.blocks), pct(c.max_code_histogram[6], c.blocks), pct(c.max_code_histogram[5], c.blocks),
             pct(c.max_code_histogram[4], c.blocks),
             pct(c.max_code_histogram[1] + c.max_code_histogram[2] + c.max_code_histogram[3], c.blocks), pct(c.max_code_histogram[0], c.blocks));
  std::string consistent;
  for (mx::scale_rule r : mx::kAllScaleRules)
    if (c.consistent(r)) consistent += std::string(consistent.empty() ? "" : ", ") + mx::to_string(r);
  fmt::print("    consistent with: {}\n", consistent.empty() ? "no rule (scales from another scheme)" : consistent);
}

struct inspect_args {
  std::string file, source;
  bool json = false;
};

int run_inspect(const inspect_args& a) {
  const safetensors_reader r(a.file);
  std::unique_ptr<safetensors_reader> source;
  if (!a.source.empty()) source = std::make_unique<safetensors_reader>(a.source);
  const checkpoint::moe_layer_scan scan = checkpoint::scan_moe_layers(r);
  const auto& layers = scan.layers;
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
  j["refused_layers"] = nlohmann::json::array();
  for (const auto& f : scan.refused) {
    j["refused_layers"].push_back({{"layer", f.layer}, {"prefix", f.prefix}, {"tensor", f.tensor}, {"reason", f.reason}});
    if (!a.json) fmt::print("MoE layer {} ({}): refused: {}\n", f.layer, f.prefix, f.reason);
  }
  for (const auto& l : layers) {
    nlohmann::json lj = {{"layer", l.layer},
                         {"prefix", l.prefix},
                         {"layout", checkpoint::layout_label(l)},
                         {"weight_dtype", to_string(l.weight_type)},
                         {"experts", l.shape.experts},
                         {"hidden", l.shape.hidden},
                         {"intermediate", l.shape.intermediate},
                         {"biases", !l.gate_up_bias.empty() || !l.down_bias.empty()},
                         {"router", l.router_weight}};
    if (!a.json)
      fmt::print("MoE layer {} ({}): {}, E={} H={} I={}{}{}\n", l.layer, l.prefix, checkpoint::layout_label(l),
                 l.shape.experts, l.shape.hidden, l.shape.intermediate, l.gate_up_bias.empty() ? "" : ", biases",
                 l.router_weight.empty() ? "" : ", router " + l.router_weight);
    if (l.layout == checkpoint::moe_layout::mxfp4_gpt_oss) {
      const auto n = checkpoint::mxfp4_tensor_names(l.prefix);
      const std::tuple<std::string, std::string, layout::checkpoint_mxfp4> weights[] = {
          {n.gate_up_blocks, n.gate_up_scales, checkpoint::gate_up_geometry(l.shape)},
          {n.down_blocks, n.down_scales, checkpoint::down_geometry(l.shape)}};
      for (const auto& [blocks, scales, geometry] : weights) {
        const scale_census c = checkpoint::take_census(geometry, r.bytes(r.entry(blocks)).data(), r.bytes(r.entry(scales)).data());
        lj["weights"][blocks] = census_json(c);
        if (!a.json) print_census(blocks, c);
      }
      if (source) {
        std::array<checkpoint::rule_match, checkpoint::kRuleCount> m;
        {  // the bar is cleared before the results are printed
          progress_bar bar("inspect");
          m = checkpoint::match_scale_rules(r, l, *source, bar.callback());
        }
        for (size_t k = 0; k < checkpoint::kRuleCount; ++k) {
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
  if (!scan.refused.empty()) {
    fmt::print(stderr, "mxmoe: {} MoE layer{} refused (listed above)\n", scan.refused.size(), scan.refused.size() == 1 ? "" : "s");
    return kBadInput;
  }
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
  cmd->add_option("FILE", a->file, "safetensors file")->required()->check(existing_file());
  cmd->add_option("--source", a->source, "the BF16 checkpoint FILE was quantized from: recompute every rule")
      ->check(existing_file());
  cmd->add_flag("--json", a->json, "print the report as JSON on stdout");
  return {cmd, [a] { return run_inspect(*a); }};
}

}  // namespace mxmoe::cli
