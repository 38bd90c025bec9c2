// `mxmoe`: MXFP4 Mixture-of-Experts tools. Parses the command line, runs one subcommand and
// turns exceptions into the documented exit codes (cli_common.h, docs/cli.md).
#include <fmt/core.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <system_error>
#include <vector>

#include "cli_common.h"
#include "nonfinite.h"
#include "mxmoe/error.h"
#include "mxmoe/safetensors.h"

namespace {

using namespace mxmoe::cli;

// --json is a flag of these commands (bench's --json names a file).
bool json_requested(int argc, char** argv) {
  if (argc < 2) return false;
  bool command = false;
  for (const char* c : {"demo", "quantize", "inspect", "run"}) command = command || std::strcmp(argv[1], c) == 0;
  for (int i = 2; command && i < argc; ++i)
    if (std::strcmp(argv[i], "--json") == 0) return true;
  return false;
}

// A failure: the message on stderr; with --json also {"error", "argument", "exit_code", ...} on
// stdout, so that a script reading stdout always gets one JSON document.
struct failure {
  int code;
  std::string prefix, message;
  nlohmann::json fields = nlohmann::json::object();  // "argument", "tensor", "file" when known
};

int report(const failure& f, bool json) {
  fmt::print(stderr, "mxmoe: {}{}\n", f.prefix, f.message);
  if (f.code == kBadInput && f.fields.contains("usage")) fmt::print(stderr, "Run with --help for more information.\n");
  if (json) {
    nlohmann::json j = {{"error", f.message}, {"argument", nullptr}, {"exit_code", f.code}};
    for (const auto& [k, v] : f.fields.items())
      if (k != "usage") j[k] = v;
    fmt::print("{}\n", j.dump(2));
  }
  return f.code;
}

// CLI11's message "--rule: expected ..." -> argument "--rule".
nlohmann::json parse_error_fields(const std::string& what) {
  nlohmann::json fields = {{"usage", true}};
  const size_t colon = what.find(": ");
  if (colon != std::string::npos && what.find(' ') > colon) fields["argument"] = what.substr(0, colon);
  return fields;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mxmoe — MXFP4 Mixture-of-Experts: quantize checkpoints, inspect them, run and verify a MoE layer "
               "on the GPU (sm_90) or the CPU reference.\n\nStart with `mxmoe demo`.\n",
               "mxmoe"};
  app.require_subcommand(1);
  app.footer(kExitCodeHelp);
  const std::vector<command> commands{add_demo_command(app),    add_quantize_command(app), add_dequantize_command(app),
                                      add_inspect_command(app), add_run_command(app),      add_bench_command(app)};
  const bool json = json_requested(argc, argv);
  // CLI11 would say only "A subcommand is required" for an unknown first word.
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const auto& c : commands) {
      names += (names.empty() ? "" : ", ") + c.app->get_name();
      known = known || c.app->get_name() == argv[1];
    }
    if (!known)
      return report({kBadInput, "error: ", "unknown command '" + std::string(argv[1]) + "'; expected one of " + names,
                     {{"usage", true}, {"argument", "COMMAND"}}},
                    json);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return report({kBadInput, "error: ", e.what(), parse_error_fields(e.what())}, json);
  }
  try {
    for (const auto& c : commands)
      if (c.app->parsed()) return c.run();
  } catch (const mxmoe::nonfinite_error& e) {
    return report({kNonfiniteInput, "non-finite input: ", e.what(), {{"argument", e.arg()}, {"tensor", e.tensor()}}}, json);
  } catch (const mxmoe::invalid_argument& e) {
    return report({kBadInput, "error: ", e.what(), {{"argument", e.arg()}}}, json);
  } catch (const mxmoe::format_error& e) {
    nlohmann::json fields = {{"file", e.file()}};
    if (!e.tensor().empty()) fields["tensor"] = e.tensor();
    return report({kBadInput, "malformed file: ", e.what(), fields}, json);
  } catch (const nonfinite_input& e) {
    return report({kNonfiniteInput, "non-finite input: ", e.what(), {{"tensor", e.tensor()}}}, json);
  } catch (const mxmoe::unsupported& e) {
    return report({kBackendUnavailable, "backend unavailable: ", e.what()}, json);
  } catch (const std::system_error& e) {
    return report({kIoError, "I/O error: ", e.what()}, json);
  } catch (const std::exception& e) {
    return report({kInternalError, "internal error: ", e.what()}, json);
  }
  return kBadInput;
}
