// `mxmoe`: MXFP4 Mixture-of-Experts tools. Parses the command line, runs one subcommand and
// turns exceptions into the documented exit codes (cli_common.h, docs/cli.md).
#include <fmt/core.h>

#include <system_error>
#include <vector>

#include "cli_common.h"
#include "nonfinite.h"
#include "mxmoe/error.h"
#include "mxmoe/safetensors.h"

int main(int argc, char** argv) {
  using namespace mxmoe::cli;
  CLI::App app{"mxmoe — MXFP4 Mixture-of-Experts: quantize checkpoints, inspect them, run and verify a MoE layer "
               "on the GPU (sm_90) or the CPU reference.\n\nStart with `mxmoe demo`.\n",
               "mxmoe"};
  app.require_subcommand(1);
  app.footer(kExitCodeHelp);
  const std::vector<command> commands{add_demo_command(app),    add_quantize_command(app), add_dequantize_command(app),
                                      add_inspect_command(app), add_run_command(app),      add_bench_command(app)};
  // CLI11 would say only "A subcommand is required" for an unknown first word.
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const auto& c : commands) {
      names += (names.empty() ? "" : ", ") + c.app->get_name();
      known = known || c.app->get_name() == argv[1];
    }
    if (!known) {
      fmt::print(stderr, "mxmoe: error: unknown command '{}'; expected one of {}\nRun with --help for more information.\n",
                 argv[1], names);
      return kBadInput;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kBadInput;
  }
  try {
    for (const auto& c : commands)
      if (c.app->parsed()) return c.run();
  } catch (const mxmoe::invalid_argument& e) {
    fmt::print(stderr, "mxmoe: error: {}\n", e.what());
    return kBadInput;
  } catch (const mxmoe::format_error& e) {
    fmt::print(stderr, "mxmoe: malformed file: {}\n", e.what());
    return kBadInput;
  } catch (const nonfinite_input& e) {
    fmt::print(stderr, "mxmoe: non-finite input: {}\n", e.what());
    return kNonfiniteInput;
  } catch (const mxmoe::unsupported& e) {
    fmt::print(stderr, "mxmoe: backend unavailable: {}\n", e.what());
    return kBackendUnavailable;
  } catch (const std::system_error& e) {
    fmt::print(stderr, "mxmoe: I/O error: {}\n", e.what());
    return kIoError;
  } catch (const std::exception& e) {
    fmt::print(stderr, "mxmoe: internal error: {}\n", e.what());
    return kInternalError;
  }
  return kBadInput;
}
