// The --device/--rule options, the progress bar and the verified run shared by the subcommands.
#include "cli_common.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>

#include "mxmoe/error.h"

namespace mxmoe::cli {

void set_details(CLI::App* cmd, const std::string& text) { cmd->footer(text + "\n\n" + kExitCodeHelp); }

void add_device_option(CLI::App* cmd, backend_request* target) {
  const std::map<std::string, backend_request> names{
      {"auto", backend_request::automatic}, {"cpu", backend_request::cpu}, {"cuda", backend_request::cuda}};
  cmd->add_option("--device", *target,
                  "auto (cuda when an sm_90 GPU is usable, else cpu, and says why), cpu, or cuda (an error "
                  "with exit code 3 when no GPU is usable)")
      ->transform(CLI::CheckedTransformer(names, CLI::ignore_case))
      ->option_text("auto|cpu|cuda (default auto)");
}

CLI::Option* add_rule_option(CLI::App* cmd, mx::scale_rule* target) {
  std::map<std::string, mx::scale_rule> names;
  for (mx::scale_rule r : mx::kAllScaleRules) names[mx::to_string(r)] = r;
  return cmd
      ->add_option("--rule", *target,
                   "E8M0 scale rule: floor (OCP MX v1.0; saturates ~41% of blocks), even (0.75 round-up: "
                   "the fixed vLLM kernel), rceil (never saturates), mse (per block, least squared error)")
      ->transform(CLI::CheckedTransformer(names, CLI::ignore_case))
      ->option_text("floor|even|rceil|mse");
}

backend_choice choose_device(backend_request request) {
  try {
    backend_choice b = choose_backend(request);
    if (request != backend_request::automatic) b.reason = "--device " + b.reason;
    return b;
  } catch (const unsupported& e) {
    throw unsupported(std::string("--device ") + e.what());
  }
}

progress_bar::progress_bar(std::string label) : label_(std::move(label)), enabled_(::isatty(STDERR_FILENO) == 1) {}

progress_bar::~progress_bar() {
  if (drawn_) std::fputs("\r\033[K", stderr);
}

void progress_bar::show(const convert_progress& p) {
  if (!enabled_ || p.total <= 0) return;
  drawn_ = true;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * std::min(p.done, p.total) / p.total);
  std::fprintf(stderr, "\r\033[K%s [%s%s] %lld/%lld %s", label_.c_str(), std::string(static_cast<size_t>(filled), '#').c_str(),
               std::string(static_cast<size_t>(kWidth - filled), ' ').c_str(), static_cast<long long>(p.done),
               static_cast<long long>(p.total), p.note.c_str());
  std::fflush(stderr);
}

verified_run run_verified(const moe_weights& weights, const moe_config& cfg, const synthetic::layer_inputs& in,
                          device_kind backend, cpu::precision reference) {
  verified_run run;
  const prepared_moe layer = prepare(weights, cfg, backend);
  run.out.resize(static_cast<size_t>(in.tokens * cfg.shape.hidden));
  const tensor_view out(run.out.data(), dtype::f32, {in.tokens, cfg.shape.hidden});
  const auto t0 = std::chrono::steady_clock::now();
  moe_forward_host(layer, in.x_view(), in.routing(), out);
  run.backend_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  run.check = verify_forward(weights, cfg, in.x_view(), in.routing(), out, backend, reference);
  return run;
}

}  // namespace mxmoe::cli
