// What the small single-question benchmarks (bench_code_fetch, bench_stream_read) share around
// their measurement: the `[--iters N] [--json PATH]` command line, the device check and writing
// the JSON without leaving a half-written file.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace mxmoe::bench {

struct iters_json_args {
  int iters = 0;
  std::string json_path;  // "" = no JSON
};

// Parses `[--iters N] [--json PATH]` (N in 1 .. 1000) into `args` (iters holds the default on
// entry). Returns 0 to go on, or the exit code (2) after printing what was wrong.
inline int parse_iters_json(int argc, char** argv, const char* name, iters_json_args& args) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) {
      args.iters = std::atoi(argv[++i]);
    } else if (a == "--json" && i + 1 < argc) {
      args.json_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--iters N] [--json PATH]\n  unknown argument '%s'\n", name, a.c_str());
      return 2;
    }
  }
  if (args.iters < 1 || args.iters > 1000) {
    std::fprintf(stderr, "--iters: expected 1 .. 1000, got %d\n", args.iters);
    return 2;
  }
  return 0;
}

// True when a CUDA device is usable; otherwise says so on stderr.
inline bool have_cuda_device(const char* name) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::fprintf(stderr, "%s: no CUDA device\n", name);
    return false;
  }
  return true;
}

// Writes `doc` to PATH.tmp, then renames it to PATH. False (after saying so) when that fails.
inline bool write_json_file(const std::string& path, const nlohmann::json& doc, const char* name) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << doc.dump(1) << "\n";
    if (!f) {
      std::fprintf(stderr, "%s: cannot write %s\n", name, tmp.c_str());
      return false;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::fprintf(stderr, "%s: cannot write %s\n", name, path.c_str());
    return false;
  }
  return true;
}

}  // namespace mxmoe::bench
