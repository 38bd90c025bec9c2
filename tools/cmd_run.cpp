// `mxmoe run`: one MoE layer (from an MXFP4 checkpoint or a synthetic preset) on cuda or cpu,
// verified against the CPU reference.
#include <fmt/core.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "cli_common.h"
#include "layer_run.h"
#include "mxmoe/checkpoint.h"
#include "mxmoe/error.h"
#include "mxmoe/presets.h"
#include "mxmoe/safetensors.h"

namespace mxmoe::cli {
namespace {

// Synthetic MXFP4 weights: uniformly random codes, and per-block scales around 1/(2.93·sqrt(K))
// (2.93 is the RMS of a uniformly random E2M1 code), so that every GEMM output is O(1).
struct synthetic_layer {
  std::vector<uint8_t> gate_up_blocks, gate_up_scales, down_blocks, down_scales;
  std::vector<uint16_t> gate_up_bias, down_bias;
  moe_weights weights;
};

void fill_mxfp4(std::mt19937_64& rng, int64_t k, std::vector<uint8_t>& blocks, std::vector<uint8_t>& scales) {
  for (size_t i = 0; i < blocks.size(); i += 8) {
    const uint64_t r = rng();
    for (size_t b = 0; b < 8 && i + b < blocks.size(); ++b) blocks[i + b] = static_cast<uint8_t>(r >> (8 * b));
  }
  const int centre = 127 + static_cast<int>(std::lround(std::log2(1.0 / (2.93 * std::sqrt(static_cast<double>(k))))));
  std::uniform_int_distribution<int> jitter(-1, 1);
  for (auto& s : scales) s = static_cast<uint8_t>(centre + jitter(rng));
}

std::unique_ptr<synthetic_layer> make_synthetic(const moe_config& cfg, bool biases, uint64_t seed) {
  const int64_t E = cfg.shape.experts, H = cfg.shape.hidden, I = cfg.shape.intermediate;
  auto s = std::make_unique<synthetic_layer>();
  std::mt19937_64 rng(seed);
  s->gate_up_blocks.resize(static_cast<size_t>(E * 2 * I * H / 2));
  s->gate_up_scales.resize(static_cast<size_t>(E * 2 * I * H / 32));
  s->down_blocks.resize(static_cast<size_t>(E * H * I / 2));
  s->down_scales.resize(static_cast<size_t>(E * H * I / 32));
  fill_mxfp4(rng, H, s->gate_up_blocks, s->gate_up_scales);
  fill_mxfp4(rng, I, s->down_blocks, s->down_scales);
  moe_weights& w = s->weights;
  w.format = weight_format::mxfp4;
  w.gate_up_blocks = tensor_view(s->gate_up_blocks.data(), dtype::u8, {E, 2 * I, H / 32, 16});
  w.gate_up_scales = tensor_view(s->gate_up_scales.data(), dtype::u8, {E, 2 * I, H / 32});
  w.down_blocks = tensor_view(s->down_blocks.data(), dtype::u8, {E, H, I / 32, 16});
  w.down_scales = tensor_view(s->down_scales.data(), dtype::u8, {E, H, I / 32});
  if (biases) {
    std::normal_distribution<float> normal(0.0f, 0.1f);
    s->gate_up_bias.resize(static_cast<size_t>(E * 2 * I));
    s->down_bias.resize(static_cast<size_t>(E * H));
    for (auto& v : s->gate_up_bias) v = float_to_bf16(normal(rng));
    for (auto& v : s->down_bias) v = float_to_bf16(normal(rng));
    w.gate_up_bias = tensor_view(s->gate_up_bias.data(), dtype::bf16, {E, 2 * I});
    w.down_bias = tensor_view(s->down_bias.data(), dtype::bf16, {E, H});
  }
  return s;
}

layer_inputs read_inputs(const std::string& path, const moe_config& cfg) {
  const safetensors_reader r(path);
  const auto& x = r.entry("x");
  const auto& logits = r.entry("logits");
  const auto is_float = [](dtype t) { return t == dtype::bf16 || t == dtype::f16 || t == dtype::f32; };
  MXMOE_CHECK_ARG(is_float(x.type) && x.shape.size() == 2 && x.shape[1] == cfg.shape.hidden, "--inputs x",
                  "a float tensor [T, " + std::to_string(cfg.shape.hidden) + "]",
                  std::string(safetensors_dtype_name(x.type)) + " " + shape_string(x.shape));
  const int64_t T = x.shape[0];
  MXMOE_CHECK_ARG(is_float(logits.type) && logits.shape == std::vector<int64_t>({T, cfg.shape.experts}), "--inputs logits",
                  "a float tensor [" + std::to_string(T) + ", " + std::to_string(cfg.shape.experts) + "]",
                  std::string(safetensors_dtype_name(logits.type)) + " " + shape_string(logits.shape));
  const auto load = [&](const safetensors_entry& e, int64_t i) -> float {
    const uint8_t* p = r.bytes(e).data();
    uint16_t h;
    float f;
    switch (e.type) {
      case dtype::bf16: std::memcpy(&h, p + 2 * i, 2); return bf16_to_float(h);
      case dtype::f16: std::memcpy(&h, p + 2 * i, 2); return f16_to_float(h);
      default: std::memcpy(&f, p + 4 * i, 4); return f;
    }
  };
  layer_inputs in;
  in.tokens = T;
  in.x.resize(static_cast<size_t>(T * cfg.shape.hidden));
  for (size_t i = 0; i < in.x.size(); ++i) in.x[i] = float_to_bf16(load(x, static_cast<int64_t>(i)));
  in.logits.resize(static_cast<size_t>(T * cfg.shape.experts));
  for (size_t i = 0; i < in.logits.size(); ++i) in.logits[i] = load(logits, static_cast<int64_t>(i));
  return in;
}

struct run_args {
  std::string checkpoint, preset, inputs, output, reference = "auto";
  int64_t layer = -1, experts = 0, tokens = -1;
  uint64_t seed = 0;
  bool force = false, json = false;
  device_request device = device_request::automatic;
};

int run_layer(const run_args& a) {
  MXMOE_CHECK_ARG(a.checkpoint.empty() != a.preset.empty(), "--checkpoint/--preset", "exactly one of them",
                  a.checkpoint.empty() ? "neither" : "both");
  MXMOE_CHECK_ARG(a.tokens < 0 || a.inputs.empty(), "--tokens", "not given together with --inputs (T comes from x)",
                  std::to_string(a.tokens));
  MXMOE_CHECK_ARG(a.experts == 0 || !a.preset.empty(), "--experts", "only with --preset", std::to_string(a.experts));
  MXMOE_CHECK_ARG(a.output.empty() || a.force || !std::filesystem::exists(a.output), "--output",
                  "a path that does not exist (or --force)", a.output);
  const backend_choice backend = choose_backend(a.device);

  std::unique_ptr<safetensors_reader> file;
  std::unique_ptr<synthetic_layer> synthetic;
  moe_config cfg;
  moe_weights weights;
  std::string source;
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
  } else {
    const model_preset* p = find_model_preset(a.preset);
    MXMOE_CHECK_ARG(p != nullptr, "--preset", "one of " + model_preset_names(), a.preset);
    cfg = p->config;
    if (a.experts > 0) cfg.shape.experts = a.experts;
    validate(cfg);
    synthetic = make_synthetic(cfg, p->has_biases, a.seed);
    weights = synthetic->weights;
    source = "preset " + a.preset + " (synthetic weights, E=" + std::to_string(cfg.shape.experts) + ")";
  }
  validate(cfg);
  validate(weights, cfg);
  const layer_inputs in = a.inputs.empty() ? generate_inputs(cfg, weights, a.tokens < 0 ? 16 : a.tokens, a.seed + 1)
                                           : read_inputs(a.inputs, cfg);
  const double work = static_cast<double>(in.tokens) * cfg.routing.top_k * 3.0 * static_cast<double>(cfg.shape.hidden) *
                      static_cast<double>(cfg.shape.intermediate);
  // The CPU backend is f32: only an f64 reference checks it. For the GPU an f32 reference is
  // tight enough (its error is far below the bf16 threshold) and much faster on big shapes.
  MXMOE_CHECK_ARG(a.reference == "auto" || a.reference == "f64" || a.reference == "f32", "--reference", "auto, f64 or f32",
                  a.reference);
  MXMOE_CHECK_ARG(!(a.reference == "f32" && backend.device == device_kind::cpu), "--reference",
                  "f64 for the cpu backend (f32 would compare it with itself)", "f32");
  const bool f64 = a.reference == "f64" || (a.reference == "auto" && (backend.device == device_kind::cpu || work <= 4e9));
  const verified_run run = run_and_verify(weights, cfg, in, backend, f64);

  if (!a.output.empty()) {
    const std::vector<std::pair<std::string, tensor_view>> tensors{
        {"out", tensor_view(run.out.data(), dtype::f32, {in.tokens, cfg.shape.hidden})}};
    write_safetensors(a.output, tensors, {{"mxmoe.backend", run.backend}}, a.force);
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
                        {"backend", run.backend},
                        {"reason", run.reason},
                        {"reference", run.reference},
                        {"rel_l2", run.error.rel_l2},
                        {"max_abs", run.error.max_abs},
                        {"threshold", run.threshold},
                        {"passed", run.passed},
                        {"backend_seconds", run.backend_seconds},
                        {"reference_seconds", run.reference_seconds}};
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print("layer: {}; T={} E={} H={} I={} top-{} {} {}\n", source, in.tokens, cfg.shape.experts, cfg.shape.hidden,
               cfg.shape.intermediate, cfg.routing.top_k, to_string(cfg.routing.kind), to_string(cfg.activation.kind));
    fmt::print("backend: {} ({})\n", run.backend, run.reason);
    fmt::print("verify vs {} reference: rel-L2 {:.3e}, max abs {:.3e}, threshold rel-L2 {:.0e}: {}\n", run.reference,
               run.error.rel_l2, run.error.max_abs, run.threshold, run.passed ? "PASS" : "FAIL");
    if (!a.output.empty()) fmt::print("wrote out [{}, {}] f32 to {}\n", in.tokens, cfg.shape.hidden, a.output);
  }
  return run.passed ? kOk : kVerificationFailed;
}

}  // namespace

command add_run_command(CLI::App& root) {
  auto a = std::make_shared<run_args>();
  CLI::App* cmd = root.add_subcommand("run", "Run one MoE layer on cuda or cpu and verify it against the reference");
  set_details(cmd,
      "Runs one MoE layer — from an MXFP4 checkpoint (--checkpoint, --layer) or a model preset with synthetic MXFP4 "
      "weights (--preset; --experts shrinks E to fit host memory) — on the chosen backend, then checks the output "
      "against the CPU reference (cpu::moe_forward in float64; float32 for GPU runs of more than 4e9 multiply-adds "
      "unless --reference f64) on the same weights and inputs. Prints rel-L2 and max abs error and the threshold "
      "(1e-4 for the f32 CPU backend, 4e-3 for the bf16 GPU layer); exit code 1 when it fails.\n"
      "Inputs: --inputs F with tensors \"x\" [T, H] and \"logits\" [T, E] (any float dtype; x is rounded to bf16), "
      "or generated from --seed (x ~ N(0,1); logits from the checkpoint's router weights when present, else N(0,1)).\n"
      "The routing and activation come from the checkpoint's mxmoe.moe_config metadata (written by quantize), else "
      "from the model family the tensor names imply.\n\n"
      "Examples:\n  mxmoe run --preset qwen3-30b-a3b --experts 16 --tokens 8 --device cpu\n"
      "  mxmoe run --checkpoint model-mxfp4.safetensors --layer 0 --inputs acts.safetensors --output out.safetensors\n"
      "  mxmoe run --preset gpt-oss-120b --tokens 32 --device cuda --json");
  cmd->add_option("--checkpoint", a->checkpoint, "MXFP4 checkpoint (gpt-oss layout)")->check(CLI::ExistingFile);
  cmd->add_option("--layer", a->layer, "MoE layer index (default: the first one)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--preset", a->preset, model_preset_names());
  cmd->add_option("--experts", a->experts, "with --preset: use this many experts instead of the model's")
      ->check(CLI::Range(int64_t{1}, int64_t{512}));
  cmd->add_option("--tokens", a->tokens, "tokens T when generating inputs (default 16)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  cmd->add_option("--seed", a->seed, "seed of generated weights and inputs")->default_val(0);
  add_device_option(cmd, &a->device);
  cmd->add_option("--inputs", a->inputs, "safetensors file with x [T, H] and logits [T, E]")->check(CLI::ExistingFile);
  cmd->add_option("--output", a->output, "write the backend's output \"out\" [T, H] f32 to this safetensors file");
  cmd->add_option("--reference", a->reference, "reference precision: auto, f64 or f32")->default_val("auto");
  cmd->add_flag("--force", a->force, "replace the --output file if it exists");
  cmd->add_flag("--json", a->json, "print the result as JSON on stdout");
  return {cmd, [a] { return run_layer(*a); }};
}

}  // namespace mxmoe::cli
