// `mxmoe demo`: the main job. Generates (deterministically) a small gpt-oss-like BF16 MoE
// checkpoint, quantizes it with every scale rule through the same code as `mxmoe quantize`,
// compares the rules (SQNR, saturation, flushes, layer output error against the BF16 layer),
// then runs the layer on the best backend present and verifies it against the reference.
#include <fmt/core.h>
#include <stdlib.h>

#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "cli_common.h"
#include "mxmoe/checkpoint.h"
#include "mxmoe/convert.h"
#include "mxmoe/safetensors.h"
#include "mxmoe/synthetic.h"
#include "mxmoe/verify.h"

namespace mxmoe::cli {
namespace {

// The embedded model: one gpt-oss-style layer (topk_softmax top-4, biases, clamped SwiGLU).
constexpr int64_t kExperts = 8, kHidden = 512, kIntermediate = 256;
constexpr int kTopK = 4;

moe_config demo_config() {
  moe_config c;
  c.shape = {kExperts, kHidden, kIntermediate};
  c.routing = {routing_kind::topk_softmax, kTopK, false, 1, 1, 1.0f};
  c.activation.kind = activation_kind::swiglu_clamped;
  c.gate_up = layout::gate_up_order::interleaved;
  return c;
}

// Weights of a trained layer are roughly Gaussian with heavier tails: N(0, 1/K) elements, 2% of
// output rows scaled up 8x (outlier channels) and 0.1% of elements scaled up 6x.
// Expert `e` of a weight stored in the gpt-oss BF16 x·W form (layout::checkpoint_xw).
void fill_weight(std::mt19937_64& rng, const layout::checkpoint_xw& g, int64_t e, uint16_t* out) {
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(g.cols)));
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> row_gain(static_cast<size_t>(g.rows));
  for (auto& gain : row_gain) gain = u(rng) < 0.02f ? 8.0f : 1.0f;
  for (int64_t r = 0; r < g.rows; ++r)
    for (int64_t c = 0; c < g.cols; ++c) {
      const float v = normal(rng) * row_gain[static_cast<size_t>(r)] * (u(rng) < 0.001f ? 6.0f : 1.0f);
      out[g.offset(e, r, c)] = float_to_bf16(v);
    }
}

void write_demo_checkpoint(const std::string& path, uint64_t seed) {
  const int64_t E = kExperts, H = kHidden, I = kIntermediate;
  std::mt19937_64 rng(seed);
  const moe_shape shape{E, H, I};
  const layout::checkpoint_xw gu = checkpoint::gate_up_xw_geometry(shape), dn = checkpoint::down_xw_geometry(shape);
  std::vector<uint16_t> gate_up(static_cast<size_t>(gu.size())), down(static_cast<size_t>(dn.size()));
  for (int64_t e = 0; e < E; ++e) {
    fill_weight(rng, gu, e, gate_up.data());
    fill_weight(rng, dn, e, down.data());
  }
  std::normal_distribution<float> small(0.0f, 0.05f), router(0.0f, 1.0f / std::sqrt(static_cast<float>(H)));
  std::vector<uint16_t> b13(static_cast<size_t>(E * 2 * I)), b2(static_cast<size_t>(E * H)), rw(static_cast<size_t>(E * H)),
      rb(static_cast<size_t>(E)), norm(static_cast<size_t>(H));
  for (auto& v : b13) v = float_to_bf16(small(rng));
  for (auto& v : b2) v = float_to_bf16(small(rng));
  for (auto& v : rw) v = float_to_bf16(router(rng));
  for (auto& v : rb) v = float_to_bf16(small(rng));
  for (auto& v : norm) v = float_to_bf16(1.0f + small(rng));
  const std::string p = checkpoint::gpt_oss_prefix(0);
  const auto n = checkpoint::bf16_gpt_oss_tensor_names(p);
  const std::vector<std::pair<std::string, tensor_view>> tensors{
      {"model.layers.0.post_attention_layernorm.weight", tensor_view(norm.data(), dtype::bf16, {H})},
      {p + "router.weight", tensor_view(rw.data(), dtype::bf16, {E, H})},
      {p + "router.bias", tensor_view(rb.data(), dtype::bf16, {E})},
      {n.gate_up, tensor_view(gate_up.data(), dtype::bf16, {E, H, 2 * I})},
      {p + "experts.gate_up_proj_bias", tensor_view(b13.data(), dtype::bf16, {E, 2 * I})},
      {n.down, tensor_view(down.data(), dtype::bf16, {E, I, H})},
      {p + "experts.down_proj_bias", tensor_view(b2.data(), dtype::bf16, {E, H})}};
  write_safetensors(path, tensors, {{"format", "pt"}, {"mxmoe.moe_config", checkpoint::config_to_json(demo_config())}}, true);
}

// The working directory: --keep DIR, or a fresh temporary directory removed at exit.
class work_dir {
 public:
  explicit work_dir(const std::string& keep) {
    if (!keep.empty()) {
      std::filesystem::create_directories(keep);
      path_ = keep;
      return;
    }
    std::string templ = (std::filesystem::temp_directory_path() / "mxmoe-demo-XXXXXX").string();
    if (!::mkdtemp(templ.data())) throw std::system_error(errno, std::generic_category(), "cannot create " + templ);
    path_ = templ;
    owned_ = true;
  }
  ~work_dir() {
    std::error_code ec;
    if (owned_) std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }
  const std::string& path() const { return path_; }
  bool kept() const { return !owned_; }

 private:
  std::string path_;
  bool owned_ = false;
};

struct demo_args {
  uint64_t seed = 0;
  int64_t tokens = 64;
  std::string keep;
  bool json = false;
  backend_request device = backend_request::automatic;
};

struct rule_row {
  mx::scale_rule rule;
  quant_stats stats;
  double layer_rel_l2 = 0;
};

double pct(int64_t part, int64_t whole) { return whole > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0; }

// The float64 reference output of a layer on the demo's inputs, f32 [T, H].
std::vector<float> reference_out(const moe_weights& w, const moe_config& cfg, const synthetic::layer_inputs& in) {
  std::vector<float> out(static_cast<size_t>(in.tokens * cfg.shape.hidden));
  cpu::moe_forward(in.x_view(), in.routing(), w, cfg, tensor_view(out.data(), dtype::f32, {in.tokens, cfg.shape.hidden}),
                   cpu::precision::f64);
  return out;
}

int run_demo(const demo_args& a) {
  const backend_choice backend = choose_device(a.device);
  const work_dir dir(a.keep);
  const std::string bf16_path = dir.file("demo-bf16.safetensors");
  write_demo_checkpoint(bf16_path, a.seed);
  const moe_config cfg = demo_config();
  const std::vector<int64_t> out_shape{a.tokens, cfg.shape.hidden};

  // The BF16 layer's output: what quantization is judged against.
  const safetensors_reader bf16_file(bf16_path);
  const auto bf16_info = checkpoint::find_moe_layer(bf16_file, 0);
  std::vector<uint16_t> w13, w2;
  const moe_weights bf16_w = checkpoint::bf16_weights(bf16_file, bf16_info, w13, w2);
  const synthetic::layer_inputs in = synthetic::make_inputs(cfg, bf16_w, a.tokens, a.seed + 1);
  const std::vector<float> bf16_out = reference_out(bf16_w, cfg, in);

  std::vector<rule_row> rows;
  for (mx::scale_rule rule : mx::kAllScaleRules) {
    const std::string path = dir.file(std::string("demo-mxfp4-") + mx::to_string(rule) + ".safetensors");
    const quantize_report rep = quantize_checkpoint(bf16_path, path, {rule, backend.device, true, {}});
    const safetensors_reader q(path);
    const auto info = checkpoint::find_moe_layer(q, 0);
    const std::vector<float> out = reference_out(checkpoint::mxfp4_weights(q, info), checkpoint::layer_config(q, info), in);
    rows.push_back({rule, rep.total,
                    compare(tensor_view(out.data(), dtype::f32, out_shape), tensor_view(bf16_out.data(), dtype::f32, out_shape))
                        .rel_l2});
  }
  const rule_row* best = &rows.front();
  for (const auto& r : rows)
    if (r.layer_rel_l2 < best->layer_rel_l2) best = &r;

  const std::string best_path = dir.file(std::string("demo-mxfp4-") + mx::to_string(best->rule) + ".safetensors");
  const safetensors_reader q(best_path);
  const auto info = checkpoint::find_moe_layer(q, 0);
  const verified_run run = run_verified(checkpoint::mxfp4_weights(q, info), checkpoint::layer_config(q, info), in,
                                        backend.device, cpu::precision::f64);
  const verify_result& v = *run.check;

  if (a.json) {
    nlohmann::json j = {{"model", {{"experts", kExperts}, {"hidden", kHidden}, {"intermediate", kIntermediate}, {"top_k", kTopK},
                                   {"routing", to_string(cfg.routing.kind)}, {"activation", to_string(cfg.activation.kind)},
                                   {"seed", a.seed}, {"tokens", a.tokens}}}};
    for (const auto& r : rows)
      j["rules"].push_back({{"rule", mx::to_string(r.rule)},
                            {"sqnr_db", r.stats.sqnr_db()},
                            {"saturated_blocks_pct", pct(r.stats.saturated_blocks, r.stats.blocks)},
                            {"flushed_pct", pct(r.stats.flushed_elements, r.stats.elements)},
                            {"layer_rel_l2_vs_bf16", r.layer_rel_l2}});
    j["run"] = {{"rule", mx::to_string(best->rule)}, {"backend", backend.name}, {"reason", backend.reason},
                {"reference", "cpu f64"},          {"rel_l2", v.error.rel_l2}, {"max_abs", v.error.max_abs},
                {"threshold", v.tolerance.rel_l2}, {"passed", v.passed()}};
    if (dir.kept()) j["files"] = dir.path();
    fmt::print("{}\n", j.dump(2));
    return v.passed() ? kOk : kVerificationFailed;
  }
  fmt::print("mxmoe demo: a gpt-oss-style MoE layer with BF16 weights (E={}, H={}, I={}, top-{}, topk_softmax, biases, "
             "clamped SwiGLU; Gaussian weights with outlier rows; seed {}), quantized to MXFP4 with every scale rule.\n\n",
             kExperts, kHidden, kIntermediate, kTopK, a.seed);
  fmt::print("{:<6} {:>9} {:>18} {:>9} {:>24}\n", "rule", "SQNR dB", "saturated blocks", "flushed", "layer rel-L2 vs BF16");
  for (const auto& r : rows)
    fmt::print("{:<6} {:>9.2f} {:>17.1f}% {:>8.2f}% {:>24.3e}\n", mx::to_string(r.rule), r.stats.sqnr_db(),
               pct(r.stats.saturated_blocks, r.stats.blocks), pct(r.stats.flushed_elements, r.stats.elements), r.layer_rel_l2);
  fmt::print("\nSQNR: weight signal-to-quantization-noise (higher is better). saturated: blocks with an element clamped "
             "to +-6 x scale. flushed: non-zero weights that became 0. layer rel-L2: ||out_mxfp4 - out_bf16|| / "
             "||out_bf16|| of the whole layer on {} random tokens (float64 reference).\n\n", a.tokens);
  fmt::print("running the layer quantized with '{}' (lowest layer error) on {}: {}\n", mx::to_string(best->rule), backend.name,
             backend.reason);
  fmt::print("verify vs {} reference: rel-L2 {:.3e}, max abs {:.3e} (threshold rel-L2 {:.0e}): {}\n", "cpu f64",
             v.error.rel_l2, v.error.max_abs, v.tolerance.rel_l2, v.passed() ? "PASS" : "FAIL");
  if (dir.kept()) fmt::print("files kept in {}\n", dir.path());
  return v.passed() ? kOk : kVerificationFailed;
}

}  // namespace

command add_demo_command(CLI::App& root) {
  auto a = std::make_shared<demo_args>();
  CLI::App* cmd = root.add_subcommand("demo", "The tour: quantize an embedded MoE layer with every rule, compare, run, verify");
  set_details(cmd,
      "Generates (deterministically, from --seed) a small gpt-oss-style BF16 MoE checkpoint (8 experts, H=512, "
      "I=256, top-4, biases, clamped SwiGLU), quantizes it to MXFP4 with each scale rule (floor, even, rceil, mse) "
      "through the same code as `mxmoe quantize`, and prints a table: weight SQNR, saturated blocks, flushed "
      "weights and the error of the whole layer's output against the BF16 layer. Then it runs the layer quantized "
      "with the best rule on the best backend present (cuda when an sm_90 GPU is usable, else cpu; it says which "
      "and why) and verifies it against the float64 CPU reference. Files go to a temporary directory that is "
      "removed afterwards, unless --keep DIR.\n\n"
      "Examples:\n  mxmoe demo\n  mxmoe demo --device cpu --json\n  mxmoe demo --keep /tmp/mxmoe-demo --seed 7");
  cmd->add_option("--seed", a->seed, "seed of the generated checkpoint and inputs")
      ->check(integer_in(0, std::numeric_limits<long long>::max()))
      ->default_val(0);
  cmd->add_option("--tokens", a->tokens, "tokens in the verification batch")->check(integer_in(1, 4096))->default_val(64);
  cmd->add_option("--keep", a->keep, "write the checkpoints into this directory (created if absent) and keep them")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            std::error_code ec;
            if (!std::filesystem::exists(v, ec) || std::filesystem::is_directory(v, ec)) return {};
            return "expected a directory (or a path to create one); got '" + v + "'";
          },
          ""));
  add_device_option(cmd, &a->device);
  cmd->add_flag("--json", a->json, "print the results as JSON on stdout");
  return {cmd, [a] { return run_demo(*a); }};
}

}  // namespace mxmoe::cli
