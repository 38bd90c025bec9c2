// `mxmoe run`: one MoE layer (from an MXFP4 checkpoint or a synthetic preset) on cuda or cpu,
// verified against the CPU reference.
#include <fmt/core.h>

#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "nonfinite.h"
#include "parallel_run.h"
#include "mxmoe/checkpoint.h"
#include "mxmoe/error.h"
#include "mxmoe/presets.h"
#include "mxmoe/safetensors.h"
#include "mxmoe/synthetic.h"
#include "mxmoe/verify.h"

namespace mxmoe::cli {
namespace {

// The most multiply-adds (T x top_k x 3 x H x I) a run gives the CPU: the reference, and the cpu
// backend itself. The float64 reference does about 1e10 per second on 2 cores (measured: qwen3-30b-a3b
// with 8 experts, T = 256, 0.8 s) and the cpu backend about 2e10, so the bound is about 100 s of
// reference; docs/cli.md states it. Above it: a GPU run with --reference none.
constexpr double kMaxCpuMultiplyAdds = 1e12;
constexpr double kReferenceMultiplyAddsPerSecond = 1e10;

double multiply_adds(const moe_config& cfg, int64_t tokens) {
  return static_cast<double>(tokens) * cfg.routing.top_k * 3.0 * static_cast<double>(cfg.shape.hidden) *
         static_cast<double>(cfg.shape.intermediate);
}

// T of the inputs file (x [T, H] of a float type).
int64_t input_tokens(const safetensors_reader& r, const moe_config& cfg) {
  const auto& x = r.entry("x");
  MXMOE_CHECK_ARG(is_float_type(x.type) && x.shape.size() == 2 && x.shape[1] == cfg.shape.hidden, "--inputs x",
                  "a float tensor [T, " + std::to_string(cfg.shape.hidden) + "]",
                  std::string(safetensors_dtype_name(x.type)) + " " + shape_string(x.shape));
  return x.shape[0];
}

// x and logits from a safetensors file (any float dtype; x rounded to bf16).
synthetic::layer_inputs read_inputs(const safetensors_reader& r, const moe_config& cfg) {
  const int64_t T = input_tokens(r, cfg);
  const auto& x = r.entry("x");
  const auto& logits = r.entry("logits");
  MXMOE_CHECK_ARG(is_float_type(logits.type) && logits.shape == std::vector<int64_t>({T, cfg.shape.experts}),
                  "--inputs logits",
                  "a float tensor [" + std::to_string(T) + ", " + std::to_string(cfg.shape.experts) + "]",
                  std::string(safetensors_dtype_name(logits.type)) + " " + shape_string(logits.shape));
  synthetic::layer_inputs in;
  in.tokens = T;
  in.hidden = cfg.shape.hidden;
  in.experts = cfg.shape.experts;
  in.x.resize(static_cast<size_t>(T * cfg.shape.hidden));
  for (size_t i = 0; i < in.x.size(); ++i) in.x[i] = float_to_bf16(load_float(r.bytes(x).data(), x.type, static_cast<int64_t>(i)));
  in.logits.resize(static_cast<size_t>(T * cfg.shape.experts));
  for (size_t i = 0; i < in.logits.size(); ++i) in.logits[i] = load_float(r.bytes(logits).data(), logits.type, static_cast<int64_t>(i));
  return in;
}

struct run_args {
  std::string checkpoint, preset, inputs, output, reference = "auto";
  int64_t layer = -1, experts = 0, tokens = -1;
  uint64_t seed = 0;
  bool force = false, json = false;
  backend_request device = backend_request::automatic;
  parallel_request parallel;  // --ep / --tp
};

int run_layer(const run_args& a) {
  MXMOE_CHECK_ARG(a.checkpoint.empty() != a.preset.empty(), "--checkpoint/--preset", "exactly one of them",
                  a.checkpoint.empty() ? "neither" : "both");
  MXMOE_CHECK_ARG(a.tokens < 0 || a.inputs.empty(), "--tokens", "not given together with --inputs (T comes from x)",
                  std::to_string(a.tokens));
  MXMOE_CHECK_ARG(a.experts == 0 || !a.preset.empty(), "--experts", "only with --preset", std::to_string(a.experts));
  MXMOE_CHECK_ARG(a.output.empty() || a.force || !std::filesystem::exists(a.output), "--output",
                  "a path that does not exist (or --force)", a.output);
  MXMOE_CHECK_ARG(!(a.reference == "f32" && a.device == backend_request::cpu), "--reference",
                  "f64 or none for the cpu backend (f32 would compare it with itself)", "f32");
  const backend_choice backend = choose_device(a.device);

  std::unique_ptr<safetensors_reader> file;
  synthetic::mxfp4_layer synthetic;
  moe_config cfg;
  moe_weights weights;
  std::string source;
  std::vector<named_tensor> given;  // checked for NaN / Inf before anything runs
  bool preset_biases = false;       // synthetic weights are made once the work is known to be bounded
  if (!a.checkpoint.empty()) {
    file = std::make_unique<safetensors_reader>(a.checkpoint);
    checkpoint::moe_layer_info info;
    if (a.layer >= 0) {
      info = checkpoint::find_moe_layer(*file, a.layer);
    } else {
      const auto layers = checkpoint::find_moe_layers(*file);
      MXMOE_CHECK_ARG(!layers.empty(), "--checkpoint", "a file with MoE layers", "none in " + a.checkpoint);
      info = layers.front();
    }
    cfg = checkpoint::layer_config(*file, info);
    weights = checkpoint::mxfp4_weights(*file, info);
    source = a.checkpoint + " layer " + std::to_string(info.layer);
    const checkpoint::mxfp4_names n = checkpoint::mxfp4_tensor_names(info.prefix);
    given = {{info.router_weight, weights.router_weight},     {info.router_bias, weights.router_bias},
             {info.correction_bias, weights.correction_bias}, {info.gate_up_bias, weights.gate_up_bias},
             {info.down_bias, weights.down_bias},             {n.gate_up_scales, weights.gate_up_scales, true},
             {n.down_scales, weights.down_scales, true}};
  } else {
    const model_preset* p = find_model_preset(a.preset);
    MXMOE_CHECK_ARG(p != nullptr, "--preset", "one of " + model_preset_names(), a.preset);
    cfg = p->config;
    if (a.experts > 0) cfg.shape.experts = a.experts;
    preset_biases = p->has_biases;
    source = "preset " + a.preset + " (synthetic weights, E=" + std::to_string(cfg.shape.experts) + ")";
  }
  validate(cfg);
  std::unique_ptr<safetensors_reader> inputs_file;
  if (!a.inputs.empty()) inputs_file = std::make_unique<safetensors_reader>(a.inputs);
  const int64_t tokens = inputs_file ? input_tokens(*inputs_file, cfg) : a.tokens < 0 ? 16 : a.tokens;
  MXMOE_CHECK_ARG(tokens >= 1, "--inputs x", "at least one token", "T = 0");
  MXMOE_CHECK_ARG((backend.device == device_kind::cuda && a.reference == "none") ||
                      multiply_adds(cfg, tokens) <= kMaxCpuMultiplyAdds,
                  inputs_file ? "--inputs" : "--tokens",
                  fmt::format("at most {} tokens for this layer: a run does at most {:.0e} multiply-adds "
                              "(T x top_k x 3 x H x I) on the CPU, about {:.0f} s of the float64 reference at the "
                              "{:.0e}/s measured on 2 cores; above it, run on a GPU without verification "
                              "(--device cuda --reference none)",
                              static_cast<int64_t>(kMaxCpuMultiplyAdds / multiply_adds(cfg, 1)), kMaxCpuMultiplyAdds,
                              kMaxCpuMultiplyAdds / kReferenceMultiplyAddsPerSecond, kReferenceMultiplyAddsPerSecond),
                  fmt::format("T = {}: {:.1e} multiply-adds, about {:.0f} s", tokens, multiply_adds(cfg, tokens),
                              multiply_adds(cfg, tokens) / kReferenceMultiplyAddsPerSecond));
  if (!a.preset.empty()) {
    synthetic = synthetic::make_layer(cfg, {.biases = preset_biases}, a.seed);
    weights = synthetic.weights();
  }
  validate(weights, cfg);
  check_finite(given);
  const synthetic::layer_inputs in =
      inputs_file ? read_inputs(*inputs_file, cfg) : synthetic::make_inputs(cfg, weights, tokens, a.seed + 1);
  if (inputs_file)
    check_finite({{"x of --inputs " + a.inputs, in.x_view()}, {"logits of --inputs " + a.inputs, in.routing().logits}});
  // The CPU backend is f32: only an f64 reference checks it. For the GPU an f32 reference is
  // tight enough (its error is far below the bf16 threshold) and much faster on big shapes.
  const std::optional<cpu::precision> reference =
      a.reference == "none"  ? std::nullopt
      : a.reference == "f64" ? std::optional(cpu::precision::f64)
      : a.reference == "f32" ? std::optional(cpu::precision::f32)
                             : std::optional(auto_reference(backend.device, cfg, in.tokens));
  parallel_outcome split;  // --ep / --tp: the layer over P ranks (parallel_run.h)
  const bool parallel = a.parallel.ep > 1 || a.parallel.tp > 1;
  verified_run run;
  if (parallel) {
    split = run_verified_parallel(weights, cfg, in, backend.device, reference, a.parallel);
    run = std::move(split.run);
  } else {  // the bar is cleared before the result is printed
    progress_bar bar("run");
    run = run_verified(weights, cfg, in, backend.device, reference, bar.callback());
  }
  const std::optional<verify_result>& v = run.check;
  const std::string reference_label = reference ? reference_name(*reference) : "none";

  if (!a.output.empty() && split.primary) {
    const std::vector<std::pair<std::string, tensor_view>> tensors{
        {"out", tensor_view(run.out.data(), dtype::f32, {in.tokens, cfg.shape.hidden})}};
    write_safetensors(a.output, tensors, {{"mxmoe.backend", backend.name}}, a.force);
  }
  if (a.json) {
    nlohmann::json j = {{"source", source},
                        {"tokens", in.tokens},
                        {"experts", cfg.shape.experts},
                        {"hidden", cfg.shape.hidden},
                        {"intermediate", cfg.shape.intermediate},
                        {"top_k", cfg.routing.top_k},
                        {"routing", to_string(cfg.routing.kind)},
                        {"activation", to_string(cfg.activation.kind)},
                        {"backend", backend.name},
                        {"reason", backend.reason},
                        {"reference", reference_label},
                        {"verified", v.has_value()},
                        {"rel_l2", v ? nlohmann::json(v->error.rel_l2) : nlohmann::json()},
                        {"max_abs", v ? nlohmann::json(v->error.max_abs) : nlohmann::json()},
                        {"threshold", v ? nlohmann::json(v->tolerance.rel_l2) : nlohmann::json()},
                        {"passed", v ? nlohmann::json(v->passed()) : nlohmann::json()},
                        {"backend_seconds", run.backend_seconds},
                        {"reference_seconds", v ? nlohmann::json(v->reference_seconds) : nlohmann::json()}};
    if (parallel) j["parallel"] = split.description;
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print("layer: {}; T={} E={} H={} I={} top-{} {} {}\n", source, in.tokens, cfg.shape.experts, cfg.shape.hidden,
               cfg.shape.intermediate, cfg.routing.top_k, to_string(cfg.routing.kind), to_string(cfg.activation.kind));
    fmt::print("backend: {} ({})\n", backend.name, backend.reason);
    if (parallel) fmt::print("parallel: {}\n", split.description);
    if (v)
      fmt::print("verify vs {} reference: rel-L2 {:.3e}, max abs {:.3e}, threshold rel-L2 {:.0e}: {}\n", reference_label,
                 v->error.rel_l2, v->error.max_abs, v->tolerance.rel_l2, v->passed() ? "PASS" : "FAIL");
    else
      fmt::print("not verified (--reference none)\n");
    if (!a.output.empty()) fmt::print("wrote out [{}, {}] f32 to {}\n", in.tokens, cfg.shape.hidden, a.output);
  }
  return !v || v->passed() ? kOk : kVerificationFailed;
}

}  // namespace

command add_run_command(CLI::App& root) {
  auto a = std::make_shared<run_args>();
  CLI::App* cmd = root.add_subcommand("run", "Run one MoE layer on cuda or cpu and verify it against the reference");
  set_details(cmd, std::string() +
      "Runs one MoE layer — from an MXFP4 checkpoint (--checkpoint, --layer) or a model preset with synthetic MXFP4 "
      "weights (--preset; --experts shrinks E to fit host memory) — on the chosen backend, then checks the output "
      "against the CPU reference (cpu::moe_forward in float64; float32 for GPU runs of more than 4e9 multiply-adds "
      "unless --reference f64; none: not verified) on the same weights and inputs. Prints rel-L2 and max abs error "
      "and the threshold (" + thresholds_text() + "); exit code 1 when it fails.\n"
      "Inputs: --inputs F with tensors \"x\" [T, H] and \"logits\" [T, E] (any float dtype; x is rounded to bf16), "
      "or generated from --seed (x ~ N(0,1); logits from the checkpoint's router weights when present, else N(0,1)).\n"
      "The routing and activation come from the checkpoint's mxmoe.moe_config metadata (written by quantize), else "
      "from the model family the tensor names imply.\n\n"
      "Examples:\n  mxmoe run --preset qwen3-30b-a3b --experts 16 --tokens 8 --device cpu\n"
      "  mxmoe run --checkpoint model-mxfp4.safetensors --layer 0 --inputs acts.safetensors --output out.safetensors\n"
      "  mxmoe run --preset gpt-oss-120b --tokens 32 --device cuda --json");
  cmd->add_option("--checkpoint", a->checkpoint, "MXFP4 checkpoint (gpt-oss layout)")->check(existing_file());
  cmd->add_option("--layer", a->layer, "MoE layer index (default: the first one)")->check(integer_in(0, 999999999));
  cmd->add_option("--preset", a->preset, model_preset_names());
  cmd->add_option("--experts", a->experts, "with --preset: use this many experts instead of the model's")
      ->check(integer_in(1, 512));
  cmd->add_option("--tokens", a->tokens, "tokens T when generating inputs (default 16)")
      ->check(integer_in(1, int64_t{1} << 20));
  cmd->add_option("--seed", a->seed, "seed of generated weights and inputs")
      ->check(integer_in(0, std::numeric_limits<long long>::max()))
      ->default_val(0);
  add_device_option(cmd, &a->device);
  cmd->add_option("--inputs", a->inputs, "safetensors file with x [T, H] and logits [T, E]")->check(existing_file());
  cmd->add_option("--output", a->output, "write the backend's output \"out\" [T, H] f32 to this safetensors file")
      ->check(output_path());
  cmd->add_option("--reference", a->reference,
                  "reference precision: auto, f64, f32, or none (not verified; the only way past the CPU bound, "
                  "with --device cuda)")
      ->transform(one_of({"auto", "f64", "f32", "none"}))
      ->default_val("auto");
  cmd->add_flag("--force", a->force, "replace the --output file if it exists");
  cmd->add_flag("--json", a->json, "print the result as JSON on stdout");
  // Expert / tensor parallelism (docs/parallel.md): in this process over an in-process group, or one
  // rank of an NCCL group when launched by scripts/launch.sh.
  cmd->add_option("--ep", a->parallel.ep, "expert parallelism over P ranks (T a multiple of P)")
      ->check(integer_in(1, 512));
  cmd->add_option("--tp", a->parallel.tp, "tensor parallelism over P ranks (whole 32-blocks of I each)")
      ->check(integer_in(1, 512));
  return {cmd, [a] { return run_layer(*a); }};
}

}  // namespace mxmoe::cli
