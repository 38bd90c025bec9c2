// Backend choice, the --device/--rule options and the progress bar shared by the subcommands.
#include "cli_common.h"

#include <unistd.h>

#include <cstdio>
#include <map>

#include "mxmoe/cuda.h"
#include "mxmoe/error.h"

namespace mxmoe::cli {

void set_details(CLI::App* cmd, const std::string& text) { cmd->footer(text + "\n\n" + kExitCodeHelp); }

void add_device_option(CLI::App* cmd, device_request* target) {
  const std::map<std::string, device_request> names{
      {"auto", device_request::automatic}, {"cpu", device_request::cpu}, {"cuda", device_request::cuda}};
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

backend_choice choose_backend(device_request request) {
  std::string why;
  const bool gpu = cuda::available(&why);
  if (request == device_request::cpu) return {device_kind::cpu, "cpu", "--device cpu was requested"};
  if (gpu) {
    const std::string name = "cuda (" + cuda::device_name() + ")";
    return {device_kind::cuda, name,
            request == device_request::cuda ? "--device cuda was requested" : "auto: a usable sm_90 GPU was found"};
  }
  if (request == device_request::cuda) throw unsupported("--device cuda: no usable GPU: " + why);
  return {device_kind::cpu, "cpu", "auto: no usable GPU (" + why + "), so the CPU backend runs"};
}

progress_bar::progress_bar(std::string label, int64_t total)
    : label_(std::move(label)), total_(total), enabled_(total > 0 && ::isatty(STDERR_FILENO) == 1) {}

progress_bar::~progress_bar() {
  if (enabled_) std::fputs("\r\033[K", stderr);
}

void progress_bar::advance(int64_t steps, const std::string& note) {
  done_ += steps;
  if (!enabled_) return;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * std::min(done_, total_) / total_);
  std::fprintf(stderr, "\r\033[K%s [%s%s] %lld/%lld %s", label_.c_str(), std::string(static_cast<size_t>(filled), '#').c_str(),
               std::string(static_cast<size_t>(kWidth - filled), ' ').c_str(), static_cast<long long>(done_),
               static_cast<long long>(total_), note.c_str());
  std::fflush(stderr);
}

}  // namespace mxmoe::cli
