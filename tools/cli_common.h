// Shared pieces of the `mxmoe` command line: exit codes, the --device and --rule options, the
// progress bar, the verified run of `run` and `demo`, and the registration hook of each subcommand
// (one file per command). The work itself is the library's (include/mxmoe/).
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "mxmoe/convert.h"
#include "mxmoe/dtype.h"
#include "mxmoe/forward.h"
#include "mxmoe/mx.h"
#include "mxmoe/synthetic.h"
#include "mxmoe/verify.h"

namespace mxmoe::cli {

// Documented in docs/cli.md and in `mxmoe --help`.
enum exit_code : int {
  kOk = 0,
  kVerificationFailed = 1,  // a result disagreed with the reference
  kBadInput = 2,            // bad usage, bad argument, malformed file, output exists without --force
  kBackendUnavailable = 3,  // --device cuda without a usable GPU, or a CPU-only build
  kIoError = 4,             // a file could not be read or written
  kInternalError = 5,
  kNonfiniteInput = 6,      // NaN / Inf in the weights or inputs (nonfinite.h), found before running
};

inline constexpr const char* kExitCodeHelp =
    "Exit codes: 0 ok; 1 verification failed; 2 bad usage or input (including a malformed file or "
    "an existing output without --force); 3 backend unavailable (--device cuda without an sm_90 GPU); "
    "4 I/O error; 5 internal error; 6 NaN/Inf in the weights or inputs (named, with the first index).";

// The long help of a subcommand (shown by `mxmoe CMD --help`, after the options), followed by
// the exit codes.
void set_details(CLI::App* cmd, const std::string& text);

// Option checks whose errors read "--rule: expected one of floor, even, rceil, mse; got 'banana'"
// (CLI11 prefixes the option's name). All run while parsing, before any work starts.
//
// One of `names` (case-insensitive); the value becomes the matching entry of `values` (as the
// integer CLI11 converts an enum option from). Without `values` the name itself is kept.
CLI::Validator one_of(const std::vector<std::string>& names, const std::vector<long long>& values = {});
// An integer in [lo, hi].
CLI::Validator integer_in(long long lo, long long hi);
// An existing regular file (inputs).
CLI::Validator existing_file();
// A file to write: not a directory, in a directory that exists. Whether it may be replaced
// (--force) is the command's check.
CLI::Validator output_path();

// A tolerance as help and docs write it: 1e-4, 4e-3, 1.5e-2.
std::string tolerance_text(double v);
// The verification thresholds of both backends, from tolerance_for (verify.h), for --help.
std::string thresholds_text();

// Adds `--device auto|cpu|cuda` to `cmd`.
void add_device_option(CLI::App* cmd, backend_request* target);

// choose_backend (forward.h) in the CLI's words: an explicit request's reason and error name the
// --device flag; auto without a usable GPU says so plainly, the CUDA error as detail. cuda
// without a GPU throws mxmoe::unsupported (exit code 3).
backend_choice choose_device(backend_request request);

// Adds `--rule floor|even|rceil|mse` to `cmd`.
CLI::Option* add_rule_option(CLI::App* cmd, mx::scale_rule* target);

// A one-line progress bar on stderr, drawn only when stderr is a terminal; fed by the library's
// progress callback (convert.h). When the steps carry bytes (conversions) it shows the rate in
// GB/s of input and the time left at that rate.
class progress_bar {
 public:
  explicit progress_bar(std::string label);
  ~progress_bar();
  void show(const convert_progress& p);
  progress_callback callback() {
    return [this](const convert_progress& p) { show(p); };
  }

 private:
  std::string label_;
  bool enabled_ = false, drawn_ = false;
  std::chrono::steady_clock::time_point start_;
};

// One MoE layer on `backend`, verified: prepare (forward.h), run on the host inputs
// (moe_forward_host), then verify_forward against the reference in `reference` precision; no
// reference (`mxmoe run --reference none`): not verified. `progress` hears of each of the three
// steps before it starts (the note says which).
struct verified_run {
  std::vector<float> out;             // the backend's output, f32 [T, H]
  std::optional<verify_result> check; // absent when not verified
  double backend_seconds = 0;
};
verified_run run_verified(const moe_weights& weights, const moe_config& cfg, const synthetic::layer_inputs& in,
                          device_kind backend, std::optional<cpu::precision> reference,
                          const progress_callback& progress = {});
// "cpu f64" / "cpu f32".
const char* reference_name(cpu::precision p);

// A subcommand registers itself and its action (returns an exit code).
using command_action = std::function<int()>;
struct command {
  CLI::App* app;
  command_action run;
};
command add_quantize_command(CLI::App& root);
command add_dequantize_command(CLI::App& root);
command add_inspect_command(CLI::App& root);
command add_run_command(CLI::App& root);
command add_bench_command(CLI::App& root);
command add_demo_command(CLI::App& root);

}  // namespace mxmoe::cli
