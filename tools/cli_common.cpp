// The --device/--rule options, the progress bar and the verified run shared by the subcommands.
#include "cli_common.h"

#include <fmt/core.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "mxmoe/cuda.h"
#include "mxmoe/error.h"

namespace mxmoe::cli {

void set_details(CLI::App* cmd, const std::string& text) { cmd->footer(text + "\n\n" + kExitCodeHelp); }

namespace {
std::string in_quotes(const std::string& v) { return "'" + v + "'"; }
}  // namespace

CLI::Validator one_of(const std::vector<std::string>& names, const std::vector<long long>& values) {
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  return CLI::Validator(
      [names, values, list](std::string& v) -> std::string {
        const std::string low = CLI::detail::to_lower(v);
        for (size_t i = 0; i < names.size(); ++i)
          if (names[i] == low) {
            v = values.empty() ? names[i] : std::to_string(values[i]);
            return {};
          }
        return "expected one of " + list + "; got " + in_quotes(v);
      },
      "");
}

CLI::Validator integer_in(long long lo, long long hi) {
  return CLI::Validator(
      [lo, hi](std::string& v) -> std::string {
        size_t used = 0;
        long long x = 0;
        try {
          x = std::stoll(v, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used != 0 && used == v.size() && x >= lo && x <= hi) return {};
        return "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]; got " + in_quotes(v);
      },
      "");
}

CLI::Validator existing_file() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        std::error_code ec;
        if (std::filesystem::is_regular_file(v, ec)) return {};
        return "expected an existing file; got " + in_quotes(v) +
               (std::filesystem::is_directory(v, ec) ? " (a directory)" : " (no such file)");
      },
      "");
}

CLI::Validator output_path() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        namespace fs = std::filesystem;
        std::error_code ec;
        if (fs::is_directory(v, ec)) return "expected a file path, not a directory; got " + in_quotes(v);
        const fs::path parent = fs::absolute(v, ec).parent_path();
        if (!fs::is_directory(parent, ec)) return "expected a path in an existing directory; got " + in_quotes(v);
        return {};
      },
      "");
}

void add_device_option(CLI::App* cmd, backend_request* target) {
  cmd->add_option("--device", *target,
                  "auto (cuda when an sm_90 GPU is usable, else cpu, and says why), cpu, or cuda (an error "
                  "with exit code 3 when no GPU is usable)")
      ->transform(one_of({"auto", "cpu", "cuda"}, {static_cast<long long>(backend_request::automatic),
                                               static_cast<long long>(backend_request::cpu),
                                               static_cast<long long>(backend_request::cuda)}))
      ->option_text("auto|cpu|cuda (default auto)");
}

CLI::Option* add_rule_option(CLI::App* cmd, mx::scale_rule* target) {
  std::vector<std::string> names;
  std::vector<long long> values;
  for (mx::scale_rule r : mx::kAllScaleRules) {
    names.emplace_back(mx::to_string(r));
    values.push_back(static_cast<long long>(r));
  }
  return cmd
      ->add_option("--rule", *target,
                   "E8M0 scale rule: floor (OCP MX v1.0; saturates ~41% of blocks), even (0.75 round-up: "
                   "the fixed vLLM kernel), rceil (never saturates), mse (per block, least squared error)")
      ->transform(one_of(names, values))
      ->option_text("floor|even|rceil|mse");
}

std::string tolerance_text(double v) {
  std::string s = fmt::format("{:.1e}", v);  // "4.0e-03"
  if (s.compare(1, 2, ".0") == 0) s.erase(1, 2);
  const size_t e = s.find("e-0");
  if (e != std::string::npos) s.erase(e + 2, 1);
  return s;
}

std::string thresholds_text() {
  const forward_tolerance cpu = tolerance_for(device_kind::cpu), gpu = tolerance_for(device_kind::cuda);
  return "rel-L2 " + tolerance_text(cpu.rel_l2) + " for the f32 CPU backend; rel-L2 " + tolerance_text(gpu.rel_l2) +
         " and max error " + tolerance_text(gpu.max_err_rel) + " x max|ref| for the bf16 GPU layer";
}

backend_choice choose_device(backend_request request) {
  try {
    backend_choice b = choose_backend(request);
    if (request != backend_request::automatic) {
      b.reason = "--device " + b.reason;
    } else if (b.device == device_kind::cpu) {
      std::string why;
      cuda::available(&why);
      b.reason = "no usable sm_90 GPU or CUDA driver was found, so the CPU backend runs (detail: " + why + ")";
    }
    return b;
  } catch (const unsupported& e) {
    throw unsupported(std::string("--device ") + e.what());
  }
}

progress_bar::progress_bar(std::string label)
    : label_(std::move(label)), enabled_(::isatty(STDERR_FILENO) == 1), start_(std::chrono::steady_clock::now()) {}

progress_bar::~progress_bar() {
  if (drawn_) std::fputs("\r\033[K", stderr);
}

void progress_bar::show(const convert_progress& p) {
  if (!enabled_ || p.total <= 0) return;
  drawn_ = true;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * std::min(p.done, p.total) / p.total);
  std::string rate;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (p.bytes_total > 0 && p.bytes_done > 0 && seconds > 0) {
    const double per_s = static_cast<double>(p.bytes_done) / seconds;
    rate = fmt::format(" {:.2f} GB/s, {:.0f} s left", per_s / 1e9,
                       static_cast<double>(p.bytes_total - std::min(p.bytes_done, p.bytes_total)) / per_s);
  }
  std::fprintf(stderr, "\r\033[K%s [%s%s] %lld/%lld%s %s", label_.c_str(), std::string(static_cast<size_t>(filled), '#').c_str(),
               std::string(static_cast<size_t>(kWidth - filled), ' ').c_str(), static_cast<long long>(p.done),
               static_cast<long long>(p.total), rate.c_str(), p.note.c_str());
  std::fflush(stderr);
}

const char* reference_name(cpu::precision p) { return p == cpu::precision::f64 ? "cpu f64" : "cpu f32"; }

verified_run run_verified(const moe_weights& weights, const moe_config& cfg, const synthetic::layer_inputs& in,
                          device_kind backend, std::optional<cpu::precision> reference,
                          const progress_callback& progress) {
  const std::string where = backend == device_kind::cuda ? "cuda" : "cpu";
  const auto step = [&](int64_t done, const std::string& note) {
    if (progress) progress({done, 3, note});
  };
  verified_run run;
  step(0, "preparing the layer for " + where);
  const prepared_moe layer = prepare(weights, cfg, backend);
  run.out.resize(static_cast<size_t>(in.tokens * cfg.shape.hidden));
  const tensor_view out(run.out.data(), dtype::f32, {in.tokens, cfg.shape.hidden});
  step(1, "running the layer on " + where);
  const auto t0 = std::chrono::steady_clock::now();
  moe_forward_host(layer, in.x_view(), in.routing(), out);
  run.backend_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (reference) {
    step(2, std::string("reference ") + reference_name(*reference));
    run.check = verify_forward(weights, cfg, in.x_view(), in.routing(), out, backend, *reference);
  }
  step(3, "done");
  return run;
}

}  // namespace mxmoe::cli
