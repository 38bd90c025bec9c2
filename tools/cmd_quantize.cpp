// `mxmoe quantize` and `mxmoe dequantize`: checkpoint conversion with a per-tensor report.
#include <fmt/core.h>
#include <unistd.h>

#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "mxmoe/convert.h"

namespace mxmoe::cli {
namespace {

double pct(int64_t part, int64_t whole) { return whole > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0; }

nlohmann::json stats_json(const quant_stats& s) {
  const double sqnr = s.sqnr_db();
  return {{"elements", s.elements},
          {"blocks", s.blocks},
          {"sqnr_db", std::isfinite(sqnr) ? nlohmann::json(sqnr) : nlohmann::json(nullptr)},
          {"saturated_blocks", s.saturated_blocks},
          {"saturated_blocks_pct", pct(s.saturated_blocks, s.blocks)},
          {"clamped_elements", s.clamped_elements},
          {"flushed_elements", s.flushed_elements},
          {"flushed_pct", pct(s.flushed_elements, s.elements)},
          {"nonfinite_blocks", s.nonfinite_blocks}};
}

void print_stats_row(const std::string& name, const quant_stats& s) {
  fmt::print("  {:<52} {:>9.2f} {:>10.2f}% {:>9.3f}% {:>9}\n", name, s.sqnr_db(), pct(s.saturated_blocks, s.blocks),
             pct(s.flushed_elements, s.elements), s.nonfinite_blocks);
}

struct quantize_args {
  std::string in, out;
  mx::scale_rule rule = mx::scale_rule::even;
  bool force = false, json = false, allow_nonfinite = false;
  backend_request device = backend_request::automatic;
};

int run_quantize(const quantize_args& a) {
  const backend_choice backend = choose_device(a.device);
  quantize_report rep;
  {  // the bar is cleared before the report is printed
    progress_bar bar("quantize");
    quantize_options o;
    o.rule = a.rule;
    o.device = backend.device;
    o.overwrite = a.force;
    o.on_progress = bar.callback();
    o.allow_nonfinite = a.allow_nonfinite;
    rep = quantize_checkpoint(a.in, a.out, o);
  }
  if (a.json) {
    nlohmann::json j = {{"input", a.in},        {"output", a.out},
                        {"rule", mx::to_string(a.rule)}, {"backend", backend.name},
                        {"copied_tensors", rep.copied_tensors}, {"copied_bytes", rep.copied_bytes},
                        {"input_bytes", rep.input_bytes}, {"output_bytes", rep.output_bytes},
                        {"seconds", rep.seconds},    {"input_gb_per_s", rep.input_gb_per_s()},
                        {"workers", rep.workers},    {"total", stats_json(rep.total)}};
    for (const auto& t : rep.tensors) j["tensors"].push_back({{"name", t.name}, {"shape", t.shape}, {"stats", stats_json(t.stats)}});
    fmt::print("{}\n", j.dump(2));
    return kOk;
  }
  fmt::print("quantized {} -> {} with rule '{}' on {} ({})\n", a.in, a.out, mx::to_string(a.rule), backend.name, backend.reason);
  fmt::print("  {:<52} {:>9} {:>11} {:>10} {:>9}\n", "tensor", "SQNR dB", "saturated", "flushed", "NaN/Inf");
  for (const auto& t : rep.tensors) print_stats_row(t.name, t.stats);
  print_stats_row("total", rep.total);
  fmt::print("{} tensors quantized, {} copied ({:.1f} MiB); {:.1f} MiB -> {:.1f} MiB in {:.2f} s ({:.2f} GB/s of input, "
             "{} {})\n",
             rep.tensors.size(), rep.copied_tensors, rep.copied_bytes / 1048576.0, rep.input_bytes / 1048576.0,
             rep.output_bytes / 1048576.0, rep.seconds, rep.input_gb_per_s(), rep.workers,
             backend.device == device_kind::cuda ? "pipeline slots" : (rep.workers == 1 ? "thread" : "threads"));
  return kOk;
}

}  // namespace

command add_quantize_command(CLI::App& root) {
  auto a = std::make_shared<quantize_args>();
  CLI::App* cmd = root.add_subcommand("quantize", "Quantize a BF16 MoE checkpoint to MXFP4 (gpt-oss layout)");
  set_details(cmd,
      "Quantize the expert weights of a BF16 MoE checkpoint (safetensors; gpt-oss fused gate_up_proj/down_proj, or "
      "Qwen3/DeepSeek per-expert gate_proj/up_proj/down_proj) to MXFP4 in the gpt-oss layout "
      "(experts.gate_up_proj_blocks/_scales, experts.down_proj_blocks/_scales; gate/up rows interleaved). Every other "
      "tensor (router, biases, attention, embeddings, shared experts) is copied unchanged. Streams expert matrices "
      "(cpu: one worker thread per core; cuda: transposed and quantized on the GPU in a pipeline); the output is "
      "written to an unnamed temporary file and linked into place only when complete. NaN/Inf weights are refused "
      "(exit code 6) unless --allow-nonfinite.\n"
      "Report per quantized tensor: SQNR (dB), blocks with at least one element clamped to +-6 (saturated), non-zero "
      "elements flushed to 0, and NaN/Inf blocks (scale 0xFF).\n\n"
      "Examples:\n"
      "  mxmoe quantize model-bf16.safetensors model-mxfp4.safetensors --rule even\n"
      "  mxmoe quantize in.safetensors out.safetensors --rule mse --force --json > report.json");
  cmd->add_option("IN", a->in, "BF16 checkpoint (.safetensors)")->required()->check(CLI::ExistingFile);
  cmd->add_option("OUT", a->out, "MXFP4 checkpoint to write")->required()->check(output_path());
  add_rule_option(cmd, &a->rule)->required();
  cmd->add_flag("--force", a->force, "replace OUT if it exists (otherwise an existing OUT is an error, exit code 2)");
  cmd->add_flag("--allow-nonfinite", a->allow_nonfinite,
                "keep NaN/Inf weights as NaN blocks (scale 0xFF, counted in the NaN/Inf column); without it they are "
                "refused with exit code 6, naming the tensor, the expert and the first [row, col]");
  add_device_option(cmd, &a->device);
  cmd->add_flag("--json", a->json, "print the report as JSON on stdout");
  return {cmd, [a] { return run_quantize(*a); }};
}

command add_dequantize_command(CLI::App& root) {
  struct args {
    std::string in, out;
    bool force = false;
  };
  auto a = std::make_shared<args>();
  CLI::App* cmd = root.add_subcommand("dequantize", "Dequantize an MXFP4 MoE checkpoint to BF16 (gpt-oss BF16 layout)");
  set_details(cmd,
      "Expand every MXFP4 MoE layer to BF16 in the gpt-oss BF16 layout (experts.gate_up_proj [E, H, 2I] with "
      "interleaved gate/up columns, experts.down_proj [E, I, H]); every other tensor is copied. MXFP4 values are "
      "exact in BF16, so `quantize` of the result reproduces the same dequantized weights.\n\n"
      "Example:\n  mxmoe dequantize model-mxfp4.safetensors model-bf16.safetensors");
  cmd->add_option("IN", a->in, "MXFP4 checkpoint")->required()->check(CLI::ExistingFile);
  cmd->add_option("OUT", a->out, "BF16 checkpoint to write")->required()->check(output_path());
  cmd->add_flag("--force", a->force, "replace OUT if it exists");
  return {cmd, [a] {
            {
              progress_bar bar("dequantize");
              dequantize_checkpoint(a->in, a->out, {a->force, bar.callback()});
            }
            fmt::print("dequantized {} -> {}\n", a->in, a->out);
            return static_cast<int>(kOk);
          }};
}

}  // namespace mxmoe::cli
