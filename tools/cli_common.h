// Shared pieces of the `mxmoe` command line: exit codes, backend choice, the progress bar and
// the registration hook of each subcommand (one file per command).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>

#include "mxmoe/dtype.h"
#include "mxmoe/mx.h"

namespace mxmoe::cli {

// Documented in docs/cli.md and in `mxmoe --help`.
enum exit_code : int {
  kOk = 0,
  kVerificationFailed = 1,  // a result disagreed with the reference
  kBadInput = 2,            // bad usage, bad argument, malformed file, output exists without --force
  kBackendUnavailable = 3,  // --device cuda without a usable GPU, or a CPU-only build
  kIoError = 4,             // a file could not be read or written
  kInternalError = 5,
};

inline constexpr const char* kExitCodeHelp =
    "Exit codes: 0 ok; 1 verification failed; 2 bad usage or input (including a malformed file or "
    "an existing output without --force); 3 backend unavailable (--device cuda without an sm_90 GPU); "
    "4 I/O error; 5 internal error.";

// The long help of a subcommand (shown by `mxmoe CMD --help`, after the options), followed by
// the exit codes.
void set_details(CLI::App* cmd, const std::string& text);

enum class device_request { automatic, cpu, cuda };

// Adds `--device auto|cpu|cuda` to `cmd`.
void add_device_option(CLI::App* cmd, device_request* target);

struct backend_choice {
  device_kind device = device_kind::cpu;
  std::string name;    // "cpu" or "cuda (NVIDIA H200)"
  std::string reason;  // why this backend
};
// auto: cuda when cuda::available(), else cpu (and says why). cuda without a GPU throws
// mxmoe::unsupported (exit code 3). Never falls back silently.
backend_choice choose_backend(device_request request);

// Adds `--rule floor|even|rceil|mse` to `cmd`.
CLI::Option* add_rule_option(CLI::App* cmd, mx::scale_rule* target);

// A one-line progress bar on stderr, drawn only when stderr is a terminal.
class progress_bar {
 public:
  progress_bar(std::string label, int64_t total);
  ~progress_bar();
  void advance(int64_t steps, const std::string& note = "");

 private:
  std::string label_;
  int64_t total_ = 0, done_ = 0;
  bool enabled_ = false;
};

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
